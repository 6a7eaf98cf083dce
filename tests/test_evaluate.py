import copy
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sr_blockwise import evaluate as ev
from sr_blockwise.cli import _every_parser, main

DOCS = Path(__file__).resolve().parent.parent / "docs" / "evaluate.md"


# ---------------------------------------------------------------- small pieces

def test_parse_mode():
    assert ev.parse_mode("exact") == ev.Mode("exact")
    assert ev.parse_mode("eps=2") == ev.Mode("eps=2") and ev.Mode("eps=2").settings.rule == "eps"
    assert ev.parse_mode("Top-K=3").options(4).top_k == 3
    assert ev.parse_mode("topk=3").name == "top-k=3"
    m = ev.parse_mode("min-block=2")
    assert (m.settings.rule, m.settings.min_block, m.options(4).is_exact) == ("exact", 2, False)
    assert ev.parse_mode("exact").options(6).is_exact
    assert ev.parse_mode("exact").options(6).propose == "recycle" and ev.parse_mode("exact").options(1).k == 1
    assert ev.parse_mode("exact-heads") == ev.Mode("exact-heads")
    assert ev.parse_mode("Exact_Heads").options(6).propose == "argmax"
    assert ev.parse_mode("exact-heads").options(6) == ev.DecodeOptions(k=6, propose="argmax")
    assert not ev.parse_mode("eps=2").options(6).is_exact
    w = ev.parse_mode("eps-window=2").options(6)
    assert (w.rule, w.eps, w.propose) == ("eps", 2, "window")
    assert ev.parse_mode("eps-window=0").options(6).is_exact  # window proposals at eps 0: argmax ones
    t = ev.parse_mode("eps=2:tree=64")
    assert t.name == "eps=2:tree=64" and t.options(10) == ev.DecodeOptions.parse("eps=2:k=10:tree=64")
    assert ev.parse_mode("exact:tree=64").options(10, 2.0).spec == "exact:k=10:tree=64:w=2"
    from sr_blockwise.evaluate.plots import _eps_of
    assert (_eps_of("eps=2:tree=256"), _eps_of("exact:tree=64"), _eps_of("eps=3")) == (2, 0, 3)
    for bad, msg in [("fast", "unknown mode 'fast'"), ("eps", "unknown mode"),
                     ("eps=x", "not a whole number"), ("eps=-1", "eps must be >= 0"), ("eps=256", "eps must be in 0..255"), ("top-k=0", "top-k must be >= 1"),
                     ("min-block=0", "min-block must be >= 1"), ("exact:k=4", "k comes from --k"),
                     ("exact:tree=64:w=2", "k comes from --k"), ("exact:tree=1", "2..1024"),
                     ("sample", "not sampling")]:
        with pytest.raises(ValueError, match=msg):
            ev.parse_mode(bad)


def test_parse_list_and_weights_spec():
    assert ev.parse_list("2,4, 6", int) == [2, 4, 6]
    assert ev.parse_list(["2,4", "6"], int) == [2, 4, 6]
    with pytest.raises(ValueError):
        ev.parse_list("2,x", int)
    assert ev.weights_spec("weights/a.json:frozen") == ("weights/a.json", "frozen")
    assert ev.weights_spec("b:fine-tuned") == ("b", "fine-tuned")
    assert ev.weights_spec("c:finetuned") == ("c", "fine-tuned")
    assert ev.weights_spec("d") == ("d", None)
    assert ev.weights_spec("C:/w/e.json") == ("C:/w/e.json", None)


