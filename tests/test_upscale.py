"""The batch command `sr-blockwise upscale` end to end, with a random tiny model (no mocks).

Decoding is the slow part (a few seconds per batch on one core), so each test decodes at most
two batches; planning checks use --dry-run, which never loads the model."""
import csv
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import two_faces
from sr_blockwise import faces as F
from sr_blockwise import upscale
from sr_blockwise import cli
# the run's own modules, where a test replaces what the run calls or reads an internal
from sr_blockwise.batch import files as batch_files, plan as batch_plan, run as batch_run


def main(args) -> int:
    return cli.main(["upscale"] + list(args))


def save(path: Path, arr) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(arr, np.uint8)).save(path)
    return path


def photo(rng, h=50, w=40):
    """A smooth-ish photo-sized image (random noise blurred by upsampling)."""
    small = rng.integers(0, 256, (h // 10 + 1, w // 10 + 1, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))


def tiny8(rng):
    return rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)


def png_header(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels and holds none: refused by Pillow on its size alone."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)) + chunk(b"IEND", b"")


@pytest.fixture
def common(tiny_weights):
    # one thread: the machine is shared; exact k=4 is the mode users run
    return ["--weights", tiny_weights, "--threads", "1", "--mode", "exact", "--k", "4"]


@pytest.fixture
def fast(tiny_weights):
    # the random tiny model accepts ~4 tokens per call here (exact: ~1.1), with acceptance lengths
    # that differ between images: fast, and the images of a batch drift apart in position
    return ["--weights", tiny_weights, "--threads", "1", "--mode", "approx", "--k", "8", "--eps", "150"]


def leftovers(root: Path) -> list[Path]:
    """Temporary files the safe writer might have left behind."""
    return [p for p in root.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]


def dry_run(capsys, args) -> list[tuple[str, str, str]]:
    capsys.readouterr()
    assert main(args + ["--dry-run", "--quiet"]) == 0
    return [tuple(line.split("\t")) for line in capsys.readouterr().out.splitlines()]


# ---------------------------------------------------------------- a real tree with bad files

def test_tree_with_bad_files(tmp_path, common, capsys, rng):
    src, gt, out = tmp_path / "in", tmp_path / "gt", tmp_path / "out"
    face_a = photo(rng, 60, 50)
    save(src / "a.jpg", face_a)
    save(src / "nested" / "deeper" / "b.png", photo(rng, 40, 40))
    save(src / "nested" / "c.png", tiny8(rng))  # 8x8: used as is
    Image.new("RGB", (8000, 6000), (90, 60, 30)).save(src / "phone.jpg")  # 48 MP: read at reduced size
    save(gt / "a.png", face_a)  # ground truth for a: matched by stem, any extension
    bad = src / "bad"
    bad.mkdir()
    jpeg = (src / "a.jpg").read_bytes()
    (bad / "corrupt.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (bad / "empty.png").write_bytes(b"")
    (bad / "text.png").write_text("not an image at all\n")
    (bad / "huge.png").write_bytes(png_header(20000, 20000))  # 400 MP: over Pillow's decompression-bomb limit
    (src / "notes.txt").write_text("ignored: no image extension\n")

    rc = main([str(src), "-o", str(out), "--batch-size", "4", "--compare", "--metrics",
               str(tmp_path / "m.json"), "--ground-truth", str(gt)] + common)
    cap = capsys.readouterr()
    assert rc == 1
    for rel in ["a.png", "nested/deeper/b.png", "nested/c.png", "phone.png"]:  # the mirrored tree
        img = Image.open(out / rel)
        assert img.size == (32, 32) and img.mode == "RGB"
        assert (out / rel).with_name(Path(rel).stem + "_compare.png").is_file()
    assert not (out / "bad").exists() or not any((out / "bad").iterdir())
    for name in ["corrupt.jpg", "empty.png", "huge.png", "text.png"]:  # reported with path and reason
        assert str(bad / name) in cap.err and str(bad / name) in cap.out
    assert "notes.txt" not in cap.out + cap.err.replace("e.g. " + str(src / "notes.txt"), "")
    assert "done 4, skipped 0 (already there), failed 4" in cap.out
    assert leftovers(out) == [] and leftovers(tmp_path) == []

    m = json.loads((tmp_path / "m.json").read_text())
    rows = {Path(r["input"]).name: r for r in m["images"]}
    assert sorted(r["status"] for r in rows.values()) == ["done"] * 4 + ["failed"] * 4
    assert "empty" in rows["empty.png"]["reason"] and "too large" in rows["huge.png"]["reason"]
    a = rows["a.jpg"]
    assert a["mode"] == "exact" and a["k"] == 4 and a["calls"] > 0 and a["mean_block"] >= 1
    assert np.isfinite(a["psnr"]) and -1 <= a["ssim"] <= 1 and "psnr_bicubic" in a
    assert "psnr" not in rows["c.png"]  # no ground truth for it
    # the compare strip with ground truth: 4 panels of 32 + 3 gaps, 4x enlarged
    assert Image.open(out / "a_compare.png").size == (4 * (4 * 32 + 3), 4 * 32)


# ---------------------------------------------------------------- interruption, resume, shards

def test_interrupt_then_skip_existing(tmp_path, fast, capsys, monkeypatch, rng):
    src, out, met = tmp_path / "in", tmp_path / "out", tmp_path / "m.csv"
    for name in ["x1.png", "x2.png", "x3.png"]:
        save(src / name, tiny8(rng))
    # the handler in place before the run: Python's default, or SIG_IGN when pytest was started
    # in the background by a non-interactive shell (then SIGINT is ignored from the start)
    handler_before = signal.getsignal(signal.SIGINT)
    # a Ctrl-C arrives during the first batch: that batch is finished, then the run stops
    monkeypatch.setattr(batch_run, "after_batch", lambda s: signal.raise_signal(signal.SIGINT))
    args = [str(src), "-o", str(out), "--metrics", str(met)] + fast
    assert main(args + ["--batch-size", "1"]) == 130
    assert "interrupted" in capsys.readouterr().out
    first = sorted(p.name for p in out.iterdir())
    assert first == ["x1.png"] and leftovers(tmp_path) == []
    stamp = (out / "x1.png").stat().st_mtime_ns
    assert signal.getsignal(signal.SIGINT) is handler_before  # handler restored

    monkeypatch.setattr(batch_run, "after_batch", lambda s: None)
    assert [r[0] for r in dry_run(capsys, args + ["--skip-existing"])] == ["skip", "todo", "todo"]
    assert main(args + ["--skip-existing", "--batch-size", "2"]) == 0
    assert "done 2, skipped 1" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["x1.png", "x2.png", "x3.png"]
    assert (out / "x1.png").stat().st_mtime_ns == stamp  # not redone
    with open(met, newline="") as f:
        rows = list(csv.DictReader(f))
    # the resumed metrics keep the first run's row for x1: complete statistics for all three
    assert [(Path(r["input"]).name, r["status"]) for r in rows] == [
        ("x1.png", "done"), ("x2.png", "done"), ("x3.png", "done")]
    assert all(int(r["calls"]) > 0 for r in rows)


def test_a_stop_finishes_the_photo_begun_and_its_faces_are_written_together(tmp_path, fast, capsys, monkeypatch, rng):
    """--faces all writes a photo's faces together, face 0 last (--skip-existing takes a photo
    whose face 0 is there for done). A Ctrl-C during a batch that decoded one of a photo's two
    faces finishes that photo, then stops before the next file."""
    src, out, met = tmp_path / "in", tmp_path / "out", tmp_path / "m.csv"
    src.mkdir()
    two_faces().save(src / "pair.png")
    save(src / "z.png", tiny8(rng))
    monkeypatch.setattr(batch_run, "after_batch", lambda s: signal.raise_signal(signal.SIGINT))
    args = [str(src), "-o", str(out), "--faces", "all", "--metrics", str(met), "--batch-size", "1"] + fast
    assert main(args) == 130
    assert "done 1, skipped 0 (already there), failed 0, not processed 1" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["pair_face0.png", "pair_face1.png"]
    assert leftovers(tmp_path) == []
    monkeypatch.setattr(batch_run, "after_batch", lambda s: None)
    assert main(args + ["--skip-existing"]) == 0
    assert "done 1, skipped 1" in capsys.readouterr().out
    # a gap among a photo's face files: the rows of every face file there are kept on resume
    (out / "pair_face1.png").rename(out / "pair_face2.png")
    assert main(args + ["--skip-existing"]) == 0
    capsys.readouterr()
    with open(met, newline="") as f:
        assert sorted(Path(r["output"]).name for r in csv.DictReader(f)) == [
            "pair_face0.png", "pair_face2.png", "z_face0.png"]


def test_a_photo_whose_writing_fails_leaves_none_of_its_files(tmp_path, fast, capsys, monkeypatch):
    """The disk fills up after a photo's second face is written (injected, at face 0): the photo
    is reported failed and its files written before are taken back, so no face file stands for
    a photo no metrics row describes; the run resumed is complete."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    two_faces().save(src / "pair.png")
    real_save = upscale.save_atomic

    def fills_up(img, path, ext):
        if "_face0" in path.name:
            raise OSError(28, "No space left on device")
        real_save(img, path, ext)
    monkeypatch.setattr(batch_run, "save_atomic", fills_up)
    args = [str(src), "-o", str(out), "--faces", "all", "--paste-back"] + fast
    assert main(args) == 1
    assert "writing failed: OSError" in capsys.readouterr().out
    assert (not out.exists() or list(out.iterdir()) == []) and leftovers(tmp_path) == []
    monkeypatch.setattr(batch_run, "save_atomic", real_save)
    assert main(args + ["--skip-existing"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["pair_face0.png", "pair_face1.png", "pair_pasted.png"]
    # a run over those results that fails the same way takes the earlier face 0 back too: left
    # there, it would make --skip-existing take the photo for done with its other faces gone
    monkeypatch.setattr(batch_run, "save_atomic", fills_up)
    assert main(args) == 1
    assert list(out.iterdir()) == []
    # but a run that wrote nothing of the photo (its first write failed) leaves earlier files
    monkeypatch.setattr(batch_run, "save_atomic", real_save)
    assert main(args) == 0
    monkeypatch.setattr(batch_run, "save_atomic", lambda img, path, ext: (_ for _ in ()).throw(OSError(28, "full")))
    assert main(args) == 1
    assert sorted(p.name for p in out.iterdir()) == ["pair_face0.png", "pair_face1.png", "pair_pasted.png"]


def test_a_photo_whose_batch_fails_is_not_decoded_further(tmp_path, fast, capsys, monkeypatch, rng):
    """Decoding fails for the batch holding a photo's first face (batch size 1): the photo is
    reported failed, its second face is not decoded only to be dropped, and the next file is done."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    two_faces().save(src / "a_pair.png")
    save(src / "b.png", tiny8(rng))
    decoded = []
    real = upscale.decode_batch

    def fails_first(up, lrs, jobs, *a, **kw):
        decoded.append(jobs[0].src.name)
        if len(decoded) == 1:
            raise RuntimeError("out of memory (simulated)")
        return real(up, lrs, jobs, *a, **kw)
    monkeypatch.setattr(batch_run, "decode_batch", fails_first)
    assert main([str(src), "-o", str(out), "--faces", "all", "--batch-size", "1"] + fast) == 1
    assert "decoding failed: RuntimeError" in capsys.readouterr().out
    assert decoded == ["a_pair.png", "b.png"]
    assert sorted(p.name for p in out.iterdir()) == ["b_face0.png"]


def test_decoding_on_the_pytorch_engine_is_said_with_the_reason(tmp_path, fast, capsys, monkeypatch, rng):
    from sr_blockwise.decoding import engine

    def refused():
        raise RuntimeError("building the native engine failed:\nengine.cpp:38:43: error: no AVX-512 here")
    monkeypatch.setattr(engine, "library", refused)
    save(tmp_path / "in" / "a.png", tiny8(rng))
    assert main([str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--quiet"] + fast) == 0
    assert ("warning: decoding on the PyTorch engine, many times slower than the native one: building the "
            "native engine failed: engine.cpp:38:43: error: no AVX-512 here") in capsys.readouterr().err


def test_taking_back_a_failed_photo_never_removes_an_input(tmp_path, fast, capsys, monkeypatch, rng):
    """The last check before a write finds an input where an output would go (an input the
    planning did not see as such, injected here): the photo fails, and the file stays."""
    src, out = tmp_path / "in", tmp_path / "out"
    save(src / "x.png", tiny8(rng))
    save(out / "x.png", tiny8(rng))
    before = (out / "x.png").read_bytes()
    real_plan = upscale.plan

    def plan_with_input_at_output(cfg):
        jobs, ignored, info = real_plan(cfg)
        info["protected"] = info["protected"] | {batch_files._resolve(out / "x.png")}
        return jobs, ignored, info
    monkeypatch.setattr(batch_run, "plan", plan_with_input_at_output)
    assert main([str(src), "-o", str(out)] + fast) == 1
    assert "is an input file: not overwritten" in capsys.readouterr().out
    assert (out / "x.png").read_bytes() == before


def test_a_crashed_runs_metrics_say_it_did_not_finish(tmp_path, fast, monkeypatch, rng):
    """A run that breaks off with an error (out of memory, a bug) still writes the rows it has,
    and its JSON summary says the run did not finish."""
    src = tmp_path / "in"
    for name in ["x1.png", "x2.png"]:
        save(src / name, tiny8(rng))

    def crash(s):
        raise RuntimeError("out of memory (injected)")
    monkeypatch.setattr(batch_run, "after_batch", crash)
    with pytest.raises(RuntimeError, match="injected"):
        main([str(src), "-o", str(tmp_path / "out"), "--metrics", str(tmp_path / "m.json"), "--batch-size", "1"] + fast)
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["summary"]["finished"] is False and [r["status"] for r in doc["images"]] == ["done"]


def test_a_metrics_file_that_cannot_be_written_loses_no_output(tmp_path, fast, capsys, monkeypatch, rng):
    """The disk fills up under the metrics file (injected): every image is still written, the
    periodic write warns once and the run goes on, and the summary and exit code 1 say so."""
    src, out = tmp_path / "in", tmp_path / "out"
    for name in ["x1.png", "x2.png"]:
        save(src / name, tiny8(rng))

    def full(self, summary, finished=True):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(upscale.Metrics, "write", full)
    # the periodic write after every batch, not every minute
    monkeypatch.setattr(upscale.Metrics, "maybe_write",
                        functools.partialmethod(upscale.Metrics.maybe_write, every=-1.0))
    args = [str(src), "-o", str(out), "--metrics", str(tmp_path / "m.csv"), "--batch-size", "1"] + fast
    assert main(args) == 1
    cap = capsys.readouterr()
    assert cap.err.count("warning: metrics file") == 1
    assert "metrics NOT written" in cap.out and "No space left on device" in cap.out
    assert sorted(p.name for p in out.iterdir()) == ["x1.png", "x2.png"]


def test_the_first_line_says_what_the_run_leaves_out(tmp_path, capsys, rng):
    """The count of inputs, an OUTDIR inside an input folder (not searched) and inputs without a
    ground truth are said before any work."""
    src, gt = tmp_path / "in", tmp_path / "gt"
    save(src / "a.png", tiny8(rng))
    save(gt / "other.png", tiny8(rng))
    (src / "notes.txt").write_text("not an image")
    capsys.readouterr()
    assert main([str(src), "-o", str(src / "res"), "--ground-truth", str(gt), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"1 image under {src}" in err and f"OUTDIR {src / 'res'}, inside an input folder, is not searched" in err
    assert f"ignored 1 file without an image extension (e.g. {src / 'notes.txt'})" in err
    assert "no ground truth in" in err and "for 1 of 1 inputs" in err


def test_a_stop_that_leaves_nothing_undone_is_not_an_interrupted_run(tmp_path):
    s = upscale.Summary(total=2, done=2, interrupted=True, blocks=[1.0, 1.0], calls=[3072, 3072])
    assert s.exit_code == 0 and not any("not processed" in line for line in s.lines("greedy"))
    upscale.Metrics(str(tmp_path / "m.json"), {}, False).write(s)  # the metrics agree
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["interrupted"] is False
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["finished"] is True
    # a write made while the run goes on says so: a file left by a killed run is no finished run's
    upscale.Metrics(str(tmp_path / "m.json"), {}, False).maybe_write(s, every=-1.0)
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["finished"] is False
    assert "3072 model calls per image" in s.lines("greedy")[-1] and "fewer than greedy" not in s.lines("greedy")[-1]
    assert upscale.Summary(total=3, done=2, interrupted=True).exit_code == 130


def test_shards_cover_each_input_once(tmp_path, capsys, monkeypatch, rng):
    src = tmp_path / "in"
    for i in range(30):
        save(src / f"d{i % 3}" / f"img{i}.png", tiny8(rng))
    args = [str(src), "-o", str(tmp_path / "out")]
    everything = dry_run(capsys, args)
    parts = [dry_run(capsys, args + ["--shard", f"{i}/2"]) for i in range(2)]
    assert len(everything) == 30 and all(parts)
    assert sorted(parts[0] + parts[1]) == sorted(everything)
    assert not set(parts[0]) & set(parts[1])
    # a shard's share depends on the file alone: adding files never moves the others
    save(src / "d0" / "new.png", tiny8(rng))
    grown = dry_run(capsys, args + ["--shard", "0/2"])
    assert set(parts[0]) <= set(grown)
    # torchrun sets RANK / WORLD_SIZE: --shard auto uses them
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert set(dry_run(capsys, args + ["--shard", "auto"])) == set(
        dry_run(capsys, args + ["--shard", "1/2"]))


def test_planning_rules(tmp_path, capsys, rng):
    a, b = tmp_path / "a", tmp_path / "b"
    save(a / "face.jpg", photo(rng))
    save(a / "face.png", photo(rng))  # same stem: the two outputs must not collide
    save(b / "sub" / "face.png", tiny8(rng))
    out = tmp_path / "out"
    rows = dry_run(capsys, [str(a), str(b), "-o", str(out), "--suffix", "_sr", "--ext", "webp"])
    assert sorted(Path(o).relative_to(out).as_posix() for _, _, o in rows) == [
        "a/face_jpg_sr.webp", "a/face_png_sr.webp", "b/sub/face_sr.webp"]
    # an OUTDIR inside the input folder is not scanned as input
    save(a / "res" / "old.png", tiny8(rng))
    assert len(dry_run(capsys, [str(a), "-o", str(a / "res")])) == 2
    # glob patterns mirror the tree below their first wildcard
    rows = dry_run(capsys, [str(tmp_path / "b" / "**" / "*.png"), "-o", str(out)])
    assert [Path(o).relative_to(out).as_posix() for _, _, o in rows] == ["sub/face.png"]


def test_the_suffix_ends_the_name_before_compare_and_pasted(tmp_path, fast, rng):
    save(tmp_path / "in" / "x.png", tiny8(rng))
    out = tmp_path / "out"
    assert main([str(tmp_path / "in"), "-o", str(out), "--suffix", "_x4", "--compare", "--paste-back"] + fast) == 0
    assert sorted(p.name for p in out.iterdir()) == ["x_x4.png", "x_x4_compare.png", "x_x4_pasted.png"]


@pytest.mark.parametrize("extra, message", [
    (lambda t: [str(t / "a"), "-o", str(t / "a")], "is the input folder"),
    (lambda t: [str(t / "a" / "x.png"), "-o", str(t / "a")], "would overwrite"),
    (lambda t: [str(t / "nope"), "-o", str(t / "out")], "no such file"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--shard", "2/2"], "0 <= I < N"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--metrics", str(t / "m.txt")], ".csv or .json"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--weights", str(t / "missing.json")], "no weights"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--k", "99"], "k must be in"),
    # found before the decoding, not when the first output or the metrics are written
    (lambda t: [str(t / "a"), "-o", str(t / "a" / "x.png" / "out")], "OUTDIR"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--metrics", str(t / "a" / "x.png" / "m.csv")],
     "--metrics folder"),
    (lambda t: (t.joinpath("m.csv").mkdir(), [str(t / "a"), "-o", str(t / "out"), "--metrics", str(t / "m.csv")])[1],
     "is a folder"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--threads", "-1"], "--threads must be >= 0"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--mode", "greedy", "--k", "4"], "greedy decoding takes one"),
    # a result beside the inputs would replace another photo there (x.png -> a/x_up.png, the user's)
    (lambda t: (save(t / "a" / "x_up.png", tiny8(np.random.default_rng(1))),
                [str(t / "a" / "x.png"), "-o", str(t / "a"), "--suffix", "_up"])[1], "exists beside the inputs"),
    (lambda t: [str(t / "a" / "*.png"), "-o", str(t / "a")], "is the folder of the pattern"),
    # --skip-existing leaves that file only where it leaves the job: with --compare the job runs
    (lambda t: (save(t / "a" / "x_up.png", tiny8(np.random.default_rng(1))),
                [str(t / "a" / "x.png"), "-o", str(t / "a"), "--suffix", "_up", "--skip-existing", "--compare"])[1],
     "exists beside the inputs"),
    # a flag the mode would not read is refused, not dropped
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--eps", "5"], "only --mode approx"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--mode", "approx", "--temperature", "0.5"], "only --mode sample"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--seed", "3"], "--seed 3: only --mode sample"),
    # values out of range, in the flags' own words
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--k", "0"], "--k 0: the block size must be >= 1"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--k", "99"], "--k 99: these weights have 10 blockwise heads"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--mode", "approx", "--eps", "-1"], "--eps -1: the tolerance"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--mode", "sample", "--temperature", "inf"],
     "--temperature inf: must be a finite number above 0"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--mode", "sample", "--seed", "-1"], "--seed -1: must be a whole"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--prior-weight", "-1"], "--prior-weight -1: the input guidance"),
    (lambda t: [str(t / "a"), "-o", str(t / "out"), "--weights", "no-such-weights"], "no weights named"),
])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])  # a dry run refuses the same
def test_bad_arguments_exit_2(tmp_path, tiny_weights, capsys, monkeypatch, rng, extra, message, dry_run):
    monkeypatch.setattr(batch_run, "decode_batch", lambda *a, **k: pytest.fail("decoded before refusing"))
    save(tmp_path / "a" / "x.png", tiny8(rng))
    args = extra(tmp_path) + (["--dry-run"] if dry_run else [])
    assert main(args + ([] if "--weights" in args else ["--weights", tiny_weights])) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_device_is_checked_by_the_run_not_the_dry_run(tmp_path, tiny_weights, capsys, rng):
    """A dry run may plan the work of another machine (e.g. the shards of a GPU cluster)."""
    save(tmp_path / "a" / "x.png", tiny8(rng))
    args = [str(tmp_path / "a"), "-o", str(tmp_path / "out"), "--device", "nodevice", "--weights", tiny_weights]
    assert main(args) == 2 and "device 'nodevice'" in capsys.readouterr().err
    assert main(args + ["--dry-run"]) == 0 and "todo" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_a_result_may_go_beside_its_photo(tmp_path, fast, capsys, rng):
    """Writing results into the inputs' own folder is fine where no file there has a result's
    name, and a run again replaces its own earlier result (every result carries the tool's mark);
    the refusal is for replacing a file of the user's (the test above)."""
    a = tmp_path / "a"
    save(a / "x.png", tiny8(rng))
    save(a / "y.png", tiny8(rng))
    rows = dry_run(capsys, [str(a / "x.png"), "-o", str(a), "--suffix", "_up"])
    assert [Path(o).name for _, _, o in rows] == ["x_up.png"]
    for _ in range(2):
        assert main([str(a / "x.png"), "-o", str(a), "--suffix", "_up", "--quiet"] + fast) == 0
    assert upscale.made_here(a / "x_up.png") and not upscale.made_here(a / "y.png")
    assert sorted(p.name for p in a.iterdir()) == ["x.png", "x_up.png", "y.png"]


