"""Analysis: preference per comparison with a bootstrap interval, attention-check exclusion,
Table 3 and % fooled beside the papers', the report and the judgments as CSV."""
from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

import numpy as np

from .common import StudyError
from .conditions import Condition
from .store import JUDGMENT_COLUMNS, RatingDB
from .study import Study

# Table 3 of the paper: preference (%) for the fine-tuned k>1 output over frozen greedy
PAPER_TABLE3 = {"exact": {2: 52.8, 4: 54.4, 6: 53.2, 8: 55.1, 10: 54.5},
                "eps=2": {2: 50.0, 4: 53.3, 6: 56.8, 8: 55.2, 10: 50.3}}
PAPER_FOOLED = 36.0  # Image Transformer paper: raters fooled by model output vs the real photo


def attention_summary(rows: list[dict], min_accuracy: float) -> dict:
    """rater -> {checks, correct, excluded}. A rater is excluded when the share of attention
    checks where they picked the real photo is below min_accuracy (raters with no check are kept)."""
    out = {}
    for r in rows:
        s = out.setdefault(r["rater"], {"checks": 0, "correct": 0, "excluded": False})
        if r["attention"]:
            s["checks"] += 1
            s["correct"] += r["chosen_cond"] == "real"
    for s in out.values():
        s["excluded"] = s["checks"] > 0 and s["correct"] / s["checks"] < min_accuracy
    return out


def exclusion_rule(min_accuracy: float) -> str:
    return (f"a rater is excluded when they picked the real photo in fewer than {min_accuracy:.0%} of "
            f"their attention checks (the real photo against an obviously broken image); raters "
            f"who answered no attention check are kept")


def bootstrap_ci(raters, images, y, n_boot: int = 2000, level: float = 0.90, seed: int = 0):
    """Percentile interval of a preference rate, resampling raters and images with replacement
    (two-way bootstrap: a judgment counts once per copy of its rater times copies of its image)."""
    y = np.asarray(y, float)
    if len(y) == 0:
        return float("nan"), float("nan")
    _, ri = np.unique(np.asarray(raters, dtype=object).astype(str), return_inverse=True)
    _, ii = np.unique(np.asarray(images), return_inverse=True)
    R, J = ri.max() + 1, ii.max() + 1
    rng = np.random.default_rng(seed)
    stats = []
    for s in range(0, n_boot, 250):  # chunks keep memory small
        b = min(250, n_boot - s)
        rc = rng.multinomial(R, np.full(R, 1 / R), size=b)
        ic = rng.multinomial(J, np.full(J, 1 / J), size=b)
        w = rc[:, ri] * ic[:, ii]
        tot = w.sum(1)
        ok = tot > 0
        stats.append((w[ok] @ y) / tot[ok])
    stats = np.concatenate(stats)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def analyze_judgments(rows: list[dict], comparisons, min_attention: float = 0.8, n_boot: int = 2000,
                      level: float = 0.90, seed: int = 0, identical=None) -> dict:
    """Per comparison (A, B): preference for A with a bootstrap interval, binomial test against
    50%, left-side choice rate, counts. identical(a, b, image) -> bool marks pixel-equal pairs."""
    from scipy.stats import binomtest

    att = attention_summary(rows, min_attention)
    kept = [r for r in rows if not r["attention"] and not att[r["rater"]]["excluded"]]
    out = []
    for a, b in comparisons:
        rs = [r for r in kept if {r["cond_a"], r["cond_b"]} == {a, b}]
        n = len(rs)
        y = [r["chosen_cond"] == a for r in rs]
        k = int(sum(y))
        lo, hi = bootstrap_ci([r["rater"] for r in rs], [r["image"] for r in rs], y, n_boot, level, seed)
        left = sum(r["chosen_side"] == "left" for r in rs)
        out.append({
            "a": a, "b": b, "n": n, "prefer_a": k,
            "rate": k / n if n else float("nan"), "ci": (lo, hi),
            "p_binomial": binomtest(k, n, 0.5).pvalue if n else float("nan"),
            "left_rate": left / n if n else float("nan"),
            "raters": len({r["rater"] for r in rs}), "images": len({r["image"] for r in rs}),
            "identical": (sum(identical(a, b, r["image"]) for r in rs) if identical and n else None),
        })
    left = sum(r["chosen_side"] == "left" for r in kept)
    checks = [r for r in rows if r["attention"]]
    return {
        "comparisons": out, "level": level, "n_boot": n_boot, "min_attention": min_attention,
        "rule": exclusion_rule(min_attention),
        "raters": {k: v for k, v in sorted(att.items())},
        "excluded": sorted(k for k, v in att.items() if v["excluded"]),
        "n_judgments": len(rows), "n_used": len(kept),
        "left": {"n": len(kept), "left": left, "rate": left / len(kept) if kept else float("nan"),
                 "p_binomial": binomtest(left, len(kept), 0.5).pvalue if kept else float("nan")},
        "attention": {"n": len(checks), "correct": sum(r["chosen_cond"] == "real" for r in checks)},
    }


