"""The evaluate result's schema: its records (one per weights x k x mode, RECORD_FIELDS), the
paper's Table 2 they are set beside, and the figures derived from records (ratios to greedy, the
summary's headline checks), shared by a run, a merge and the report."""
from __future__ import annotations

SCHEMA = "sr-blockwise-evaluate"

# 2: exact rows may take block statistics from the replay; 3: mode exact recycles proposals (not
# replayed), exact-heads is the heads alone (replayed; the paper's Table 2 exact column)
SCHEMA_VERSION = 3

# The paper's Table 2 (mean accepted block size, CelebA dev) and Figure 4's super-resolution peak.
PAPER_TABLE2 = {
    # the paper's exact column proposes with the heads alone: our exact-heads mode
    ("frozen", "exact-heads"): {2: 1.07, 4: 1.08, 6: 1.09, 8: 1.09, 10: 1.10},
    ("frozen", "eps=2"): {2: 1.24, 4: 1.36, 6: 1.38, 8: 1.49, 10: 1.40},
    ("fine-tuned", "exact-heads"): {2: 1.59, 4: 2.11, 6: 2.23, 8: 2.17, 10: 2.04},
    ("fine-tuned", "eps=2"): {2: 1.96, 4: 3.75, 6: 5.25, 8: 6.36, 10: 6.79},
}

PAPER_PEAK = {"speedup": 4.0, "k": 6, "variant": "fine-tuned", "mode": "eps=2", "mean_block": 5.3,
              "baseline": "greedy decoding in tensor2tensor (no KV cache); hardware not given; batch 1"}

# Every record has exactly these fields (null where they do not apply), in this order.
RECORD_FIELDS = {
    "weights": "weights name (the .json file's stem); null for bicubic and nearest",
    "variant": "frozen | fine-tuned | null: which column of the paper's Table 2 the weights match",
    "method": "greedy | greedy-uncached | blockwise | bicubic | nearest",
    "mode": "greedy | greedy-uncached | exact | exact-heads | eps=E | top-k=N | min-block=N | oracle | bicubic | nearest",
    "k": "block size (tokens proposed per call); 1 for greedy; null for bicubic and nearest",
    "rule": "acceptance rule passed to the decoder: exact | eps | topk | oracle; null for bicubic and nearest",
    "eps": "eps rule: accepted distance in intensity levels",
    "top_k": "topk rule: proposal accepted if among p1's top_k values",
    "min_block": "tokens accepted per call whatever the rule says",
    "exact_by_construction": "true if the mode promises output identical to greedy",
    "n_images": "images the block statistics (mean_block, block_hist, calls) cover",
    "n_images_decoded": "images decoded for real: seconds, speedups, identity and quality cover these",
    "block_stats_from": "decoded | replay (exact-heads modes: decoding.exact_block_stats on the greedy output)",
    "replay_matches_decoded": "exact-heads modes: share of decoded images whose replayed blocks and calls equal "
                              "the decoded ones (must be 1); null where no replay ran",
    "mean_block": "mean accepted block size: all tokens / all decoding steps, over the images",
    "block_hist": "block_hist[n-1] = decoding steps that accepted n tokens, summed over images",
    "calls_per_image": "model calls an image took part in, mean over images",
    "seconds_per_image": "decode wall time of all batches / images (batch size in settings)",
    "speedup_vs_greedy": "seconds_per_image of KV-cached greedy (same weights, same run) / this row's",
    "speedup_vs_uncached_greedy": "seconds_per_image of greedy without a KV cache (estimated) / this row's",
    "call_reduction": "greedy calls_per_image / this row's",
    "cost_per_call_vs_greedy": "(seconds per call of this row) / (seconds per call of KV-cached greedy)",
    "identical_to_greedy": "share of images whose output equals greedy's exactly (all 3072 values)",
    "tokens_identical_to_greedy": "share of output values equal to greedy's",
    "psnr_vs_real": "PSNR (dB) against the real 32x32 face, mean over images",
    "ssim_vs_real": "SSIM against the real face, mean over images",
    "perceptual_vs_real": "perceptual distance (settings.perceptual.label) against the real face, mean",
    "psnr_vs_exact": "PSNR against the same model's exact-mode (= greedy) output; null if infinite",
    "ssim_vs_exact": "SSIM against the same model's exact-mode output",
    "perceptual_vs_exact": "perceptual distance against the same model's exact-mode output",
    "bits_per_dim": "the weights' negative log-likelihood of the real faces, bits per intensity",
    "paper_mean_block": "the paper's Table 2 value for this variant, mode and k, if it has one",
    "timing": "measured | estimated (greedy-uncached; see notes and docs/evaluate.md)",
    "notes": "list of strings: anything a reader of this row should know",
}

def new_record(**values) -> dict:
    unknown = set(values) - set(RECORD_FIELDS)
    if unknown:
        raise KeyError(f"not record fields: {sorted(unknown)}")
    rec = dict.fromkeys(RECORD_FIELDS)
    rec["notes"] = []
    rec.update(values)
    return rec


def ratios_to_greedy(spi: float, calls: float, g_spi: float, g_calls: float) -> dict:
    """A blockwise row's speed against KV-cached greedy of the same weights: one place for the
    formulas, used by a run's records and by merged (pooled) ones."""
    return dict(speedup_vs_greedy=g_spi / spi, call_reduction=g_calls / calls,
                cost_per_call_vs_greedy=(spi / calls) / (g_spi / g_calls))


def summarize(result: dict) -> dict:
    """Exact-mode identity and the peak speedup, the two headline checks."""
    recs = result["records"]
    exact = [r for r in recs if r["method"] == "blockwise" and r["exact_by_construction"]]
    ident = [{"weights": r["weights"], "k": r["k"], "mode": r["mode"], "identical_to_greedy": r["identical_to_greedy"],
              "images": r["n_images_decoded"]} for r in exact]
    replayed = [r for r in exact if r.get("replay_matches_decoded") is not None]
    blk = [r for r in recs if r["method"] == "blockwise" and r["rule"] != "oracle"]  # oracle: a bound, not a decoder
    peak = max(blk, key=lambda r: r["speedup_vs_greedy"], default=None)
    peak_u = max(blk, key=lambda r: r["speedup_vs_uncached_greedy"], default=None)
    # the paper's decoders both re-run the prefix at every call: calls saved are what compares
    peak_c = max(blk, key=lambda r: r["call_reduction"] or 0, default=None)
    pick = lambda r, f: None if r is None else {"weights": r["weights"], "k": r["k"], "mode": r["mode"], "speedup": r[f],
                                                "mean_block": r["mean_block"]}
    return {"exact_identical_to_greedy": ident,
            "exact_all_identical": all(r["identical_to_greedy"] == 1.0 for r in exact),
            "replay_all_match": all(r["replay_matches_decoded"] == 1.0 for r in replayed),
            "peak_speedup_vs_greedy": pick(peak, "speedup_vs_greedy"),
            "peak_speedup_vs_uncached_greedy": pick(peak_u, "speedup_vs_uncached_greedy"),
            "peak_call_reduction": pick(peak_c, "call_reduction")}


def _index(result):
    return {(r["weights"], r["mode"], r["k"]): r for r in result["records"] if r["weights"]}


def _blockwise_lines(result):
    """(weights, mode) pairs that have blockwise rows, in run order."""
    seen = {}
    for r in result["records"]:
        if r["method"] == "blockwise":
            seen.setdefault((r["weights"], r["mode"]), []).append(r)
    return seen

