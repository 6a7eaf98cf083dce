"""The Markdown report and headline of a result (the paper's Table 2 beside ours, speed,
quality, what differs from the paper and why), and the writing of every output file."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .plots import grid_image, plot_mean_block, plot_quality, plot_speedup
from .records import PAPER_PEAK, PAPER_TABLE2, _blockwise_lines, _index
from .store import write_json


def split_words(data: dict) -> str:
    """Which faces a result is of: the project's held-out test split, or a folder's faces where
    they carry no CelebA partition (all are test faces then)."""
    return ("the project's held-out test split" if data.get("labelled", True)
            else "a folder without CelebA partition labels")


def paper_comparison(result: dict) -> str:
    """The paper's peak beside ours, like for like: its decoders both re-run the prefix at every
    call (neither caches), so ours to set beside it are the calls saved at its setting."""
    p = PAPER_PEAK
    at = [r for r in result["records"] if r["method"] == "blockwise" and r["mode"] == p["mode"] and r["k"] == p["k"]]
    best = max(at, key=lambda r: r["call_reduction"] or 0, default=None)
    ours = (f"Ours at that setting: {best['call_reduction']:.2f}x fewer calls than greedy (mean block "
            f"{best['mean_block']:.2f}, {best['weights']})" if best else
            f"This run has no {p['mode']} row at k={p['k']} to set beside it")
    c = result["summary"].get("peak_call_reduction")
    if c and not (best and (c["mode"], c["k"]) == (best["mode"], best["k"])):
        ours += f"; the most calls saved: {c['speedup']:.2f}x ({c['weights']}, {c['mode']}, k={c['k']})"
    return (f"The paper: {p['speedup']}x wall clock at k={p['k']} ({p['variant']}, {p['mode']}) from a mean block "
            f"of {p['mean_block']}, with neither of its decoders caching (each call re-runs the prefix). {ours}.")


def _fmt(x, nd=2):
    if x is None:
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{nd}f}"


def head_acceptance(block_hist) -> list[float]:
    """P(head j's proposal accepted | heads 2..j-1 accepted), j = 2..k, from a block histogram."""
    h = np.asarray(block_hist, dtype=np.float64)
    at_least = h[::-1].cumsum()[::-1]  # at_least[j-1] = steps that accepted >= j tokens
    return [float(at_least[j] / at_least[j - 1]) if at_least[j - 1] else 0.0 for j in range(1, len(h))]


def table2_markdown(result) -> str:
    """The paper's Table 2 layout: k down, (weights, mode) across; ours with the paper's in brackets."""
    idx = _index(result)
    cols = list(_blockwise_lines(result))
    vmap = {w["name"]: w["variant"] for w in result["weights"]}
    head = ["k"] + [f"{w} ({vmap.get(w) or 'variant?'}), {m}" for w, m in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in result["settings"]["ks"]:
        cells = [str(k)]
        for w, m in cols:
            r = idx.get((w, m, k))
            if r is None:
                cells.append("—")
                continue
            paper = r["paper_mean_block"]
            cells.append(_fmt(r["mean_block"]) + (f" ({paper:.2f})" if paper is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speed_markdown(result) -> str:
    head = ["weights", "mode", "k", "mean block", "calls / image", "s / image", "speedup vs greedy (KV cache)",
            "speedup vs greedy (no cache)", "call reduction", "cost per call vs greedy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["records"]:
        if r["method"] in ("bicubic", "nearest"):
            continue
        est = " (est.)" if r["timing"] == "estimated" else ""
        lines.append("| " + " | ".join([r["weights"], r["mode"], str(r["k"]), _fmt(r["mean_block"]),
                                        _fmt(r["calls_per_image"], 0), _fmt(r["seconds_per_image"], 3) + est,
                                        _fmt(r["speedup_vs_greedy"]) + "x", _fmt(r["speedup_vs_uncached_greedy"]) + "x",
                                        _fmt(r["call_reduction"]) + "x", _fmt(r["cost_per_call_vs_greedy"]) + "x"]) + " |")
    return "\n".join(lines)


def quality_markdown(result) -> str:
    p = (result["settings"]["perceptual"] or {}).get("kind", "perceptual").upper().replace("STLPIPS", "ST-LPIPS")
    head = ["weights", "mode", "k", "PSNR real", "SSIM real", f"{p} real", "PSNR exact", "SSIM exact",
            f"{p} exact", "identical to greedy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["records"]:
        if r["method"] == "greedy-uncached":
            continue
        ident = "—" if r["identical_to_greedy"] is None else f"{100 * r['identical_to_greedy']:.1f}%"
        psnr_x = "inf" if r["psnr_vs_exact"] is None and r["ssim_vs_exact"] == 1.0 else _fmt(r["psnr_vs_exact"])
        lines.append("| " + " | ".join([r["weights"] or "—", r["mode"], _fmt(r["k"], 0) if r["k"] else "—",
                                        _fmt(r["psnr_vs_real"]), _fmt(r["ssim_vs_real"], 3),
                                        _fmt(r["perceptual_vs_real"], 4), psnr_x, _fmt(r["ssim_vs_exact"], 3),
                                        _fmt(r["perceptual_vs_exact"], 4), ident]) + " |")
    return "\n".join(lines)


def exact_markdown(result) -> str:
    rows = result["summary"]["exact_identical_to_greedy"]
    if not rows:
        return "No exact-mode rows in this run."
    lines = ["| weights | mode | k | identical to greedy |", "|---|---|---|---|"]
    for r in rows:
        same = round(r["identical_to_greedy"] * r["images"])
        lines.append(f"| {r['weights']} | {r['mode']} | {r['k']} | {same} / {r['images']} "
                     f"({100 * r['identical_to_greedy']:.1f}%) |")
    verdict = ("Exact mode gave output identical to greedy decoding on every image, at every k: it keeps its name."
               if result["summary"]["exact_all_identical"] else
               "**Exact mode differed from greedy decoding on some images: it does not deserve its name here.**")
    return verdict + "\n\n" + "\n".join(lines)


def differences(result) -> list[str]:
    """Where our numbers differ from the paper's, with the measured reasons we have."""
    out = []
    idx = _index(result)
    ks = result["settings"]["ks"]
    s = result["settings"]
    for w in result["weights"]:
        name, v, cfg = w["name"], w["variant"], w["config"]
        if v is None:
            out.append(f"`{name}`: not recognisably frozen or fine-tuned (name it `...frozen...` / `...finetuned...`, "
                       f"or pass `{name}:frozen`), so it has no Table 2 column to compare with.")
            continue
        for mode in ("exact-heads", "eps=2"):
            rows = [idx[(name, mode, k)] for k in ks if (name, mode, k) in idx]
            rows = [r for r in rows if r["paper_mean_block"] is not None]
            if not rows:
                continue
            d = np.mean([r["mean_block"] - r["paper_mean_block"] for r in rows])
            pairs = ", ".join(f"k={r['k']}: {r['mean_block']:.2f} vs {r['paper_mean_block']:.2f}" for r in rows)
            line = (f"`{name}` ({v}, {mode}): mean block {'above' if d > 0 else 'below'} the paper's by "
                    f"{abs(d):.2f} on average ({pairs}).")
            big = max(rows, key=lambda r: r["k"])
            acc = head_acceptance(big["block_hist"])
            if acc:
                line += (f" Measured at k={big['k']}: head 2 is accepted on {100 * acc[0]:.0f}% of steps "
                         f"(the paper's k=2 row implies {100 * (PAPER_TABLE2[(v, mode)][2] - 1):.0f}%); "
                         "given the heads before it were accepted, head j is accepted on "
                         + ", ".join(f"{100 * a:.0f}%" for a in acc) + " of steps (j = 2..k).")
            out.append(line)
        if v == "frozen" and cfg.get("head1") == "base":
            out.append(f"`{name}`: our p1 is the base model itself (head1='base'); the paper's p1 passes through "
                       "the head layer, so its frozen model is not bit-identical to the base. Both make exact "
                       "mode equal greedy decoding of the model that is decoded.")
        out.append(f"`{name}`: our model is d_model={cfg.get('d_model')}, {cfg.get('n_enc_layers')} encoder / "
                   f"{cfg.get('n_dec_layers')} decoder layers, heads hidden {cfg.get('head_ff')} per group "
                   f"(the paper: 512, 4 / 8 layers, 2048, trained 1M + 250k steps on 8 GPUs); it scores "
                   f"{w['bits_per_dim']:.3f} bits/dim on these faces. Block sizes and quality are those of this smaller, "
                   "shorter-trained model, not of the paper's.")
    sm = result["summary"]
    pk = sm["peak_speedup_vs_greedy"]
    if pk:
        out.append(f"Wall clock: our peak over greedy with a KV cache is {pk['speedup']:.2f}x ({pk['weights']}, "
                   f"{pk['mode']}, k={pk['k']}, mean block {pk['mean_block']:.2f}). " + paper_comparison(result))
        curve = [idx[(pk["weights"], pk["mode"], k)] for k in ks if (pk["weights"], pk["mode"], k) in idx]
        out.append("Why speed is not block size (measured, " + f"{pk['weights']} {pk['mode']}): speedup = call "
                   "reduction / cost of a call relative to a greedy call: " + "; ".join(
                       f"k={r['k']}: {r['call_reduction']:.2f} / {r['cost_per_call_vs_greedy']:.2f} = "
                       f"{r['speedup_vs_greedy']:.2f}x" for r in curve) + ". A blockwise call feeds k tokens "
                   "per image and runs the k-head layer, so it costs more than a greedy call: fewer calls buy less "
                   "than their count says, and past the peak the extra cost per call outgrows the saved calls.")
    g = [r for r in result["records"] if r["method"] == "greedy"]
    if g:
        out.append("Greedy decoding without a KV cache (the paper's decoder) is estimated "
                   + ", ".join(f"{r['speedup_vs_uncached_greedy']:.1f}x slower than with one ({r['weights']})" for r in g)
                   + ": what the cache adds. Our blockwise decoding over that uncached greedy mixes the cache's "
                   "gain with blockwise decoding's, so it is not the paper's speedup either; speedups over the "
                   "cached greedy are what a user gets.")
    m = result["machine"]
    out.append(f"Hardware: the paper's is not given (batch 1). Ours: {m['cpu']}"
               + (f" + {m['gpu']}" if m.get("gpu") else "") + f", torch threads: {m['torch_threads']}, batch "
               f"{s['batch_size']}, {s['dtype']}; "
               + ("each run's machine and load averages are listed with its command"
                  if result.get("runs") else
                  f"load average {m['load_average_start']} at the start, {m['load_average_end']} at the end")
               + " (other processes slow every timing alike, not fairly: greedy runs first).")
    out.append(f"Data: the paper reports CelebA dev images; we use the first {result['data']['n_images']} faces of "
               f"{split_words(result['data'])} ({result['data']['split_size']} faces), 8x8 made by 4x4 box "
               "averaging.")
    return out


def report_markdown(result, files) -> str:
    m, s, d = result["machine"], result["settings"], result["data"]
    perc = s["perceptual"]
    sm = result["summary"]
    if result.get("runs"):
        produced = (f"Merged by `{result['command']}` on {result['created']} (UTC) from {len(result['runs'])} runs "
                    "with the same settings (per weights, runs over adjacent ranges of faces are pooled); each "
                    "row's speedup is against its weights' greedy, decoded batch by batch beside it:\n\n" + runs_markdown(result) + "\n\n")
    else:
        produced = (f"Produced by `{result['command']}` on {result['created']} (UTC).  \n"
                    f"Machine: {_machine_text(m)}.  \n")
    parts = [
        "# Blockwise parallel decoding: evaluation",
        produced +
        f"Data: `{d['path']}`, {split_words(d)}, "
        + (f"faces {d['first']}..{d['first'] + d['n_images'] - 1}" if d.get("first") else f"first {d['n_images']}")
        + f" of {d['split_size']} faces. "
        f"Batch size {s['batch_size']}, {s['dtype']}."
        + (f" **Input guidance: prior weight {s['prior_weight']:g}** in every decode (1 is the model as "
           "trained; greedy, exact and the paper's comparisons are all at this weight)."
           if s.get("prior_weight", 1.0) != 1 else ""),
        "## Mean accepted block size (the paper's Table 2 layout)",
        "Ours, with the paper's Table 2 value (CelebA dev) in brackets where it has one. The paper's exact "
        "column proposes with the heads alone: our exact-heads; our exact also recycles each verification's "
        "logits past its rejected proposal (the same output, longer blocks).",
        table2_markdown(result),
        f"![mean block size vs k]({Path(files['plot_mean_block']).name})",
        "## Wall-clock speed",
        "Seconds per image = decode wall time of each batch, summed, / images. Speedups are against greedy "
        "decoding of the same weights in the same run (greedy runs first). The no-cache greedy row is an "
        "estimate (see Method).",
        speed_markdown(result),
    ]
    if sm["peak_speedup_vs_greedy"]:
        pk = sm["peak_speedup_vs_greedy"]
        parts.append(f"Peak: **{pk['speedup']:.2f}x** over KV-cached greedy ({pk['weights']}, {pk['mode']}, k={pk['k']}). "
                     + paper_comparison(result))
    parts += [
        f"![speedup vs k]({Path(files['plot_speedup']).name})",
        "## Exact mode is greedy decoding",
        exact_markdown(result),
        "## Quality",
        f"Against the real 32x32 face and against the same weights' exact-mode output (= greedy). "
        f"Perceptual distance: {perc['label'] if perc else 'not computed'} (lower is better). "
        "PSNR against an identical image is infinite.",
        quality_markdown(result),
        f"![quality vs eps]({Path(files['plot_quality']).name})",
        "## Bits per dimension",
        "| weights | variant | bits/dim |\n|---|---|---|\n" + "\n".join(
            f"| {w['name']} | {w['variant'] or '—'} | {w['bits_per_dim']:.4f} |" for w in result["weights"]),
        "## Where our numbers differ from the paper's, and why (as far as measured)",
        "\n".join(f"- {x}" for x in differences(result)),
        "## Method",
        "\n".join(f"- {x}" for x in method_notes(result)),
        "## Image grid",
        "Columns: 8x8 input, bicubic, greedy, blockwise exact, blockwise approximate, real face.",
        "\n\n".join(f"![grid {n}]({Path(p).name})" for n, p in files.items() if n.startswith("grid_"))
        or "None here: a merged report has no images (the runs' own folders have their grids).",
    ]
    if result["skipped"]:
        parts += ["## Skipped", "\n".join(f"- {x}" for x in result["skipped"])]
    return "\n\n".join(parts) + "\n"


def _machine_text(m) -> str:
    return (f"{m['cpu']} ({m['cpu_count']} cores, torch threads: {m['torch_threads']})"
            + (f", {m['gpu']}" if m.get("gpu") else "") + f", torch {m['torch']}, device {m['device']}; "
            f"load average {m['load_average_start']} -> {m['load_average_end']}")


def runs_markdown(result) -> str:
    """A merged result's runs: which weights each measured, with its command, date and machine."""
    lines = []
    for r in result["runs"]:
        st = r.get("decode_store") or {}
        sit = st.get("sittings") or {}
        lines.append(f"- {', '.join(r['weights'])}, faces {r['first']}..{r['first'] + r['n_images'] - 1}: "
                     f"`{r['command']}`, finished {r['created']}; {_machine_text(r['machine'])}"
                     + (f"; decoded in {len(sit)} sitting(s), {st.get('batches_reused', 0)} batches read back"
                        if sit else "") + ".")
    return "\n".join(lines)


def method_notes(result) -> list[str]:
    s = result["settings"]
    perc = s["perceptual"]
    notes = [
        "Mean accepted block size: all tokens / all decoding steps over the images (3072 tokens per image; "
        "a step is one accepted block). Calls per image count the first, prefix-free call too.",
        f"PSNR: `skimage.metrics.peak_signal_noise_ratio`, {s['psnr']}, per image on uint8 RGB, then averaged.",
        f"SSIM: `skimage.metrics.structural_similarity`, {s['ssim']}, per image, then averaged.",
        (f"Perceptual distance: {perc['label']}, inputs {perc['resize']} to [-1, 1]. {perc['note']}."
         if perc else "Perceptual distance: not computed (--perceptual none)."),
        "Bits/dim: " + s["bits_per_dim"] + ".",
        f"Greedy without a KV cache: the real decoder (`decoding.greedy_uncached`) is timed on the first "
        f"{s['uncached_prefix_tokens']} tokens of one batch, and one step (forward over the prefix + argmax) is "
        "timed (median of 3) at every prefix length it uses (whole attention blocks, L, 2L, ..., 3072); those "
        "step costs are summed over the decoder's 3072 steps (no curve is fitted). Its cost per token grows "
        "with the prefix over the whole image, so a linear extrapolation of the first tokens would be too low "
        "(the row's notes give both).",
    ]
    store = s.get("decode_store") or {}
    if store.get("sittings"):
        sit = store["sittings"]
        notes.append(
            "Decoding order: each batch of faces was decoded greedily and then in every mode before the next "
            "batch, so greedy and blockwise timings of a batch come from the same minutes. "
            + (f"This run resumed a stopped one: {store['batches_reused']} of {sum(sit.values())} batches were "
               f"read back from `{store['dir']}`; the batches came from {len(sit)} sittings ("
               + "; ".join(f"{k}: {v} batches" for k, v in sit.items()) + ")."
               if len(sit) > 1 or store.get("batches_reused") else "All batches were decoded in this sitting."))
    replayed = [r for r in result["records"] if r.get("block_stats_from") == "replay"]
    if replayed:
        r0 = replayed[0]
        notes.append(
            f"Exact-heads block sizes of all {r0['n_images']} faces come from a replay "
            "(`decoding.exact_block_stats`): exact mode's output is the greedy output, and a decoder state "
            "depends only on its prefix, bit for bit, never on the call it comes in (tested), so one "
            "teacher-forced pass of the decoder's own `step` over the greedy tokens yields every state "
            "exact decoding would see; walking the image with the heads' proposals gives its accepted blocks "
            f"for every k. "
            + (" and ".join(dict.fromkeys(f"{r['n_images_decoded']} faces of {r['weights']}" for r in replayed))
               + f" (the first {s['decode_exact']} of each run) were" if result.get("runs")
               else f"The first {r0['n_images_decoded']} faces were") + " also decoded for real: their "
            "seconds per image, identity to greedy and quality are the rows' ones, and the replay matched "
            "their blocks and calls on "
            + ", ".join(f"{100 * r['replay_matches_decoded']:.0f}%" for r in replayed) + " of them.")
    for w in result["weights"]:  # a merged result: each run's own estimate (the row pools them)
        for part in w.get("parts") or [{"uncached_timing": w["uncached_timing"]}]:
            u = part["uncached_timing"]
            who = (f"{w['name']}, faces {part['first']}..{part['first'] + part['n_images'] - 1}" if "first" in part
                   else w["name"])
            notes.append(f"{who}: no-cache prefix measured {u['prefix_seconds_measured']:.3f} s vs "
                         f"{u['prefix_seconds_predicted']:.3f} s predicted by the step timings ({u['prefix_check']:.2f}x); "
                         f"estimate {u['estimate_seconds_batch'] / u['batch']:.2f} s per image, linear extrapolation "
                         f"{u['linear_extrapolation_seconds_batch'] / u['batch']:.2f} s"
                         + (f", whole decode measured {u['seconds_batch'] / u['batch']:.2f} s." if u["measured"] else "."))
    return notes


def summary_markdown(result) -> str:
    """One row per (weights, mode, k): block size beside the paper's, how many faces gave the
    blocks and how many were decoded, speed against greedy, quality against the real face, and
    identity to greedy. Exact rows that match greedy on every decoded face show "= greedy" for
    quality, since their outputs are greedy's (their decoded subset would only add noise)."""
    p = (result["settings"]["perceptual"] or {}).get("kind", "perceptual").upper().replace("STLPIPS", "ST-LPIPS")
    head = ["weights", "mode", "k", "mean block (paper)", "faces: blocks / decoded", "s/image", "vs greedy",
            "PSNR", "SSIM", p, "identical to greedy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["records"]:
        if r["method"] == "greedy-uncached":
            continue
        if r["method"] in ("bicubic", "nearest"):
            lines.append("| " + " | ".join(["—", r["method"], "—", "—", str(r["n_images"]), "—", "—",
                                            _fmt(r["psnr_vs_real"]), _fmt(r["ssim_vs_real"], 3),
                                            _fmt(r["perceptual_vs_real"], 3), "—"]) + " |")
            continue
        paper = r["paper_mean_block"]
        block = _fmt(r["mean_block"]) + (f" ({paper:.2f})" if paper is not None else "")
        ident, same_as_greedy = "—", False
        if r["method"] == "blockwise" and r["identical_to_greedy"] is not None and r["exact_by_construction"]:
            n = r["n_images_decoded"]
            ident = f"{round(r['identical_to_greedy'] * n)}/{n}"
            same_as_greedy = r["identical_to_greedy"] == 1.0
        quality = (["= greedy"] * 3 if same_as_greedy else
                   [_fmt(r["psnr_vs_real"]), _fmt(r["ssim_vs_real"], 3), _fmt(r["perceptual_vs_real"], 3)])
        lines.append("| " + " | ".join([r["weights"], r["mode"], str(r["k"]), block,
                                        f"{r['n_images']} / {r['n_images_decoded']}",
                                        _fmt(r["seconds_per_image"]), _fmt(r["speedup_vs_greedy"]) + "x",
                                        *quality, ident]) + " |")
    return "\n".join(lines)


def headline_markdown(result, files) -> str:
    """The headline tables and plot, with command, date and machine: for the README."""
    m = result["machine"]
    pk = result["summary"]["peak_speedup_vs_greedy"]
    peak = (f"Peak wall-clock speedup {pk['speedup']:.2f}x over KV-cached greedy ({pk['weights']}, {pk['mode']}, "
            f"k={pk['k']}). " + paper_comparison(result) if pk else "")
    if result.get("runs"):
        provenance = (f"{result['data']['n_images']} faces, batch {result['settings']['batch_size']}; "
                      f"{len(result['runs'])} runs merged by `{result['command']}`:\n\n" + runs_markdown(result))
        every_row = "Every row: block size, speed and quality; speed against greedy decoded beside it:"
    else:
        provenance = (f"Command: `{result['command']}`; {result['created']}; {m['cpu']}"
                      + (f", {m['gpu']}" if m.get("gpu") else "") + f", torch threads: {m['torch_threads']}, "
                      f"batch {result['settings']['batch_size']}, {result['data']['n_images']} faces.")
        every_row = "Every row: block size, speed and quality from the same run:"
    return "\n\n".join([
        f"Mean accepted block size on {split_words(result['data'])}, ours (paper's Table 2):",
        table2_markdown(result), peak, every_row,
        summary_markdown(result),
        f"![speedup vs k]({Path(files['plot_speedup']).name})",
        provenance,
    ]) + "\n"


def write_all(result: dict, samples: dict, out: Path) -> dict:
    """Plots, image grids, report.md and headline.md under `out`; returns their paths."""
    out = Path(out)
    files = {"plot_mean_block": str(out / "mean_block_vs_k.png"), "plot_speedup": str(out / "speedup_vs_k.png"),
             "plot_quality": str(out / "quality_vs_eps.png")}
    plot_mean_block(result, Path(files["plot_mean_block"]))
    plot_speedup(result, Path(files["plot_speedup"]))
    plot_quality(result, Path(files["plot_quality"]))
    for name, m in samples["models"].items():
        ks = sorted({k for k, _ in (key for key in m if key != "greedy")})
        k = 6 if 6 in ks else max(ks, default=None)
        modes = [mode for kk, mode in (key for key in m if key != "greedy") if kk == k]
        exact = next((x for x in ("exact", "exact-heads") if x in modes), None)
        approx = next((x for x in modes if x.startswith("eps=")), None) or next(
            (x for x in modes if x not in ("exact", "exact-heads")), None)
        p = out / f"grid_{name.replace('/', '_')}.png"  # a checkpoint's name has its run folder
        grid_image(samples, name, k, exact, approx).save(p)
        files[f"grid_{name}"] = str(p)
    files["report"] = str(out / "report.md")
    files["headline"] = str(out / "headline.md")
    Path(files["report"]).write_text(report_markdown(result, files))
    Path(files["headline"]).write_text(headline_markdown(result, files))
    return files


def _write_outputs(result: dict, samples: dict, out: Path, json_path: Path) -> dict:
    """Report, plots, grids under `out`, then the JSON (with their paths) at `json_path`."""
    files = {"json": str(json_path)}
    files.update(write_all(result, samples, out))
    result["files"] = files
    write_json(result, json_path)
    return result

