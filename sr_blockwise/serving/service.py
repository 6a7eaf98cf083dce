"""A decode service for a server with many users: worker threads (one per core) decode every
waiting face, faces with the same options together. On the native engine a worker runs a
continuous batch (decoding.engine.ContinuousBatch): a face joins the running batch of its
options between calls and leaves it when its last intensity is decoded, so a request never
waits for another request to finish. Faces whose options differ (mode, k, eps, guidance, guard,
temperature, tree) decode in separate batches, side by side on the workers, oldest first; trees
and models the native engine does not run decode in rounds, one round at a time (the PyTorch
engine's cache is the model's). Every face's output is the one it gets decoded alone (samples
get the seed they would get alone), and each request sees its own face's progress.

The queue is bounded: a face beyond it is refused with Busy, which says when to try again; a
cancelled face (its client left) leaves the queue, or its batch.

Importing this module is cheap: torch is imported by the worker.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque

import numpy as np



def limit_malloc_arenas(n: int = 2) -> bool:
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX=n): by default each thread that allocates
    at once may get its own, a server with dozens of request threads then keeps freed memory in
    each (measured: 1.8x the one-client peak at 32 clients, 1.3x with 2). False where there is no
    glibc."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-8, n))  # M_ARENA_MAX
    except (OSError, AttributeError):
        return False


class Busy(Exception):
    """The queue is full: try again after retry_after seconds."""

    def __init__(self, retry_after: int, waiting: int):
        super().__init__(f"the server is busy ({waiting} faces waiting); try again in {retry_after} s")
        self.retry_after = retry_after
        self.waiting = waiting


class Cancelled(Exception):
    pass


def group_key(opts) -> str:
    """What must match for faces to share a decode() call: every option but the sampling seed
    (each face is given its own)."""
    return repr(sorted((k, v) for k, v in dataclasses.asdict(opts).items() if k != "seed"))


class Ticket:
    """One face in the service: wait() for its DecodeResult (a batch of one); progress(Frame) is
    called from the worker while it decodes; cancel() when its client leaves."""

    def __init__(self, lr: np.ndarray, opts, progress=None):
        self.lr, self.opts, self.progress = lr, opts, progress
        self.key = group_key(opts)
        self.arrived = time.perf_counter()
        self.done = threading.Event()
        self.cancelled = False
        self.result = self.error = self.done_at = None

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None):
        if not self.done.wait(timeout):
            self.cancel()
            raise TimeoutError(f"decoding took more than {timeout:.0f} s; the server is busy, try again later")
        if self.error is not None:
            raise self.error
        return self.result

    def _finish(self, result=None, error=None) -> None:
        self.result, self.error = result, error
        self.done_at = time.perf_counter()
        self.done.set()


class DecodeService:
    """decode() for many callers at once. max_waiting: faces queued (not yet decoding) before
    submit refuses with Busy; max_batch: faces per decode() call; progress_every: model calls
    between progress frames (only when some face in the round listens); workers: rounds decoded
    at once (the PyTorch engine's rounds one at a time all the same: its cache is the model's)."""

    def __init__(self, model, max_waiting: int = 64, max_batch: int = 4, progress_every: int = 16,
                 workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.model, self.max_waiting, self.max_batch = model, max_waiting, max_batch
        self.progress_every = progress_every
        self._waiting: deque[Ticket] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._face_seconds = 0.5  # a running estimate of decode seconds per face, for Retry-After
        self.served = self.rounds = self.refused = 0
        self._torch_engine = threading.Lock()  # the PyTorch engine decodes with the model's own KV cache
        self._streams: list = []  # (key, ContinuousBatch) of the continuous batches running
        self._workers = [threading.Thread(target=self._run, name=f"sr-blockwise-serve-{i}", daemon=True)
                         for i in range(workers)]
        for w in self._workers:
            w.start()

    # ---------------------------------------------------------------- callers

    def submit(self, lr: np.ndarray, opts, progress=None) -> Ticket:
        """Queue one (8, 8, 3) uint8 input; raises Busy when the queue is full."""
        t = Ticket(np.asarray(lr, np.uint8), opts, progress)
        with self._cond:
            self._drop_cancelled()
            if self._closed:
                raise RuntimeError("the decode service is closed")
            if len(self._waiting) >= self.max_waiting:
                self.refused += 1
                raise Busy(self.retry_after(), len(self._waiting))
            self._waiting.append(t)
            self._cond.notify()
        return t

    def decode(self, lr: np.ndarray, opts, timeout: float | None = None):
        """One face, blocking: its DecodeResult (a batch of one)."""
        return self.submit(lr, opts).wait(timeout)

    def stream(self, lr: np.ndarray, opts, time_limit: float | None = None, min_interval: float = 0.25):
        """As live.decode_live, through the service: yield Frames (the newest, at most one per
        min_interval seconds) and finally the DecodeResult. Closing the generator (the user left)
        cancels the face. Raises Busy at once when the queue is full."""
        from .live import Frame
        newest: list = [None]
        ready = threading.Event()
        t0 = time.perf_counter()

        def progress(frame: Frame):
            newest[0] = frame
            ready.set()

        ticket = self.submit(lr, opts, progress)
        last = 0.0
        try:
            while not ticket.done.is_set():
                ready.wait(1.0)
                ready.clear()
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    raise TimeoutError(f"decoding took more than {time_limit:.0f} s; the server is busy, "
                                       "try again later")
                frame = newest[0]
                if frame is not None and not ticket.done.is_set() and time.perf_counter() - last >= min_interval:
                    last = time.perf_counter()
                    newest[0] = None
                    yield frame
            yield ticket.wait()
        finally:
            ticket.cancel()

    def retry_after(self) -> int:
        """Seconds until the queue has room, about: the waiting faces at the measured speed."""
        return max(1, math.ceil(len(self._waiting) * self._face_seconds))

    def info(self) -> dict:
        with self._cond:
            self._drop_cancelled()
            return {"waiting": len(self._waiting), "max_waiting": self.max_waiting, "max_batch": self.max_batch,
                    "workers": len(self._workers),
                    "served": self.served, "rounds": self.rounds, "refused": self.refused,
                    "face_seconds": round(self._face_seconds, 3)}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for w in self._workers:
            w.join(timeout=30)

    # ---------------------------------------------------------------- the worker

    def _drop_cancelled(self) -> None:
        for t in [t for t in self._waiting if t.cancelled]:
            self._waiting.remove(t)
            t._finish(error=Cancelled())

    def _next_round(self) -> list[Ticket] | None:
        """The oldest waiting face that no running continuous batch will take, and every other
        waiting face with its options, up to max_batch."""
        with self._cond:
            while True:
                self._drop_cancelled()
                taken = {key for key, stream in self._streams if stream.free}
                waiting = [t for t in self._waiting if t.key not in taken]
                if waiting or self._closed:
                    break
                self._cond.wait()
            if not waiting:
                return None
            batch = [t for t in waiting if t.key == waiting[0].key][: self.max_batch]
            for t in batch:
                self._waiting.remove(t)
            return batch

    def _take(self, key: str, n: int) -> list[Ticket]:
        """Up to n waiting faces of these options, oldest first, out of the queue."""
        with self._cond:
            self._drop_cancelled()
            batch = [t for t in self._waiting if t.key == key][:n]
            for t in batch:
                self._waiting.remove(t)
            return batch

    def _run(self) -> None:
        from ..decoding.engine import engine_for
        while (batch := self._next_round()) is not None:
            try:
                if engine_for(self.model, batch[0].opts) == "native":
                    self._decode_continuously(batch)
                else:
                    with self._torch_engine:
                        self._decode_round(batch)
            except BaseException as e:  # each face's caller raises it; the worker goes on
                for t in batch:
                    if not t.done.is_set():
                        t._finish(error=e)

    def _decode_continuously(self, batch: list[Ticket]) -> None:
        """A continuous batch of these faces' options: the faces of those options that arrive
        join it between calls, until none is left decoding."""
        from ..decoding.engine import ContinuousBatch
        opts, key = batch[0].opts, batch[0].key
        stream = ContinuousBatch(self.model, opts, self.max_batch)
        decoding: dict[int, Ticket] = {}
        entry = (key, stream)
        with self._cond:
            self._streams.append(entry)
            self.rounds += 1
        try:
            while batch or stream.live:
                if batch:
                    self._admit(stream, batch, decoding)
                for tag, result in stream.run(self.progress_every):
                    self._finished(decoding.pop(tag), result)
                left = [tag for tag, t in decoding.items() if t.cancelled]
                if left:
                    stream.drop(left)
                    for tag in left:
                        decoding.pop(tag)._finish(error=Cancelled())
                self._report(stream, decoding)
                batch = self._take(key, stream.free) if stream.free else []
        except BaseException as e:  # each face's caller raises it
            for t in [*batch, *decoding.values()]:
                t._finish(error=e)
            raise
        finally:
            with self._cond:
                self._streams.remove(entry)
                self._cond.notify_all()  # faces of these options that came meanwhile: another batch

    def _admit(self, stream, batch: list[Ticket], decoding: dict) -> None:
        stream.admit(np.stack([t.lr for t in batch]), [id(t) for t in batch], _seeds(batch))
        decoding.update((id(t), t) for t in batch)
        batch.clear()

    def _finished(self, t: Ticket, result) -> None:
        self._face_seconds = 0.8 * self._face_seconds + 0.2 * result.seconds / max(1, result.extra["batch"])
        with self._cond:
            self.served += 1
        t._finish(result)

    def _report(self, stream, decoding: dict) -> None:
        """Each listening face's progress, as a Frame."""
        from .live import Frame
        if any(t.progress is not None for t in decoding.values()):
            for tag, tokens, done, bmap, calls, seconds in stream.progress():
                t = decoding[tag]
                if t.progress is not None and not t.cancelled:
                    t.progress(Frame(tokens, done, bmap, calls, seconds))

    def _decode_round(self, batch: list[Ticket]) -> None:
        from ..decoding import DecodeResult, decode
        from .live import Frame
        opts = batch[0].opts
        lr = np.stack([t.lr for t in batch])
        seeds = _seeds(batch)
        t0 = time.perf_counter()

        def progress(tokens, done, bmap, calls):
            if all(t.cancelled for t in batch):  # every client left: stop the round
                raise Cancelled()
            for i, t in enumerate(batch):
                if t.progress is not None and not t.cancelled:
                    t.progress(Frame(tokens[i], int(done[i]), bmap[i], int(calls), time.perf_counter() - t0))

        listens = any(t.progress is not None for t in batch)
        try:
            r = decode(self.model, lr, opts, progress=progress if listens else None,
                       progress_every=self.progress_every, seeds=seeds)
        except Cancelled as e:
            for t in batch:
                t._finish(error=e)
            return
        seconds = time.perf_counter() - t0
        self._face_seconds = 0.8 * self._face_seconds + 0.2 * seconds / len(batch)
        with self._cond:
            self.rounds += 1
            self.served += len(batch)
        for i, t in enumerate(batch):
            t._finish(DecodeResult(r.images[i:i + 1], [r.stats[i]], r.block_map[i:i + 1], seconds, r.calls,
                                   {"batch": len(batch)}))


def _seeds(batch: list[Ticket]) -> list[int] | None:
    """Each sampled face's seed for decode: the sample it gets alone, whatever its batch."""
    from ..decoding.sampling import SEED_STRIDE
    return [t.opts.seed * SEED_STRIDE for t in batch] if batch[0].opts.temperature > 0 else None
