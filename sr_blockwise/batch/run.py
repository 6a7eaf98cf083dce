"""The batch run: validate, plan, check, open, then batches decoded and their photos written, then
the summary (BatchRun); a stop asked for finishes the batch in hand."""
from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path, PurePosixPath

import numpy as np

from ..data import BadImage, bicubic_upscale, match_input
from ..faces import own_scale
from ..metrics import PSNR_SETTINGS, SSIM_SETTINGS
from .files import FOREIGN, _resolve, check_writable, foreign_beside_inputs, save_atomic, sweep_temp_files
from .photos import Photo, compare_strip, load_ground_truth, load_photo, paste_plan_of, quality
from .plan import Config, Job, already_done, plan
from .report import Metrics, Summary, _printable, _shown, metrics_path


def job_seed(seed: int, rel: PurePosixPath) -> int:
    """Sampling seed per image (decode's `seeds=`) from --seed and its relative path: the same
    image gets the same sample whatever its batch, shard or resume: the sample decode gives it
    alone at seed sha1(SEED:REL) (decoding.sampling.SEED_STRIDE)."""
    from ..decoding.sampling import SEED_STRIDE
    return int.from_bytes(hashlib.sha1(os.fsencode(f"{seed}:{rel}")).digest()[:4], "big") * SEED_STRIDE


def after_batch(summary: "Summary") -> None:
    """Called after each batch is written. A hook for tests (e.g. to simulate a Ctrl-C)."""


class _StopFlag:
    """First Ctrl-C / SIGTERM: finish the current batch, then stop. Second: stop now."""

    def __init__(self, quiet: bool):
        self.set, self.quiet, self.old = False, quiet, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signals only work there
            for s in (signal.SIGINT, signal.SIGTERM):
                self.old[s] = signal.signal(s, self.handle)
        return self

    def handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        if not self.quiet:
            print("\nstopping after the current batch (a second Ctrl-C or SIGTERM stops now)", file=sys.stderr)

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def decode_batch(up, lrs: np.ndarray, jobs: list[Job], opts, progress=None):
    """(B,8,8,3) -> (the decoder's own images, api.ImageStats per image). Sampling seeds each
    image from its path (job_seed), not from its position in the batch, so a sample does not
    depend on its batch either."""
    seeds = [job_seed(opts.seed, j.rel) for j in jobs] if opts.temperature > 0 else None
    return up.decode(lrs, opts, seeds=seeds, progress=progress)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run(cfg: Config) -> int:
    """The whole command; returns the exit code (0 all done, 1 some failed, 130 interrupted).
    Bad arguments raise ValueError / FileNotFoundError (exit 2 in the CLI)."""
    return BatchRun(cfg).run()


def validate(cfg: Config) -> None:
    """The arguments' own checks, before any file is looked at."""
    if cfg.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's default), got {cfg.threads}")
    mode_settings(cfg)


def mode_settings(cfg: Config):
    """The decode mode's options from the flags, checked in the flags' own words (the model's
    limits come when it loads)."""
    from ..decoding import mode_options
    return mode_options(cfg.mode, k=cfg.k, eps=cfg.eps, temperature=cfg.temperature, seed=cfg.seed,
                        prior_weight=cfg.prior_weight, guard=cfg.guard, flags=True)


