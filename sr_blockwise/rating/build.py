"""Building a study folder: every study face decoded once per condition, written with its hash into
the manifest; resumable, and a damaged complete study is made again as recorded."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from .common import FORMAT, StudyError, app_version, now_iso
from .conditions import (DEFAULT_CONDITIONS, FINETUNED, FROZEN, Condition, parse_comparisons, parse_conditions,
                         sample_seeds)
from .images import broken_image, png_bytes, sha256_bytes, write_file, write_json
from .study import damaged_files, read_manifest

DEFAULT_QUESTION = "Which image is more likely to have been taken by a camera?"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_")


# ---------------------------------------------------------------- build

def _check_counts_and_question(n_faces: int, n_practice: int, question: str) -> None:
    """Refuse a study without faces to rate or without a question."""
    if n_faces < 1 or n_practice < 0:
        raise StudyError(f"need at least one face (got n_faces={n_faces}, n_practice={n_practice})")
    if not question.strip():
        raise StudyError("the question is empty")


def _pick_faces(data, split: str, n_faces: int, n_practice: int, seed: int):
    """The split's faces, the study's pick of them (sorted indices) and their images."""
    from ..data import load_faces

    faces = load_faces(data).part(split)
    need = n_faces + n_practice
    if len(faces) < need:
        raise StudyError(f"split {split!r} has {len(faces)} faces; the study needs {need} "
                         f"({n_faces} rated + {n_practice} practice)")
    pick = np.sort(np.random.default_rng(seed).choice(len(faces), need, replace=False))
    return faces, pick, faces.images[pick]


def _image_dirs(conds) -> dict[str, str]:
    """Each kind of image's folder in the study: the photos, the attention checks, each decoded condition."""
    dirs = {"real": "images/real", "broken": "images/broken"}
    for i, c in enumerate(conds):
        if c.decoded:
            dirs[c.name] = f"images/c{i:02d}_{_slug(c.name)}"
    return dirs


def _reopen_study(folder: Path, settings: dict, log) -> tuple[dict | None, set]:
    """The study already in the folder: refused if it is a different one; if it is complete, its
    manifest and its images missing or altered (those are made again), else (None, empty)."""
    if not (folder / "manifest.json").exists():
        return None, set()
    old = read_manifest(folder)
    if old.get("settings") != settings:
        diff = [k for k in settings if old.get("settings", {}).get(k) != settings[k]]
        raise StudyError(f"{folder} already holds a different study (differs in: {', '.join(diff)}); "
                         f"use a new folder")
    if not old.get("complete"):
        return None, set()
    damaged = set(damaged_files(folder, old.get("files", {})))
    if not damaged:
        log(f"study {old['study_id']} in {folder} is already complete")
    else:
        # every image is made the same way again (decoding is deterministic; samples have
        # their seeds in the manifest): the damaged ones are made and written where they
        # come out as recorded; the others are left as they are
        log(f"study {old['study_id']}: {len(damaged)} image(s) missing or altered; making them again")
    return old, damaged


def _check_restored(folder: Path, restoring: dict, differ: list, source: dict) -> None:
    """Refuse a restore where images made again differ from the recorded ones (they are not written)."""
    if differ:  # e.g. other faces under --data, or decoded on a processor that rounds differently
        built = restoring.get("source", {}).get("data")
        raise StudyError(
            f"{folder}: {len(differ)} image(s) made again differ from the study's "
            f"({', '.join(sorted(differ)[:3])}{', ...' if len(differ) > 3 else ''}): not written"
            + (f"; the study was built from {built}, this run reads {source['data']}"
               if built and built != source["data"] else "")
            + "; where they cannot be made as recorded, build the study in a new folder")


def build_study(folder, conditions=None, compare="baseline", data=None, split="test", n_faces=100,
                n_practice=3, seed=0, question=DEFAULT_QUESTION, frozen=FROZEN, finetuned=FINETUNED,
                batch_size=16, threads=0, progress=True, log=print) -> dict:
    """Make (or finish) a study folder; returns the manifest. Resumable: images already written
    are kept, so a killed build continues where it stopped. A folder holding a different study
    is refused."""
    folder = Path(folder)
    conds, refs = parse_conditions(conditions or DEFAULT_CONDITIONS, frozen, finetuned)
    comparisons = parse_comparisons(compare, conds, frozen, finetuned)
    _check_counts_and_question(n_faces, n_practice, question)
    weights, paths = _check_weights(refs, conds)
    faces, pick, images = _pick_faces(data, split, n_faces, n_practice, seed)
    need = n_faces + n_practice
    dirs = _image_dirs(conds)
    # sampled conditions: decode's seed for every face, so that the images can be rebuilt bit for bit
    seeds = {c.name: sample_seeds(seed, c.name, need) for c in conds if c.rule == "sample"}

    settings = _study_settings(conds, comparisons, weights, question, seed, split, n_faces, n_practice,
                               faces.ids, pick, dirs, seeds)
    # a complete study with images missing or altered: made again
    restoring, damaged = _reopen_study(folder, settings, log)
    if restoring and not damaged:
        return restoring
    folder.mkdir(parents=True, exist_ok=True)
    source = {"data": str(data or "default"), "weights": {k: str(v) for k, v in paths.items()}}
    if not restoring:  # a restore keeps the complete manifest: an interrupted one can be run again
        write_json(folder / "manifest.json", {"format": FORMAT, "complete": False, "settings": settings,
                                              "source": source, "built_with": app_version(), "started": now_iso()})
    differ = []  # restoring: images that came out otherwise than recorded (not written)

    def needed(rel: str) -> bool:
        return rel in damaged if restoring else not (folder / rel).exists()

    def put(rel: str, img: np.ndarray) -> bool:
        """Write a study image; restoring, only a damaged one, and only as recorded."""
        encoded = png_bytes(img)
        if restoring and (rel not in damaged or sha256_bytes(encoded) != restoring["files"].get(rel)):
            if rel in damaged:
                differ.append(rel)
            return False
        write_file(folder / rel, encoded)
        return True

    for j in range(need):  # photos and attention-check images need no model
        put(f"{dirs['real']}/{j:04d}.png", images[j])
        put(f"{dirs['broken']}/{j:04d}.png", broken_image(images[j], seed * 7919 + j))

    todo = [(c, [j for j in range(need) if needed(f"{dirs[c.name]}/{j:04d}.png")]) for c in conds if c.decoded]
    _decode_conditions(todo, images, dirs, paths, seeds, put, folder, batch_size, threads, progress)
    if restoring:
        _check_restored(folder, restoring, differ, source)
        log(f"study {restoring['study_id']} in {folder}: restored, complete")
        return restoring

    return _complete_manifest(folder, settings, source, conds, comparisons, dirs, need, n_faces, n_practice, log)


