"""`evaluate --merge`: one result from finished runs over disjoint faces or other weights, every
row pooled from its parts."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..model import SEQ_LEN
from .records import SCHEMA, SCHEMA_VERSION, ratios_to_greedy, summarize
from .report import _write_outputs


# settings that must agree for rows of different runs to stand in one table
MERGE_SAME_SETTINGS = ("ks", "modes", "batch_size", "dtype", "device", "psnr", "ssim", "perceptual",
                       "uncached_prefix_tokens", "decode_exact", "decode_approx", "prior_weight")

# what a setting was in results written before it existed
SETTING_BEFORE_IT_EXISTED = {"prior_weight": 1.0}

# record fields that say what a row is: the same in every part of it
ROW_IDENTITY = ("weights", "variant", "method", "mode", "k", "rule", "eps", "top_k", "min_block",
                "exact_by_construction", "paper_mean_block", "timing")

def _faces(r) -> tuple[int, int]:
    """A result's test faces as [first, first + n) (results before --first started at 0)."""
    a = r["data"].get("first", 0)
    return a, a + r["data"]["n_images"]


def _mean(recs, field, weight):
    """Mean of a per-image mean over parts, weighted by each part's images; None if a part has none
    (an infinite PSNR is written as null: the pooled mean is infinite too)."""
    vals = [(r[field], r[weight]) for r in recs]
    if any(v is None for v, _ in vals):
        return None
    return sum(v * w for v, w in vals) / sum(w for _, w in vals)


def pool_records(parts: list[dict]) -> dict:
    """One row from the same row of runs over disjoint faces. Counts and block histograms add up;
    per-image means are weighted by the images they cover (timing, identity and quality by the
    decoded images, calls by all); ratios to greedy are recomputed from the pooled figures (by
    `_relate`)."""
    rec = dict(parts[0])
    for f in ROW_IDENTITY:
        if any(p[f] != rec[f] for p in parts):
            raise ValueError(f"row {rec['weights']} {rec['mode']} k={rec['k']}: {f} differs between the runs")
    decoded = "n_images_decoded" if rec["n_images_decoded"] is not None else "n_images"
    rec["n_images"] = sum(p["n_images"] for p in parts)
    if rec["n_images_decoded"] is not None:
        rec["n_images_decoded"] = sum(p["n_images_decoded"] for p in parts)
    if rec["block_hist"] is not None:
        K = max(len(p["block_hist"]) for p in parts)
        hist = np.zeros(K, dtype=np.int64)
        for p in parts:
            hist[:len(p["block_hist"])] += p["block_hist"]
        rec["block_hist"] = hist.tolist()
        rec["mean_block"] = SEQ_LEN * rec["n_images"] / int(hist.sum())
    if any(p["block_stats_from"] == "replay" for p in parts):
        rec["block_stats_from"] = "replay"
    rec["calls_per_image"] = _mean(parts, "calls_per_image", "n_images")  # bits/dim: set by the caller
    for f in ("seconds_per_image", "identical_to_greedy", "tokens_identical_to_greedy", "replay_matches_decoded",
              "psnr_vs_real", "ssim_vs_real", "perceptual_vs_real", "psnr_vs_exact", "ssim_vs_exact",
              "perceptual_vs_exact"):
        rec[f] = _mean(parts, f, decoded)
    rec["notes"] = list(dict.fromkeys(x for p in parts for x in p["notes"]))
    return rec


def _relate(rows: list[dict]) -> None:
    """Ratios to greedy (same weights) from pooled seconds and calls, as `run_evaluation` makes them."""
    g = next(r for r in rows if r["method"] == "greedy")
    u = next((r for r in rows if r["method"] == "greedy-uncached"), None)
    for r in rows:  # greedy without a cache too: one call per token, as greedy with one
        r.update(ratios_to_greedy(r["seconds_per_image"], r["calls_per_image"],
                                  g["seconds_per_image"], g["calls_per_image"]))
        if u is not None:
            r["speedup_vs_uncached_greedy"] = u["seconds_per_image"] / r["seconds_per_image"]


def _data_of(r) -> tuple:
    """What data a result ran on: the file by its name (runs come from other machines), split, split size."""
    return Path(r["data"]["path"]).name, r["data"]["split"], r["data"]["split_size"]


def _check_mergeable(where: str, r: dict, first: dict) -> None:
    """Refuse a result that is not this version's, did not finish, or ran on other data or settings
    than the first result."""
    if r.get("schema") != SCHEMA or r.get("schema_version") != SCHEMA_VERSION:
        # an older version's rows mean other things (schema 2's exact is today's exact-heads)
        raise ValueError(f"{where}: not an sr-blockwise evaluate result of schema version "
                         f"{SCHEMA_VERSION} (got {r.get('schema')!r} {r.get('schema_version')!r}): "
                         f"evaluate it again with this version")
    if not r.get("complete"):
        raise ValueError(f"{where}: the run did not finish (complete: false); finish it with --resume first")
    if _data_of(r) != _data_of(first):
        raise ValueError(f"{where}: other data than the first result's: data.path (file name), data.split, data.split_size are "
                         f"{_data_of(r)}, not {_data_of(first)}")
    for key in MERGE_SAME_SETTINGS:
        mine, theirs = (x["settings"].get(key, SETTING_BEFORE_IT_EXISTED.get(key)) for x in (r, first))
        if mine != theirs:
            raise ValueError(f"{where}: settings.{key} is {mine!r}, not {theirs!r} as in the first "
                             f"result: rows would not compare")


