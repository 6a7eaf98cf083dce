"""Benchmarks: the tables are well formed, and the oracle run hits the call-count bound."""
import numpy as np
import pytest
import torch

from conftest import make_tiny
from sr_blockwise.decoding import engine
from sr_blockwise.bench import call_breakdown, call_cost_table, decode_table, time_call, train_throughput


def test_oracle_accepts_k_per_call_and_tables_are_complete():
    m = make_tiny(0).for_inference(torch.float32)
    lr = np.random.default_rng(0).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    rows = decode_table(m, lr, ks=(4,), modes=("exact", "oracle"))
    assert [r["mode"] for r in rows] == ["greedy", "exact", "oracle"]
    assert rows[1]["same_as_greedy"] is True
    oracle = rows[-1]
    assert oracle["mean_block"] == 4.0 and oracle["calls"] == 3072 / 4 + 1  # ~m/k + 1 calls
    cost = call_cost_table(m, tokens=(1, 3), batches=(1, 2), reps=2, torch_model=m)
    assert [(r["engine"], r["batch"], r["tokens"]) for r in cost] == [
        (e, b, n) for e in ("native", "torch") for b in (1, 2) for n in (1, 3)]
    assert all(r["ms"] > 0 for r in cost)
    parts = call_breakdown(m, 4, batches=(1,), reps=2)[0]
    assert set(parts) == {"batch", "k", "call_ms", "host_ms", *[f"{n}_ms" for n in engine.STAGES]}


def test_every_stage_of_a_call_is_timed_and_only_when_asked():
    """An oracle k=4 call runs every stage, so each gets cycles; without drafting the draft stage
    gets almost none; a batch that was not asked keeps no counts."""
    m = make_tiny(0).for_inference(torch.float32)
    with_draft, without = [], []
    time_call(m, 4, 2, reps=3, stage_ticks=with_draft)
    time_call(m, 4, 2, reps=3, propose=False, stage_ticks=without)
    assert (with_draft[0] > 0).all(), dict(zip(engine.STAGES, with_draft[0].tolist()))
    draft = engine.STAGES.index("draft")
    assert without[0][draft] < 0.2 * with_draft[0][draft]
    b = engine.Batch(m, torch.zeros(1, 192, dtype=torch.int64), 2)
    assert not b.struct.stage_ticks  # a null pointer: nothing counted


def test_stages_are_timed_in_calls_that_go_by_image():
    """At 2 threads a k=4 call of 4 images goes by image (each thread runs its share alone): the
    first thread's share of the work still gets every stage's cycles."""
    m = make_tiny(0).for_inference(torch.float32)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ticks = []
        time_call(m, 4, 2 * engine.IMAGES_PER_THREAD, reps=3, stage_ticks=ticks)
    finally:
        torch.set_num_threads(before)
    assert (ticks[0] > 0).all(), dict(zip(engine.STAGES, ticks[0].tolist()))


def test_bench_decode_refuses_a_negative_thread_count():
    import argparse

    from sr_blockwise.cli.bench import register
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command"))
    args = p.parse_args(["bench-decode", "--threads", "-1"])
    with pytest.raises(ValueError, match="--threads"):
        args.func(args)


@pytest.mark.parametrize("argv, message", [
    (["--k", "11"], "10 blockwise heads, so each k must be in 1..10"),
    (["--k", "0"], "each k must be in 1..10"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--images", "0"], "--images must be >= 1"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--prior-weight", "-1"], "prior_weight must be a number >= 0"),
])
def test_bench_decode_refuses_bad_arguments_before_measuring(monkeypatch, capsys, argv, message):
    from sr_blockwise import bench
    from sr_blockwise.cli import main
    monkeypatch.setattr(bench, "call_cost_table", lambda *a, **k: pytest.fail("measured before refusing"))
    assert main(["bench-decode", "--json", "", "--torch-images", "0"] + argv) == 2
    assert message in capsys.readouterr().err


def test_bench_decode_breaks_a_call_down_at_each_k_asked(monkeypatch):
    """--k says which calls' time is broken down by stage, as it says which are decoded."""
    from sr_blockwise import bench
    from sr_blockwise.cli import main

    class Measured(Exception):
        pass

    def stop(*a, **kw):
        raise Measured
    seen = []
    monkeypatch.setattr(bench, "call_cost_table", lambda *a, **kw: [])
    monkeypatch.setattr(bench, "call_breakdown", lambda model, k, **kw: seen.append(k) or [{"batch": 1, "k": k}])
    monkeypatch.setattr(bench, "decode_table", stop)
    for ks, want in (("2", [2]), ("3,9", [3, 9])):
        seen.clear()
        with pytest.raises(Measured):  # stopped once the breakdown is done
            main(["bench-decode", "--json", "", "--torch-images", "0", "--batch-size", "1", "--k", ks])
        assert seen == want


def test_train_throughput_counts_flops():
    r = train_throughput("tiny", batch=2, steps=1)
    assert r["gflop_per_image"] > 0.1 and 0 < r["fraction_of_matmul_rate"] < 1
    ft = train_throughput("tiny", batch=2, steps=1, stage="finetune", head_frac=0.5)
    assert (ft["stage"], ft["head_frac"]) == ("finetune", 0.5)
    assert ft["gflop_per_image"] > r["gflop_per_image"]  # backward through the base for 5x the heads' positions


def test_decode_table_decodes_every_row_at_the_prior_weight_given():
    """bench-decode --prior-weight: the exact-heads row's blocks are those of exact decoding at
    that weight (the replay over that weight's greedy output), not the unweighted model's."""
    from sr_blockwise.decoding import DecodeOptions, decode, exact_block_stats
    m = make_tiny(3).for_inference(torch.float32)
    lr = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    rows = decode_table(m, lr, ks=(4,), modes=("exact-heads",), prior_weight=3.0)
    guided = decode(m, lr, DecodeOptions(k=1, prior_weight=3.0)).images
    replay = exact_block_stats(m, lr, guided, [4], prior_weight=3.0)[4]
    assert rows[1]["mean_block"] == np.mean([s.mean_block for s in replay])
    plain = decode_table(m, lr, ks=(4,), modes=("exact-heads",))
    assert plain[1]["mean_block"] != rows[1]["mean_block"]  # the weight changes the blocks here