def _check_weights(refs: dict, conds) -> tuple[dict, dict]:
    """Each weights label's sha256 and path; a condition whose k is beyond its weights' heads is
    refused now rather than after hours of decoding."""
    from ..checkpoints import read_card, resolve, sha256_of

    weights, paths = {}, {}
    for label, ref in refs.items():
        p = resolve(ref)
        paths[label] = p
        card = None if p.suffix == ".pt" else read_card(p)
        weights[label] = {"sha256": sha256_of(p) if card is None else card["sha256"]}
        K = (card or {}).get("config", {}).get("n_blockwise")
        for c in conds:
            if c.weights == label and K is not None and c.k > K:
                raise StudyError(f"{c.name}: weights {label} have {K} blockwise heads, so k must be <= {K}")
    return weights, paths


def _study_settings(conds, comparisons, weights, question, seed, split, n_faces, n_practice, ids, pick, dirs,
                    seeds) -> dict:
    """What makes a study this study: the manifest's settings, compared when a folder is reopened."""
    def described(c: Condition) -> dict:
        # prior_weight only where it is not 1, guard where there is one and the sampling fields
        # only for samples: a study without them has the same manifest and id whichever version
        # built it
        return ({"name": c.name, "rule": c.rule, "k": c.k, "eps": c.eps, "weights": c.weights, "dir": dirs[c.name]}
                | ({"prior_weight": c.prior_weight} if c.prior_weight != 1 else {})
                | ({"guard": c.guard} if c.guard else {})
                | ({"temperature": c.temperature, "seeds": seeds[c.name]} if c.name in seeds else {}))

    return {
        "conditions": [described(c) for c in conds],
        "comparisons": [list(p) for p in comparisons],
        "weights": weights,
        "question": question.strip(),
        "seed": int(seed), "split": split, "n_faces": int(n_faces), "n_practice": int(n_practice),
        "faces": [{"index": j, "input_id": int(ids[i]), "practice": j >= n_faces}
                  for j, i in enumerate(pick)],
    }


def _decode_conditions(todo, images, dirs, paths, seeds, put, folder, batch_size, threads, progress) -> None:
    """Decode each condition's missing images (todo: (condition, face indices)) in batches, writing
    them with put and their decode statistics beside them."""
    import torch
    from tqdm import tqdm

    from ..checkpoints import load_model
    from ..data import downsample_8
    from ..decoding import decode

    if threads:
        torch.set_num_threads(threads)
    models = {}
    bar = tqdm(total=sum(len(t) for _, t in todo), desc="decoding study", unit="img", disable=not progress)
    for c, missing in todo:
        stats_path = folder / dirs[c.name] / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        for s in range(0, len(missing), batch_size):
            idx = missing[s:s + batch_size]
            if c.weights not in models:
                models[c.weights] = load_model(paths[c.weights])
            bar.set_postfix_str(c.name)
            res = decode(models[c.weights], downsample_8(images[idx]), c.options(),
                         seeds=[seeds[c.name][j] for j in idx] if c.name in seeds else None)
            for j, img, st in zip(idx, res.images, res.stats):
                if put(f"{dirs[c.name]}/{j:04d}.png", img):
                    stats[str(j)] = {"mean_block": st.mean_block, "calls": st.calls}
            write_json(stats_path, stats)
            bar.update(len(idx))
    bar.close()


def _complete_manifest(folder, settings, source, conds, comparisons, dirs, need, n_faces, n_practice, log) -> dict:
    """Every image's sha256, the decodes' mean blocks and the study id, written as the complete manifest."""
    mpath = folder / "manifest.json"
    files = {}
    for d in sorted(set(dirs.values())):
        for j in range(need):
            rel = f"{d}/{j:04d}.png"
            files[rel] = sha256_bytes((folder / rel).read_bytes())
    decode_stats = {}
    for c in conds:
        sp = folder / dirs.get(c.name, "") / "stats.json"
        if c.decoded and sp.exists():
            st = json.loads(sp.read_text())
            vals = [st[str(j)]["mean_block"] for j in range(n_faces) if str(j) in st]
            decode_stats[c.name] = {"mean_block": float(np.mean(vals)) if vals else None}
    study_id = sha256_bytes(json.dumps({"settings": settings, "files": files}, sort_keys=True).encode())[:16]
    manifest = {"format": FORMAT, "complete": True, "study_id": study_id, "settings": settings,
                "files": files, "decode": decode_stats, "source": source, "built_with": app_version(),
                "finished": now_iso()}
    write_json(mpath, manifest)
    log(f"study {study_id}: {len(conds)} conditions, {len(comparisons)} comparisons, "
        f"{n_faces} faces (+{n_practice} practice) in {folder}")
    return manifest