def analyze(study: Study, db_path=None, **kw) -> dict:
    db = RatingDB(db_path or study.folder / "ratings.sqlite", study.study_id, create=False)
    res = analyze_judgments(db.judgments(), study.comparisons, identical=study.identical, **kw)
    res["study_id"] = study.study_id
    res["question"] = study.question
    res["weights"] = study.weights_sha
    res["decode"] = study.manifest.get("decode", {})
    refused = [r for r in db.refusals() if not r["practice"]]
    res["refused_quick"] = {"n": len(refused), "min_answer_ms": sorted({r["min_answer_ms"] for r in refused}),
                            "by_rater": dict(Counter(r["rater"] for r in refused).most_common())}
    return res


def _pct(x) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f}"


def _cell(c) -> str:
    if not c["n"]:
        return "no judgments"
    return f"{_pct(c['rate'])} [{_pct(c['ci'][0])}, {_pct(c['ci'][1])}] (n={c['n']})"


def table3(res: dict) -> str:
    """Table 3's layout: one row per k, columns exact / eps=E, the paper's number beside ours.
    Rows are comparisons of a k>1 condition (A) against k=1 greedy (B)."""
    cols, rows = {}, {}  # cols: column key -> the paper's numbers apply (neither side guided)
    for c in res["comparisons"]:
        pair = _conditions(c)
        if pair is None:
            continue
        a, b = pair
        if a.rule not in ("exact", "eps") or b.rule != "greedy":
            continue
        # guided or guarded conditions get their own columns, without the paper's numbers (it had
        # neither)
        guided = lambda c: ("" if c.prior_weight == 1 else f":w={c.prior_weight:g}") + \
            (f":guard={c.guard:g}" if c.guard else "")
        key = (a.mode + guided(a), a.weights, b.weights + guided(b))
        cols.setdefault(key, not guided(a) and not guided(b))
        rows.setdefault(a.k, {})[key] = c
    if not cols:
        return "(no comparison of a k>1 condition against greedy in this study)\n"
    several = len({(w1, w2) for _, w1, w2 in cols}) > 1
    head, line = ["k"], ["---"]
    for mode, wa, wb in cols:
        label = f"{mode} ({wa} vs {wb})" if several else mode
        head += [f"{label}: paper", f"{label}: ours [{res['level']:.0%} CI]"]
        line += ["---:", "---:"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(line) + "|"]
    for k in sorted(rows):
        cells = [str(k)]
        for key in cols:
            paper = PAPER_TABLE3.get(key[0], {}).get(k) if cols[key] else None
            cells.append("—" if paper is None else f"{paper:.1f}")
            cells.append(_cell(rows[k][key]) if key in rows[k] else "—")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _conditions(c):
    try:
        return Condition.from_name(c["a"]), Condition.from_name(c["b"])
    except StudyError:
        return None


def fooled_table(res: dict) -> str:
    """% fooled: for each model output compared with the real photo, the share of judgments that
    picked the model's image, with its interval, beside the Image Transformer paper's ~36% (its
    study rated samples at temperature 0.8-1.0: the number is shown beside such rows only)."""
    out = [f"| model output | % fooled [{res['level']:.0%} CI] (judgments) | Image Transformer paper |",
           "|---|---:|---:|"]
    for c in res["comparisons"]:
        if "real" not in (c["a"], c["b"]) or not c["n"]:
            continue
        model = c["b"] if c["a"] == "real" else c["a"]
        rate, (lo, hi) = c["rate"], c["ci"]
        if c["a"] == "real":  # preference was for the photo: fooled is the other side
            rate, lo, hi = 1 - rate, 1 - hi, 1 - lo
        try:
            m = Condition.from_name(model)
            comparable = m.rule == "sample" and 0.8 <= m.temperature <= 1.0
        except StudyError:
            comparable = False
        paper = f"~{PAPER_FOOLED:.0f}" if comparable else "—"
        out.append(f"| {model} | {_pct(rate)} [{_pct(lo)}, {_pct(hi)}] ({c['n']}) | {paper} |")
    if len(out) == 2:
        if any("real" in (c["a"], c["b"]) for c in res["comparisons"]):
            return "(no judgments yet of a model output against the real photo)\n"
        return "(no comparison of a model output against the real photo in this study)\n"
    return "\n".join(out) + "\n"


def same_distribution(a: Condition, b: Condition) -> bool:
    """Two sampled conditions that differ only in k: speculative and plain sampling of the same
    model at the same temperature and guidance draw from the same distribution."""
    if a.rule != "sample" or b.rule != "sample" or a.weights != b.weights:
        return False
    oa, ob = a.options(), b.options()
    return (oa.temperature, oa.prior_weight, oa.guard) == (ob.temperature, ob.prior_weight, ob.guard)