def test_evaluate_command_has_an_option_for_every_config_field_with_its_default():
    """`sr-blockwise evaluate` builds EvalConfig from options named after its fields: without
    options it is the dataclass's default config but for the decode store, which the command
    keeps in ~/.cache unless told 'none'."""
    from dataclasses import replace

    from sr_blockwise.cli import build_parser
    from sr_blockwise.cli.evaluate import config_of
    parse = lambda *a: config_of(build_parser().parse_args(["evaluate", *a]))
    assert parse() == replace(ev.EvalConfig(), cache_dir="~/.cache/sr-blockwise/evaluate")
    assert parse("--cache-dir", "none", "--k", "2,6", "--modes", "exact,eps=1", "--json", "r.json", "--quiet",
                 "-n", "7") == replace(ev.EvalConfig(), ks=[2, 6], modes=["exact", "eps=1"], json_path="r.json",
                                       progress=False, n_images=7)
    # the dtype as every command spells it, recorded in evaluate's short spelling
    assert parse("--dtype", "float32").dtype == "fp32" and parse("--dtype", "bfloat16").dtype == "bf16"


def test_evaluate_dtype_is_spelt_as_every_commands_and_the_old_names_still_work(capsys):
    """--dtype bfloat16 / float32 / float16, as the other commands; bf16 / fp32 / fp16 give the
    same run with a deprecation note on stderr; a run's command line reproduces it without one."""
    from sr_blockwise.cli import build_parser
    from sr_blockwise.cli.evaluate import config_of
    parser = build_parser()
    parse = lambda *a: config_of(parser.parse_args(["evaluate", *a]))
    assert [parse("--dtype", d).dtype for d in ("bfloat16", "float32", "float16")] == ["bf16", "fp32", "fp16"]
    assert capsys.readouterr().err == ""
    for old, new in (("bf16", "bfloat16"), ("fp32", "float32"), ("fp16", "float16")):
        assert parse("--dtype", old) == parse("--dtype", new)
        assert capsys.readouterr().err == f"sr-blockwise evaluate: --dtype {old} is deprecated: use --dtype {new}\n"
    evaluate = next(p for p in _every_parser(parser) if p.prog == "sr-blockwise evaluate")
    assert "{bfloat16,float32,float16}" in evaluate.format_help()
    assert "--dtype float32 " in ev.EvalConfig(dtype="fp32").command()

def test_a_command_missing_an_optional_package_names_its_extra(tiny_weights, celeba_npz, tmp_path, monkeypatch,
                                                                capsys):
    """The perceptual metric is the `eval` extra: without it, `evaluate` stops with the pip
    command that installs it (exit 2), not a traceback."""
    import sys
    monkeypatch.setitem(sys.modules, "stlpips_pytorch", None)  # imports of it fail, as when not installed
    assert main(["evaluate", "--weights", tiny_weights, "--data", str(celeba_npz), "--limit", "1",
                 "--perceptual", "stlpips", "--out", str(tmp_path), "--cache-dir", "none", "--quiet"]) == 2
    assert "pip install 'sr-blockwise[eval]'" in capsys.readouterr().err

def test_infer_variant():
    assert ev.infer_variant("cpu-frozen", {}) == "frozen"
    assert ev.infer_variant("cpu-finetuned", {}) == "fine-tuned"
    assert ev.infer_variant("x", {"stage": "finetune"}) == "fine-tuned"
    assert ev.infer_variant("x", {}) is None


def test_head_acceptance():
    # 10 steps: 5 accepted 1 token, 3 accepted 2, 2 accepted 3
    assert ev.head_acceptance([5, 3, 2]) == pytest.approx([0.5, 0.4])
    assert ev.head_acceptance([4]) == []


def test_docs_list_every_record_field():
    text = DOCS.read_text()
    for f in ev.RECORD_FIELDS:
        assert f"`{f}`" in text, f"docs/evaluate.md does not document the record field {f!r}"


def test_bad_mode_and_weights_fail_cleanly(tiny_weights, tmp_path, capsys):
    assert main(["evaluate", "--weights", tiny_weights, "--modes", "fastest", "--out", str(tmp_path)]) == 2
    assert "unknown mode" in capsys.readouterr().err
    assert main(["evaluate", "--weights", str(tmp_path / "nope.json"), "--out", str(tmp_path)]) == 2
    assert "no weights" in capsys.readouterr().err
    assert main(["evaluate", "--weights", tiny_weights, tiny_weights, "--out", str(tmp_path)]) == 2
    assert "same name" in capsys.readouterr().err


