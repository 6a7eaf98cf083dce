"""The evaluation run: every weights decoded greedily and in every (k, mode), batch by batch, then
the rows (block size, speed, quality) from those decodes, plus greedy without a KV cache (timed
on one batch and estimated), exact mode's replay and bits/dim."""
from __future__ import annotations

import os
import platform
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .. import metrics
# portable_path: results name no folder of the machine that made them
from ..checkpoints import load_model, portable_path, read_card, read_checkpoint, resolve, sha256_of
from ..data import DEFAULT_DATA, downsample_8, load_faces, to_tokens
from ..decoding import DecodeOptions, decode, engine_for, exact_block_stats, greedy_uncached, pooled_block_hist
from ..model import SEQ_LEN
from .config import DTYPES, EvalConfig, Mode, infer_variant, parse_mode, weights_name, weights_spec
from .records import PAPER_PEAK, PAPER_TABLE2, SCHEMA, SCHEMA_VERSION, new_record, ratios_to_greedy, summarize
from .report import _write_outputs
from .store import DecodeStore, join_batches, write_json


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
       3072 / L distinct prefix lengths T = L, 2L, ..., 3072 (median of `reps`), and sum:
       estimate = sum_i step(T_i) = L * sum_j step(j L). No curve is fitted: a step's cost is no
       straight line in T (on the shipped model it grows faster than T, and a line through the
       medians goes below zero at T = L).
    With prefix_tokens=3072 the whole decode is run and its measured time is used instead.
    The measured prefix is compared with the same sum over its steps (`prefix_check`)."""
    L = model.cfg.block_len
    m = max(1, min(prefix_tokens, SEQ_LEN))
    greedy_uncached(model, lr, 1, prior_weight)  # untimed: a first call's one-time costs are no step's
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
    estimate = float(L * sum(step.values()))
    predicted_prefix = float(sum(step[(i // L + 1) * L] for i in range(m)))
    measured = m == SEQ_LEN  # the whole decode was run: no estimate needed
    return {"seconds_batch": prefix_s if measured else estimate, "measured": measured,
            "estimate_seconds_batch": estimate, "batch": len(lr), "prefix_tokens": m,
            "prefix_seconds_measured": prefix_s, "prefix_seconds_predicted": predicted_prefix,
            "prefix_check": prefix_s / predicted_prefix if predicted_prefix else None,
            "prefix_tokens_match_cached": float((tokens == want).mean()),
            "linear_extrapolation_seconds_batch": prefix_s / m * SEQ_LEN,
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


def _decode_record(name, variant, mode: Mode, k, run, greedy, real) -> dict:
    stats = run["stats"]
    n = len(stats)
    hist, mean_block = pooled_block_hist(stats)
    calls = float(np.mean([s.calls for s in stats]))
    spi = run["seconds"] / n
    rule = mode.settings
    rec = new_record(weights=name, variant=variant, method="greedy" if mode.name == "greedy" else "blockwise",
                     mode=mode.name, k=k, rule=rule.rule, eps=rule.eps, top_k=rule.top_k,
                     min_block=rule.min_block, exact_by_construction=mode.options(k).is_exact,
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


def replayable(opts: DecodeOptions) -> bool:
    """Whether exact_block_stats gives this decode's blocks without decoding: greedy's output with
    the heads' proposals alone (exact-heads); recycled proposals read logits past a rejected token,
    which no pass over the greedy output computes."""
    return opts.is_exact and opts.propose != "recycle" and not opts.tree


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
    return Evaluation(cfg, on_progress).run()


class Evaluation:
    """One evaluation run, in phases: the settings checked, the test faces read, the baseline rows,
    the work planned, every decode (phase 1), then each weights' rows from those decodes (phase 2)."""

    def __init__(self, cfg: EvalConfig, on_progress=None):
        self.cfg, self.on_progress = cfg, on_progress
        self.records, self.weights_info, self.skipped = [], [], []

    def run(self) -> tuple[dict, dict]:
        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.check()
        self.read_faces()
        self.perceptual = None if cfg.perceptual == "none" else metrics.Perceptual(cfg.perceptual, cfg.device)
        self.result = self.new_result()
        n = self.n
        self.G = min(cfg.grid_images, n, cfg.decode_exact or n, cfg.decode_approx or n)  # faces every row decodes
        self.samples = {"lr": self.lr[:self.G], "real": self.real[:self.G], "models": {}}
        self.baselines()
        self.plan_work()
        self.bar = tqdm(total=self.total, unit="img", disable=not cfg.progress, dynamic_ncols=True)
        self.decode_all()
        for path, forced, card, jobs in self.plan:
            self.weights_rows(path, forced, card, jobs)
        self.bar.close()
        result = self.result
        result["machine"]["load_average_end"] = _loadavg()
        result["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        result["complete"] = True
        result["summary"] = summarize(result)
        return result, self.samples

    def progress(self) -> None:
        if self.on_progress is not None:
            self.result["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self.on_progress(self.result)

    # ------------------------------------------------ settings, faces, the result begun

    def check(self) -> None:
        """The settings refused before any work, the weights found (a bad name fails here)."""
        cfg = self.cfg
        if cfg.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {cfg.dtype!r}: use {', '.join(DTYPES)}")
        if cfg.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {cfg.batch_size}")
        for what, v in (("decode_exact", cfg.decode_exact), ("decode_approx", cfg.decode_approx)):
            if v is not None and v < 1:
                raise ValueError(f"{what} must be >= 1 image, got {v}")
        self.modes = [parse_mode(m) for m in cfg.modes]
        self.blockwise = [m for m in dict.fromkeys(self.modes) if m.name != "greedy"]
        self.ks = sorted(set(int(k) for k in cfg.ks))
        if any(k < 1 for k in self.ks):
            raise ValueError(f"every k must be >= 1, got {self.ks}")
        self.specs = [weights_spec(w) for w in cfg.weights]
        if not self.specs:
            raise ValueError("no weights to evaluate")
        self.paths = [resolve(w) for w, _ in self.specs]  # fail early, before any decoding, on a bad name
        names = [weights_name(p) for p in self.paths]
        if len(set(names)) < len(names):  # rows are keyed by name: two would mix
            raise ValueError(f"two weights go by the same name in {names}: give each once")

    def read_faces(self) -> None:
        """The held-out test split (a folder of photos without split labels: everything)."""
        cfg = self.cfg
        self.data_path = Path(cfg.data) if cfg.data else DEFAULT_DATA / "celeba32.npz"
        self.faces = faces = load_faces(self.data_path, progress=cfg.progress).part("test")
        first = cfg.first
        if not 0 <= first < len(faces):
            raise ValueError(f"--first {first}: the test split of {self.data_path} has {len(faces)} faces "
                             f"(0..{len(faces) - 1})")
        self.n = n = min(cfg.n_images, cfg.limit if cfg.limit is not None else cfg.n_images, len(faces) - first)
        if n < 1:
            raise ValueError(f"{self.data_path}: no test images to evaluate")
        self.real = faces.images[first:first + n]
        self.lr = downsample_8(self.real)

    def new_result(self) -> dict:
        """The result as the JSON holds it, before any row."""
        cfg, faces, first, n, perceptual = self.cfg, self.faces, self.cfg.first, self.n, self.perceptual
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "complete": False,
            "created": None, "command": cfg.command(), "machine": machine_info(cfg.device),
            "data": {"path": portable_path(self.data_path), "split": "test", "first": first, "n_images": n,
                     "split_size": len(faces), "first_images": faces.names[first:first + 3],
                     # a folder without CelebA partition labels: every face counts as a test face
                     "labelled": bool((np.asarray(faces.split) >= 0).any())},
            "settings": {"ks": self.ks, "modes": [m.name for m in self.modes], "batch_size": cfg.batch_size,
                         "dtype": cfg.dtype, "device": cfg.device, "psnr": dict(metrics.PSNR_SETTINGS),
                         "ssim": dict(metrics.SSIM_SETTINGS),
                         "perceptual": perceptual.describe() if perceptual else None,
                         "uncached_prefix_tokens": cfg.uncached_prefix,
                         "bits_per_dim": "fp32 forward, p1 logits, over the evaluated images",
                         "seconds_per_image": "decode wall time of each batch summed, / images",
                         "exact_reference": "the same weights' greedy output (exact mode must equal it)",
                         "decode_exact": cfg.decode_exact, "decode_approx": cfg.decode_approx,
                         "prior_weight": cfg.prior_weight},
            "weights": self.weights_info,
            "paper": {"table2": {f"{v}, {m}": {str(k): x for k, x in t.items()} for (v, m), t in PAPER_TABLE2.items()},
                      "peak_speedup": PAPER_PEAK},
            "skipped": self.skipped,
            "records": self.records,
            "summary": None,
        }

    def baselines(self) -> None:
        """The no-model baseline rows (bicubic is also a grid column)."""
        n, lr, real = self.n, self.lr, self.real
        for method, upscale, note in (
                ("bicubic", metrics.bicubic_baseline, "Pillow bicubic resize of the 8x8 input to 32x32"),
                ("nearest", metrics.nearest_baseline, "nearest-neighbour upscaling: each 8x8 input pixel as a 4x4 block")):
            out, secs = upscale(lr)
            self.samples[method] = out[:self.G]
            self.records.append(new_record(method=method, mode=method, n_images=n, seconds_per_image=secs / n,
                                           timing="measured", **quality(real, None, out, self.perceptual),
                                           notes=[note]))

    def plan_work(self) -> None:
        """The work list, for one progress bar over all decodes: each weights' (k, mode) jobs,
        those its heads cannot run listed as skipped."""
        cfg, n, plan = self.cfg, self.n, []
        for (spec, forced), path in zip(self.specs, self.paths):
            card = read_card(path) if path.suffix == ".json" else {"config": read_checkpoint(path)["model_config"],
                                                                   "meta": {}}
            K = card["config"].get("n_blockwise", 1)
            jobs = []
            for k in self.ks:
                for m in self.blockwise:
                    if k > K:
                        self.skipped.append(f"{weights_name(path)}: k={k} {m.name}: the weights have {K} heads")
                    elif m.settings.min_block > k:
                        self.skipped.append(f"{weights_name(path)}: k={k} {m.name}: min-block larger than k")
                    else:
                        jobs.append((k, m))
            plan.append((path, forced, card, jobs))
        if self.blockwise and not any(jobs for *_, jobs in plan):  # no blockwise row at all: refused, not an empty table
            raise ValueError("no mode and k to decode: " + "; ".join(self.skipped[:4])
                             + ("; ..." if len(self.skipped) > 4 else ""))
        self.plan = plan
        self.n_exact = n if cfg.decode_exact is None else min(n, cfg.decode_exact)
        self.n_approx = n if cfg.decode_approx is None else min(n, cfg.decode_approx)
        self.total = sum(n + sum(self.decoded(k, m) for k, m in jobs) for *_, jobs in plan)

    def decoded(self, k: int, m: Mode) -> int:
        """How many faces a (k, mode) decodes: --decode-exact / --decode-approx limit them."""
        return self.n_exact if m.options(k).is_exact else self.n_approx

    # ------------------------------------------------ phase 1: the decodes

    def decode_all(self) -> None:
        """The decodes, batch by batch: each batch of faces is decoded greedily and then in every
        mode before the next batch starts, so every speed ratio compares decodes made in the same
        minutes, also when a resumed run (--resume) spans several sittings."""
        cfg, n, w, bar = self.cfg, self.n, self.cfg.prior_weight, self.bar
        sitting = (f"{platform.node()} pid {os.getpid()} {datetime.now(timezone.utc).isoformat(timespec='seconds')}"
                   f" #{uuid.uuid4().hex[:6]}")
        store = DecodeStore(cfg.cache_dir, cfg.resume, sitting)
        self.models, self.runs = {}, {}
        for path, forced, card, jobs in self.plan:
            name = weights_name(path)
            bar.set_description(f"{name}: loading")
            model = load_model(path, dtype=DTYPES[cfg.dtype], device=cfg.device)
            # warm-up (not timed): a short oracle decode runs every kernel the timed decodes will
            kw = max([k for k, _ in jobs], default=1)
            decode(model, self.lr[:1], DecodeOptions(k=kw, rule="oracle", prior_weight=w))
            self.models[name] = (model, card.get("sha256") or sha256_of(path))
            self.runs[name] = {"greedy": []} | {(k, m): [] for k, m in jobs}
        for i in range(0, n, cfg.batch_size):
            for path, forced, card, jobs in self.plan:
                name = weights_name(path)
                model, sha = self.models[name]
                todo = [("greedy", "greedy", DecodeOptions(k=1, prior_weight=w), n)] + [
                    ((k, m), f"k={k} {m.name}", m.options(k, w), self.decoded(k, m)) for k, m in jobs]
                # modes limited by --decode-exact / --decode-approx decode only their first nd faces
                todo = [(job, label, opts, self.lr[i:min(i + cfg.batch_size, nd)])
                        for job, label, opts, nd in todo if i < nd]
                keys = [store.key(sha, label, opts, cfg.dtype, cfg.device, x) for _, label, opts, x in todo]
                group = store.load_group(keys)
                for j, ((job, label, opts, x), key) in enumerate(zip(todo, keys)):
                    if group is None:
                        bar.set_description(f"{name}: {label}")
                    self.runs[name][job].append(group[j] if group is not None else store.decode(model, x, opts, key))
                    bar.update(len(x))
        self.result["settings"]["decode_store"] = {"dir": cfg.cache_dir, "resume": cfg.resume,
                                                   "batches_reused": store.reused, "sittings": store.sittings}

    # ------------------------------------------------ phase 2: the rows

    def weights_rows(self, path: Path, forced, card: dict, jobs: list) -> None:
        """One weights' rows from its decodes (and the cheap measurements that need no decoding),
        then its bits/dim on every row."""
        name = weights_name(path)
        variant = forced or infer_variant(name, card.get("meta", {}))
        model = self.models[name][0]
        g = join_batches(self.runs[name]["greedy"])
        greedy, unc = self.greedy_rows(name, variant, model, g)
        replay = self.replay(name, model, g, jobs)
        self.blockwise_rows(name, variant, jobs, g, greedy, replay, unc["seconds_batch"] / unc["batch"])
        # bits/dim of the real faces, in fp32 so the score does not depend on --dtype
        self.bar.set_description(f"{name}: bits/dim")
        del model, self.models[name]
        model32 = load_model(path, dtype=torch.float32, device=self.cfg.device)
        from ..train import bits_per_dim
        bpd = bits_per_dim(model32, self.real, batch_size=8, bf16=False, device=self.cfg.device)
        del model32
        for rec in self.records:
            if rec["weights"] == name:
                rec["bits_per_dim"] = bpd
        self.weights_info.append({"name": name, "path": portable_path(path), "variant": variant,
                                  "config": card["config"], "meta": card.get("meta", {}), "bits_per_dim": bpd,
                                  "uncached_timing": unc})

    def greedy_rows(self, name: str, variant: str, model, g: dict) -> tuple[dict, dict]:
        """Greedy with the KV cache first, the reference for speed, identity and quality; then
        greedy without a KV cache, as the paper's reference code runs (timed on one batch).
        Returns (the greedy reference, the uncached timing)."""
        cfg, n, real = self.cfg, self.n, self.real
        grec = _decode_record(name, variant, Mode("greedy"), 1, g, None, real)
        grec.update(speedup_vs_greedy=1.0, call_reduction=1.0, cost_per_call_vs_greedy=1.0,
                    identical_to_greedy=1.0, tokens_identical_to_greedy=1.0)
        grec.update(quality(real, g["images"], g["images"], self.perceptual))
        greedy = {**grec, "_images": g["images"]}
        self.samples["models"][name] = {"greedy": g["images"][:self.G]}

        self.bar.set_description(f"{name}: greedy, no KV cache")
        b = min(cfg.batch_size, n)
        unc = time_uncached_greedy(model, self.lr[:b], g["images"][:b], cfg.uncached_prefix, cfg.device,
                                   prior_weight=cfg.prior_weight)
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
        self.records += [grec, urec]
        self.progress()
        return greedy, unc

    def replay(self, name: str, model, g: dict, jobs: list) -> dict:
        """Exact-heads modes' blocks for all images and every k from one teacher-forced pass over
        the greedy output (cheap); checked against the real decodes of the first n_exact images."""
        ks_exact = sorted({k for k, m in jobs if replayable(m.options(k))})
        replay = {k: [] for k in ks_exact}
        if ks_exact:
            self.bar.set_description(f"{name}: exact-mode replay")
            for i in range(0, self.n, 32):
                for k, st in exact_block_stats(model, self.lr[i:i + 32], g["images"][i:i + 32], ks_exact,
                                               prior_weight=self.cfg.prior_weight).items():
                    replay[k] += st
        return replay

    def same_engine_greedy(self, name: str, opts, n: int):
        """Greedy's output of the first n faces on the engine opts decode on, where that is not
        greedy's own (trees run on the torch engine on a CPU); None where it is."""
        model = self.models[name][0]
        engine = engine_for(model, opts)
        if engine == engine_for(model, DecodeOptions()):
            return None
        cache = self.__dict__.setdefault("_greedy_by_engine", {})
        if (name, engine, n) not in cache:
            self.bar.set_description(f"{name}: greedy on the {engine} engine")
            b, w = self.cfg.batch_size, self.cfg.prior_weight
            cache[(name, engine, n)] = np.concatenate([decode(model, self.lr[i:min(i + b, n)], DecodeOptions(prior_weight=w),
                                                             engine=engine).images for i in range(0, n, b)])
        return cache[(name, engine, n)]

    def blockwise_rows(self, name: str, variant: str, jobs: list, g: dict, greedy: dict, replay: dict,
                       u_spi: float) -> None:
        """A row per (k, mode) decoded; u_spi: uncached greedy's seconds per image."""
        real = self.real
        for k, m in jobs:
            nd = self.decoded(k, m)
            r = join_batches(self.runs[name][(k, m)])
            rec = _decode_record(name, variant, m, k, r, greedy, real)
            rec.update(quality(real[:nd], g["images"][:nd], r["images"], self.perceptual))
            if replayable(m.options(k)):
                _use_replay(rec, replay[k], r["stats"], greedy)
            ref = self.same_engine_greedy(name, m.options(k, self.cfg.prior_weight), nd)
            if ref is not None and rec["exact_by_construction"]:
                same = r["images"].reshape(nd, -1) == ref.reshape(nd, -1)
                rec.update(identical_to_greedy=float(same.all(1).mean()), tokens_identical_to_greedy=float(same.mean()))
                rec["notes"].append("compared with greedy decoded on the engine this mode ran on "
                                    "(the engines round differently)")
            rec["speedup_vs_uncached_greedy"] = u_spi / rec["seconds_per_image"]
            if rec["exact_by_construction"] and rec["identical_to_greedy"] < 1:
                rec["notes"].append("NOT identical to greedy although the mode promises it")
            self.records.append(rec)
            self.samples["models"][name][(k, m.name)] = r["images"][:self.G]
            self.progress()


def evaluate(cfg: EvalConfig) -> dict:
    """Run and write everything under cfg.out; returns the result (with its "files")."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = Path(cfg.json_path) if cfg.json_path else out / "results.json"
    # the JSON is rewritten after every row ("complete": false) until the run ends; the rows come
    # after all decoding, and until then the decoded batches are in cfg.cache_dir
    result, samples = run_evaluation(cfg, on_progress=lambda r: write_json(r, json_path))
    return _write_outputs(result, samples, out, json_path)