def test_exit_codes_in_a_real_process(tmp_path, tiny_weights):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "zero.jpg").write_bytes(b"")
    (bad / "text.png").write_text("hello")
    cmd = [sys.executable, "-m", "sr_blockwise", "upscale", "--weights", tiny_weights, "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run(cmd + [str(bad), "-o", str(tmp_path / "out")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert str(bad / "zero.jpg") in r.stderr and str(bad / "text.png") in r.stderr
    r = subprocess.run(cmd + [str(bad), "-o", str(tmp_path / "out"), "--batch-size", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "batch-size" in r.stderr


# ---------------------------------------------------------------- batch invariance

def test_same_output_alone_or_in_a_batch_of_32(tmp_path, fast, rng):
    src = tmp_path / "in"
    for i in range(32):  # a mix of 8x8 inputs and photos
        save(src / f"f{i:02d}.png", tiny8(rng) if i % 2 else photo(rng))
    assert main([str(src), "-o", str(tmp_path / "batch"), "--batch-size", "32", "--quiet"] + fast) == 0
    names = ["f07.png", "f20.png"]
    assert main([str(src / n) for n in names] + ["-o", str(tmp_path / "alone"), "--batch-size", "1",
                                                 "--quiet"] + fast) == 0
    for n in names:
        alone = np.asarray(Image.open(tmp_path / "alone" / n))
        assert (alone == np.asarray(Image.open(tmp_path / "batch" / n))).all(), n


def test_match_input_back_projects_each_output_onto_its_input(tmp_path, fast, rng, capsys):
    """--match-input (the default): the saved face is data.match_input of the decoder's own output
    (--no-match-input), so its 4x4 means are the 8x8 input again; the metrics say which it was."""
    from sr_blockwise.data import downsample_8, match_input
    src = tmp_path / "in"
    inputs = {f"f{i}.png": tiny8(rng) for i in range(3)}
    for name, lr in inputs.items():
        save(src / name, lr)
    assert main([str(src), "-o", str(tmp_path / "plain"), "--no-match-input", "--quiet",
                 "--metrics", str(tmp_path / "p.json")] + fast) == 0
    assert main([str(src), "-o", str(tmp_path / "matched"), "--quiet",
                 "--metrics", str(tmp_path / "m.json")] + fast) == 0
    for name, lr in inputs.items():
        plain = np.asarray(Image.open(tmp_path / "plain" / name))
        matched = np.asarray(Image.open(tmp_path / "matched" / name))
        np.testing.assert_array_equal(matched, match_input(plain, lr))
        assert np.abs(downsample_8(matched).astype(int) - lr).max() <= 1
        assert np.abs(downsample_8(plain).astype(int) - lr).max() > 1  # a random model does not match it
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["settings"]["match_input"] is True and all(r["match_input"] is True for r in doc["images"])
    assert json.loads((tmp_path / "p.json").read_text())["settings"]["match_input"] is False
    # resuming the unmatched run with matching on keeps its outputs, and warns that they differ in kind
    capsys.readouterr()
    assert main([str(src), "-o", str(tmp_path / "plain"), "--skip-existing", "--metrics", str(tmp_path / "p.json")]
                + fast) == 0
    assert "3 outputs kept by --skip-existing were saved without --match-input" in capsys.readouterr().err


def test_prior_weight_is_applied_recorded_and_checked_on_resume(tmp_path, fast, rng, capsys):
    """--prior-weight reaches the decoder (other outputs than weight 1), the metrics record it
    (the default when not given), and a resumed run with another weight warns."""
    from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT
    src = tmp_path / "in"
    for i in range(2):
        save(src / f"f{i}.png", tiny8(rng))
    runs = {"w1": ["--prior-weight", "1"], "w4": ["--prior-weight", "4"], "default": []}
    for name, extra in runs.items():
        assert main([str(src), "-o", str(tmp_path / name), "--no-match-input", "--quiet",
                     "--metrics", str(tmp_path / f"{name}.json")] + fast + extra) == 0
    out = {name: [np.asarray(Image.open(tmp_path / name / f"f{i}.png")) for i in range(2)] for name in runs}
    assert all(not np.array_equal(a, b) for a, b in zip(out["w1"], out["w4"]))
    for name, w in (("w1", 1.0), ("w4", 4.0), ("default", DEFAULT_PRIOR_WEIGHT)):
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert doc["settings"]["prior_weight"] == w and all(r["prior_weight"] == w for r in doc["images"])
    capsys.readouterr()
    assert main([str(src), "-o", str(tmp_path / "w4"), "--no-match-input", "--skip-existing",
                 "--metrics", str(tmp_path / "w4.json")] + fast + ["--prior-weight", "1"]) == 0
    assert "2 outputs kept by --skip-existing were decoded with another --prior-weight" in capsys.readouterr().err


def test_guard_is_applied_recorded_and_checked_on_resume(tmp_path, fast, rng, capsys):
    """--guard reaches the decoder (a tight guard gives other outputs than none), the metrics
    record it (DEFAULT_GUARD when not given), a resumed run with another guard warns, and a
    negative one is refused in the flag's words."""
    from sr_blockwise.decoding import DEFAULT_GUARD
    src = tmp_path / "in"
    for i in range(2):
        save(src / f"f{i}.png", tiny8(rng))
    runs = {"off": ["--guard", "0"], "tight": ["--guard", "4"], "default": []}
    for name, extra in runs.items():
        assert main([str(src), "-o", str(tmp_path / name), "--no-match-input", "--quiet",
                     "--metrics", str(tmp_path / f"{name}.json")] + fast + extra) == 0
    out = {name: [np.asarray(Image.open(tmp_path / name / f"f{i}.png")) for i in range(2)] for name in runs}
    assert all(not np.array_equal(a, b) for a, b in zip(out["off"], out["tight"]))
    for name, g in (("off", 0.0), ("tight", 4.0), ("default", DEFAULT_GUARD)):
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert doc["settings"]["guard"] == g and all(r["guard"] == g for r in doc["images"])
    capsys.readouterr()
    assert main([str(src), "-o", str(tmp_path / "tight"), "--no-match-input", "--skip-existing",
                 "--metrics", str(tmp_path / "tight.json")] + fast + ["--guard", "0"]) == 0
    assert "2 outputs kept by --skip-existing were decoded with another --guard" in capsys.readouterr().err
    assert main([str(src), "-o", str(tmp_path / "x"), "--guard", "-1"] + fast) == 2
    assert "--guard -1: must be a number of intensity levels >= 0" in capsys.readouterr().err
    # --measure-greedy decodes greedy with the same guard: exact mode's outputs are identical to it
    exact = ["--weights", fast[1], "--threads", "1", "--mode", "exact", "--k", "4"]
    assert main([str(src), "-o", str(tmp_path / "exact"), "--measure-greedy", "--guard", "4", "--quiet",
                 "--metrics", str(tmp_path / "exact.json")] + exact) == 0
    assert json.loads((tmp_path / "exact.json").read_text())["summary"]["greedy_check"]["identical"] is True


def test_default_guidance_follows_the_weights(tmp_path, tiny_weights, rng):
    """Weights without the learned input prior decode at guidance 1 by default;
    weights with it at DEFAULT_PRIOR_WEIGHT; an explicit weight they cannot take is refused."""
    from conftest import make_tiny
    from sr_blockwise.checkpoints import save_weights
    from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT
    no_prior = str(save_weights(make_tiny(1, lr_prior=False), tmp_path / "no-prior", {}))
    save(tmp_path / "in" / "a.png", tiny8(rng))
    flags = ["--threads", "1", "--mode", "approx", "--k", "8", "--eps", "150", "--quiet"]
    for weights, expected in ((no_prior, 1.0), (tiny_weights, DEFAULT_PRIOR_WEIGHT)):
        met = tmp_path / f"{Path(weights).stem}.json"
        assert main([str(tmp_path / "in"), "-o", str(tmp_path / Path(weights).stem), "--weights", weights,
                     "--metrics", str(met)] + flags) == 0
        assert json.loads(met.read_text())["settings"]["prior_weight"] == expected
    assert main([str(tmp_path / "in"), "-o", str(tmp_path / "x"), "--weights", no_prior,
                 "--prior-weight", "2"] + flags) == 2


# ---------------------------------------------------------------- odd file names, links, signals

def test_file_names_need_not_be_utf8(tmp_path, fast, capsys, rng):
    """A name that is not valid UTF-8 is an input like any other: same bytes out, in the metrics."""
    src, out = tmp_path / "in", tmp_path / "out"
    odd = os.fsdecode(b"caf\xe9.png")  # Latin-1, as old cameras and zip files write names
    save(src / odd, tiny8(rng))
    save(src / "ok.png", tiny8(rng))
    # printed with the odd byte escaped, as stderr shows it
    assert [o for _, _, o in dry_run(capsys, [str(src), "-o", str(out)])] == [
        str(out / "caf\\xe9.png"), str(out / "ok.png")]
    assert main([str(src), "-o", str(out), "--quiet", "--metrics", str(tmp_path / "m.csv")] + fast) == 0
    assert sorted(os.listdir(os.fsencode(out))) == [b"caf\xe9.png", b"ok.png"]
    with open(tmp_path / "m.csv", newline="", encoding="utf-8", errors="surrogateescape") as f:
        assert sorted(r["relative"] for r in csv.DictReader(f)) == [odd, "ok.png"]
    # the JSON writer too, and a resumed run reads the CSV back
    assert main([str(src), "-o", str(out), "--quiet", "--skip-existing", "--metrics", str(tmp_path / "m.json")]
                + fast) == 0
    assert sorted(r["input"] for r in json.loads((tmp_path / "m.json").read_text())["images"]) == [
        str(src / odd), str(src / "ok.png")]


def test_control_characters_in_names_are_escaped_in_messages(tmp_path, fast, capsys, rng):
    """A newline in a name does not split a message line, an escape sequence does not reach the
    terminal; the file is still an input like any other, and its output keeps its name."""
    src, out = tmp_path / "in", tmp_path / "out"
    save(src / "new\nline.png", tiny8(rng))
    (src / "bad\x1b[31m.png").write_text("not an image")
    assert main([str(src), "-o", str(out), "--metrics", str(tmp_path / "m.csv")] + fast) == 1
    said = capsys.readouterr()
    assert "\x1b" not in said.err + said.out and "\\x1b[31m.png" in said.err
    failed = [line for line in said.out.splitlines() if "bad" in line]
    assert failed and all("\\x1b[31m.png" in line for line in failed)
    assert (out / "new\nline.png").is_file()
    # the other messages too: the first line's ignored files, a refusal naming a path
    (src / "note\x1b[31m.txt").write_text("x")
    assert main([str(src), "-o", str(tmp_path / "out2"), "--dry-run"]) == 0
    assert "note\\x1b[31m.txt" in capsys.readouterr().err
    assert main([str(tmp_path / "no\nsuch"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no\\nsuch" in err and len(err.strip().splitlines()) == 1
    # and the metrics file's name in the summary
    assert main([str(src / "new\nline.png"), "-o", str(tmp_path / "out3"), "--metrics", str(tmp_path / "m\x1b.csv")] + fast) == 0
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err and "m\\x1b.csv" in said.out


def test_shards_and_seeds_of_utf8_names_did_not_move():
    """os.fsencode gives valid UTF-8 names the bytes str.encode gave: shards and samples stay."""
    from pathlib import PurePosixPath as P
    for rel, shard7, shard_big, seed0, seed5 in [
            ("a.png", 1, 856020, 4218228204646650, 1016058890167526),
            ("d0/img1.png", 2, 759097, 1039320910953379, 2171947279822292),
            ("caf\u00e9/\u9854.jpg", 4, 475648, 1055971380904639, 1248961843874291)]:
        assert (upscale.shard_of(P(rel), 7), upscale.shard_of(P(rel), 1000003)) == (shard7, shard_big)
        assert (upscale.job_seed(0, P(rel)), upscale.job_seed(5, P(rel))) == (seed0, seed5)


def test_symlink_loop_is_reported_and_skipped(tmp_path, fast, capsys, rng):
    src = tmp_path / "in"
    save(src / "ok.png", tiny8(rng))
    (src / "self.png").symlink_to("self.png")
    assert main([str(src), "-o", str(tmp_path / "out"), "--quiet"] + fast) == 1
    err = capsys.readouterr().err
    assert str(src / "self.png") in err and "symbolic links" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ok.png"]


def test_globs_match_as_glob_does_but_double_star_follows_no_folder_symlink(tmp_path, capsys, rng, monkeypatch):
    """Python's ** follows folder symlinks, loops included: a loop lists every file below it
    dozens of times over. The command's ** does not (as its folder scans do not); one wildcard
    still matches through a linked folder, and on a tree without links every pattern matches
    what glob.glob matches."""
    import glob as globlib
    monkeypatch.chdir(tmp_path)
    for f in ["in/a.png", "in/sub/b.png", "in/sub/deep/c.png", "in/.hid/d.png", "in/sub/.e.png", "other/f.png"]:
        save(Path(f), tiny8(rng))
    patterns = ["in/**/*.png", "in/**", "in/**/", "**/*.png", "in/*/", "in/**.png", "in/*/*.png",
                "in/**/deep/*.png", "*/**/c.png", "in/sub/.*.png", str(tmp_path / "in" / "**" / "*.png")]
    for p in patterns:
        assert batch_plan._glob(p) == sorted(Path(m) for m in globlib.glob(p, recursive=True)), p
    (tmp_path / "in" / "sub" / "up").symlink_to("..")  # a loop
    (tmp_path / "in" / "link").symlink_to("../other")
    out = tmp_path / "out"
    by_folder = [i for _, i, _ in dry_run(capsys, ["in", "-o", str(out)])]  # hidden files too
    by_glob = [i for _, i, _ in dry_run(capsys, ["in/**/*.png", "-o", str(out)])]
    assert by_glob == [i for i in by_folder if "/." not in i] == ["in/a.png", "in/sub/b.png", "in/sub/deep/c.png"]
    assert [i for _, i, _ in dry_run(capsys, ["in/*/*.png", "-o", str(out)])] == ["in/link/f.png", "in/sub/b.png"]


def test_each_file_symlink_gets_its_own_output(tmp_path, capsys, rng):
    """alias.png -> real.png are two input names: two outputs, not one chosen by sort order."""
    src, out = tmp_path / "in", tmp_path / "out"
    save(src / "z_real.png", tiny8(rng))
    (src / "a_alias.png").symlink_to("z_real.png")
    rows = dry_run(capsys, [str(src), "-o", str(out)])
    assert [(i, o) for _, i, o in rows] == [(str(src / "a_alias.png"), str(out / "a_alias.png")),
                                           (str(src / "z_real.png"), str(out / "z_real.png"))]
    # one path reached twice (its folder and itself) is still decoded once
    assert len(dry_run(capsys, [str(src), str(src / "z_real.png"), "-o", str(out)])) == 2


def test_longest_legal_names_are_written(tmp_path, fast, rng):
    """The temporary file's name is short: a 255-byte output name still works, atomically."""
    src, out = tmp_path / "in", tmp_path / "out"
    name = "f" * 251 + ".png"  # 255 bytes, the usual limit
    save(src / name, tiny8(rng))
    assert main([str(src), "-o", str(out), "--quiet", "--metrics", str(tmp_path / ("m" * 250 + ".csv"))]
                + fast) == 0
    assert (out / name).is_file() and (tmp_path / ("m" * 250 + ".csv")).is_file()
    assert leftovers(tmp_path) == []


def test_a_killed_runs_temporary_file_is_removed_by_the_next_run(tmp_path, fast, capsys, rng):
    """A process killed (SIGKILL) while writing leaves its hidden temporary file behind; a later
    run into that folder removes it once it is stale (untouched for upscale.TEMP_STALE_S), and
    keeps those of a live process and of another machine."""
    src, out = tmp_path / "in", tmp_path / "out"
    save(src / "a.png", tiny8(rng))
    out.mkdir()
    child = ("import os, signal, sys; from pathlib import Path; from sr_blockwise.batch.files import _temp_name; "
             "_temp_name(Path(sys.argv[1]) / 'a.png').write_bytes(b'half an image'); "
             "os.kill(os.getpid(), signal.SIGKILL)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-c", child, str(out)], env=env, timeout=120)
    assert r.returncode == -signal.SIGKILL
    (killed,) = leftovers(out)
    dead_pid = killed.name.split("-")[1]
    live = batch_files._temp_name(out / "b.png")  # this process's: being written
    live.write_bytes(b"")
    other_host = "0" * 8 if batch_files._HOST != "0" * 8 else "1" * 8
    elsewhere = out / f".{other_host}-{dead_pid}-{'ab' * 6}.tmp"  # a dead pid, on another machine
    elsewhere.write_bytes(b"")
    # just killed: it might yet be a write in progress, of a process whose id is not seen here
    assert main([str(src), "-o", str(out)] + fast) == 0
    assert "that a killed run left" not in capsys.readouterr().err and killed.exists()
    stale = time.time() - upscale.TEMP_STALE_S - 1
    for f in (killed, live, elsewhere):
        os.utime(f, (stale, stale))
    assert main([str(src), "-o", str(out)] + fast) == 0
    assert "removed 1 temporary file that a killed run left" in capsys.readouterr().err
    assert not killed.exists() and live.exists() and elsewhere.exists() and (out / "a.png").is_file()


def test_resumed_metrics_keep_rows_however_the_input_is_spelled(tmp_path, fast, monkeypatch, rng):
    """Rows are matched by the output's path below OUTDIR: a resumed run may spell the input or
    OUTDIR another way (here relative, then absolute) and still keep the first run's rows."""
    src, met = tmp_path / "in", tmp_path / "m.csv"
    save(src / "x1.png", tiny8(rng))
    monkeypatch.chdir(tmp_path)
    assert main(["in", "-o", "out", "--quiet", "--metrics", "m.csv"] + fast) == 0
    save(src / "x2.png", tiny8(rng))
    monkeypatch.chdir(src)
    args = [str(src), "-o", str(tmp_path / "out"), "--quiet", "--skip-existing", "--metrics", str(met)]
    assert main(args + fast) == 0

    def rows():
        with open(met, newline="") as f:
            return list(csv.DictReader(f))
    assert [(r["relative"], r["status"], r["input"]) for r in rows()] == [
        ("x1.png", "done", "in/x1.png"), ("x2.png", "done", str(src / "x2.png"))]
    # a file from before `relative` existed is matched by its output path (from the current folder)
    monkeypatch.chdir(tmp_path)
    old = [{k: v for k, v in r.items() if k != "relative"} for r in rows()]
    with open(met, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(old[0]))
        w.writeheader()
        w.writerows(old)
    assert main(args + fast) == 0
    assert [(r["relative"], r["status"], int(r["calls"]) > 0) for r in rows()] == [
        ("x1.png", "done", True), ("x2.png", "done", True)]


def test_first_ctrl_c_stops_when_a_batch_fails_or_while_reading(tmp_path, tiny_weights, monkeypatch, capsys, rng):
    """One Ctrl-C stops after the batch in hand (exit 130) even when that batch's decoding failed,
    or when no batch was formed because every file read so far was bad."""
    src = tmp_path / "in"
    for i in range(3):
        save(src / f"x{i}.png", tiny8(rng))
    args = [str(src), "-o", str(tmp_path / "out"), "--weights", tiny_weights, "--threads", "1",
            "--batch-size", "1", "--quiet"]
    calls = []

    def interrupted(exc):
        def f(*a, **kw):
            calls.append(1)
            if len(calls) == 1:
                signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C once
            raise exc
        return f
    monkeypatch.setattr(batch_run, "decode_batch", interrupted(RuntimeError("CUDA out of memory (simulated)")))
    assert main(args) == 130 and len(calls) == 1
    calls.clear()
    monkeypatch.setattr(batch_run, "load_photo", interrupted(upscale.BadImage("not a readable image")))
    assert main(args) == 130 and len(calls) == 1
    assert "interrupted after 0 of 3 images" in capsys.readouterr().err


def test_formats_pillow_cannot_decode_are_not_picked_up(tmp_path, capsys, rng):
    save(tmp_path / "in" / "a.png", tiny8(rng))
    (tmp_path / "in" / "clip.wmf").write_bytes(b"\xd7\xcd\xc6\x9a" + bytes(36))  # placeable WMF header
    (tmp_path / "in" / "clip.emf").write_bytes(bytes(40))
    assert {".wmf", ".emf"}.isdisjoint(upscale.readable_exts())
    rows = dry_run(capsys, [str(tmp_path / "in"), "-o", str(tmp_path / "out")])
    assert [Path(i).name for _, i, _ in rows] == ["a.png"]


def test_sample_mode_speculative_with_k_and_plain_with_k1(tmp_path, tiny_weights, rng):
    """--mode sample --k 4 samples by speculative sampling (blocks > 1 token), reproducibly and
    whatever the batch; --k 1 is plain sampling (one token per call)."""
    for i in range(2):
        save(tmp_path / "in" / f"f{i}.png", tiny8(rng))
    flags = ["--weights", tiny_weights, "--threads", "1", "--mode", "sample", "--seed", "7", "--quiet"]
    runs = {}
    for name, extra in (("k4", ["--k", "4"]), ("k4-alone", ["--k", "4", "--batch-size", "1"]), ("k1", ["--k", "1"])):
        met = tmp_path / f"{name}.json"
        assert main([str(tmp_path / "in"), "-o", str(tmp_path / name), "--metrics", str(met)] + flags + extra) == 0
        rows = sorted(json.loads(met.read_text())["images"], key=lambda r: r["input"])
        imgs = [np.asarray(Image.open(tmp_path / name / f"f{i}.png")) for i in range(2)]
        runs[name] = (rows, imgs)
    assert all(r["mean_block"] > 1.1 for r in runs["k4"][0])
    assert all(r["mean_block"] == 1 for r in runs["k1"][0])
    for i in range(2):
        np.testing.assert_array_equal(runs["k4"][1][i], runs["k4-alone"][1][i])
        assert not np.array_equal(runs["k4"][1][i], runs["k1"][1][i])


# ---------------------------------------------------------------- faces in photos

def test_faces_all_paste_back_and_photos_without_a_face(tmp_path, fast, capsys, rng):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    two_faces().save(src / "pair_face0.png")  # the mark in its name: face 1 is still _face1
    save(src / "wall.png", photo(rng, 60, 90))  # no face
    save(src / "tiny.png", tiny8(rng))
    rc = main([str(src), "-o", str(out), "--faces", "all", "--paste-back", "--compare",
               "--metrics", str(tmp_path / "m.json")] + fast)
    cap = capsys.readouterr()
    assert rc == 0
    for name in ["pair_face0_face0.png", "pair_face0_face1.png", "wall_face0.png", "tiny_face0.png"]:
        assert Image.open(out / name).size == (32, 32), name
        assert (out / name.replace(".png", "_compare.png")).is_file()
    # pasted back at the model's scale: the photo reduced so that its largest face is 8 px, then 4x
    scale = json.loads((tmp_path / "m.json").read_text())["images"][0]["paste_scale"]
    pasted_size = Image.open(out / "pair_face0_pasted.png").size
    assert pasted_size == F.pasted_size((832, 512), scale) and scale < 0.25
    assert (f"  {src / 'pair_face0.png'}: {pasted_size[0]}x{pasted_size[1]}: the photo at {scale:.3g}x, "
            "where face 0 (") in cap.out
    # no face found: the centre square's result is written, but not pasted over the photo's middle
    wall = np.asarray(Image.open(src / "wall.png").resize((360, 240), Image.Resampling.BICUBIC))
    assert (np.asarray(Image.open(out / "wall_pasted.png")) == wall).all()
    assert (f"warning: {src / 'wall.png'}: no face found in the 90x60 photo: its centre square is used; "
            "the pasted photo is the photo enlarged, nothing pasted") in cap.err
    assert "done 3, skipped 0 (already there), failed 0" in cap.out and "faces written 4" in cap.out
    rows = {Path(r["output"]).name: r for r in json.loads((tmp_path / "m.json").read_text())["images"]}
    p0, p1 = rows["pair_face0_face0.png"], rows["pair_face0_face1.png"]
    assert (p0["face"], p1["face"], p0["framing"], rows["wall_face0.png"]["framing"]) == (0, 1, "detected", "centre square")
    assert rows["tiny_face0.png"]["framing"] == "as is"  # the value docs/upscale.md names
    assert p0["box"][2] - p0["box"][0] > p1["box"][2] - p1["box"][0] and p1["box"][0] > 512
    # resumed: every face's row of the earlier run is kept, not only face 0's
    assert main([str(src), "-o", str(out), "--faces", "all", "--paste-back", "--compare", "--skip-existing",
                 "--metrics", str(tmp_path / "m.json")] + fast) == 0
    capsys.readouterr()
    again = {Path(r["output"]).name: r for r in json.loads((tmp_path / "m.json").read_text())["images"]}
    assert again.keys() == rows.keys() and again["pair_face0_face1.png"]["calls"] == p1["calls"]
    # the pasted photo: the photo at that scale outside the faces, the results inside
    pasted = np.asarray(Image.open(out / "pair_face0_pasted.png"))
    plain = F.paste_canvas(two_faces(), scale)
    assert (pasted[:2] == plain[:2]).all() and not (pasted == plain).all()
    assert all(r["paste_scale"] == scale for r in rows.values() if r["input"].endswith("pair_face0.png"))
    # a dry run gives each photo's scale (its faces are found, no model loaded)
    assert main([str(src), "-o", str(tmp_path / "dry"), "--faces", "all", "--paste-back", "--dry-run"]) == 0
    plans = {Path(line.split("\t")[1]).name: line.split("\t")[3] for line in capsys.readouterr().out.splitlines()}
    assert plans["pair_face0.png"] == f"pasted back {pasted_size[0]}x{pasted_size[1]}: the photo at {scale:.3g}x, " \
        f"where face 0 ({plans['pair_face0.png'].split('face 0 (')[1]}"
    assert plans["wall.png"] == "pasted back 360x240: the photo 4x"  # no face: nothing pasted
    assert plans["tiny.png"].startswith("pasted back: the 32x32 result")
    # largest only, and --no-face skip: the wall is listed, not written, and not a failure
    out2 = tmp_path / "out2"
    rc = main([str(src), "-o", str(out2), "--no-face", "skip"] + fast)
    cap = capsys.readouterr()
    assert rc == 0 and "no face found 1" in cap.out
    assert sorted(p.name for p in out2.iterdir()) == ["pair_face0.png", "tiny.png"]
    # --faces none: the centre square, no detection; pasted back into the photo too
    assert main([str(src), "-o", str(tmp_path / "out3"), "--faces", "none", "--paste-back"] + fast) == 0
    assert "warning" not in capsys.readouterr().err
    assert Image.open(tmp_path / "out3" / "pair_face0_pasted.png").size == F.pasted_size((832, 512), 32 / 512)
    assert Image.open(tmp_path / "out3" / "tiny_pasted.png").size == (32, 32)  # an 8x8 input: its result


def test_a_failed_write_names_the_output_not_its_temporary_file(tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(30, "Read-only file system", str(args[0] if args else self))
    monkeypatch.setattr(Image.Image, "save", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)  # a read-only file system refuses even that
    with pytest.raises(OSError) as e:
        upscale.save_atomic(np.zeros((32, 32, 3), np.uint8), tmp_path / "x.png", "png")
    assert e.value.errno == 30 and e.value.filename == str(tmp_path / "x.png") and list(tmp_path.iterdir()) == []


def test_a_photo_as_its_own_ground_truth_is_scored_against_its_inputs_crop(tmp_path, fast, rng):
    """--ground-truth crops the truth as the input's face was cropped: a photo that is its own
    ground truth scores the output against the input's own 32x32 crop (a CelebA photo's paper
    crop and a centre square resample otherwise than a face's warp)."""
    from sr_blockwise.data import DEFAULT_DATA
    from sr_blockwise.faces import celeba_face, centre_face
    from sr_blockwise.metrics import psnr
    folder = DEFAULT_DATA / "celeba" / "img_align_celeba"
    if not folder.is_dir():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"CelebA photos not found at {folder}")
    photos = {"celeba": Image.open(sorted(folder.glob("*.jpg"))[-16]).convert("RGB"),  # 178x218
              "wall": Image.fromarray(photo(rng, 60, 90))}
    for name, img in photos.items():
        for d in ("in", "gt"):
            save(tmp_path / d / f"{name}.png", np.asarray(img))
    out = tmp_path / "out"
    assert main([str(tmp_path / "in"), "-o", str(out), "--ground-truth", str(tmp_path / "gt"), "--faces", "none",
                 "--metrics", str(tmp_path / "m.json")] + fast) == 0
    rows = {Path(r["input"]).stem: r for r in json.loads((tmp_path / "m.json").read_text())["images"]}
    for name, face in (("celeba", celeba_face(photos["celeba"])), ("wall", centre_face(photos["wall"]))):
        result = np.asarray(Image.open(out / f"{name}.png"))
        assert rows[name]["psnr"] == pytest.approx(float(psnr(face.crop, result)[0]), abs=1e-9), name