def test_ks_beyond_every_weights_heads_are_refused_not_an_empty_table(tiny_weights, celeba_npz, tmp_path, capsys):
    """One k beyond the heads is skipped with a note (the smoke run has one); all of them: refused."""
    assert main(["evaluate", "--weights", tiny_weights, "--data", str(celeba_npz), "-n", "1", "--k", "11,12",
                 "--modes", "exact", "--out", str(tmp_path / "ev"), "--quiet"]) == 2
    assert "no mode and k to decode" in (err := capsys.readouterr().err) and "k=11 exact: the weights have 10 heads" in err


def test_checkpoints_are_named_by_their_run():
    assert ev.weights_name(Path("/c/cpu-distill-sum/last.pt")) == "cpu-distill-sum/last"
    assert ev.weights_name(Path("weights/cpu-frozen.json")) == "cpu-frozen"


# ---------------------------------------------------------------- the smoke run

@pytest.fixture(scope="module")
def smoke(tiny_weights, celeba_npz, tmp_path_factory):
    """One small real run through the CLI: 2 test faces, k in {2, 4} (and 16, more heads than the
    tiny model has: skipped), greedy, exact, exact-heads and eps=2."""
    out = tmp_path_factory.mktemp("eval")
    rc = _smoke_run(tiny_weights, celeba_npz, out, "--json", str(out / "sub" / "run.json"))
    return rc, out, out / "sub" / "run.json"


def _smoke_run(tiny_weights, celeba_npz, out, *more):
    threads = torch.get_num_threads()
    try:
        return main(["evaluate", "--weights", f"{tiny_weights}:frozen", "--data", str(celeba_npz),
                     "--limit", "2", "--k", "2,4,16", "--modes", "greedy,exact,exact-heads,eps=2", "--batch-size", "2",
                     "--threads", "1", "--uncached-prefix", "16", "--decode-exact", "1", "--decode-approx", "1",
                     "--out", str(out), "--cache-dir", str(out / "store"), "--quiet", *more])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_uncached_rep(monkeypatch):
    """The uncached-greedy estimate times each prefix length once, not thrice: a test that runs
    evaluate again and again checks what is read back and merged, not that estimate (the smoke
    run's test does)."""
    monkeypatch.setattr(ev.run, "time_uncached_greedy", functools.partial(ev.run.time_uncached_greedy, reps=1))


def _strict(path):
    def no_constant(name):  # NaN / Infinity are not JSON: other tools could not read them
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(Path(path).read_text(), parse_constant=no_constant)


def test_smoke_exit_code_and_schema(smoke):
    rc, out, js = smoke
    assert rc == 0
    r = _strict(js)
    assert r["schema"] == ev.SCHEMA and r["schema_version"] == ev.SCHEMA_VERSION and r["complete"] is True
    for key in ("created", "command", "machine", "data", "settings", "weights", "paper", "records", "summary"):
        assert key in r
    assert r["data"]["n_images"] == 2 and r["data"]["split"] == "test"
    assert "--limit 2" in r["command"]
    assert r["settings"]["perceptual"]["label"]
    for rec in r["records"]:
        assert list(rec) == list(ev.RECORD_FIELDS)
    kinds = [(x["method"], x["mode"], x["k"]) for x in r["records"]]
    assert kinds == [("bicubic", "bicubic", None), ("nearest", "nearest", None), ("greedy", "greedy", 1),
                     ("greedy-uncached", "greedy-uncached", 1),
                     ("blockwise", "exact", 2), ("blockwise", "exact-heads", 2), ("blockwise", "eps=2", 2),
                     ("blockwise", "exact", 4), ("blockwise", "exact-heads", 4), ("blockwise", "eps=2", 4)]
    assert any("k=16" in s for s in r["skipped"])


