"""The evaluation run: speed and quality of every (weights, k, mode), measured side by side on
the held-out test split, written as JSON, a Markdown report beside the paper's Table 2, plots and
an image grid.

The paper's lesson is that block size is not speed and speed is not quality, so one run measures
all three on the same images, the same machine and the same process (a resumed run: the same
sitting for each batch of faces, see DecodeStore):
- block size: mean accepted block (tokens per decoding step, Table 2's measure), model calls;
- speed: seconds per image and speedup over greedy decoding with a KV cache, run first, in the
  same run (and over greedy without a cache, as the paper's reference code runs);
- quality: PSNR, SSIM and a perceptual distance against the real face and against the model's own
  exact (= greedy) output; the bicubic and nearest-neighbour upscalings of the 8x8 input are rows too.
The JSON layout (one record per weights x k x mode) is documented in docs/evaluate.md and in
RECORD_FIELDS below; it is versioned by SCHEMA_VERSION.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shlex
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import metrics
from .checkpoints import load_model, read_card, resolve, sha256_of
from .data import DEFAULT_DATA, downsample_8, enlarge, load_faces, to_tokens
from .decoding import DecodeOptions, DecodeStats, decode, exact_block_stats, greedy_uncached, pooled_block_hist
from .model import SEQ_LEN

STORE_VERSION = 1  # layout of a DecodeStore batch file
# the code a stored batch's output and timing depend on: a change to it invalidates the store
CODE_VERSION = hashlib.sha256(b"".join((Path(__file__).parent / f).read_bytes()
                                       for f in ("decoding.py", "model.py"))).hexdigest()[:16]

SCHEMA = "sr-blockwise-evaluate"
SCHEMA_VERSION = 2  # 2: exact rows may take block statistics from the replay

# The paper's Table 2 (mean accepted block size, CelebA dev) and Figure 4's super-resolution peak.
PAPER_TABLE2 = {
    ("frozen", "exact"): {2: 1.07, 4: 1.08, 6: 1.09, 8: 1.09, 10: 1.10},
    ("frozen", "eps=2"): {2: 1.24, 4: 1.36, 6: 1.38, 8: 1.49, 10: 1.40},
    ("fine-tuned", "exact"): {2: 1.59, 4: 2.11, 6: 2.23, 8: 2.17, 10: 2.04},
    ("fine-tuned", "eps=2"): {2: 1.96, 4: 3.75, 6: 5.25, 8: 6.36, 10: 6.79},
}
PAPER_PEAK = {"speedup": 4.0, "k": 6, "variant": "fine-tuned", "mode": "eps=2", "mean_block": 5.3,
              "baseline": "greedy decoding in tensor2tensor (no KV cache); hardware not given; batch 1"}

# Every record has exactly these fields (null where they do not apply), in this order.
RECORD_FIELDS = {
    "weights": "weights name (the .json file's stem); null for bicubic and nearest",
    "variant": "frozen | fine-tuned | null: which column of the paper's Table 2 the weights match",
    "method": "greedy | greedy-uncached | blockwise | bicubic | nearest",
    "mode": "greedy | greedy-uncached | exact | eps=E | top-k=N | min-block=N | oracle | bicubic | nearest",
    "k": "block size (tokens proposed per call); 1 for greedy; null for bicubic and nearest",
    "rule": "acceptance rule passed to the decoder: exact | eps | topk | oracle; null for bicubic and nearest",
    "eps": "eps rule: accepted distance in intensity levels",
    "top_k": "topk rule: proposal accepted if among p1's top_k values",
    "min_block": "tokens accepted per call whatever the rule says",
    "exact_by_construction": "true if the mode promises output identical to greedy",
    "n_images": "images the block statistics (mean_block, block_hist, calls) cover",
    "n_images_decoded": "images decoded for real: seconds, speedups, identity and quality cover these",
    "block_stats_from": "decoded | replay (exact modes: decoding.exact_block_stats on the greedy output)",
    "replay_matches_decoded": "exact modes: share of decoded images whose replayed blocks and calls equal "
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


# ---------------------------------------------------------------- modes, options

@dataclass(frozen=True)
class Mode:
    name: str  # canonical label: exact, eps=2, top-k=3, min-block=2, oracle, greedy
    rule: str = "exact"
    eps: int = 0
    top_k: int = 1
    min_block: int = 1
    propose: str = "argmax"  # eps-window=E: the heads propose window centres (decoding.window_centre)

    def options(self, k: int, prior_weight: float = 1.0) -> DecodeOptions:
        return DecodeOptions(k=k, rule=self.rule, eps=self.eps, top_k=self.top_k, min_block=self.min_block,
                             propose=self.propose, prior_weight=prior_weight)


def parse_mode(text: str) -> Mode:
    """greedy | exact | oracle | eps=E | eps-window=E | top-k=N | min-block=N (min-block uses the
    exact rule; eps-window is the eps rule with window-centre proposals)."""
    t = text.strip().lower().replace("_", "-")
    if t in ("greedy", "exact", "oracle"):
        return Mode(t, rule="oracle" if t == "oracle" else "exact")
    name, eq, val = t.partition("=")
    if not eq or not val.strip().lstrip("-").isdigit():
        raise ValueError(f"unknown mode {text!r}: use greedy, exact, oracle, eps=E, eps-window=E, top-k=N or min-block=N")
    v = int(val)
    if name == "eps":
        if v < 0:
            raise ValueError(f"mode {text!r}: eps must be >= 0")
        return Mode(f"eps={v}", rule="eps", eps=v)
    if name == "eps-window":
        if v < 1:
            raise ValueError(f"mode {text!r}: eps-window needs eps >= 1")
        return Mode(f"eps-window={v}", rule="eps", eps=v, propose="window")
    if name in ("top-k", "topk"):
        if v < 1:
            raise ValueError(f"mode {text!r}: top-k must be >= 1")
        return Mode(f"top-k={v}", rule="topk", top_k=v)
    if name in ("min-block", "minblock"):
        if v < 1:
            raise ValueError(f"mode {text!r}: min-block must be >= 1")
        return Mode(f"min-block={v}", rule="exact", min_block=v)
    raise ValueError(f"unknown mode {text!r}: use greedy, exact, oracle, eps=E, eps-window=E, top-k=N or min-block=N")


def parse_list(text, kind=str) -> list:
    """'2,4,6' or ['2,4', '6'] -> [2, 4, 6]."""
    parts = [text] if isinstance(text, str) else list(text)
    out = [p.strip() for s in parts for p in str(s).split(",") if p.strip()]
    try:
        return [kind(p) for p in out]
    except ValueError:
        raise ValueError(f"could not read {text!r} as a comma-separated list") from None


def weights_spec(spec: str) -> tuple[str, str | None]:
    """NAME_OR_PATH[:frozen|:fine-tuned] -> (name_or_path, variant or None)."""
    head, sep, tail = spec.rpartition(":")
    if sep and tail.lower().replace("_", "-") in ("frozen", "fine-tuned", "finetuned"):
        return head, "frozen" if tail.lower() == "frozen" else "fine-tuned"
    return spec, None


def weights_name(path: Path) -> str:
    """What a weights file is called in the report: shipped weights by their name, a training
    checkpoint by its run folder too (every run's checkpoint is called last.pt)."""
    return f"{path.parent.name}/{path.stem}" if path.suffix == ".pt" else path.stem


def infer_variant(name: str, meta: dict) -> str | None:
    """Which column of Table 2 weights belong to: from the name, else the card's training stage."""
    n = name.lower().replace("_", "-")
    if "finetun" in n or "fine-tun" in n:
        return "fine-tuned"
    if "frozen" in n:
        return "frozen"
    stage = str(meta.get("stage", "")).lower()
    return {"finetune": "fine-tuned", "heads": "frozen", "base": "frozen"}.get(stage)


@dataclass
class EvalConfig:
    weights: list[str] = field(default_factory=lambda: ["cpu-frozen", "cpu-finetuned"])
    data: str | None = None  # default: the project's data (SR_BLOCKWISE_DATA), held-out test split
    n_images: int = 500
    limit: int | None = None  # smoke tests: at most this many images
    first: int = 0  # skip this many test faces: a run in parts (merged with --merge)
    ks: list[int] = field(default_factory=lambda: [2, 4, 6, 8, 10])
    modes: list[str] = field(default_factory=lambda: ["exact", "eps=2"])
    batch_size: int = 1  # the paper's Figure 4 is at batch 1
    dtype: str = "bf16"
    device: str = "cpu"
    threads: int = 0  # 0: torch's default
    out: str = "results"
    json_path: str | None = None  # default OUT/results.json
    perceptual: str = "auto"  # auto | lpips | stlpips | stlpips-vgg | none
    uncached_prefix: int = 64  # tokens of the real no-cache decoder to run (see time_uncached_greedy)
    # exact modes: decode only the first N images for real (timing, identity, quality); block
    # statistics of all images come from the replay (decoding.exact_block_stats). None: decode all
    decode_exact: int | None = None
    # other modes (eps, top-k, ...): decode only the first N images (they cannot be replayed)
    decode_approx: int | None = None
    grid_images: int = 6
    progress: bool = True
    # finished decode batches are saved here (None: nowhere); with resume=True, batches already
    # there are read back instead of decoded again, so a stopped run goes on where it was
    cache_dir: str | None = None
    resume: bool = False
    # input guidance of every decode (decoding.DecodeOptions.prior_weight); 1: the model as trained.
    # bits/dim are always the model's as trained
    prior_weight: float = 1.0

    def command(self) -> str:
        """The command line that reproduces this run."""
        a = ["sr-blockwise", "evaluate", "--weights", *self.weights]
        if self.data:
            a += ["--data", str(self.data)]
        if self.first:
            a += ["--first", str(self.first)]
        a += ["--n-images", str(self.n_images)]
        if self.limit is not None:
            a += ["--limit", str(self.limit)]
        a += ["--k", ",".join(map(str, self.ks)), "--modes", ",".join(self.modes),
              "--batch-size", str(self.batch_size), "--dtype", self.dtype, "--device", self.device]
        if self.threads:
            a += ["--threads", str(self.threads)]
        if self.decode_exact is not None:
            a += ["--decode-exact", str(self.decode_exact)]
        if self.decode_approx is not None:
            a += ["--decode-approx", str(self.decode_approx)]
        a += ["--uncached-prefix", str(self.uncached_prefix)]
        a += ["--perceptual", self.perceptual, "--out", str(self.out)]
        a += ["--cache-dir", str(self.cache_dir) if self.cache_dir else "none"]
        if self.resume:
            a += ["--resume"]
        if self.json_path:
            a += ["--json", str(self.json_path)]
        if self.prior_weight != 1:
            a += ["--prior-weight", f"{self.prior_weight:g}"]
        return shlex.join(a)


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


# ---------------------------------------------------------------- measuring

def machine_info(device: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:  # the model name is more telling than "x86_64"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "device": device, "gpu": None,
            "load_average_start": _loadavg(), "load_average_end": None}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _loadavg():
    try:  # other processes on the machine slow every timing: record how busy it was
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class DecodeStore:
    """Finished decode batches on disk, one .npz each, so that a long evaluation (hours on a CPU)
    can be stopped and resumed. A batch's key is the hash of everything its output and timing
    depend on: the store format, the decoding code (CODE_VERSION), the weights file's sha256, the
    row (job) and its decode options, dtype, device, torch version and threads, and the 8x8 input
    bytes. Every batch keeps the sitting (process) that decoded it, so the report can say when
    timings come from more than one."""

    def __init__(self, root: str | Path | None, resume: bool, sitting: str):
        self.root = Path(root).expanduser() if root else None
        self.resume, self.sitting = resume, sitting
        self.reused = 0
        self.sittings: dict[str, int] = {}

    def key(self, weights_sha: str, job: str, opts: DecodeOptions, dtype: str, device: str,
            lr: np.ndarray) -> str:
        h = hashlib.sha256(json.dumps([STORE_VERSION, CODE_VERSION, weights_sha, job, repr(opts), dtype, device,
                                       torch.__version__, torch.get_num_threads(), list(lr.shape)]).encode())
        h.update(np.ascontiguousarray(lr).tobytes())
        return h.hexdigest()[:32]

    def load_group(self, keys: list[str]) -> list[dict] | None:
        """All the batches of one (faces, weights) group, or None unless every one is stored and
        readable: a group is decoded whole in one sitting, so its speed ratios compare the same
        minutes (a run stopped halfway through a group decodes the group again)."""
        if not (self.resume and self.root is not None):
            return None
        group = []
        for key in keys:
            try:
                with np.load(self.root / f"{key}.npz") as z:
                    group.append({"images": z["images"], "seconds": float(z["seconds"]), "sitting": str(z["sitting"]),
                                  "stats": [DecodeStats(int(c), [int(x) for x in h[:int(n)]], float(t))
                                            for c, h, n, t in zip(z["calls"], z["hists"], z["hist_len"],
                                                                  z["image_seconds"])]})
            except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # missing, torn or foreign
                return None
        self.reused += len(group)
        for b in group:
            self.sittings[b["sitting"]] = self.sittings.get(b["sitting"], 0) + 1
        return group

    def decode(self, model, lr: np.ndarray, opts: DecodeOptions, key: str) -> dict:
        """Decode one batch now and save it."""
        r = decode(model, lr, opts)
        b = {"images": r.images, "stats": r.stats, "seconds": r.seconds, "sitting": self.sitting}
        self.sittings[self.sitting] = self.sittings.get(self.sitting, 0) + 1
        if self.root is not None:
            K = max(len(st.block_hist) for st in r.stats)
            hists = np.zeros((len(r.stats), K), np.int64)
            for i, st in enumerate(r.stats):
                hists[i, :len(st.block_hist)] = st.block_hist
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f"{key}.{os.getpid()}.tmp.npz"
            np.savez(tmp, images=r.images, seconds=r.seconds, sitting=self.sitting,
                     calls=np.array([st.calls for st in r.stats]), hists=hists,
                     hist_len=np.array([len(st.block_hist) for st in r.stats]),
                     image_seconds=np.array([st.seconds for st in r.stats]))
            os.replace(tmp, self.root / f"{key}.npz")  # atomic: a killed run never leaves half a batch
        return b


def join_batches(batches: list[dict]) -> dict:
    """Per-batch decodes -> one run. Seconds per image = summed batch wall time / images."""
    return {"images": np.concatenate([b["images"] for b in batches]),
            "stats": [st for b in batches for st in b["stats"]],
            "seconds": sum(b["seconds"] for b in batches)}


@torch.no_grad()
def time_uncached_greedy(model, lr: np.ndarray, greedy_images: np.ndarray, prefix_tokens: int = 64,
                         device: str = "cpu", reps: int = 3, prior_weight: float = 1.0) -> dict:
    """Seconds for one batch of greedy decoding without a KV cache (the paper's reference decoder,
    `decoding.greedy_uncached`), estimated, since running it whole costs minutes per image.

    Step i of that decoder runs the full forward over the prefix rounded up to whole attention
    blocks, T_i = (i // L + 1) * L, so its cost grows with i over the whole image, not only over
    the first block: a linear extrapolation of the first tokens would be too low. We
    1. run the real decoder on the first `prefix_tokens` tokens (measured; its tokens are checked
       against the KV-cached greedy output), and
    2. time one step (forward over T tokens + p1's argmax, as the decoder does) at each of the
       3072 / L distinct prefix lengths T = L, 2L, ..., 3072 (median of `reps`), fit
       cost(T) = a + b T, and sum: estimate = sum_i cost(T_i) = L * sum_j cost(j L).
    With prefix_tokens=3072 the whole decode is run and its measured time is used instead.
    The measured prefix of step 1 is compared with the same sum over its steps (`prefix_check`)."""
    L = model.cfg.block_len
    m = max(1, min(prefix_tokens, SEQ_LEN))
    tokens, prefix_s = greedy_uncached(model, lr, m, prior_weight)
    want = to_tokens(greedy_images)[:, :m]
    src = torch.from_numpy(to_tokens(lr)).to(device)
    tgt = torch.from_numpy(to_tokens(greedy_images)).to(device)
    Ts = list(range(L, SEQ_LEN + 1, L))
    times = {T: [] for T in Ts}
    for _ in range(reps):  # round robin: a burst of load elsewhere hits one pass, not one T
        for T in Ts:
            _sync(device)
            t0 = time.perf_counter()
            h = model(src, tgt[:, :T])
            model.logits(h[:, T - 1], src, torch.full((len(src),), T - 1, device=src.device), prior_weight).argmax(-1)
            _sync(device)
            times[T].append(time.perf_counter() - t0)
    step = {T: float(np.median(v)) for T, v in times.items()}
    # a forward over T tokens costs a + b*T (local attention: every part is linear in T); the
    # least-squares line through the medians smooths out the rest of the noise
    b, a = np.polyfit(Ts, list(step.values()), 1) if len(Ts) > 1 else (0.0, step[L])
    cost = lambda T: a + b * T
    estimate = float(L * sum(cost(T) for T in step))
    predicted_prefix = float(sum(cost((i // L + 1) * L) for i in range(m)))
    measured = m == SEQ_LEN  # the whole decode was run: no estimate needed
    return {"seconds_batch": prefix_s if measured else estimate, "measured": measured,
            "estimate_seconds_batch": estimate, "batch": len(lr), "prefix_tokens": m,
            "prefix_seconds_measured": prefix_s, "prefix_seconds_predicted": predicted_prefix,
            "prefix_check": prefix_s / predicted_prefix if predicted_prefix else None,
            "prefix_tokens_match_cached": float((tokens == want).mean()),
            "linear_extrapolation_seconds_batch": prefix_s / m * SEQ_LEN,
            "step_cost_fit": {"a": float(a), "b": float(b)},
            "step_seconds_by_prefix": {str(T): s for T, s in step.items()}}


def quality(real: np.ndarray, exact: np.ndarray | None, images: np.ndarray, perceptual) -> dict:
    """The six quality fields: PSNR, SSIM, perceptual against the real faces and the exact output."""
    q = {"psnr_vs_real": metrics.mean(metrics.psnr(real, images)),
         "ssim_vs_real": metrics.mean(metrics.ssim(real, images)),
         "perceptual_vs_real": metrics.mean(perceptual(real, images)) if perceptual else None}
    if exact is not None:
        q |= {"psnr_vs_exact": metrics.mean(metrics.psnr(exact, images)),
              "ssim_vs_exact": metrics.mean(metrics.ssim(exact, images)),
              "perceptual_vs_exact": metrics.mean(perceptual(exact, images)) if perceptual else None}
    return q


def new_record(**values) -> dict:
    unknown = set(values) - set(RECORD_FIELDS)
    if unknown:
        raise KeyError(f"not record fields: {sorted(unknown)}")
    rec = dict.fromkeys(RECORD_FIELDS)
    rec["notes"] = []
    rec.update(values)
    return rec


def _decode_record(name, variant, mode: Mode, k, run, greedy, real) -> dict:
    stats = run["stats"]
    n = len(stats)
    hist, mean_block = pooled_block_hist(stats)
    calls = float(np.mean([s.calls for s in stats]))
    spi = run["seconds"] / n
    rec = new_record(weights=name, variant=variant, method="greedy" if mode.name == "greedy" else "blockwise",
                     mode=mode.name, k=k, rule=mode.rule, eps=mode.eps, top_k=mode.top_k,
                     min_block=mode.min_block, exact_by_construction=mode.options(k).is_exact,
                     n_images=n, n_images_decoded=n, block_stats_from="decoded",
                     mean_block=mean_block, block_hist=hist.tolist(),
                     calls_per_image=calls, seconds_per_image=spi, timing="measured",
                     paper_mean_block=PAPER_TABLE2.get((variant, mode.name), {}).get(k))
    if greedy is not None:
        g_spi, g_calls = greedy["seconds_per_image"], greedy["calls_per_image"]
        same = run["images"].reshape(n, -1) == greedy["_images"][:n].reshape(n, -1)
        rec.update(ratios_to_greedy(spi, calls, g_spi, g_calls),
                   identical_to_greedy=float(same.all(1).mean()), tokens_identical_to_greedy=float(same.mean()))
    return rec


def ratios_to_greedy(spi: float, calls: float, g_spi: float, g_calls: float) -> dict:
    """A blockwise row's speed against KV-cached greedy of the same weights: one place for the
    formulas, used by a run's records and by merged (pooled) ones."""
    return dict(speedup_vs_greedy=g_spi / spi, call_reduction=g_calls / calls,
                cost_per_call_vs_greedy=(spi / calls) / (g_spi / g_calls))


def _use_replay(rec: dict, replayed: list, decoded: list, greedy: dict) -> None:
    """Give an exact row the replay's block statistics over all images (it has decoded the first
    len(decoded)), and say how many decoded images the replay matched exactly."""
    same = [a.block_hist == b.block_hist and a.calls == b.calls for a, b in zip(decoded, replayed)]
    rec["replay_matches_decoded"] = float(np.mean(same))
    if not all(same):
        rec["notes"].append(f"REPLAY DIFFERS from decoding on {len(same) - sum(same)} of {len(same)} images")
    if len(replayed) > len(decoded):
        hist, mean_block = pooled_block_hist(replayed)
        calls = float(np.mean([s.calls for s in replayed]))
        rec.update(n_images=len(replayed), block_stats_from="replay", block_hist=hist.tolist(),
                   mean_block=mean_block, calls_per_image=calls,
                   call_reduction=greedy["calls_per_image"] / calls)
        rec["notes"].append(f"block statistics of all {len(replayed)} images from the replay "
                            f"(decoding.exact_block_stats); seconds, identity and quality from decoding the "
                            f"first {len(decoded)}")


def run_evaluation(cfg: EvalConfig, on_progress=None) -> tuple[dict, dict]:
    """Run everything; returns (result for the JSON, samples for the image grid).
    on_progress(result): called with the partial result after every finished row, so a long run
    that dies still leaves its numbers."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {cfg.dtype!r}: use {', '.join(DTYPES)}")
    if cfg.batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {cfg.batch_size}")
    for what, v in (("decode_exact", cfg.decode_exact), ("decode_approx", cfg.decode_approx)):
        if v is not None and v < 1:
            raise ValueError(f"{what} must be >= 1 image, got {v}")
    modes = [parse_mode(m) for m in cfg.modes]
    blockwise = [m for m in dict.fromkeys(modes) if m.name != "greedy"]
    ks = sorted(set(int(k) for k in cfg.ks))
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {ks}")
    specs = [weights_spec(w) for w in cfg.weights]
    if not specs:
        raise ValueError("no weights to evaluate")
    paths = [resolve(w) for w, _ in specs]  # fail early, before any decoding, on a bad name
    names = [weights_name(p) for p in paths]
    if len(set(names)) < len(names):  # rows are keyed by name: two would mix
        raise ValueError(f"two weights go by the same name in {names}: give each once")

    # the held-out test split (a folder of photos without split labels: everything)
    data_path = Path(cfg.data) if cfg.data else DEFAULT_DATA / "celeba32.npz"
    faces = load_faces(data_path, progress=cfg.progress).part("test")
    first = cfg.first
    if not 0 <= first < len(faces):
        raise ValueError(f"--first {first}: the test split of {data_path} has {len(faces)} faces (0..{len(faces) - 1})")
    n = min(cfg.n_images, cfg.limit if cfg.limit is not None else cfg.n_images, len(faces) - first)
    if n < 1:
        raise ValueError(f"{data_path}: no test images to evaluate")
    real = faces.images[first:first + n]
    lr = downsample_8(real)

    perceptual = None if cfg.perceptual == "none" else metrics.Perceptual(cfg.perceptual, cfg.device)
    records, weights_info, skipped = [], [], []
    result = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "complete": False,
        "created": None, "command": cfg.command(), "machine": machine_info(cfg.device),
        "data": {"path": str(data_path), "split": "test", "first": first, "n_images": n,
                 "split_size": len(faces), "first_images": faces.names[first:first + 3]},
        "settings": {"ks": ks, "modes": [m.name for m in modes], "batch_size": cfg.batch_size,
                     "dtype": cfg.dtype, "device": cfg.device, "psnr": dict(metrics.PSNR_SETTINGS),
                     "ssim": dict(metrics.SSIM_SETTINGS),
                     "perceptual": perceptual.describe() if perceptual else None,
                     "uncached_prefix_tokens": cfg.uncached_prefix,
                     "bits_per_dim": "fp32 forward, p1 logits, over the evaluated images",
                     "seconds_per_image": "decode wall time of each batch summed, / images",
                     "exact_reference": "the same weights' greedy output (exact mode must equal it)",
                     "decode_exact": cfg.decode_exact, "decode_approx": cfg.decode_approx,
                     "prior_weight": cfg.prior_weight},
        "weights": weights_info,
        "paper": {"table2": {f"{v}, {m}": {str(k): x for k, x in t.items()} for (v, m), t in PAPER_TABLE2.items()},
                  "peak_speedup": PAPER_PEAK},
        "skipped": skipped,
        "records": records,
        "summary": None,
    }

    def progress():
        if on_progress is not None:
            result["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            on_progress(result)
    G = min(cfg.grid_images, n, cfg.decode_exact or n, cfg.decode_approx or n)  # faces every row decodes
    samples = {"lr": lr[:G], "real": real[:G], "models": {}}

    # the no-model baseline rows (bicubic is also a grid column)
    for method, upscale, note in (
            ("bicubic", metrics.bicubic_baseline, "Pillow bicubic resize of the 8x8 input to 32x32"),
            ("nearest", metrics.nearest_baseline, "nearest-neighbour upscaling: each 8x8 input pixel as a 4x4 block")):
        out, secs = upscale(lr)
        samples[method] = out[:G]
        records.append(new_record(method=method, mode=method, n_images=n, seconds_per_image=secs / n,
                                  timing="measured", **quality(real, None, out, perceptual), notes=[note]))

    # the work list, for one progress bar over all decodes
    plan = []
    for (spec, forced), path in zip(specs, paths):
        card = read_card(path) if path.suffix == ".json" else {"config": torch.load(
            path, map_location="cpu", weights_only=True)["model_config"], "meta": {}}
        K = card["config"].get("n_blockwise", 1)
        jobs = []
        for k in ks:
            for m in blockwise:
                if k > K:
                    skipped.append(f"{weights_name(path)}: k={k} {m.name}: the weights have {K} heads")
                elif m.min_block > k:
                    skipped.append(f"{weights_name(path)}: k={k} {m.name}: min-block larger than k")
                else:
                    jobs.append((k, m))
        plan.append((path, forced, card, jobs))
    n_exact = n if cfg.decode_exact is None else min(n, cfg.decode_exact)
    n_approx = n if cfg.decode_approx is None else min(n, cfg.decode_approx)
    total = sum(n + sum(n_exact if m.options(k).is_exact else n_approx for k, m in jobs) for *_, jobs in plan)
    w = cfg.prior_weight
    bar = tqdm(total=total, unit="img", disable=not cfg.progress, dynamic_ncols=True)

    # Phase 1, the decodes, batch by batch: each batch of faces is decoded greedily and then in
    # every mode before the next batch starts, so every speed ratio compares decodes made in the
    # same minutes, also when a resumed run (--resume) spans several sittings.
    sitting = (f"{platform.node()} pid {os.getpid()} {datetime.now(timezone.utc).isoformat(timespec='seconds')}"
               f" #{uuid.uuid4().hex[:6]}")
    store = DecodeStore(cfg.cache_dir, cfg.resume, sitting)
    models, runs = {}, {}
    for path, forced, card, jobs in plan:
        name = weights_name(path)
        bar.set_description(f"{name}: loading")
        model = load_model(path, dtype=DTYPES[cfg.dtype], device=cfg.device)
        # warm-up (not timed): a short oracle decode runs every kernel the timed decodes will
        kw = max([k for k, _ in jobs], default=1)
        decode(model, lr[:1], DecodeOptions(k=kw, rule="oracle", prior_weight=w))
        models[name] = (model, card.get("sha256") or sha256_of(path))
        runs[name] = {"greedy": []} | {(k, m): [] for k, m in jobs}
    for i in range(0, n, cfg.batch_size):
        for path, forced, card, jobs in plan:
            name = weights_name(path)
            model, sha = models[name]
            todo = [("greedy", "greedy", DecodeOptions(k=1, prior_weight=w), n)] + [
                ((k, m), f"k={k} {m.name}", m.options(k, w), n_exact if m.options(k).is_exact else n_approx)
                for k, m in jobs]
            # modes limited by --decode-exact / --decode-approx decode only their first nd faces
            todo = [(job, label, opts, lr[i:min(i + cfg.batch_size, nd)]) for job, label, opts, nd in todo if i < nd]
            keys = [store.key(sha, label, opts, cfg.dtype, cfg.device, x) for _, label, opts, x in todo]
            group = store.load_group(keys)
            for j, ((job, label, opts, x), key) in enumerate(zip(todo, keys)):
                if group is None:
                    bar.set_description(f"{name}: {label}")
                runs[name][job].append(group[j] if group is not None else store.decode(model, x, opts, key))
                bar.update(len(x))
    result["settings"]["decode_store"] = {"dir": cfg.cache_dir, "resume": cfg.resume,
                                          "batches_reused": store.reused, "sittings": store.sittings}

    # Phase 2: the rows, from the decodes (and the cheap measurements that need no decoding)
    for path, forced, card, jobs in plan:
        name = weights_name(path)
        variant = forced or infer_variant(name, card.get("meta", {}))
        model = models[name][0]

        # greedy with the KV cache first: the reference for speed, identity and quality
        g = join_batches(runs[name]["greedy"])
        grec = _decode_record(name, variant, Mode("greedy"), 1, g, None, real)
        grec.update(speedup_vs_greedy=1.0, call_reduction=1.0, cost_per_call_vs_greedy=1.0,
                    identical_to_greedy=1.0, tokens_identical_to_greedy=1.0)
        grec.update(quality(real, g["images"], g["images"], perceptual))
        greedy = {**grec, "_images": g["images"]}
        samples["models"][name] = {"greedy": g["images"][:G]}

        # greedy without a KV cache, as the paper's reference code runs (timed on one batch)
        bar.set_description(f"{name}: greedy, no KV cache")
        b = min(cfg.batch_size, n)
        unc = time_uncached_greedy(model, lr[:b], g["images"][:b], cfg.uncached_prefix, cfg.device,
                                   prior_weight=w)
        u_spi = unc["seconds_batch"] / b
        urec = new_record(weights=name, variant=variant, method="greedy-uncached", mode="greedy-uncached", k=1,
                          rule="exact", eps=0, top_k=1, min_block=1, exact_by_construction=True, n_images=b,
                          n_images_decoded=b, block_stats_from="decoded",
                          mean_block=1.0, calls_per_image=float(SEQ_LEN), seconds_per_image=u_spi,
                          timing="measured" if unc["measured"] else "estimated",
                          notes=[("measured: the whole decode was run on one batch" if unc["measured"] else
                                  f"estimated from the first {unc['prefix_tokens']} tokens of the real decoder "
                                  f"({unc['prefix_seconds_measured']:.3f} s, {unc['prefix_check']:.2f}x the per-step "
                                  f"model) and timed steps at each prefix length; see docs/evaluate.md"),
                                 f"its first {unc['prefix_tokens']} tokens match the KV-cached greedy output "
                                 f"at {100 * unc['prefix_tokens_match_cached']:.1f}% of positions",
                                 f"a linear extrapolation of the prefix would say "
                                 f"{unc['linear_extrapolation_seconds_batch'] / b:.3f} s per image"])
        urec.update(ratios_to_greedy(u_spi, SEQ_LEN, grec["seconds_per_image"], grec["calls_per_image"]))
        grec["speedup_vs_uncached_greedy"] = u_spi / grec["seconds_per_image"]
        urec["speedup_vs_uncached_greedy"] = 1.0
        records += [grec, urec]
        progress()

        # exact modes' blocks for all images and every k from one teacher-forced pass over the
        # greedy output (cheap); checked against the real decodes of the first n_exact images
        ks_exact = sorted({k for k, m in jobs if m.options(k).is_exact})
        replay = {k: [] for k in ks_exact}
        if ks_exact:
            bar.set_description(f"{name}: exact-mode replay")
            for i in range(0, n, 32):
                for k, st in exact_block_stats(model, lr[i:i + 32], g["images"][i:i + 32], ks_exact,
                                               prior_weight=w).items():
                    replay[k] += st

        # the blockwise decodes
        for k, m in jobs:
            nd = n_exact if m.options(k).is_exact else n_approx
            r = join_batches(runs[name][(k, m)])
            rec = _decode_record(name, variant, m, k, r, greedy, real)
            rec.update(quality(real[:nd], g["images"][:nd], r["images"], perceptual))
            if m.options(k).is_exact:
                _use_replay(rec, replay[k], r["stats"], greedy)
            rec["speedup_vs_uncached_greedy"] = u_spi / rec["seconds_per_image"]
            if rec["exact_by_construction"] and rec["identical_to_greedy"] < 1:
                rec["notes"].append("NOT identical to greedy although the mode promises it")
            records.append(rec)
            samples["models"][name][(k, m.name)] = r["images"][:G]
            progress()

        # bits/dim of the real faces, in fp32 so the score does not depend on --dtype
        bar.set_description(f"{name}: bits/dim")
        del model, models[name]
        model32 = load_model(path, dtype=torch.float32, device=cfg.device)
        from .train import bits_per_dim
        bpd = bits_per_dim(model32, real, batch_size=8, bf16=False, device=cfg.device)
        del model32
        for rec in records:
            if rec["weights"] == name:
                rec["bits_per_dim"] = bpd
        weights_info.append({"name": name, "path": str(path), "variant": variant, "config": card["config"],
                             "meta": card.get("meta", {}), "bits_per_dim": bpd, "uncached_timing": unc})
    bar.close()
    result["machine"]["load_average_end"] = _loadavg()
    result["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["complete"] = True
    result["summary"] = summarize(result)
    return result, samples


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
    pick = lambda r, f: None if r is None else {"weights": r["weights"], "k": r["k"], "mode": r["mode"], "speedup": r[f],
                                                "mean_block": r["mean_block"]}
    return {"exact_identical_to_greedy": ident,
            "exact_all_identical": all(r["identical_to_greedy"] == 1.0 for r in exact),
            "replay_all_match": all(r["replay_matches_decoded"] == 1.0 for r in replayed),
            "peak_speedup_vs_greedy": pick(peak, "speedup_vs_greedy"),
            "peak_speedup_vs_uncached_greedy": pick(peak_u, "speedup_vs_uncached_greedy")}


# ---------------------------------------------------------------- writing

def _clean(x):
    """JSON has no inf/nan: write them as null (an infinite PSNR means identical images)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x


def write_json(result: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(result), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def evaluate(cfg: EvalConfig) -> dict:
    """Run and write everything under cfg.out; returns the result (with its "files")."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = Path(cfg.json_path) if cfg.json_path else out / "results.json"
    # the JSON is rewritten after every row ("complete": false) until the run ends; the rows come
    # after all decoding, and until then the decoded batches are in cfg.cache_dir
    result, samples = run_evaluation(cfg, on_progress=lambda r: write_json(r, json_path))
    return _write_outputs(result, samples, out, json_path)


def _write_outputs(result: dict, samples: dict, out: Path, json_path: Path) -> dict:
    """Report, plots, grids under `out`, then the JSON (with their paths) at `json_path`."""
    files = {"json": str(json_path)}
    files.update(write_all(result, samples, out))
    result["files"] = files
    write_json(result, json_path)
    return result


# ---------------------------------------------------------------- merging runs

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
    by_weights: dict[str, list] = {}
    for i, r in enumerate(results):
        where = r.get("_path", f"result {i + 1}")
        if r.get("schema") != SCHEMA or r.get("schema_version") != first.get("schema_version"):
            raise ValueError(f"{where}: not an sr-blockwise evaluate result of schema version "
                             f"{first.get('schema_version')} (got {r.get('schema')!r} {r.get('schema_version')!r})")
        if not r.get("complete"):
            raise ValueError(f"{where}: the run did not finish (complete: false); finish it with --resume first")
        data_of = lambda x: (Path(x["data"]["path"]).name, x["data"]["split"], x["data"]["split_size"])
        if data_of(r) != data_of(first):  # the file by its name: runs come from other machines
            raise ValueError(f"{where}: other data than the first result's: data.path (file name), data.split, data.split_size are "
                             f"{data_of(r)}, not {data_of(first)}")
        for key in MERGE_SAME_SETTINGS:
            mine, theirs = (x["settings"].get(key, SETTING_BEFORE_IT_EXISTED.get(key)) for x in (r, first))
            if mine != theirs:
                raise ValueError(f"{where}: settings.{key} is {mine!r}, not {theirs!r} as in the first "
                                 f"result: rows would not compare")
        for w in r["weights"]:
            by_weights.setdefault(w["name"], []).append((_faces(r), r, w))
    # every weights: its runs' faces side by side, from face 0, all weights up to the same face
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
    N = ends.pop()

    def rows(r, weights):
        return [x for x in r["records"] if x["weights"] == weights]

    # the no-model rows over the first weights' runs (they cover every face once); results from
    # before the nearest row was added have none, and a merge keeps it only if every run has it
    lead = next(iter(by_weights.values()))
    records = []
    for method in ("bicubic", "nearest"):
        rows_of = [[x for x in r["records"] if x["method"] == method] for _, r, _ in lead]
        if all(rows_of):
            records.append(pool_records([x for rs in rows_of for x in rs]))
    weights_info = []
    for name, parts in by_weights.items():
        keys = [(x["mode"], x["k"]) for x in rows(parts[0][1], name)]
        for (a, b), r, _ in parts[1:]:
            if [(x["mode"], x["k"]) for x in rows(r, name)] != keys:
                raise ValueError(f"{r.get('_path', 'a result')}: other rows for {name} than its first run's")
        pooled = [pool_records([rows(r, name)[j] for _, r, _ in parts]) for j in range(len(keys))]
        _relate(pooled)
        records += pooled
        w = dict(parts[0][2])
        w["bits_per_dim"] = sum(p[2]["bits_per_dim"] * (p[0][1] - p[0][0]) for p in parts) / N
        for x in pooled:
            x["bits_per_dim"] = w["bits_per_dim"]
        w["parts"] = [{"first": a, "n_images": b - a, "bits_per_dim": wi["bits_per_dim"],
                       "uncached_timing": wi["uncached_timing"]} for (a, b), _, wi in parts]
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


# ---------------------------------------------------------------- report, plots, grid

def _fmt(x, nd=2):
    if x is None:
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{nd}f}"


def grid_image(samples: dict, name: str, k: int, exact: str | None, approx: str | None):
    """Rows: faces; columns: 8x8 input, bicubic, greedy, blockwise exact, blockwise approx, real."""
    from PIL import Image, ImageDraw, ImageFont
    m = samples["models"][name]
    cols = [("8x8 input", enlarge(samples["lr"], 16)), ("bicubic", enlarge(samples["bicubic"], 4)),
            ("greedy", enlarge(m["greedy"], 4))]
    if exact:
        cols.append((f"{exact} k={k}", enlarge(m[(k, exact)], 4)))
    if approx:
        cols.append((f"{approx} k={k}", enlarge(m[(k, approx)], 4)))
    cols.append(("real", enlarge(samples["real"], 4)))
    S, pad, top = 128, 4, 22
    rows = len(samples["real"])
    W, H = len(cols) * (S + pad) + pad, top + rows * (S + pad) + pad
    img = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # older Pillow
        font = ImageFont.load_default()
    for c, (title, faces) in enumerate(cols):
        x = pad + c * (S + pad)
        draw.text((x + 2, 4), title, fill="black", font=font)
        for r in range(rows):
            img.paste(Image.fromarray(faces[r]), (x, top + r * (S + pad)))
    return img


def _index(result):
    return {(r["weights"], r["mode"], r["k"]): r for r in result["records"] if r["weights"]}


def _blockwise_lines(result):
    """(weights, mode) pairs that have blockwise rows, in run order."""
    seen = {}
    for r in result["records"]:
        if r["method"] == "blockwise":
            seen.setdefault((r["weights"], r["mode"]), []).append(r)
    return seen


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
        for mode in ("exact", "eps=2"):
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
    pk, pu = sm["peak_speedup_vs_greedy"], sm["peak_speedup_vs_uncached_greedy"]
    if pk:
        out.append(f"Wall clock: our peak over greedy with a KV cache is {pk['speedup']:.2f}x ({pk['weights']}, "
                   f"{pk['mode']}, k={pk['k']}, mean block {pk['mean_block']:.2f}); over greedy without a cache "
                   f"{pu['speedup']:.2f}x ({pu['weights']}, {pu['mode']}, k={pu['k']}); the paper: "
                   f"{PAPER_PEAK['speedup']}x at k={PAPER_PEAK['k']} ({PAPER_PEAK['variant']}, {PAPER_PEAK['mode']}, "
                   f"mean block {PAPER_PEAK['mean_block']}), over a decoder without a cache.")
        curve = [idx[(pk["weights"], pk["mode"], k)] for k in ks if (pk["weights"], pk["mode"], k) in idx]
        out.append("Why speed is not block size (measured, " + f"{pk['weights']} {pk['mode']}): speedup = call "
                   "reduction / cost of a call relative to a greedy call: " + "; ".join(
                       f"k={r['k']}: {r['call_reduction']:.2f} / {r['cost_per_call_vs_greedy']:.2f} = "
                       f"{r['speedup_vs_greedy']:.2f}x" for r in curve) + ". A blockwise call feeds k tokens "
                   "per image and runs the k-head layer, so it costs more than a greedy call: fewer calls buy less "
                   "than their count says, and past the peak the extra cost per call outgrows the saved calls.")
    g = [r for r in result["records"] if r["method"] == "greedy"]
    if g:
        out.append("The paper's baseline decoder has no KV cache. Ours without a cache is estimated "
                   + ", ".join(f"{r['speedup_vs_uncached_greedy']:.1f}x slower than with one ({r['weights']})" for r in g)
                   + "; speedups over that baseline are the comparable ones, speedups over the cached one are "
                   "what a user gets.")
    m = result["machine"]
    out.append(f"Hardware: the paper's is not given (batch 1). Ours: {m['cpu']}"
               + (f" + {m['gpu']}" if m.get("gpu") else "") + f", torch threads: {m['torch_threads']}, batch "
               f"{s['batch_size']}, {s['dtype']}; "
               + ("each run's machine and load averages are listed with its command"
                  if result.get("runs") else
                  f"load average {m['load_average_start']} at the start, {m['load_average_end']} at the end")
               + " (other processes slow every timing alike, not fairly: greedy runs first).")
    out.append(f"Data: the paper reports CelebA dev images; we use the first {result['data']['n_images']} faces of "
               f"the project's held-out test split ({result['data']['split_size']} faces), 8x8 made by 4x4 box "
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
        f"Data: `{d['path']}`, held-out test split, "
        + (f"faces {d['first']}..{d['first'] + d['n_images'] - 1}" if d.get("first") else f"first {d['n_images']}")
        + f" of {d['split_size']} faces. "
        f"Batch size {s['batch_size']}, {s['dtype']}."
        + (f" **Input guidance: prior weight {s['prior_weight']:g}** in every decode (1 is the model as "
           "trained; greedy, exact and the paper's comparisons are all at this weight)."
           if s.get("prior_weight", 1.0) != 1 else ""),
        "## Mean accepted block size (the paper's Table 2 layout)",
        "Ours, with the paper's Table 2 value (CelebA dev) in brackets where it has one.",
        table2_markdown(result),
        f"![mean block size vs k]({Path(files['plot_mean_block']).name})",
        "## Wall-clock speed",
        "Seconds per image = decode wall time of each batch, summed, / images. Speedups are against greedy "
        "decoding of the same weights in the same run (greedy runs first). The no-cache greedy row is an "
        "estimate (see Method).",
        speed_markdown(result),
    ]
    if sm["peak_speedup_vs_greedy"]:
        pk, pu = sm["peak_speedup_vs_greedy"], sm["peak_speedup_vs_uncached_greedy"]
        parts.append(f"Peak: **{pk['speedup']:.2f}x** over KV-cached greedy ({pk['weights']}, {pk['mode']}, k={pk['k']}); "
                     f"**{pu['speedup']:.2f}x** over greedy without a cache ({pu['weights']}, {pu['mode']}, k={pu['k']}). "
                     f"The paper: **{PAPER_PEAK['speedup']}x** at k={PAPER_PEAK['k']} ({PAPER_PEAK['variant']}, "
                     f"{PAPER_PEAK['mode']}).")
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
        "timed (median of 3) at every prefix length it uses (whole attention blocks, L, 2L, ..., 3072); a line "
        "a + b*T is fitted to those step costs and summed over the decoder's 3072 steps. Its cost per token "
        "grows with the prefix over the whole image, so a linear extrapolation of the first tokens would be "
        "too low (the row's notes give both).",
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
            f"Exact-mode block sizes of all {r0['n_images']} faces come from a replay "
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
    pu = result["summary"]["peak_speedup_vs_uncached_greedy"]
    peak = (f"Peak wall-clock speedup {pk['speedup']:.2f}x over KV-cached greedy ({pk['weights']}, {pk['mode']}, k={pk['k']}), "
            f"{pu['speedup']:.2f}x over greedy without a cache; the paper: 4.0x at k=6." if pk else "")
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
        "Mean accepted block size on the held-out test split, ours (paper's Table 2):",
        table2_markdown(result), peak, every_row,
        summary_markdown(result),
        f"![speedup vs k]({Path(files['plot_speedup']).name})",
        provenance,
    ]) + "\n"


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_mean_block(result, path: Path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    vmap = {w["name"]: w["variant"] for w in result["weights"]}
    drawn = set()
    for i, ((w, m), rows) in enumerate(_blockwise_lines(result).items()):
        c = f"C{i % 10}"
        ax.plot([1] + [r["k"] for r in rows], [1.0] + [r["mean_block"] for r in rows], "o-", color=c,
                label=f"ours: {w}, {m}")
        key = (vmap.get(w), m)
        if key in PAPER_TABLE2 and key not in drawn:
            drawn.add(key)
            t = PAPER_TABLE2[key]
            ax.plot([1] + list(t), [1.0] + list(t.values()), "x--", color=c, alpha=0.7,
                    label=f"paper: {key[0]}, {m}")
    ks = [1] + result["settings"]["ks"]
    ax.plot(ks, ks, ":", color="grey", label="upper bound (block = k)")
    ax.set(xlabel="k (block size)", ylabel="mean accepted block size", title="Mean accepted block size vs k")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speedup(result, path: Path):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharex=True)
    g = {r["weights"]: r for r in result["records"] if r["method"] == "greedy"}
    for i, ((w, m), rows) in enumerate(_blockwise_lines(result).items()):
        c = f"C{i % 10}"
        ks = [1] + [r["k"] for r in rows]
        axes[0].plot(ks, [1.0] + [r["speedup_vs_greedy"] for r in rows], "o-", color=c, label=f"{w}, {m}")
        axes[1].plot(ks, [g[w]["speedup_vs_uncached_greedy"]] + [r["speedup_vs_uncached_greedy"] for r in rows],
                     "o-", color=c, label=f"{w}, {m}")
    for ax, title in zip(axes, ["over greedy with a KV cache (same run)", "over greedy without a KV cache (est.)"]):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.plot([PAPER_PEAK["k"]], [PAPER_PEAK["speedup"]], "*", ms=14, color="black",
                label="paper: 4.0x at k=6 (fine-tuned, eps=2)")
        ax.set(xlabel="k (block size)", ylabel="wall-clock speedup", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _eps_of(mode):
    return 0 if mode == "exact" else int(mode.split("=")[1]) if mode.startswith("eps=") else None


def plot_quality(result, path: Path):
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    perc = (result["settings"]["perceptual"] or {}).get("label", "perceptual")
    fields = [("psnr", "PSNR (dB)"), ("ssim", "SSIM"), ("perceptual", perc)]
    lines = {}
    for r in result["records"]:
        e = _eps_of(r["mode"]) if r["method"] == "blockwise" else None
        if e is not None:
            lines.setdefault((r["weights"], r["k"]), []).append((e, r))
    bic = next((r for r in result["records"] if r["method"] == "bicubic"), None)
    for row, ref in enumerate(["real", "exact"]):
        for col, (f, label) in enumerate(fields):
            ax = axes[row, col]
            for i, ((w, k), pts) in enumerate(lines.items()):
                pts = sorted((e, r[f"{f}_vs_{ref}"]) for e, r in pts if r[f"{f}_vs_{ref}"] is not None
                             and math.isfinite(r[f"{f}_vs_{ref}"]))
                if pts:
                    ax.plot(*zip(*pts), "o-", color=f"C{i % 10}", label=f"{w}, k={k}", ms=4)
            if ref == "real" and bic is not None and bic[f"{f}_vs_real"] is not None:
                ax.axhline(bic[f"{f}_vs_real"], ls="--", color="grey", label="bicubic")
            ax.set(xlabel="eps (0 = exact)", ylabel=label, title=f"{label.split(' (')[0]} vs {ref}")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=6)
    fig.suptitle("Quality vs eps (against the real face, top; against the exact output, bottom)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        exact = "exact" if "exact" in modes else None
        approx = next((x for x in modes if x.startswith("eps=")), None) or next(
            (x for x in modes if x != "exact"), None)
        p = out / f"grid_{name.replace('/', '_')}.png"  # a checkpoint's name has its run folder
        grid_image(samples, name, k, exact, approx).save(p)
        files[f"grid_{name}"] = str(p)
    files["report"] = str(out / "report.md")
    files["headline"] = str(out / "headline.md")
    Path(files["report"]).write_text(report_markdown(result, files))
    Path(files["headline"]).write_text(headline_markdown(result, files))
    return files
