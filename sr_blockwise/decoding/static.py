"""The static-shape engine: one decoding step whose shapes depend only on the batch and the tree,
for accelerators.

On a GPU a step of this small model is a few hundred kernel launches, each far shorter than the
host takes to issue it, and the torch engine also waits for the host every call (finished images
leave the batch, histograms are counted on the host). Here every image stays in the batch (a
finished one computes and writes nothing that is kept), every image's position, accepted length,
statistics and output are device tensors, and acceptance, commit and the next proposals run on
the device: a step never waits for the host, which checks every few steps whether all images
are done. On CUDA the step is captured once per (batch, tree) as a CUDA graph and replayed (an
eager step where capture fails). The same code runs eagerly on any device; the tests run it on
the CPU.

A chain of k tokens is the tree of its rank-0 path (Tree.chain), so greedy decoding (k=1), chains
and trees are the one step, exact mode's recycled proposals on the rank-0 path included. Not
here (the torch engine's): sampling, min-block and outside proposers.
"""
from __future__ import annotations

import time
import warnings
import weakref

import torch

from ..data import from_tokens, to_tokens
from ..model import SEQ_LEN, SRC_LEN, ImageTransformerSR
from .guard import cell_guard
from .options import DecodeOptions
from .results import DecodeResult, DecodeStats
from .rules import window_mass
from .tree import Tree, deepest_passing, path_reader, recycled, tree_for
from ..heads import draft_tree

CHECK_EVERY = 8  # steps between the host's looks at whether every image is done


def static_problem(opts: DecodeOptions) -> str | None:
    """Why the static engine cannot decode with opts, or None where it can."""
    if opts.temperature > 0:
        return "sampling draws from the host's per-image noise tables: the torch engine samples"
    if opts.min_block > 1:
        return "min-block forces a chain's prefix: the torch engine runs it"
    return None