def test_smoke_values(smoke):
    r = _strict(smoke[2])
    recs = {(x["mode"], x["k"]): x for x in r["records"]}
    for (mode, k), x in recs.items():
        if mode in ("bicubic", "nearest"):
            assert x["weights"] is None and x["psnr_vs_real"] > 0 and x["perceptual_vs_real"] >= 0
            continue
        assert x["weights"] == "tiny-random" and x["variant"] == "frozen"
        assert 1 <= x["mean_block"] <= k
        assert x["seconds_per_image"] > 0 and x["speedup_vs_greedy"] > 0 and x["speedup_vs_uncached_greedy"] > 0
        assert x["bits_per_dim"] > 0
        if mode != "greedy-uncached":
            assert sum(x["block_hist"]) > 0 and len(x["block_hist"]) == k
            if mode == "greedy":
                assert x["n_images"] == x["n_images_decoded"] == 2
            if mode in ("eps=2", "exact"):  # --decode-approx / --decode-exact 1: no replay for them
                assert x["n_images"] == x["n_images_decoded"] == 1 and x["block_stats_from"] == "decoded"
                assert x["replay_matches_decoded"] is None
            for f in ("psnr_vs_real", "ssim_vs_real", "perceptual_vs_real", "ssim_vs_exact", "perceptual_vs_exact"):
                assert x[f] is not None, f
    # both exact modes must be greedy decoding, image for image
    for k in (2, 4):
        x = recs[("exact-heads", k)]
        assert x["exact_by_construction"] and x["identical_to_greedy"] == 1.0
        # --decode-exact 1: one face decoded, both faces' blocks replayed, the replay checked
        assert (x["n_images"], x["n_images_decoded"], x["block_stats_from"]) == (2, 1, "replay")
        assert x["replay_matches_decoded"] == 1.0 and len(x["block_hist"]) == k
        assert x["psnr_vs_exact"] is None and x["ssim_vs_exact"] == 1.0 and x["perceptual_vs_exact"] == 0.0
        assert x["paper_mean_block"] == ev.PAPER_TABLE2[("frozen", "exact-heads")][k]
        e = recs[("exact", k)]  # recycled proposals: decoded, no paper column of its own
        assert e["exact_by_construction"] and e["identical_to_greedy"] == 1.0 and e["paper_mean_block"] is None
        assert e["replay_matches_decoded"] is None and e["block_stats_from"] == "decoded"
        assert not recs[("eps=2", k)]["exact_by_construction"]
    assert recs[("greedy", 1)]["speedup_vs_greedy"] == 1.0
    assert recs[("greedy-uncached", 1)]["timing"] == "estimated"
    assert r["summary"]["exact_all_identical"] is True and r["summary"]["replay_all_match"] is True
    assert len(r["summary"]["exact_identical_to_greedy"]) == 4  # exact and exact-heads at k = 2, 4
    u = r["weights"][0]["uncached_timing"]
    assert u["prefix_tokens"] == 16 and u["prefix_tokens_match_cached"] == 1.0
    # the estimate is the measured steps summed over the image (no fitted curve, which went
    # below zero at short prefixes): every prefix length timed, the prefix predicted above zero
    steps = {int(T): s for T, s in u["step_seconds_by_prefix"].items()}
    L = min(steps)
    assert sorted(steps) == list(range(L, 3072 + 1, L))
    assert u["estimate_seconds_batch"] == pytest.approx(L * sum(steps.values()))
    assert u["prefix_seconds_predicted"] == pytest.approx(16 * steps[L]) and u["prefix_check"] > 0


