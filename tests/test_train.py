"""Training: loss goes down, resume continues exactly, bad inputs refused, DDP with 2 processes."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sr_blockwise.checkpoints import read_checkpoint as load_checkpoint
from sr_blockwise.train import FRESH_ADAM_RAMP, TrainConfig, bits_per_dim, lr_at, train


@pytest.fixture
def small_data(tmp_path):
    rng = np.random.default_rng(0)
    n = 24
    base = rng.integers(0, 256, (n, 1, 1, 3))  # flat-coloured faces: learnable in a few steps
    imgs = np.clip(base + rng.integers(-3, 4, (n, 32, 32, 3)), 0, 255).astype(np.uint8)
    path = tmp_path / "faces.npz"
    np.savez(path, images=imgs, celeba_id=np.arange(n) * 16 + 1, split=np.zeros(n, np.int64))
    return str(path)


def cfg(data, run, **kw):
    """A tiny run in float32: what these tests check does not depend on the dtype, and a processor
    without bf16 instructions (AVX2) runs bf16 autocast's products ~100x slower than float32's
    (test_bf16_autocast_training_resumes_exactly covers TrainConfig's default, bf16)."""
    return TrainConfig(**{"run": run, "preset": "tiny", "data": data, "batch_size": 4, "lr": 3e-3,
                          "warmup": 5, "eval_minutes": 1e9, "ckpt_minutes": 1e9, "bf16": False, **kw})


def test_loss_falls_and_resume_continues_exactly(small_data, tmp_path, monkeypatch):
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    train(cfg(small_data, "a", max_steps=9), progress=False)  # stops mid-epoch (6 steps/epoch)
    first = load_checkpoint(tmp_path / "cache/a/last.pt")
    assert first["step"] == 9
    train(cfg(small_data, "a", max_steps=16), resume=True, progress=False)
    # the same 16 steps in one go give the same weights: data order and optimizer resumed
    train(cfg(small_data, "b", max_steps=16), progress=False)
    a = load_checkpoint(tmp_path / "cache/a/last.pt")["model"]
    b = load_checkpoint(tmp_path / "cache/b/last.pt")["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    log = (tmp_path / "cache/a/log.csv").read_text().splitlines()
    assert log[0].startswith("step,") and len(log) >= 2
    # the model learned: held-in bits/dim fell from the seeded initial model's
    from sr_blockwise.train import init_model
    imgs = np.load(small_data)["images"]
    before = bits_per_dim(init_model(cfg(small_data, "x")), imgs, bf16=False)
    after_model = init_model(cfg(small_data, "x"))
    after_model.load_state_dict(b)
    assert bits_per_dim(after_model, imgs, bf16=False) < before - 0.2
    with pytest.raises(ValueError, match="different settings"):
        train(cfg(small_data, "a", max_steps=20, batch_size=2), resume=True, progress=False)


def test_bf16_autocast_training_resumes_exactly(small_data, tmp_path, monkeypatch):
    """TrainConfig's default dtype: under bf16 autocast, 2 steps and a resume to 4 give the weights
    of 4 steps in one go, and the loss is finite."""
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    assert TrainConfig().bf16
    train(cfg(small_data, "a", max_steps=2, bf16=True), progress=False)
    train(cfg(small_data, "a", max_steps=4, bf16=True), resume=True, progress=False)
    out = train(cfg(small_data, "b", max_steps=4, bf16=True), progress=False)
    a = load_checkpoint(tmp_path / "cache/a/last.pt")["model"]
    b = load_checkpoint(tmp_path / "cache/b/last.pt")["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert np.isfinite(out["bpd_train"])


def test_bf16_autocast_on_a_processor_without_bf16_instructions_is_warned_of(monkeypatch):
    """bf16 autocast on an x86 CPU without AVX-512 BF16 or AMX gets a warning naming --fp32; with
    either instruction set, float32, or a GPU, none."""
    from sr_blockwise.decoding import engine
    from sr_blockwise.train import slow_bf16_note
    for flags, device, bf16, warned in [(b"flags : fpu sse2 avx avx2 fma", "cpu", True, True),
                                        (b"flags : fpu avx2 avx512f avx512_bf16", "cpu", True, False),
                                        (b"flags : fpu avx2 amx_tile amx_bf16", "cpu", True, False),
                                        (b"flags : fpu sse2 avx avx2 fma", "cpu", False, False),
                                        (b"flags : fpu sse2 avx avx2 fma", "cuda", True, False),
                                        (b"aarch64", "cpu", True, False)]:  # not x86: cannot tell
        monkeypatch.setattr(engine, "cpu_flags", lambda f=flags: f)
        note = slow_bf16_note(TrainConfig(device=device, bf16=bf16))
        assert (note is not None) == warned, (flags, device, bf16)
        assert note is None or "--fp32" in note


def test_resume_refuses_a_cut_short_checkpoint_and_notes_a_changed_schedule(small_data, tmp_path, monkeypatch, capsys):
    from sr_blockwise.checkpoints import WeightsError
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    train(cfg(small_data, "a", max_steps=2), progress=False)
    capsys.readouterr()
    train(cfg(small_data, "a", max_steps=3, lr=0.01), resume=True, progress=False)
    assert "with other settings than it was trained with: lr" in capsys.readouterr().err
    # best.pt is read for its score only: a damaged one is warned about, and the resume goes on
    (tmp_path / "cache/a/best.pt").write_bytes(b"not a checkpoint")
    train(cfg(small_data, "a", max_steps=4, lr=0.01), resume=True, progress=False)
    assert "best.pt: not a usable training checkpoint" in capsys.readouterr().err
    last = tmp_path / "cache/a/last.pt"
    last.write_bytes(last.read_bytes()[:5000])  # a full disk or a killed copy
    with pytest.raises(WeightsError, match="last.pt: not a usable training checkpoint"):
        train(cfg(small_data, "a", max_steps=5), resume=True, progress=False)


def test_losses_are_logged_every_10_steps_and_the_best_validated_checkpoint_kept(small_data, tmp_path, monkeypatch):
    """Losses are read every 10 steps, not every step (each read waits for a GPU to finish), with
    one log row each and none repeated; the result is of the last step. With validation at every
    step, every step has its row and best.pt holds the best-scored one."""
    import csv
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    out = train(cfg(small_data, "a", max_steps=23), progress=False)
    rows = list(csv.DictReader(open(tmp_path / "cache/a/log.csv")))
    assert [int(r["step"]) for r in rows] == [10, 20]
    assert out["step"] == 23 and np.isfinite(out["bpd_train"]) and load_checkpoint(tmp_path / "cache/a/last.pt")["step"] == 23
    d = dict(np.load(small_data))
    d["split"] = np.where(np.arange(len(d["split"])) < 4, 1, 0)  # 4 validation faces
    np.savez(tmp_path / "with_val.npz", **d)
    train(cfg(str(tmp_path / "with_val.npz"), "v", max_steps=5, eval_minutes=0, eval_images=4), progress=False)
    rows = list(csv.DictReader(open(tmp_path / "cache/v/log.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5]
    val = [float(r["val_bpd"]) for r in rows]
    best = load_checkpoint(tmp_path / "cache/v/best.pt")
    assert best["step"] == 1 + int(np.argmin(val)) and best["best_val_bpd"] == pytest.approx(min(val))
    # a resume measures against best.pt's score, which can be newer than last.pt's (a hard kill)
    best["best_val_bpd"] = 0.5
    torch.save(best, tmp_path / "cache/v/best.pt")
    train(cfg(str(tmp_path / "with_val.npz"), "v", max_steps=7, eval_minutes=0, eval_images=4), resume=True, progress=False)
    assert load_checkpoint(tmp_path / "cache/v/best.pt")["best_val_bpd"] == 0.5
    # and a fresh run never brings back a best.pt of an earlier run of that name
    (tmp_path / "cache/v/last.pt").unlink()
    train(cfg(small_data, "v", max_steps=1), progress=False)  # no validation faces: no best.pt
    assert not (tmp_path / "cache/v/best.pt").exists()


def test_schedule_offset_continues_the_source_runs_schedule():
    """A warm start with --schedule-offset S reads the source run's curve at S + step (after a
    short ramp for the fresh optimizer), not a new warmup from zero."""
    source = TrainConfig(lr=8e-4, warmup=200)
    warm = TrainConfig(lr=8e-4, warmup=200, schedule_offset=4029)
    for step in (FRESH_ADAM_RAMP, 500, 3000):
        assert lr_at(step, warm) == pytest.approx(lr_at(4029 + step, source))
    assert lr_at(1, warm) == pytest.approx(lr_at(4030, source) / FRESH_ADAM_RAMP)
    assert lr_at(1, source) == pytest.approx(8e-4 / 200)  # no offset: the plain warmup


def test_frozen_head_stage_leaves_the_base_untouched(small_data, tmp_path, monkeypatch):
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    train(cfg(small_data, "base", max_steps=3), progress=False)
    before = load_checkpoint(tmp_path / "cache/base/last.pt")["model"]
    train(cfg(small_data, "heads", stage="heads", max_steps=3,
              init_from=str(tmp_path / "cache/base/last.pt")), progress=False)
    after = load_checkpoint(tmp_path / "cache/heads/last.pt")["model"]
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and all(k.startswith("heads.") for k in changed)


def test_base_stage_heads_do_not_move_the_base():
    """Heads trained in the base stage read the decoder state and the output projection without
    training them: the head loss sends no gradient to any base parameter."""
    from conftest import make_tiny
    from sr_blockwise.model import SEQ_LEN
    from sr_blockwise.train import TrainingLoss
    model = make_tiny(7).train()
    loss_fn = TrainingLoss(model, TrainConfig(preset="tiny", stage="base", head_frac=0.1))
    src, tgt = torch.randint(0, 256, (2, 192)), torch.randint(0, 256, (2, SEQ_LEN))
    base_loss, head_loss, _ = loss_fn(src, tgt, torch.Generator().manual_seed(0))
    head_loss.backward()
    for name, p in model.named_parameters():
        moved = p.grad is not None and bool(p.grad.abs().sum() > 0)
        assert moved == name.startswith("heads."), name


@pytest.mark.parametrize("head1,head_loss,window", [
    ("base", "sum", 0), ("layer", "sum", 0), ("layer", "random", 0), ("base", "random", 0), ("base", "sum", 2),
    ("layer", "random", 3)])
def test_head_loss_scores_each_head_as_decoding_reads_it(head1, head_loss, window):
    """Every head's training loss is the cross-entropy of the logits decoding gets from
    `head_logits` (priors included) at the token it predicts, over the targets inside the image;
    with a window W, -log of those logits' softmax mass on the values within W of the token."""
    from conftest import make_tiny
    from sr_blockwise.model import SEQ_LEN
    from sr_blockwise.train import TrainingLoss
    model = make_tiny(5, head1=head1).double().train()
    cfg = TrainConfig(preset="tiny", stage="finetune", head_frac=1.0, head_loss=head_loss, head_window=window)
    src, tgt = torch.randint(0, 256, (1, 192)), torch.randint(0, 256, (1, SEQ_LEN))
    _, head_loss_value, per_head = TrainingLoss(model, cfg)(src, tgt, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)  # the positions and head the loss drew
    pos = torch.randperm(SEQ_LEN, generator=gen)[None]
    G, K = model.cfg.n_groups, model.cfg.n_blockwise
    groups = [int(torch.randint(G, (1,), generator=gen))] if head_loss == "random" else list(range(G))
    with torch.no_grad():
        logits = model.head_logits(model(src, tgt)[:, pos[0]], K, src, pos, tgt)  # (1, 3072, K, 256)
    want = []
    for g in groups:
        j = g + (K - G)  # head1="base": group g is head g + 2 (index g + 1); "layer": head g + 1
        t = pos[0] + j
        valid = t < SEQ_LEN  # the last j positions have nothing that far ahead
        p, x = logits[0, valid, j].softmax(-1), tgt[0, t[valid]]
        near = (torch.arange(256)[None] - x[:, None]).abs() <= window  # (n, 256)
        want.append(float(-(p * near).sum(-1).log().mean()))
    assert per_head.tolist() == pytest.approx(want, rel=1e-5)
    assert float(head_loss_value.detach()) == pytest.approx(sum(want) if head_loss == "sum" else want[0] * G, rel=1e-5)


def test_window_nll_is_minus_log_mass_near_the_target():
    from sr_blockwise.train import window_nll
    logits = torch.randn(3, 4, 256, dtype=torch.double)
    target = torch.tensor([[0, 255, 100, -100], [1, 254, 7, 128], [3, 3, 3, -100]])
    torch.testing.assert_close(window_nll(logits, target, 0), torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="none").view(3, 4))
    p = logits.softmax(-1)
    assert float(window_nll(logits, target, 2)[0, 0]) == pytest.approx(float(-p[0, 0, :3].sum().log()))  # 0..2
    assert float(window_nll(logits, target, 2)[1, 1]) == pytest.approx(float(-p[1, 1, 252:].sum().log()))  # 252..255
    assert float(window_nll(logits, target, 2)[1, 2]) == pytest.approx(float(-p[1, 2, 5:10].sum().log()))
    assert float(window_nll(logits, target, 2)[0, 3]) == 0.0  # ignored
    assert (window_nll(logits, target, 3) <= window_nll(logits, target, 1)).all()


def test_base_stage_training_with_heads_equals_training_without(small_data, tmp_path, monkeypatch):
    """End to end (optimizer, clipping included): 3 steps with the heads' loss on or off leave the
    same base. Up to bf16 noise: the two runs allocate differently, and oneDNN's bf16 kernels can
    round differently with alignment (seen: 3e-5); a leak would move weights by ~lr = 3e-3."""
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    train(cfg(small_data, "with", max_steps=3), progress=False)
    train(cfg(small_data, "without", max_steps=3, head_weight=0.0), progress=False)
    a = load_checkpoint(tmp_path / "cache/with/last.pt")["model"]
    b = load_checkpoint(tmp_path / "cache/without/last.pt")["model"]
    for k in a:
        if not k.startswith("heads."):
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=3e-4, msg=k)
    assert not all(torch.equal(a[k], b[k]) for k in a if k.startswith("heads."))


def test_bad_inputs_touch_no_checkpoint(small_data, tmp_path, monkeypatch):
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(cfg(str(tmp_path / "nope.npz"), "x", max_steps=1), progress=False)
    empty = tmp_path / "empty.npz"
    np.savez(empty, images=np.zeros((0, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="empty"):
        train(cfg(str(empty), "x", max_steps=1), progress=False)
    train(cfg(small_data, "c", max_steps=1), progress=False)
    ck = tmp_path / "cache/c/last.pt"
    stamp = ck.stat().st_mtime_ns
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg(small_data, "c", max_steps=1), progress=False)
    with pytest.raises(ValueError, match="does not match"):
        train(TrainConfig(run="c", preset="cpu", data=small_data, max_steps=1), resume=True, progress=False)
    assert ck.stat().st_mtime_ns == stamp


def test_train_command_has_an_option_for_every_config_field_with_its_default():
    """`sr-blockwise train` builds TrainConfig from options named after its fields: without
    options it is the dataclass's default config, and each option lands in its field."""
    from dataclasses import replace

    from sr_blockwise.cli import build_parser, config_from
    parse = lambda *a: config_from(TrainConfig, build_parser().parse_args(["train", *a]))
    assert parse() == TrainConfig()
    assert parse("--run-name", "r", "--fp32", "--weight-decay", "0.1", "--head-window", "2", "--stage", "heads") == \
        replace(TrainConfig(), run="r", bf16=False, weight_decay=0.1, head_window=2, stage="heads")

def test_ddp_two_cpu_processes(small_data, tmp_path):
    env = {**os.environ, "SR_BLOCKWISE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517",
           "-m", "sr_blockwise", "train", "--run-name", "ddp", "--preset", "tiny", "--data", small_data,
           "--batch-size", "2", "--max-steps", "3", "--warmup", "2", "--quiet", "--eval-minutes", "1e9"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert load_checkpoint(tmp_path / "cache/ddp/last.pt")["step"] == 3


def test_distill_targets_then_finetune_on_them(small_data, tmp_path, monkeypatch, tiny_weights):
    """Sequence-level distillation: the model's own greedy outputs become training targets."""
    from sr_blockwise.cli import main

    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    out = tmp_path / "distill.npz"
    assert main(["distill", "--weights", tiny_weights, "--data", small_data, "--n", "4",
                 "--batch-size", "4", "-o", str(out)]) == 0
    d = np.load(out)
    assert d["images"].shape == (4, 32, 32, 3) and d["lr"].shape == (4, 8, 8, 3)
    r = train(cfg(small_data, "ft", stage="finetune", init_from=tiny_weights, distill=str(out),
                  max_steps=2, batch_size=2), progress=False)
    assert r["step"] == 2
    # heads on the frozen base: the last --eval-images targets are held out and scored by replay
    # (which raises unless they are still the base's greedy outputs)
    r = train(cfg(small_data, "hd", stage="heads", init_from=tiny_weights, distill=str(out),
                  max_steps=2, batch_size=2, eval_images=2), progress=False)
    assert r["step"] == 2 and 1.0 <= r["val_block"] <= 10.0
    rows = (tmp_path / "cache/hd/log.csv").read_text().splitlines()
    assert rows[0].endswith(",val_block") and float(rows[-1].split(",")[-1]) == r["val_block"]
    assert rows[1].startswith("0,") and 1.0 <= float(rows[1].split(",")[-1]) <= 10.0  # before training
    # the learning curve takes such a log (its step-0 row has no training loss)
    png = tmp_path / "curve.png"
    assert main(["learning-curve", "hd", "--batch-sizes", "2", "-o", str(png)]) == 0
    assert png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="leave none to train on"):
        train(cfg(small_data, "hd4", stage="heads", init_from=tiny_weights, distill=str(out),
                  max_steps=2, batch_size=2, eval_images=4), progress=False)


def test_distill_keeps_the_targets_decoded_before_a_crash(small_data, tmp_path, monkeypatch, tiny_weights):
    """Decoding targets takes CPU-hours: a run stopped after its first batch keeps that batch."""
    import sr_blockwise.decoding as decoding
    from sr_blockwise.cli import main

    real_decode, calls = decoding.decode, []

    def decode_then_crash(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_decode(*args, **kw)

    monkeypatch.setattr(decoding, "decode", decode_then_crash)
    out = tmp_path / "distill.npz"
    assert main(["distill", "--weights", tiny_weights, "--data", small_data, "--n", "4",
                 "--batch-size", "2", "-o", str(out)]) == 130  # the CLI's exit code for a Ctrl-C
    d = np.load(out)
    assert d["images"].shape == (2, 32, 32, 3) and len(d["lr"]) == len(d["train_index"]) == 2
    assert not list(tmp_path.glob("*.tmp*"))


def test_init_from_a_model_without_lr_skip_grows_it_unchanged(small_data, tmp_path):
    """Old weights (no lr_skip) warm-start the lr_skip preset: the new embedding starts at zero,
    so the grown model computes exactly what the old one did."""
    from conftest import make_tiny
    from sr_blockwise.checkpoints import save_weights
    from sr_blockwise.model import SEQ_LEN
    from sr_blockwise.train import init_model
    old = make_tiny(3, lr_skip=False)
    path = save_weights(old, tmp_path / "old")
    grown = init_model(cfg(small_data, "g", init_from=str(path))).eval()
    assert grown.cfg.lr_skip and not old.cfg.lr_skip
    src = torch.randint(0, 256, (2, 192))
    tgt = torch.randint(0, 256, (2, SEQ_LEN))
    with torch.no_grad():
        torch.testing.assert_close(grown(src, tgt), old(src, tgt), rtol=0, atol=1e-5)


def test_lr_prior_starts_from_the_datas_offset_histogram(small_data, tmp_path, monkeypatch):
    """A fresh run sets lr_prior to the log-histogram of (intensity - input cell intensity): on
    faces that are flat colours plus noise in -3..3 nearly all its mass lies within 3 levels."""
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    from sr_blockwise.train import init_lr_prior, init_model
    model = init_model(cfg(small_data, "p"))
    assert not model.lr_prior.any()  # zero in the model itself (old weights warm-start unchanged)
    init_lr_prior(model, np.load(small_data)["images"])
    p = model.lr_prior.exp()
    torch.testing.assert_close(p.sum(1), torch.ones(3))  # a distribution per channel
    assert (p[:, 255 - 3 : 255 + 4].sum(1) > 0.95).all()
    train(cfg(small_data, "p", max_steps=1), progress=False)  # train() does the same itself
    assert load_checkpoint(tmp_path / "cache/p/last.pt")["model"]["lr_prior"].exp().sum(1).min() > 0.9
    # but not in the frozen-base heads stage: a base grown from weights without the prior keeps
    # a zero prior there, so p1 stays exactly the old base's
    from conftest import make_tiny
    from sr_blockwise.checkpoints import save_weights
    old = save_weights(make_tiny(2, lr_prior=False), tmp_path / "old")
    train(cfg(small_data, "h", stage="heads", max_steps=1, init_from=str(old)), progress=False)
    assert not load_checkpoint(tmp_path / "cache/h/last.pt")["model"]["lr_prior"].any()


def test_a_run_resumes_with_the_features_it_started_with(small_data, tmp_path, monkeypatch):
    """A run started before its preset gained a feature (here nbr_draft) still
    resumes, as the model it was: the preset only decides what a new run or warm start builds."""
    from dataclasses import replace
    from sr_blockwise import model as model_module
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    tiny = model_module.PRESETS["tiny"]
    monkeypatch.setitem(model_module.PRESETS, "tiny", replace(tiny, nbr_draft=False))
    train(cfg(small_data, "r", max_steps=2), progress=False)
    monkeypatch.setitem(model_module.PRESETS, "tiny", tiny)  # the preset gains nbr_draft
    train(cfg(small_data, "r", max_steps=3), resume=True, progress=False)
    ck = load_checkpoint(tmp_path / "cache/r/last.pt")
    assert ck["step"] == 3 and ck["model_config"]["nbr_draft"] is False


def test_weights_without_nbr_draft_keep_their_tables_and_grow_the_third_at_zero(small_data, tmp_path):
    """Weights with the neighbour prior but without drafts: a warm start keeps their two
    tables (the left one is then read one pixel back) and adds the third reference at zero."""
    from conftest import make_tiny
    from sr_blockwise.checkpoints import save_weights
    from sr_blockwise.train import init_model
    old = make_tiny(4, nbr_draft=False)
    grown = init_model(cfg(small_data, "g", init_from=str(save_weights(old, tmp_path / "old"))))
    assert grown.cfg.nbr_draft and grown.heads.nbr_prior.shape[1] == 3
    assert torch.equal(grown.heads.nbr_prior[:, :2], old.heads.nbr_prior)
    assert not grown.heads.nbr_prior[:, 2].any()


def test_weights_without_nbr_prior_grow_it_unchanged_and_training_moves_it(small_data, tmp_path, monkeypatch):
    """Weights without the neighbour prior: a warm start grows it at zero,
    so every head's logits are the old model's; then the heads stage trains the tables (their
    own, larger step) and nothing of the base."""
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    from conftest import make_tiny
    from sr_blockwise.checkpoints import save_weights
    from sr_blockwise.model import SEQ_LEN
    from sr_blockwise.train import TABLE_LR_MULT, init_model
    old = make_tiny(4, nbr_prior=False, nbr_draft=False)
    path = save_weights(old, tmp_path / "old")
    grown = init_model(cfg(small_data, "g", init_from=str(path))).eval()
    assert grown.cfg.nbr_prior and not grown.heads.nbr_prior.any()
    src, tgt = torch.randint(0, 256, (2, 192)), torch.randint(0, 256, (2, SEQ_LEN))
    with torch.no_grad():
        h = old(src, tgt)
        torch.testing.assert_close(grown.head_logits(h, 10, src, tokens=tgt), old.head_logits(h, 10, src),
                                   rtol=0, atol=0)
    train(cfg(small_data, "h", stage="heads", max_steps=3, init_from=str(path)), progress=False)
    after = load_checkpoint(tmp_path / "cache/h/last.pt")
    tab = after["model"]["heads.nbr_prior"]
    # Adam's first steps move each entry by about the learning rate: the tables' is larger
    assert tab.abs().max() > 0.5 * TABLE_LR_MULT * lr_at(1, cfg(small_data, "h"))
    for k, v in old.state_dict().items():
        if not k.startswith("heads."):
            assert torch.equal(after["model"][k], v), k