def report_markdown(res: dict) -> str:
    pct_level = f"{res['level']:.0%}"
    n_raters = len(res["raters"])
    lines = [f"# Human rating study {res.get('study_id', '')}".rstrip(), ""]
    if res.get("question"):
        lines += [f"Question: \"{res['question']}\"", ""]
    lines += [f"{n_raters} raters ({len(res['excluded'])} excluded), {res['n_judgments']} judgments recorded, "
              f"{res['n_used']} used (attention checks and excluded raters left out).", "",
              f"Exclusion rule: {res['rule']}.", ""]
    if res["excluded"]:
        lines += ["Excluded raters: " + ", ".join(
            f"{r} ({res['raters'][r]['correct']}/{res['raters'][r]['checks']} checks passed)"
            for r in res["excluded"]), ""]
    at = res["attention"]
    lines += [f"Attention checks: {at['correct']} of {at['n']} picked the real photo"
              + (f" ({_pct(at['correct'] / at['n'])}%)." if at["n"] else "."), ""]
    lines += [f"## Table 3: preference (%) for the k>1 output over greedy (k=1), {pct_level} bootstrap CI", "",
              table3(res),
              "Paper: fine-tuned model with k>1 against the frozen k=1 (plain greedy) model; "
              "number of raters and pairs not reported.", ""]
    lines += ["## All comparisons", "",
              f"| A vs B | prefer A % | {pct_level} CI | p (binomial, 50%) | left chosen % | judgments "
              f"| raters | images | identical pairs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in res["comparisons"]:
        ident = "—" if c["identical"] is None else str(c["identical"])
        p = "—" if c["p_binomial"] != c["p_binomial"] else f"{c['p_binomial']:.3g}"
        lines.append(f"| {c['a']} vs {c['b']} | {_pct(c['rate'])} | [{_pct(c['ci'][0])}, {_pct(c['ci'][1])}] "
                     f"| {p} | {_pct(c['left_rate'])} | {c['n']} | {c['raters']} | {c['images']} | {ident} |")
    lines += ["", f"## % fooled: model output against the real photo, {pct_level} bootstrap CI", "",
              fooled_table(res),
              f"Image Transformer paper: raters fooled about {PAPER_FOOLED:.0f}% of the time by its samples at "
              f"temperature 0.8-1.0 (its own model and raters); shown beside our samples at such temperatures only. "
              f"50% would mean raters cannot tell the model's faces from photos.", ""]
    checks = []
    for c in res["comparisons"]:
        pair = _conditions(c)
        if pair and same_distribution(*pair):
            p = "—" if c["p_binomial"] != c["p_binomial"] else f"{c['p_binomial']:.3g}"
            checks.append(f"- {c['a']} vs {c['b']}: {_cell(c)}, binomial p = {p}")
    if checks:
        lines += ["## Check of the method: samples of one distribution", "",
                  "These sampled conditions differ only in k (or their seed): speculative sampling (k > 1) "
                  "and plain sampling (k = 1) of the same model at the same temperature and guidance. "
                  "Their images differ (each face's "
                  "sample is drawn with its own seed), their distribution does not, so the expected "
                  "preference is 50%; an interval that excludes 50% would point at a fault.", ""]
        lines += checks + [""]
    rq = res.get("refused_quick")
    if rq and rq["n"]:
        lines += [f"Presses refused as too quick (under {'/'.join(map(str, rq['min_answer_ms']))} ms after their "
                  f"pair appeared; not judgments): {rq['n']}, by rater: "
                  + ", ".join(f"{r} {n}" for r, n in list(rq["by_rater"].items())[:10])
                  + (", ..." if len(rq["by_rater"]) > 10 else "") + ". Many from one rater suggest they "
                  "answered without looking.", ""]
    lf = res["left"]
    p = "—" if lf["p_binomial"] != lf["p_binomial"] else f"{lf['p_binomial']:.3g}"
    lines += ["", f"Left-side bias: the left image was chosen in {_pct(lf['rate'])}% of {lf['n']} "
              f"judgments (two-sided binomial p = {p}).", ""]
    if res.get("decode"):
        lines += ["Mean accepted block size of the study images: " + ", ".join(
            f"{k} {v['mean_block']:.2f}" for k, v in res["decode"].items() if v.get("mean_block")) + ".", ""]
    lines += [f"Method: preference = share of judgments choosing A. The {pct_level} interval is a percentile "
              f"bootstrap ({res['n_boot']} resamples) that resamples raters and images with replacement; the "
              f"binomial test treats judgments as independent. Identical pairs: both images equal pixel "
              f"for pixel (raters can only guess).", ""]
    return "\n".join(lines)


def write_csv(rows: list[dict], path, excluded=()) -> Path:
    """All judgments, one per line, with a column saying whether the rater was excluded."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JUDGMENT_COLUMNS + ["rater_excluded"])
        for r in rows:
            w.writerow([r[c] for c in JUDGMENT_COLUMNS] + [int(r["rater"] in excluded)])
    os.replace(tmp, path)
    return path