def test_smoke_files(smoke):
    rc, out, js = smoke
    r = _strict(js)
    files = r["files"]
    assert Path(files["json"]) == js
    for key in ("report", "headline", "plot_mean_block", "plot_speedup", "plot_quality", "grid_tiny-random"):
        assert Path(files[key]).is_file() and Path(files[key]).parent == out, key
    for key in ("plot_mean_block", "plot_speedup", "plot_quality"):
        assert Image.open(files[key]).size[0] > 300
    grid = np.asarray(Image.open(files["grid_tiny-random"]))
    # the faces every row decoded (--decode-exact 1): 1 face x 6 columns
    assert 128 < grid.shape[0] < 2 * 128 and grid.shape[1] > 6 * 128
    report = Path(files["report"]).read_text()
    for text in ("Table 2", "1.07", "4.0x", "identical", "ST-LPIPS" if "ST" in r["settings"]["perceptual"]["label"]
                 else "LPIPS", "differ from the paper", r["command"]):
        assert text in report, text
    assert "mean_block_vs_k.png" in report and "grid_tiny-random.png" in report
    headline = Path(files["headline"]).read_text()
    assert r["command"] in headline
    # the paper's peak is set beside calls saved (its decoders both re-run the prefix), at its
    # own setting where the run has it (this one has no eps=2 row at k=6), and the most saved;
    # not beside our cached decoding over the uncached greedy
    best = max((x for x in r["records"] if x["method"] == "blockwise" and x["rule"] != "oracle"),
               key=lambda x: x["call_reduction"])
    assert r["summary"]["peak_call_reduction"]["speedup"] == best["call_reduction"]
    assert "no eps=2 row at k=6" in headline and f"the most calls saved: {best['call_reduction']:.2f}x" in headline
    assert "over greedy without a cache" not in headline + report
    # the one-table summary: an exact row that matched greedy on its decoded faces shows greedy's
    # quality; an eps row shows its own
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line for line in headline.splitlines()
            if line.startswith("| tiny-random |")}
    for x in r["records"]:
        if x["method"] == "blockwise":
            line = rows[(x["weights"], x["mode"], str(x["k"]))]
            if x["mode"] in ("exact", "exact-heads"):
                n = x["n_images_decoded"]
                assert f"= greedy | {round(x['identical_to_greedy'] * n)}/{n} |" in line
            else:
                assert "= greedy" not in line and f"| {x['psnr_vs_real']:.2f} |" in line


def _as_made_by(result: dict, name: str) -> dict:
    """A copy of an evaluate result whose weights rows are named `name`."""
    other = copy.deepcopy(result)
    for w in other["weights"]:
        w["name"] = name
    for x in other["records"]:
        if x["weights"]:
            x["weights"] = name
    return other