def _runs_by_weights(results: list[dict]) -> dict[str, list]:
    """Each weights' runs as (faces, result, weights entry), every result checked first."""
    first = results[0]
    by_weights: dict[str, list] = {}
    for i, r in enumerate(results):
        _check_mergeable(r.get("_path", f"result {i + 1}"), r, first)
        for w in r["weights"]:
            by_weights.setdefault(w["name"], []).append((_faces(r), r, w))
    return by_weights


def _faces_covered(by_weights: dict[str, list]) -> int:
    """The number of faces every weights covers: each weights' runs sorted by face (in place), side
    by side from face 0, all weights up to the same face."""
    ends = set()
    for name, parts in by_weights.items():
        parts.sort(key=lambda p: p[0])
        at = 0
        for (a, b), r, _ in parts:
            if a != at:
                what = "overlap" if a < at else "leave a gap"
                raise ValueError(f"{r.get('_path', 'a result')}: its faces {a}..{b - 1} of {name} {what} "
                                 f"after faces 0..{at - 1} in the other results (each face of a weights once, "
                                 "from face 0 on, no gaps)")
            at = b
        ends.add(at)
    if len(ends) > 1:
        raise ValueError(f"the weights cover different numbers of faces ({sorted(ends)}): merge the same faces "
                         "for every weights")
    return ends.pop()


def _rows_of(r: dict, weights: str) -> list[dict]:
    """A result's records of one weights."""
    return [x for x in r["records"] if x["weights"] == weights]


def _no_model_rows(lead: list) -> list[dict]:
    """The no-model rows pooled over the first weights' runs (they cover every face once); results
    from before the nearest row was added have none, and a merge keeps it only if every run has it."""
    records = []
    for method in ("bicubic", "nearest"):
        rows_of = [[x for x in r["records"] if x["method"] == method] for _, r, _ in lead]
        if all(rows_of):
            records.append(pool_records([x for rs in rows_of for x in rs]))
    return records


def _pool_weights(name: str, parts: list, n_faces: int) -> tuple[list[dict], dict]:
    """One weights' rows pooled over its runs, with ratios to its own greedy, and its weights entry
    (bits per dim weighted by faces, each part listed)."""
    keys = [(x["mode"], x["k"]) for x in _rows_of(parts[0][1], name)]
    for (a, b), r, _ in parts[1:]:
        if [(x["mode"], x["k"]) for x in _rows_of(r, name)] != keys:
            raise ValueError(f"{r.get('_path', 'a result')}: other rows for {name} than its first run's")
    pooled = [pool_records([_rows_of(r, name)[j] for _, r, _ in parts]) for j in range(len(keys))]
    _relate(pooled)
    w = dict(parts[0][2])
    w["bits_per_dim"] = sum(p[2]["bits_per_dim"] * (p[0][1] - p[0][0]) for p in parts) / n_faces
    for x in pooled:
        x["bits_per_dim"] = w["bits_per_dim"]
    w["parts"] = [{"first": a, "n_images": b - a, "bits_per_dim": wi["bits_per_dim"],
                   "uncached_timing": wi["uncached_timing"]} for (a, b), _, wi in parts]
    return pooled, w


def merge_results(results: list[dict], command: str) -> dict:
    """One result from finished runs with the same settings: runs of different weights, and runs
    of the same weights over disjoint, adjacent ranges of test faces (`--first`). Why: 500 faces
    with every k and mode take this 2-core machine 1.5-2.5 hours per weights, a sitting is 3 hours,
    and the decode store in ~/.cache does not outlive a sitting here. Every row's speedup is
    pooled from its own weights' greedy, decoded batch by batch beside it; `runs` lists each run's
    faces, weights, command, date and machine."""
    if len(results) < 2:
        raise ValueError("--merge needs at least two results.json files")
    first = results[0]
    by_weights = _runs_by_weights(results)
    N = _faces_covered(by_weights)
    lead = next(iter(by_weights.values()))
    records = _no_model_rows(lead)
    weights_info = []
    for name, parts in by_weights.items():
        pooled, w = _pool_weights(name, parts, N)
        records += pooled
        weights_info.append(w)
    at0 = next(r for (a, _), r, _ in lead if a == 0)
    merged = {key: first[key] for key in ("schema", "schema_version", "paper")}
    merged.update({
        "complete": True, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command, "machine": first["machine"],
        "data": {**at0["data"], "first": 0, "n_images": N,  # the parts' first names, in face order
                 "first_images": [x for _, r, _ in lead for x in r["data"]["first_images"]][:3]},
        "settings": {**first["settings"], "decode_store": None},
        "runs": [{"command": r["command"], "created": r["created"], "machine": r["machine"],
                  "weights": [w["name"] for w in r["weights"]], "first": _faces(r)[0],
                  "n_images": r["data"]["n_images"], "decode_store": r["settings"].get("decode_store")}
                 for r in results],
        "weights": weights_info,
        "skipped": list(dict.fromkeys(s for r in results for s in r["skipped"])),
        "records": records,
    })
    merged["summary"] = summarize(merged)
    return merged


def merge(paths: list, out, json_path=None, command: str = "") -> dict:
    """`evaluate --merge`: read the results, merge, and write the report, plots and JSON under
    `out` (no image grids: a results.json holds no images)."""
    results = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such results file")
        try:
            r = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON ({e})") from None
        r["_path"] = str(p)
        results.append(r)
    result = merge_results(results, command)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _write_outputs(result, {"models": {}}, out, Path(json_path) if json_path else out / "results.json")