class StaticDecoder:
    """Preallocated state and a fixed-shape step for `batch` images decoded with opts."""

    def __init__(self, model: ImageTransformerSR, batch: int, opts: DecodeOptions, capture: bool | None = None):
        dev = next(model.parameters()).device
        self.model, self.opts, self.B = model, opts, batch
        self.tree = tree_for(model, opts) if opts.tree else Tree.chain(opts.k)
        self.T = self.tree.tensors(dev)
        D = self.tree.depth
        self.cache = model.new_cache(torch.zeros(batch, SRC_LEN, dtype=torch.long, device=dev), max_extra=max(16, D + 1))
        # room past the image for a finished image's masked writes
        self.out = torch.zeros(batch, SEQ_LEN + D + 2, dtype=torch.long, device=dev)
        self.bmap = torch.zeros_like(self.out)
        self.t = torch.zeros(batch, dtype=torch.long, device=dev)
        self.calls = torch.zeros(batch, dtype=torch.long, device=dev)
        self.hist = torch.zeros(batch, D + 1, dtype=torch.long, device=dev)
        self.props = torch.zeros(batch, self.tree.size, dtype=torch.long, device=dev)
        self.ar = torch.arange(batch, device=dev)
        self.capture = dev.type == "cuda" if capture is None else capture
        self.graph = None

    def load(self, src: torch.Tensor) -> None:
        """Start decoding the inputs src (batch, 192): the first call and the first proposals."""
        m = self.model
        self.cache.load(m, src)
        for x in (self.out, self.bmap, self.t, self.hist):
            x.zero_()
        self.calls.fill_(1)
        h = m.step(self.cache, torch.full((self.B, 1), -1, dtype=torch.long, device=src.device), self.t)[:, 0]
        first = self._guarded(m.logits(h, self.cache.src, self.t, self.opts.prior_weight), self.t, None).argmax(-1)
        self.props.copy_(self._grow(h, first))

    def _guarded(self, logits, pos, read):
        o = self.opts
        return cell_guard(logits, self.cache.src, pos, self.out, o.guard, read=read) if o.guard else logits

    def _grow(self, h, first, given=None):
        o = self.opts
        window = o.propose == "window" and o.eps > 0
        return draft_tree(self.model, h, self.cache.src, self.t, self.out, self.T["levels"], first, o.prior_weight,
                          score=(lambda z: window_mass(z, o.eps)) if window else None,
                          given=(*given, self.T["spine"]) if given is not None else None)

    def _step(self) -> None:
        """One call for every image: verify its tree, keep its deepest passing path, grow the next."""
        m, o, T, t = self.model, self.opts, self.T, self.t
        live = t < SEQ_LEN
        pos = t + 1
        h, kv = m.step_tree(self.cache, self.props, pos, T["depth"], T["ancestors"])
        qpos = pos[:, None] + T["depth"]
        read = path_reader(self.out, self.props, T, t) if o.guard else None
        logits = self._guarded(m.logits(h, self.cache.src, qpos, o.prior_weight), qpos, read)
        best = deepest_passing(self.props, logits, T, o)
        n = torch.where(live, torch.minimum(T["depth"][best] + 1, SEQ_LEN - t), 0)
        path = T["path_at"][best]
        m.keep_path(self.cache, kv, path, pos, self.ar)
        at = t[:, None] + torch.arange(path.shape[1], device=t.device)
        keep = at < (t + n)[:, None]
        self.out.scatter_(1, at, torch.where(keep, self.props.gather(1, path), self.out.gather(1, at)))
        self.bmap.scatter_(1, at, torch.where(keep, n[:, None], self.bmap.gather(1, at)))
        self.hist.scatter_add_(1, (n - 1).clamp(min=0)[:, None], live[:, None].long())
        self.calls.add_((live & (SEQ_LEN - t > 1)).long())  # the last token needs no call (as the torch engine's)
        t.add_(n)
        choices = logits.argmax(-1)
        first = choices[self.ar, best]  # p1's choice after the path: the next sure token
        given = recycled(T, best, choices) if o.propose == "recycle" else None
        self.props.copy_(self._grow(h[self.ar, best], first, given))

    def step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _capture(self, src) -> None:
        """Record the step as a CUDA graph (after warm-up steps on a side stream, as CUDA graphs
        need), then start again from src; an eager step where capture fails."""
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
            self.graph = graph
        except RuntimeError as e:
            warnings.warn(f"CUDA graph capture failed, stepping eagerly: {e}")
            self.capture = False
        self.load(src)

    @torch.no_grad()
    def decode(self, lr, progress=None, progress_every: int = 64) -> DecodeResult:
        """Decode `batch` 8x8 inputs; progress as decode's, every multiple of CHECK_EVERY steps."""
        dev = self.t.device
        src = torch.from_numpy(to_tokens(lr)).to(dev)
        t0 = time.perf_counter()
        self.load(src)
        if self.capture and self.graph is None:
            self._capture(src)
        finish = torch.zeros(self.B, dtype=torch.float64)
        steps = 0
        while steps <= SEQ_LEN:
            self.step()
            steps += 1
            if steps % CHECK_EVERY:
                continue
            done = (self.t >= SEQ_LEN).cpu()  # the host's one look at the device every few steps
            finish[done & (finish == 0)] = time.perf_counter() - t0
            if progress is not None and steps % progress_every < CHECK_EVERY:
                progress(*self._snapshot(), int(self.calls.max()))
            if done.all():
                break
        tokens, t, bmap = self._snapshot()
        stats = [DecodeStats(int(c), h.tolist(), float(f)) for c, h, f in zip(self.calls.cpu(), self.hist.cpu(), finish)]
        if progress is not None:
            progress(tokens, t, bmap, int(self.calls.max()))
        return DecodeResult(from_tokens(tokens), stats, bmap.astype("uint8"), time.perf_counter() - t0,
                            int(self.calls.max()), {"engine": "static", "graph": self.graph is not None,
                                                    **({"tree": self.tree.size} if self.opts.tree else {})})

    def _snapshot(self):
        return (self.out[:, :SEQ_LEN].clamp(0, 255).cpu().numpy(), self.t.cpu().numpy(),
                self.bmap[:, :SEQ_LEN].cpu().numpy())


_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decode_static(model: ImageTransformerSR, lr, opts: DecodeOptions, progress, progress_every: int) -> DecodeResult:
    """decode on the static engine, reusing a model's decoder (and its captured graph) for the same
    batch size and options."""
    decoders = _DECODERS.setdefault(model, {})
    key = (len(lr), opts.spec)
    if key not in decoders:
        decoders.clear()  # one shape's state at a time: a decoder holds a whole KV cache
        decoders[key] = StaticDecoder(model, len(lr), opts)
    return decoders[key].decode(lr, progress, progress_every)