class BatchRun:
    """One run of the command, in stages: validate, plan, check (or list a dry run), open, then
    batches decoded and their photos written, then the summary. The stages share the run's
    attributes: the jobs, the model and options, the summary, the metrics, the progress bar."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.face_files = {}  # output folder -> {(name before _faceN, extension): [N >= 1, ...]}
        self.photos = {}  # id(job) -> (Photo, results so far): a photo's outputs wait for all its faces
        self.progress_shown = 0.0  # when the bar last showed the batch's share

    def run(self) -> int:
        validate(self.cfg)
        self.plan_work()
        self.check()
        if self.cfg.dry_run:
            return self.list_dry_run()
        self.open()
        self.warn_kept_unlike()
        self.decode_all()
        return self.summarise()

    def say(self, msg: str) -> None:
        # a message names paths: their control characters escaped, as everywhere (a message is one line)
        if not self.cfg.quiet:
            print(_shown(msg), file=sys.stderr)

    # ------------------------------------------------ plan and checks

    def plan_work(self) -> None:
        """This shard's jobs, those an earlier run did (--skip-existing), the rest to do; said."""
        cfg = self.cfg
        self.jobs, ignored, self.info = plan(cfg)
        if self.info["total"] == 0:
            raise ValueError("no images found in " + ", ".join(cfg.inputs)
                             + (f" ({_count(len(ignored), 'file')} without an image extension ignored)" if ignored else ""))
        self.mpath = metrics_path(cfg.metrics, self.info["shard"])
        self.done_before = [j for j in self.jobs if cfg.skip_existing and already_done(j)]
        self.skip = {id(j) for j in self.done_before}
        self.todo = [j for j in self.jobs if id(j) not in self.skip]
        shard_i, shard_n = self.info["shard"]
        self.say(f"{_count(self.info['total'], 'image')} under {self.info['base']}"
                 + (f", shard {shard_i}/{shard_n}: {len(self.jobs)}" if shard_n > 1 else "")
                 + (f", {len(self.done_before)} already done" if self.done_before else "")
                 + (f"; ignored {_count(len(ignored), 'file')} without an image extension (e.g. {ignored[0]})"
                    if ignored else "")
                 + (f"; OUTDIR {cfg.outdir}, inside an input folder, is not searched for inputs"
                    if self.info["outdir_inside"] else ""))
        no_gt = [j for j in self.todo if j.gt is None] if cfg.ground_truth else []
        if no_gt:
            self.say(f"warning: no ground truth in {cfg.ground_truth} for {len(no_gt)} of {len(self.todo)} inputs "
                     f"(e.g. {no_gt[0].src}): they get no PSNR / SSIM")

    def check(self) -> None:
        """Every check that needs no model, before a dry run lists the work: it refuses what the
        run would."""
        from ..api import pick_device
        from ..checkpoints import card_config, default_weights, resolve

        cfg = self.cfg
        self.seed = 0 if cfg.seed is None else cfg.seed
        if not cfg.dry_run:  # the machine's, not the arguments': a dry run may plan the work elsewhere
            pick_device(cfg.device)
        card = resolve(cfg.weights or default_weights())
        self.check_k(card_config(card)[1].n_blockwise if card.suffix == ".json" else None)  # a .pt's: once it loads
        # OUTDIR (where there is anything to write) and the metrics file's folder must take files
        if self.todo:
            check_writable(Path(cfg.outdir), "OUTDIR")
        if self.mpath:
            if Path(self.mpath).is_dir():
                raise ValueError(f"--metrics {self.mpath} is a folder; name a .csv or .json file")
            check_writable(Path(self.mpath).parent, "--metrics folder")

    def check_k(self, heads: int | None) -> None:
        """k beyond the model's heads: a bad argument, before any work."""
        k = self.cfg.k
        if k is not None and heads is not None and k > heads:
            raise ValueError(f"--k {k}: these weights have {heads} blockwise heads, so --k must be in 1..{heads}")

    def list_dry_run(self) -> int:
        cfg = self.cfg
        for j in self.jobs:
            # with --paste-back, the scale each photo would be pasted back at: its faces are found
            todo = id(j) not in self.skip
            scale = "\t" + _shown(dry_paste_plan(j.src, cfg.faces, cfg.no_face)) if cfg.paste_back and todo else ""
            print(f"{'todo' if todo else 'skip'}\t{_shown(j.src)}\t{_shown(j.out)}{scale}")
        return 0

    # ------------------------------------------------ open

    def open(self) -> None:
        """What a killed run left removed, the model loaded, the options settled against it, the
        summary and the metrics begun (with the rows of the outputs kept)."""
        import torch

        from ..api import Upscaler
        from ..decoding import not_native

        cfg = self.cfg
        # what a killed run left half-written in the folders this one writes to
        swept = sweep_temp_files(sorted({p.parent for j in self.jobs for p in (j.out, j.compare, j.paste) if p}
                                        | ({Path(self.mpath).parent} if self.mpath else set())))
        if swept:
            self.say(f"removed {_count(swept, 'temporary file')} that a killed run left")
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        self.up = up = Upscaler(cfg.weights, device=cfg.device, dtype=cfg.dtype)
        self.check_k(up.max_k)  # a training checkpoint's heads are known once it loads
        # the weights' default guidance where none is given, the mode checked against these weights
        self.opts = up.options(cfg.mode, k=cfg.k, eps=cfg.eps, temperature=cfg.temperature, seed=cfg.seed,
                               prior_weight=cfg.prior_weight, guard=cfg.guard)
        why = not_native(up.model)
        if self.todo and why and up.device == "cpu":  # on a GPU the PyTorch engine is the one meant
            print(f"warning: decoding on the PyTorch engine, many times slower than the native one: {why}",
                  file=sys.stderr)
        self.summary = Summary(total=len(self.jobs), skipped=len(self.done_before),
                               load_seconds=time.perf_counter() - t0)
        settings = self.settings()
        self.metrics = Metrics(self.mpath, settings, cfg.skip_existing, cfg.outdir)
        self.base_row = {k: settings[k] for k in ("mode", "k", "eps", "temperature", "seed", "batch_size",
                                                  "prior_weight", "guard", "match_input")}
        for j in self.done_before:
            self.metrics.add({**self.names(j), "status": "skipped"})
            # with --faces all, the photo's other faces written by the earlier run keep their rows too
            for f in (self.further_faces(j) if cfg.faces == "all" else []):
                out = self.face_output(j, f, j.out)
                self.metrics.add({**self.names(j), "output": str(out),
                                  "relative": out.relative_to(cfg.outdir).as_posix(), "status": "skipped"})

    def settings(self) -> dict:
        """The run's settings, as the metrics file records them."""
        cfg, opts = self.cfg, self.opts
        shard_i, shard_n = self.info["shard"]
        return {"weights": str(self.up.weights), "mode": cfg.mode, "k": opts.k,
                "eps": opts.eps if cfg.mode == "approx" else None,
                "temperature": opts.temperature or None, "seed": self.seed if opts.temperature else None,
                "batch_size": cfg.batch_size, "prior_weight": opts.prior_weight, "guard": opts.guard,
                "match_input": cfg.match_input, "device": self.up.device, "dtype": cfg.dtype,
                "shard": f"{shard_i}/{shard_n}", "ssim": dict(SSIM_SETTINGS), "psnr": dict(PSNR_SETTINGS)}

    def warn_kept_unlike(self) -> None:
        """A resumed run whose settings differ would leave its outputs unlike each other: say so,
        for each setting that outputs kept by --skip-existing were made with otherwise."""
        m, pw, guard = self.cfg.match_input, self.opts.prior_weight, self.opts.guard
        # (the setting, its value in an earlier row, its value now, how the kept ones were made,
        # what the new ones are, what to pass to keep them alike). A CSV row holds "True" /
        # "False", a JSON row a bool; a row of a run before the setting existed has none (or ""
        # in a CSV): not matched, decoded at weight 1, without the guard
        for key, read, now, kept, new, flag in [
                ("match_input", lambda v: str(v or False), str(m), f"saved {'without' if m else 'with'} --match-input",
                 f"are {'' if m else 'not '}matched", f"--{'no-' if m else ''}match-input"),
                ("prior_weight", lambda v: float(v or 1), pw, "decoded with another --prior-weight",
                 f"use {pw:g}", "the old --prior-weight"),
                ("guard", lambda v: float(v or 0), guard, "decoded with another --guard",
                 f"use {guard:g}", "the old --guard")]:
            rows = [self.metrics.previous.get(self.names(j)["relative"]) for j in self.done_before]
            unlike = [j for j, r in zip(self.done_before, rows) if r is not None and read(r.get(key)) != now]
            if unlike:
                print(f"warning: {len(unlike)} outputs kept by --skip-existing were {kept} "
                      f"(e.g. {_shown(unlike[0].out)}); the new ones {new}. Rerun those without "
                      f"--skip-existing, or pass {flag}, to keep them alike", file=sys.stderr)

    # ------------------------------------------------ names

    def names(self, j: Job) -> dict:
        """A metrics row's paths."""
        return {"input": str(j.src), "output": str(j.out), "relative": j.out.relative_to(self.cfg.outdir).as_posix()}

    def face_output(self, j: Job, n: int, path: Path) -> Path:
        """Face n's file: with --faces all, STEM_face0 -> STEM_faceN (likewise its _compare)."""
        if n == 0:
            return path
        head, mark, tail = path.name.rpartition(f"_face0{self.cfg.suffix}")  # the mark plan() added: the last
        return path.with_name(f"{head}_face{n}{self.cfg.suffix}{tail}")

    def further_faces(self, j: Job) -> list[int]:
        """With --faces all, the numbers n >= 1 of the photo's face files in OUTDIR (each folder
        listed once: a resume of a large run asks this of every photo)."""
        suffix, folder = self.cfg.suffix, j.out.parent
        if folder not in self.face_files:
            pattern = re.compile(r"(.*)_face([1-9][0-9]*)" + re.escape(suffix) + r"(\.[^.]*)")
            index = self.face_files[folder] = {}
            for f in (folder.iterdir() if folder.is_dir() else []):
                m = pattern.fullmatch(f.name)
                if m:
                    index.setdefault((m.group(1), m.group(3)), []).append(int(m.group(2)))
        head, _, tail = j.out.name.rpartition(f"_face0{suffix}")
        return sorted(self.face_files[folder].get((head, tail), []))

    # ------------------------------------------------ batches and decoding

    def decode_all(self) -> None:
        """Batch after batch until every job is done or a stop is asked for; the metrics written
        at the end whatever happens (after a crash, as of a run that broke off)."""
        from tqdm import tqdm

        cfg, s = self.cfg, self.summary
        shard_i, shard_n = self.info["shard"]
        self.bar = tqdm(total=len(self.todo), unit="img", disable=cfg.quiet, dynamic_ncols=True, smoothing=0.1,
                        desc="upscale" + (f" {shard_i}/{shard_n}" if shard_n > 1 else ""))
        t1 = time.perf_counter()
        ended = False  # the run came to its end, or to a stop asked for; not a crash
        try:
            with _StopFlag(cfg.quiet) as self.stop:
                for batch in self.batches():
                    if not self.decode(batch):
                        continue
                    s.seconds = time.perf_counter() - t1
                    self.metrics.maybe_write(s)
                    after_batch(s)
                    if self.stop.set and not self.photos:  # a photo begun is finished first: its faces are
                        break  # written together (batches() reads no further file)
                # Ctrl-C: stopped after the batch in hand (one whose decoding failed ends in batches())
                s.interrupted = self.stop.set
            ended = True
        except KeyboardInterrupt:  # the second Ctrl-C: the batch in flight is dropped
            s.interrupted = ended = True
        finally:
            s.seconds = time.perf_counter() - t1
            self.bar.close()
            try:
                self.metrics.write(s, finished=ended)  # not after a crash: the file then says the run broke off
                s.metrics_error = None
            except OSError as e:
                s.metrics_error = _shown(f"{self.mpath}: {e}")

    def batches(self):
        """(job, face number, 8x8 input) batches; a photo's faces may span several batches."""
        cfg, batch = self.cfg, []
        for j in self.todo:
            if self.stop.set:  # Ctrl-C: read no more (also when every file so far failed to load)
                break
            try:
                ph = load_photo(j.src, cfg.faces, cfg.no_face)
            except BadImage as e:  # its message starts with the file's name: we print the path
                self.fail(j, str(e).removeprefix(f"{j.src}: ").removeprefix(f"{j.src.name}: "))
                continue
            except Exception as e:  # whatever else a strange file does, the run goes on
                self.fail(j, f"{type(e).__name__}: {e}")
                continue
            if ph.warn:
                self.bar.write(f"warning: {_shown(j.src)}: {ph.note}"
                               + ("; the pasted photo is the photo enlarged, nothing pasted"
                                  if cfg.paste_back and ph.faces else ""), file=sys.stderr)
            if not ph.faces:  # --no-face skip
                self.summary.no_face.append(str(j.src))
                self.metrics.add({**self.names(j), "status": "no face", "reason": ph.note})
                self.bar.update(1)
                continue
            self.photos[id(j)] = (ph, {})
            for n, f in enumerate(ph.faces):
                if id(j) not in self.photos:  # a batch with its first faces failed: the rest would be dropped
                    break
                batch.append((j, n, f.lr))
                if len(batch) == cfg.batch_size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def decode(self, batch) -> bool:
        """A batch decoded, and each photo whose faces are all decoded then written; False where
        the decoding failed (its photos reported failed, the run goes on)."""
        cfg, s, opts = self.cfg, self.summary, self.opts
        bjobs = [j for j, _, _ in batch]
        lrs = np.stack([lr for _, _, lr in batch])
        try:
            images, stats = decode_batch(self.up, lrs, bjobs, opts, None if cfg.quiet else self.progress)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # e.g. out of GPU memory: report the batch, go on
            for j in {id(j): j for j in bjobs}.values():  # a photo once, however many of its faces
                if id(j) in self.photos:
                    self.photos.pop(id(j))
                    self.fail(j, f"decoding failed: {type(e).__name__}: {e}")
            return False
        if cfg.measure_greedy and s.greedy_check is None and opts.k > 1:  # two more decodes
            s.greedy_check = _greedy_check(self.up.model, lrs, images, opts)
        if cfg.match_input:  # after the greedy check, which compares the decoder's own outputs
            images = match_input(images, lrs)
        for (j, n, lr), img, st in zip(batch, images, stats):
            if id(j) not in self.photos:  # the photo failed with an earlier batch
                continue
            ph, results = self.photos[id(j)]
            results[n] = (img, lr, self.row(j, ph, n, st), st)
            if len(results) == len(ph.faces):  # a photo's faces are written together
                self.finish_photo(j, ph, results)
        return True

    def row(self, j: Job, ph: Photo, n: int, st) -> dict:
        """Face n's metrics row, as decoded."""
        face = ph.faces[n]
        aligned = not face.as_is
        out = self.face_output(j, n, j.out)
        return {**self.names(j), "output": str(out), "relative": out.relative_to(self.cfg.outdir).as_posix(),
                "status": "done", **self.base_row, "face": n,
                "framing": face.how if aligned else ph.note, "faces_note": ph.note,
                # in the photo's own pixels (a photo over 40 MP is read at reduced size)
                "box": [round(v * own_scale(ph.image), 1) for v in face.box] if aligned else None,
                "calls": st.calls, "mean_block": round(st.mean_block, 4), "seconds": round(st.seconds, 4)}

    def progress(self, tokens, done_counts, bmap, calls):
        """The current batch's share on the bar, twice a second."""
        if time.perf_counter() - self.progress_shown > 0.5:
            from ..model import SEQ_LEN  # loaded with the model by now

            self.progress_shown = time.perf_counter()
            self.bar.set_postfix_str(f"batch {done_counts.mean() / SEQ_LEN:.0%}", refresh=True)

    def fail(self, j: Job, reason: str):
        self.summary.failed.append((str(j.src), reason))
        self.metrics.add({**self.names(j), "status": "failed", "reason": reason})
        self.bar.write(f"failed: {_shown(j.src)}: {_shown(reason)}", file=sys.stderr)
        self.bar.update(1)

    # ------------------------------------------------ writing

    def finish_photo(self, j: Job, ph: Photo, results: dict) -> None:
        """A photo whose faces are all decoded: written, then counted (or failed)."""
        s = self.summary
        self.photos.pop(id(j))
        try:
            self.write_photo(j, ph, results)
        except Exception as e:  # disk full, permissions...: this image failed
            self.fail(j, f"writing failed: {type(e).__name__}: {e}")
            return
        for _, _, row, st in (results[n] for n in range(len(ph.faces))):
            self.metrics.add(row)
            s.blocks.append(st.mean_block)
            s.calls.append(st.calls)
        s.faces += len(ph.faces)
        s.done += 1
        if j.paste is not None and not ph.faces[0].as_is:
            s.pasted.append((str(j.src), paste_plan_of(ph)[0].note))
        self.bar.update(1)

    def write_photo(self, j: Job, ph: Photo, results: dict) -> None:
        """A photo's outputs, once all its faces are decoded: the further faces, the pasted photo,
        then face 0 last, since --skip-existing takes a photo whose face 0 (and compare strip and
        pasted photo) exists for done: a run stopped between two of its faces leaves none written.
        A write that fails (a full disk) takes back the photo's files written before it."""
        written = []
        try:
            for n in reversed(range(len(ph.faces))):
                self.write_face(j, ph, results, n, written)
        except BaseException:
            # and, once this run has replaced any of them, an earlier run's face 0, pasted photo
            # or strip: --skip-existing would take the photo for done, with faces missing
            for path in [*written, *((j.out, j.paste, j.compare) if written else ())]:
                if path is not None and _resolve(path) not in self.info["protected"]:  # never an input
                    path.unlink(missing_ok=True)
            raise

    def write_face(self, j: Job, ph: Photo, results: dict, n: int, written: list) -> None:
        """Face n's output (and compare strip; with face 0 the pasted photo), each path added to
        `written` once it is there."""
        cfg, info = self.cfg, self.info
        img, lr, row, _ = results[n]
        face = ph.faces[n]
        aligned = not face.as_is
        out, compare = self.face_output(j, n, j.out), j.compare and self.face_output(j, n, j.compare)
        if _resolve(out) in info["protected"] or (compare and _resolve(compare) in info["protected"]):
            raise ValueError(f"{out} is an input file: not overwritten")
        if n > 0 and foreign_beside_inputs(out, info["input_folders"]):  # face 0's: before any work (plan)
            raise ValueError(f"{_shown(out)} {FOREIGN}")
        gt = None
        if j.gt is not None:
            row["ground_truth"] = str(j.gt)
            try:
                gt = load_ground_truth(j.gt, face if aligned else None, ph.image.size if aligned else None)
            except BadImage as e:
                row["reason"] = f"ground truth unusable: {e}"
                if n == 0 and not cfg.quiet:  # once a photo (written last)
                    self.bar.write(_shown(f"warning: {j.src}: ground truth unusable: {e}"), file=sys.stderr)
        if gt is not None:
            row["psnr"], row["ssim"] = quality(gt, img)
            row["psnr_bicubic"], row["ssim_bicubic"] = quality(gt, bicubic_upscale(lr))
        if n == 0 and j.paste is not None:  # before face 0: the photo is done when face 0 is there
            save_atomic(self.pasted_photo(ph, results, img), j.paste, cfg.ext)
            written.append(j.paste)
        if compare is not None:
            save_atomic(compare_strip(lr, img, gt), compare, cfg.ext)
            written.append(compare)
        save_atomic(img, out, cfg.ext)
        written.append(out)

    def pasted_photo(self, ph: Photo, results: dict, img: np.ndarray) -> np.ndarray:
        """--paste-back: the photo with its faces' results pasted back; each face's row gets the
        scale it was pasted at."""
        at, pasted = paste_plan_of(ph)
        if at is None:  # an 8x8 or 32x32 input: the result is the whole photo
            return img
        from ..faces import paste_back
        whole = paste_back(ph.image, pasted, [results[i][0] for i in range(len(pasted))], at.scale)
        own = own_scale(ph.image)
        for i in results:  # the pasted photo's side / the photo's own (one read reduced: larger)
            results[i][2]["paste_scale"] = round(at.scale / own, 5)
        return whole

    # ------------------------------------------------ summary

    def summarise(self) -> int:
        """The summary (quiet: only what needs attention); returns the exit code."""
        s, mpath = self.summary, self.mpath
        if not self.cfg.quiet:
            print(_printable("\n".join(s.lines(self.cfg.mode))
                             + (f"\nmetrics: {_shown(mpath)}" if mpath and not s.metrics_error else "")))
        else:
            if s.failed:
                print(f"{len(s.failed)} of {s.total} images failed", file=sys.stderr)
            if s.interrupted and s.left:
                print(f"interrupted after {s.done + s.skipped} of {s.total} images", file=sys.stderr)
            if s.metrics_error:
                print(f"metrics NOT written: {s.metrics_error}", file=sys.stderr)
        return s.exit_code