def test_merge_runs_of_different_weights(smoke, tmp_path, capsys):
    """A run per weights, merged: one table with every weights' rows and bicubic once, each run's
    command and machine listed; other faces, other settings, the same faces of a weights twice or
    an unfinished run are refused with the reason and nothing is written."""
    r = _strict(smoke[2])
    other = _as_made_by(r, "tiny-copy")  # the same run, as if a second weights had made it
    other["command"] = r["command"].replace("tiny-random", "tiny-copy")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(r))
    b.write_text(json.dumps(other))
    out = tmp_path / "merged"
    assert main(["evaluate", "--merge", str(a), str(b), "--out", str(out)]) == 0
    m = _strict(out / "results.json")
    assert m["complete"] is True and m["data"] == r["data"] and "--merge" in m["command"]
    assert [x["method"] for x in m["records"]].count("bicubic") == 1
    assert [x["method"] for x in m["records"]].count("nearest") == 1
    rows = [(x["weights"], x["mode"], x["k"]) for x in m["records"] if x["weights"]]
    assert rows == [(w, x["mode"], x["k"]) for w in ("tiny-random", "tiny-copy") for x in r["records"] if x["weights"]]
    assert [run["weights"] for run in m["runs"]] == [["tiny-random"], ["tiny-copy"]]
    assert [w["name"] for w in m["weights"]] == ["tiny-random", "tiny-copy"]
    assert len(m["summary"]["exact_identical_to_greedy"]) == 2 * len(r["summary"]["exact_identical_to_greedy"])
    headline = (out / "headline.md").read_text()
    assert r["command"] in headline and other["command"] in headline and m["command"] in headline
    assert "| tiny-copy | exact | 2 |" in headline and "| tiny-random | exact | 2 |" in headline
    assert "no images" in (out / "report.md").read_text() and (out / "speedup_vs_k.png").is_file()

    def refused(result, why):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(result))
        dest = tmp_path / "refused"
        assert main(["evaluate", "--merge", str(a), str(bad), "--out", str(dest)]) == 2
        assert why in capsys.readouterr().err and not dest.exists()

    refused(r, "overlap")
    cases = [(("data", "n_images"), 3, "different numbers of faces"), (("settings", "ks"), [2], "settings.ks"),
             (("data", "split_size"), 7, "data.split_size"), (("complete",), False, "did not finish"),
             (("schema_version",), 2, f"schema version {ev.SCHEMA_VERSION}")]  # schema 2: exact meant exact-heads
    for (*path, key), value, why in cases:
        x = copy.deepcopy(other)
        target = x
        for p in path:
            target = target[p]
        target[key] = value
        refused(x, why)
    assert main(["evaluate", "--merge", str(a), str(tmp_path / "nope.json"), "--out", str(out)]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_merge_pools_runs_over_adjacent_faces(tiny_weights, celeba_npz, tmp_path, capsys, one_uncached_rep):
    """Faces 0..1 in one run, and as face 0 + face 1 (--first) merged: the same rows, the same
    block histograms, calls, identity and quality (each face decodes alone, batch 1), pooled
    timings; a gap between parts is refused. (Exact-heads mode only, replayed: the pooling does not
    depend on the mode, and an eps=2 row cost 4 more decodes; quality pooling is checked on the
    greedy row.)"""
    def run(out, *more):
        threads = torch.get_num_threads()
        try:
            return main(["evaluate", "--weights", f"{tiny_weights}:frozen", "--data", str(celeba_npz),
                         "--k", "2", "--modes", "exact-heads", "--batch-size", "1", "--threads", "1",
                         "--uncached-prefix", "16", "--decode-exact", "1", "--out", str(tmp_path / out),
                         "--cache-dir", str(tmp_path / "store"), "--quiet", *more])
        finally:
            torch.set_num_threads(threads)

    assert run("whole", "-n", "2") == 0
    assert run("a", "-n", "1") == 0
    assert run("b", "--first", "1", "-n", "1") == 0
    b = _strict(tmp_path / "b" / "results.json")
    assert b["data"]["first"] == 1 and "--first 1" in b["command"]
    assert main(["evaluate", "--merge", str(tmp_path / "b" / "results.json"), str(tmp_path / "a" / "results.json"),
                 "--out", str(tmp_path / "merged")]) == 0
    whole, m = _strict(tmp_path / "whole" / "results.json"), _strict(tmp_path / "merged" / "results.json")
    assert m["data"]["n_images"] == 2 and m["data"]["first"] == 0
    assert m["data"]["first_images"] == whole["data"]["first_images"]
    assert [(r["first"], r["n_images"]) for r in m["runs"]] == [(1, 1), (0, 1)]
    assert [(x["mode"], x["k"]) for x in m["records"]] == [(x["mode"], x["k"]) for x in whole["records"]]
    for x, y in zip(m["records"], whole["records"]):
        assert list(x) == list(ev.RECORD_FIELDS)
        if x["method"] == "greedy-uncached":
            continue
        assert x["n_images"] == y["n_images"] and x["block_hist"] == y["block_hist"], x["mode"]
        fields = ["mean_block", "calls_per_image", "bits_per_dim"]
        if x["n_images_decoded"] == y["n_images_decoded"]:  # quality covers the decoded faces
            fields += ["psnr_vs_real", "ssim_vs_real", "perceptual_vs_real", "identical_to_greedy"]
        for f in fields:
            assert (x[f] is None) == (y[f] is None), (x["mode"], f)
            if y[f] is not None:
                assert x[f] == pytest.approx(y[f], rel=1e-4, abs=1e-6), (x["mode"], f)
        if x["mode"] == "exact-heads":  # decoded: face 0 in "whole", faces 0 and 1 in the parts
            assert (y["n_images_decoded"], x["n_images_decoded"]) == (1, 2)
            assert x["identical_to_greedy"] == 1.0 and x["replay_matches_decoded"] == 1.0
        if x["method"] == "blockwise":
            g = next(r for r in m["records"] if r["method"] == "greedy")
            assert x["speedup_vs_greedy"] == pytest.approx(g["seconds_per_image"] / x["seconds_per_image"])
    assert m["summary"]["exact_all_identical"] and m["summary"]["replay_all_match"]
    report = (tmp_path / "merged" / "report.md").read_text()
    assert "faces 1..1" in report
    # each part's own no-cache estimate (the merged row pools them)
    assert "tiny-random, faces 0..0: no-cache prefix" in report and "tiny-random, faces 1..1: no-cache prefix" in report
    b["data"]["first"] = 2  # face 2 after face 0: face 1 missing
    (tmp_path / "c.json").write_text(json.dumps(b))
    assert main(["evaluate", "--merge", str(tmp_path / "a" / "results.json"), str(tmp_path / "c.json"),
                 "--out", str(tmp_path / "gap")]) == 2
    assert "leave a gap" in capsys.readouterr().err and not (tmp_path / "gap").exists()


def test_resume_reads_back_whole_saved_groups(tiny_weights, celeba_npz, tmp_path, one_uncached_rep):
    """4 faces in batches of 2. A resumed run reads back every (batch, weights) group whose files
    are all there, with their timings, and decodes again, whole, a group with a torn file; a store
    opened without --resume reads nothing back."""
    args = ("--limit", "4", "--k", "2", "--decode-approx", "4", "--decode-exact", "2", "--perceptual", "none")
    store = tmp_path / "store"
    assert _smoke_run(tiny_weights, celeba_npz, tmp_path / "a", "--cache-dir", str(store), *args) == 0
    first = _strict(tmp_path / "a" / "results.json")
    files = sorted(store.glob("*.npz"), key=lambda f: f.stat().st_mtime_ns)
    # faces 0-1: greedy, exact, exact-heads and eps=2 at k=2; faces 2-3: greedy, eps=2 (exact
    # modes on the first 2 faces, exact-heads replayed over all 4)
    assert len(files) == 6 and first["settings"]["decode_store"]["batches_reused"] == 0

    def rows(r):
        return {(x["mode"], x["k"]): x for x in r["records"] if x["method"] in ("greedy", "blockwise")}

    # all there: everything read back, timings included
    assert _smoke_run(tiny_weights, celeba_npz, tmp_path / "b", "--cache-dir", str(store), "--resume", *args) == 0
    second = _strict(tmp_path / "b" / "results.json")
    assert second["settings"]["decode_store"]["batches_reused"] == 6
    for key, x in rows(first).items():
        y = rows(second)[key]
        for f in ("seconds_per_image", "mean_block", "block_hist", "calls_per_image", "identical_to_greedy",
                  "psnr_vs_real"):
            assert x[f] == y[f], (key, f)
    assert "--resume" in second["command"] and f"--cache-dir {store}" in second["command"]

    # the last file written belongs to faces 2-3: that group is decoded again, both of its batches
    torn = tmp_path / "torn"
    torn.mkdir()
    for f in files:
        (torn / f.name).write_bytes(f.read_bytes())
    (torn / files[-1].name).write_bytes(b"torn")
    assert _smoke_run(tiny_weights, celeba_npz, tmp_path / "c", "--cache-dir", str(torn), "--resume", *args) == 0
    third = _strict(tmp_path / "c" / "results.json")
    ds = third["settings"]["decode_store"]
    assert ds["batches_reused"] == 4 and sorted(ds["sittings"].values()) == [2, 4]
    for key, x in rows(first).items():
        assert x["block_hist"] == rows(third)[key]["block_hist"]
    assert "4 of 6 batches were read back" in (tmp_path / "c" / "report.md").read_text()

    # without --resume nothing is read back, though every file is there (evaluate passes its
    # --resume flag straight to the store; checked on the store, as a 4th full run cost a minute)
    keys = [f.stem for f in files]
    assert ev.DecodeStore(store, False, "d").load_group(keys) is None
    assert len(ev.DecodeStore(store, True, "d").load_group(keys)) == 6


def test_store_keys_tell_rows_apart(monkeypatch):
    """k=1 exact decodes with the same options as greedy, but is its own row: its own batch file.
    A batch decoded on AMX tiles is not one decoded with multiply-adds (their outputs differ)."""
    store = ev.DecodeStore(None, True, "test")
    lr = np.zeros((2, 8, 8, 3), np.uint8)
    opts = ev.Mode("exact").options(1)
    assert opts == ev.DecodeOptions(k=1)
    a = store.key("sha", "greedy", ev.DecodeOptions(k=1), "bf16", "cpu", lr)
    assert a != store.key("sha", "k=1 exact", opts, "bf16", "cpu", lr)
    assert a != store.key("sha", "greedy", ev.DecodeOptions(k=1), "bf16", "cpu", lr + 1)
    assert a != store.key("other", "greedy", ev.DecodeOptions(k=1), "bf16", "cpu", lr)
    assert a == store.key("sha", "greedy", ev.DecodeOptions(k=1), "bf16", "cpu", lr.copy())
    from sr_blockwise.decoding import engine
    tiles = engine.available() and engine.uses_amx()
    monkeypatch.setattr(engine, "available", lambda: True)
    monkeypatch.setattr(engine, "uses_amx", lambda: not tiles)
    assert a != store.key("sha", "greedy", ev.DecodeOptions(k=1), "bf16", "cpu", lr)


def test_prior_weight_run_is_exact_recorded_and_not_merged_with_others(smoke, tiny_weights, celeba_npz, tmp_path):
    """--prior-weight: every decode at that input guidance (exact mode still equals greedy, the
    replay still matches), recorded in the settings, command and report; greedy outputs differ
    from the unguided run's; a merge with a run at another weight is refused."""
    out = tmp_path / "w3"
    assert _smoke_run(tiny_weights, celeba_npz, out, "--prior-weight", "3") == 0
    r = _strict(out / "results.json")
    assert r["settings"]["prior_weight"] == 3.0 and "--prior-weight 3" in r["command"]
    assert r["summary"]["exact_all_identical"] and r["summary"]["replay_all_match"]
    assert "prior weight 3" in (out / "report.md").read_text()
    plain = _strict(smoke[2])
    greedy_of = lambda x: next(rec for rec in x["records"] if rec["method"] == "greedy")
    assert greedy_of(r)["psnr_vs_real"] != greedy_of(plain)["psnr_vs_real"]
    old = _as_made_by(plain, "tiny-old")
    del old["settings"]["prior_weight"]  # a result from before the setting: weight 1
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(r))
    b.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="prior_weight is 1.0, not 3.0"):
        ev.merge([str(a), str(b)], str(tmp_path / "merged"))
    # a result from before the setting merges with a new one at weight 1
    assert main(["evaluate", "--merge", str(smoke[2]), str(b), "--out", str(tmp_path / "m1")]) == 0


def test_the_paper_peak_is_set_beside_calls_saved_at_its_setting():
    """The paper's 4.0x (eps=2, k=6, mean block 5.3, neither decoder caching) is compared with
    our calls saved at that same setting, and the most any row saved is added where it differs."""
    from sr_blockwise.evaluate.report import paper_comparison
    row = {"method": "blockwise", "mode": "eps=2", "k": 6, "call_reduction": 2.84, "mean_block": 2.84, "weights": "w"}
    result = {"records": [row], "summary": {"peak_call_reduction": {"speedup": 3.83, "weights": "w",
                                                                     "mode": "eps-window=2", "k": 10}}}
    text = paper_comparison(result)
    assert "4.0x wall clock at k=6" in text and "mean block of 5.3" in text
    assert "Ours at that setting: 2.84x fewer calls than greedy (mean block 2.84, w)" in text
    assert "the most calls saved: 3.83x (w, eps-window=2, k=10)" in text
    result["summary"]["peak_call_reduction"].update(mode="eps=2", k=6, speedup=2.84)
    assert "the most calls saved" not in paper_comparison(result)
