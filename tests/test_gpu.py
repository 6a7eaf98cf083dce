"""gpu/: faces packed losslessly for a training machine, and the training script end to end on
this CPU with the tiny preset (the same script, only its settings differ)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, part_mask, save_faces

ROOT = Path(__file__).resolve().parent.parent


def pack(*args):
    return subprocess.run([sys.executable, str(ROOT / "gpu" / "pack.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def small_npz(celeba_npz, tmp_path_factory):
    """1,500 real faces of every part of the split (test faces included: pack must leave them out)."""
    faces = load_faces(celeba_npz)
    test = np.flatnonzero(part_mask("test", faces.ids, faces.split))
    path = tmp_path_factory.mktemp("small") / "faces.npz"
    keep = np.zeros(len(faces), bool)  # Faces.subset takes a mask
    keep[np.r_[0:1200, np.flatnonzero(faces.split == 1)[:100], test[:200]]] = True
    save_faces(faces.subset(keep), path)
    return path


def test_pack_round_trip_is_lossless_and_leaves_out_the_test_faces(small_npz, tmp_path):
    r = pack("pack", tmp_path / "faces", "--data", small_npz, "--n-val", 64)  # no budget: every training face
    assert r.returncode == 0, r.stderr
    r = pack("unpack", tmp_path / "faces", tmp_path / "back.npz")
    assert r.returncode == 0, r.stderr
    src, back = load_faces(small_npz), load_faces(tmp_path / "back.npz")
    assert len(back.part("test")) == 0 and len(back.part("val")) == 64
    assert len(back.part("train")) == len(src.part("train"))
    # the same faces, bit for bit, each with its own id and partition
    by_id = {i: img for i, img in zip(src.ids, src.images)}
    assert all((by_id[i] == img).all() for i, img in zip(back.ids, back.images))
    assert (back.part("val").ids == src.part("val").ids[:64]).all()


def test_pack_keeps_to_the_budget_and_unpack_refuses_altered_faces(small_npz, tmp_path):
    out = tmp_path / "faces"
    assert pack("pack", out, "--data", small_npz, "--n-val", 0, "--max-mb", 2.0).returncode == 0
    meta = json.loads((out / "meta.json").read_text())
    assert 0 < meta["n"] < len(load_faces(small_npz).part("train")) and meta["bytes"] <= 2e6
    mosaic = sorted(out.glob("mosaic-*.webp"))[0]
    grid = np.asarray(Image.open(mosaic)).copy()
    grid[5, 5, 0] ^= 1  # one intensity, one level off
    Image.fromarray(grid).save(mosaic, "WEBP", lossless=True)
    r = pack("unpack", out, tmp_path / "back.npz")
    assert r.returncode != 0 and "do not match" in r.stderr
    assert not (tmp_path / "back.npz").exists()


def test_pack_refuses_a_budget_without_training_faces(small_npz, tmp_path):
    r = pack("pack", tmp_path / "faces", "--data", small_npz, "--n-val", 64, "--max-mb", 0.5)
    assert r.returncode != 0 and "no training face fits" in r.stderr
    assert not (tmp_path / "faces" / "meta.json").exists()


def test_gpu_preset_comes_back_in_one_file():
    """The gpu preset's checkpoint as train.sh writes it (matrices in bf16, priors and output
    projection float32) stays under 16 MiB with room for the pickle: one small file to copy back."""
    from sr_blockwise.checkpoints import compact_state_dict
    from sr_blockwise.model import ImageTransformerSR, preset
    state = compact_state_dict(ImageTransformerSR(preset("gpu")).state_dict())
    assert state["lr_prior"].dtype == state["heads.nbr_prior"].dtype == state["lm_head.weight"].dtype == torch.float32
    assert state["decoder.0.self_attn.qkv.weight"].dtype == torch.bfloat16
    sizes = [v.numel() * v.element_size() for v in state.values()]
    assert sum(sizes) < 16 * 2**20 - 500_000


def test_gpu_script_dry_run_on_cpu(small_npz, tmp_path):
    """train.sh with the tiny preset for 2 steps a stage, scoring validation faces every step:
    both stages come back without optimizer state, load, export with test scores, and the
    fine-tuned run started from the base's weights."""
    packed = tmp_path / "faces"
    assert pack("pack", packed, "--data", small_npz, "--n-val", 16, "--max-mb", 100).returncode == 0
    # the warm start beside them begins from "shipped" weights: here a tiny model's checkpoint
    from sr_blockwise.model import ImageTransformerSR, preset
    torch.manual_seed(7)
    warm = ImageTransformerSR(preset("tiny"))
    torch.save({"model": warm.state_dict(), "model_config": warm.cfg.to_dict()}, tmp_path / "warm.pt")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), SR_BLOCKWISE_CACHE=str(tmp_path / "cache"), PY=sys.executable,
               DEVICE="cpu", PRESET="tiny", BATCH="2", MAX_STEPS="2", EVAL_MIN="0", PACKED=str(packed),
               OMP_NUM_THREADS="1", THREADS="1", WARM_FROM=str(tmp_path / "warm.pt"), WARM_PRESET="tiny",
               PROFILE="2", PROFILE_STEPS="1", FP32="1")  # float32: bf16 products are slow on most CPUs
    r = subprocess.run([str(ROOT / "gpu" / "train.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for run in ("gpu-base", "gpu-ft", "warm-ft"):
        ck = torch.load(out / f"{run}.pt", map_location="cpu", weights_only=True)
        # the best-scored checkpoint came back (validation at every step here: a best.pt was kept)
        assert (tmp_path / "cache" / run / "best.pt").exists()
        assert "opt" not in ck and 1 <= ck["step"] <= 2 and ck["best_val_bpd"] < 9  # scored, not inf
        assert ck["train_config"]["bf16"] is False  # FP32=1 reached every training run
        load_model(out / f"{run}.pt")
        assert "val_bpd" in (out / f"{run}-log.csv").read_text()
    assert "done" in (out / "run.log").read_text()
    # profiled first, once for the one preset both runs use: a row of images/s and the operators
    profile = (out / "profile-tiny.txt").read_text()
    assert "| 2 | " in profile and "== profiler, batch 2" in profile and "aten::" in profile
    assert "fine-tuning step, float32" in profile  # and the profile
    assert not (out / "profile-cpu.txt").exists()
    # the warm start trained the given weights, not fresh ones
    w_ft = torch.load(out / "warm-ft.pt", map_location="cpu", weights_only=True)["model"]
    name = "decoder.0.ff.up.weight"
    assert 0 < (w_ft[name].float() - warm.state_dict()[name]).norm() < 0.05 * warm.state_dict()[name].norm()
    # the fine-tuned run began from the base's weights (from a fresh start the relative distance
    # would be ~1.4), and bringing back kept the tiny model's tensors (all small) in float32
    base = torch.load(out / "gpu-base.pt", map_location="cpu", weights_only=True)["model"]
    ft = torch.load(out / "gpu-ft.pt", map_location="cpu", weights_only=True)["model"]
    on_disk = torch.load(tmp_path / "cache" / "gpu-base" / "best.pt", map_location="cpu", weights_only=True)["model"]
    w = [n for n, v in base.items() if n.startswith("decoder") and v.ndim == 2]
    dist = sum((ft[n] - base[n]).norm() ** 2 for n in w) ** 0.5 / sum(base[n].norm() ** 2 for n in w) ** 0.5
    assert 0 < dist < 0.05
    assert all(torch.equal(base[n], on_disk[n].to(base[n].dtype)) for n in base)
    assert base["lr_prior"].dtype == torch.float32 and base["decoder.0.ff.up.weight"].dtype == torch.bfloat16
    # and exports as shipped weights would be, scored on the held-out faces
    r = subprocess.run([sys.executable, "-m", "sr_blockwise", "export", str(out / "gpu-ft.pt"), "--name", "gpu-ft",
                        "--data", str(small_npz), "--eval-images", "4", "--out-dir", str(tmp_path / "w")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "w" / "gpu-ft.json").read_text())["meta"]["test_images_scored"] == 4


def test_the_gpu_decode_benchmark_runs_end_to_end_here(tiny_weights, celeba_npz, tmp_path):
    """gpu/bench_decode.py on this CPU with small settings: both tables, the JSON, exact == greedy."""
    faces = tmp_path / "test-faces.npz"
    r = pack("test-faces", faces, "--data", celeba_npz, "--n", 2)
    assert r.returncode == 0, r.stderr
    kept = load_faces(faces)
    assert len(kept) == 2 and part_mask("test", kept.ids, kept.split).all()
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "gpu" / "bench_decode.py"), "--weights", tiny_weights, "--device",
                        "cpu", "--data", str(faces), "--faces", "1", "--batches", "1,2", "--sizes", "1,4",
                        "--decode-batches", "1", "--modes", "greedy,exact:k=4:tree=4", "--reps", "2", "--engine", "static",
                        "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "bench_decode.json").read_text())
    assert [(c["batch"], c["candidates"]) for c in res["call_cost"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert all(c["ms_per_call"] > 0 and not c["graph"] for c in res["call_cost"])
    assert [(d["mode"], d["engine"], d["same_as_greedy"]) for d in res["decode"]] == \
        [("greedy", "static", True), ("exact:k=4:tree=4", "static", True)]
    assert res["data"] == "held-out faces" and "ms_per_call" in r.stdout
