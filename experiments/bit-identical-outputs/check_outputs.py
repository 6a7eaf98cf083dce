"""Decode a fixed set of held-out faces in every mode and save the outputs, or compare them with a
saved run: a refactor that moves code must leave every output bit for bit as it was.

    python experiments/bit-identical-outputs/check_outputs.py --save before.npz   # on the old tree
    python experiments/bit-identical-outputs/check_outputs.py --compare before.npz  # on the new one

What it records, on the first --faces faces of the held-out split:
- the shipped weights (cpu-finetuned, bf16) on the native engine: greedy, exact k=6 (recycled
  proposals), exact-heads k=6, eps=2 k=6, eps=2 window proposals, top-2 with min_block 2, oracle
  k=6, exact at prior weight 2; the torch engine for greedy and eps=2 k=6; sampling at T=0.8
  with k=1 and k=4 (fixed seeds, native engine); the images, block maps and per-image call
  counts of each;
- exact mode's replay (exact_block_stats, k in 1..10) on both engines;
- small random models (the tests' `tiny` preset, fixed seeds) in float64 and bf16: head1='layer'
  (p1 through the head layer; torch engine), nbr_prior without nbr_draft, no nbr_prior; their
  greedy, exact, eps and sampled outputs on one face, every head's logits on a teacher-forced
  pass, and the training loss (each stage), so head and training code moved elsewhere is
  checked too.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tree this script lives in

from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces, to_tokens
from sr_blockwise.decoding import DecodeOptions, decode, exact_block_stats
from sr_blockwise.model import ImageTransformerSR, preset


def record(out: dict, name: str, res) -> None:
    out[f"{name}/images"] = res.images
    out[f"{name}/block_map"] = res.block_map
    out[f"{name}/calls"] = np.array([s.calls for s in res.stats])


def shipped_modes(faces_lr: np.ndarray, out: dict) -> None:
    m = load_model("cpu-finetuned")
    modes = {
        "greedy": (DecodeOptions(k=1), "auto"),
        "exact_k6": (DecodeOptions(k=6, rule="exact"), "auto"),  # recycled proposals
        "exact_heads_k6": (DecodeOptions(k=6, rule="exact", propose="argmax"), "auto"),
        "eps2_k6": (DecodeOptions(k=6, rule="eps", eps=2), "auto"),
        "eps2_window_k6": (DecodeOptions(k=6, rule="eps", eps=2, propose="window"), "auto"),
        "top2_minblock2_k6": (DecodeOptions(k=6, rule="topk", top_k=2, min_block=2), "auto"),
        "oracle_k6": (DecodeOptions(k=6, rule="oracle"), "auto"),
        "exact_k6_w2": (DecodeOptions(k=6, rule="exact", prior_weight=2.0), "auto"),
        "greedy_torch": (DecodeOptions(k=1), "torch"),
        "eps2_k6_torch": (DecodeOptions(k=6, rule="eps", eps=2), "torch"),
        "sample_T0.8_k1": (DecodeOptions(k=1, temperature=0.8, seed=3), "auto"),
        "sample_T0.8_k4": (DecodeOptions(k=4, temperature=0.8, seed=5), "auto"),
    }
    for name, (opts, engine) in modes.items():
        t0 = time.perf_counter()
        res = decode(m, faces_lr, opts, engine=engine)
        record(out, f"shipped/{name}", res)
        print(f"shipped {name:22s} engine={res.extra['engine']:6s} calls={res.calls:5d} "
              f"{time.perf_counter() - t0:5.1f} s", flush=True)
    for engine, greedy in (("native", "greedy"), ("torch", "greedy_torch")):
        # each engine replays its own greedy outputs (the engines round differently)
        stats = exact_block_stats(m, faces_lr, out[f"shipped/{greedy}/images"], range(1, 11), engine=engine)
        for k, st in stats.items():
            out[f"shipped/replay_{engine}/k{k}/hist"] = np.array([s.block_hist for s in st])
            out[f"shipped/replay_{engine}/k{k}/calls"] = np.array([s.calls for s in st])
        print(f"shipped replay on {engine}", flush=True)



def tiny(seed: int, **overrides) -> ImageTransformerSR:
    """A random `tiny` model, its priors random too (as the tests' make_tiny)."""
    torch.manual_seed(seed)
    m = ImageTransformerSR(preset("tiny", **overrides)).eval()
    if m.lr_emb is not None:
        torch.nn.init.normal_(m.lr_emb.weight, std=0.1)
    if m.lr_prior is not None:
        torch.nn.init.normal_(m.lr_prior, std=1.0)
    if m.heads is not None and m.heads.nbr_prior is not None:
        torch.nn.init.normal_(m.heads.nbr_prior, std=1.0)
    return m


TINY = {
    "layer": dict(head1="layer", lr_prior=False, nbr_prior=False, nbr_draft=False),
    "layer_prior": dict(head1="layer", nbr_prior=False, nbr_draft=False),
    "nbr_no_draft": dict(nbr_draft=False),
    "no_nbr": dict(nbr_prior=False, nbr_draft=False),
    "tiny": dict(),
}


def tiny_models(faces32: np.ndarray, faces_lr: np.ndarray, out: dict) -> None:
    from sr_blockwise.train import TrainConfig, TrainingLoss
    src = torch.from_numpy(to_tokens(faces_lr))
    tgt = torch.from_numpy(to_tokens(faces32))
    for i, (name, over) in enumerate(TINY.items()):
        t0 = time.perf_counter()
        m = tiny(10 + i, **over)
        # the training loss of each stage, float32, fixed position draws
        for stage in ("base", "heads", "finetune"):
            for head_loss in ("sum", "random"):
                loss = TrainingLoss(m.train(), TrainConfig(preset="tiny", stage=stage, head_loss=head_loss))
                base, head, per = loss(src, tgt, torch.Generator().manual_seed(7))
                out[f"tiny/{name}/loss_{stage}_{head_loss}"] = np.array(
                    [base.item(), head.item()] + ([] if per is None else per.tolist()))
        m.eval()
        # every head's logits on a teacher-forced pass, float64
        md = tiny(10 + i, **over).double()
        with torch.no_grad():
            h = md(src, tgt)
            k = md.cfg.n_blockwise
            z = md.head_logits(h, k, src, tokens=tgt, prior_weight=1.5)
            out[f"tiny/{name}/head_logits"] = z[:, ::97].numpy()
        # decoding, in bf16 as for inference, one face (the shipped weights cover the rest)
        mi = tiny(10 + i, **over).for_inference(torch.bfloat16)
        for mode, opts in {"greedy": DecodeOptions(k=1), "exact_k5": DecodeOptions(k=5),
                           "eps3_k5": DecodeOptions(k=5, rule="eps", eps=3),
                           "window_k5": DecodeOptions(k=5, rule="eps", eps=3, propose="window"),
                           "sample_k4": DecodeOptions(k=4, temperature=0.8, seed=2)}.items():
            for engine in ("torch", "native"):
                if engine == "native" and (opts.temperature > 0 or mi.cfg.head1 != "base"):
                    continue
                record(out, f"tiny/{name}/{mode}_{engine}", decode(mi, faces_lr[:1], opts, engine=engine))
        print(f"tiny {name} {time.perf_counter() - t0:5.1f} s", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", help="write the outputs to this .npz")
    g.add_argument("--compare", help="compare the outputs with this .npz; exit 1 on any difference")
    ap.add_argument("--faces", type=int, default=3, help="held-out faces to decode")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    faces = load_faces(part="test").images[: a.faces]
    lr = downsample_8(faces)
    out: dict = {}
    t0 = time.perf_counter()
    shipped_modes(lr, out)
    tiny_models(faces, lr, out)
    print(f"{len(out)} arrays in {time.perf_counter() - t0:.0f} s")
    if a.save:
        np.savez_compressed(a.save, **out)
        print(f"saved {a.save}")
        return 0
    with np.load(a.compare) as ref:
        names = set(ref.files) | set(out)
        bad = [n for n in sorted(names) if n not in ref.files or n not in out
               or ref[n].shape != out[n].shape or not np.array_equal(ref[n], out[n])]
    for n in bad:
        print(f"DIFFERS: {n}")
    print(f"{len(names) - len(bad)} of {len(names)} arrays bit for bit identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