def dry_paste_plan(src: Path, which: str, no_face: str) -> str:
    """--dry-run --paste-back: the scale a file's faces would be pasted back at, or why not."""
    try:
        plan, _ = paste_plan_of(load_photo(src, which, no_face))
    except BadImage as e:
        return f"not readable: {str(e).removeprefix(f'{src}: ').removeprefix(f'{src.name}: ')}"
    except Exception as e:  # whatever else a strange file does (the run reports it as failed)
        return f"not readable: {type(e).__name__}: {e}"
    return "pasted back: the 32x32 result (an 8x8 or 32x32 input)" if plan is None else f"pasted back {plan.note}"


def _greedy_check(model, lrs, images, opts) -> dict:
    """Decode the first batch again greedily (the same guidance and cell guard), at the same batch
    size: wall-clock speedup, and
    (exact mode) whether the outputs match greedy as they must. The blockwise decode is timed
    again too: the first batch of a run also pays for warming up, greedy would not."""
    from ..decoding import DecodeOptions, decode
    g = decode(model, lrs, DecodeOptions(k=1, prior_weight=opts.prior_weight, guard=opts.guard))
    seconds = decode(model, lrs, opts).seconds
    return {"images": len(lrs), "seconds": seconds, "greedy_seconds": g.seconds,
            "speedup": g.seconds / seconds if seconds > 0 else math.nan,
            "identical": bool((g.images == images).all()) if opts.is_exact else None}
