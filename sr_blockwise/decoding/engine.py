"""The native decoding engine: `engine.cpp` compiled once, called through ctypes.

A decoding call of this model is microseconds of arithmetic that PyTorch spends milliseconds
launching (~1,300 operations). The engine does a whole blockwise step for every image of a
batch in one native call: the decoder step for the block's tokens, p1's logits, the acceptance
rule, the commit, and the next block's proposals (engine.cpp says why it is exact).

Built with the system's C++ compiler on first use into ~/.cache/sr-blockwise/engine/ (a few
seconds; `SR_BLOCKWISE_CACHE` moves it), for the processor it runs on: AVX-512 where it has it
(and AMX's tiles), else AVX2's 8-float vectors. Where it cannot be built (no compiler, or one
that refuses the source), `available()` is False, `build_problem()` says why, and decoding falls
back to the PyTorch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import torch

from ..data import from_tokens, to_tokens
from ..model import SEQ_LEN, SRC_LEN, VOCAB, ImageTransformerSR
from .guard import GUARD_SLOPE
from .results import DecodeResult, DecodeStats
from .sampling import sampling_noise

SOURCE = Path(__file__).with_name("engine.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
MAX_TOKENS = 16  # tokens per call at most (engine.cpp's MAXK)
IMAGES_PER_THREAD = 2  # engine.cpp's: a k > 1 call with this many live images a thread goes by image
RULES = {"exact": 0, "eps": 1, "topk": 2, "oracle": 3, "sample": 4}
# a call's stages, in engine.cpp's order (enum Stage), for Batch.time_stages
STAGES = ("embed", "qkv", "kv_write", "self_att", "cross_att", "linear", "norm_gelu", "logits", "accept", "draft")

_F = ctypes.POINTER(ctypes.c_float)
_I64 = ctypes.POINTER(ctypes.c_int64)


class _Mat(ctypes.Structure):  # a weight matrix in panels of 16 columns, float32 or bfloat16 (engine.cpp's Mat)
    _fields_ = [("p", ctypes.c_void_p), ("bf16", ctypes.c_int), ("rows", ctypes.c_int)]


class _Layer(ctypes.Structure):
    _fields_ = ([(n, _F) for n in ("ln1_w", "ln1_b", "qkv_b", "out_b", "ln2_w", "ln2_b", "cq_b", "cout_b",
                                   "ln3_w", "ln3_b", "up_b", "down_b")]
                + [(n, _Mat) for n in ("qkv_w", "out_w", "cq_w", "cout_w", "up_w", "down_w")])


class _Engine(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_int) for n in ("d", "H", "L", "ff", "n_layers", "G", "f",
                                             "has_lr_prior", "has_nbr_prior", "nbr_draft")]
                + [("layers", ctypes.POINTER(_Layer))]
                + [(n, _F) for n in ("tgt_emb", "dec_ln_w", "dec_ln_b")]
                + [(n, _Mat) for n in ("lm_w", "heads_up_w", "heads_down_w")]
                + [(n, _F) for n in ("heads_up_b", "heads_down_b", "heads_ln_w", "heads_ln_b", "lr_prior", "nbr_prior")]
                + [("B", ctypes.c_int), ("cache_len", ctypes.c_int), ("kv_bf16", ctypes.c_int)]
                + [(n, ctypes.POINTER(ctypes.c_void_p)) for n in ("k_cache", "v_cache", "enc_k", "enc_v")]
                + [("n_src", ctypes.c_int),
                   ("pos_emb", _F), ("cell", ctypes.POINTER(ctypes.c_int32)), ("prior_weight", ctypes.c_float),
                   ("guard", ctypes.c_float), ("guard_slope", ctypes.c_float),
                   ("work", _F), ("threads", ctypes.c_int)]
                + [(n, _F) for n in ("noise_first", "noise_accept", "noise_draft", "qlog")]
                + [("stage_ticks", ctypes.POINTER(ctypes.c_double))])


class _Options(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_int) for n in ("k", "rule", "eps", "top_k", "min_block", "window")]
                + [("temperature", ctypes.c_float), ("recycle", ctypes.c_int)])


def _cache_dir() -> Path:
    return Path(os.environ.get("SR_BLOCKWISE_CACHE", Path.home() / ".cache" / "sr-blockwise")) / "engine"


_lib = None
_build_error: str | None = None


def library():
    """The compiled engine (built on first use, then loaded from the cache); raises RuntimeError
    with the reason where it cannot be built."""
    global _lib, _build_error
    if _lib is not None:
        return _lib
    if _build_error is not None:
        raise RuntimeError(_build_error)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        _build_error = "no C++ compiler (g++) found: the native engine cannot be built"
        raise RuntimeError(_build_error)
    # -march=native: a cached build is only for a processor with the same instruction sets
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + cpu_flags()).hexdigest()[:16]
    so = _cache_dir() / f"engine-{key}.so"
    if not so.exists():
        so.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
            out = Path(tmp) / so.name
            r = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                _build_error = f"building the native engine failed:\n{r.stderr[-2000:]}"
                raise RuntimeError(_build_error)
            os.replace(out, so)  # atomic: a concurrent build leaves one whole file
    lib = ctypes.CDLL(str(so))
    for name in ("engine_start", "engine_step", "engine_draft"):
        getattr(lib, name).restype = None
    lib.engine_iterate.restype = ctypes.c_int
    lib.engine_amx.restype = ctypes.c_int
    lib.engine_work_floats.restype = ctypes.c_size_t
    _lib = lib
    return lib


def cpu_flags() -> bytes:
    """The processor's instruction-set flags (/proc/cpuinfo's flags line; elsewhere its name)."""
    try:
        lines = Path("/proc/cpuinfo").read_bytes().splitlines()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
    return next((ln for ln in lines if ln.startswith(b"flags")), platform.machine().encode())


def threads_for_this_thread() -> int:
    """OpenMP threads for a call made from the calling thread: torch's count on the main thread,
    1 elsewhere. Both share one OpenMP runtime; once the process's thread pools outnumber the
    cores (a worker's team besides one the main thread ran), barriers sleep instead of spinning:
    a face took 3.1 s on 2 threads in a worker thread against 0.3 s on 1
    (experiments/demo-latency/worker_threads.py)."""
    return torch.get_num_threads() if threading.current_thread() is threading.main_thread() else 1


def uses_amx() -> bool:
    """Whether the engine multiplies bfloat16 matrices on this processor's AMX tiles (engine.cpp's
    amx_range): then a model's bf16 weights are packed for them. The tiles round differently from
    the multiply-adds of a processor without AMX, and decoding carries that on: the two share
    about half of a face's intensities (35 dB PSNR apart), at the same quality."""
    return bool(library().engine_amx())


def available() -> bool:
    return build_problem() is None


def build_problem() -> str | None:
    """Why the engine cannot be built here, in a line: the compiler's first error where it
    refused the source (None where it builds)."""
    try:
        library()
        return None
    except RuntimeError as e:
        lines = str(e).splitlines()
        error = next((ln.strip() for ln in lines[1:] if "error:" in ln), None)
        return f"{lines[0].rstrip(':')}: {error}" if error else lines[0].rstrip(":")


def supports(model: ImageTransformerSR) -> str | None:
    """None where the engine runs this model, else why not."""
    cfg = model.cfg
    if cfg.head1 != "base":
        return "the native engine runs head1='base' models (p1 = the base logits)"
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 16 or cfg.d_model % 32:
        return "the native engine needs a head dimension that is a multiple of 16 and a model width that is a multiple of 32"
    if cfg.block_len <= MAX_TOKENS or cfg.block_len % 32:
        return (f"the native engine needs attention blocks longer than {MAX_TOKENS} tokens and a multiple of 32 "
                "(a window starts at a block start, and keys are cached in tiles of 32)")
    if cfg.d_ff % 16 or cfg.head_ff % 16:
        return "the native engine needs widths that are multiples of 16"
    return None


def _ptr(t: torch.Tensor, kind=_F):
    return ctypes.cast(t.data_ptr(), kind)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


class Weights:
    """A model's weights in the engine's layout (float32; linear weights transposed, in x out, in
    panels of 16 columns, and kept in bfloat16 where every entry is a bfloat16 value already: the
    same numbers, half the bytes to stream), packed once and shared by every batch decoded with
    the model. `bf16`: the decoder layers' matrices are all bfloat16 (a decoder trained in bf16,
    whose keys and values were bfloat16 in training), and then batches keep their keys and values
    in bfloat16 too: reading them is most of an attention call."""

    def __init__(self, model: ImageTransformerSR):
        why = supports(model)
        if why:
            raise ValueError(why)
        cfg = model.cfg
        self.cfg = cfg
        keep = []  # every tensor a pointer refers to stays alive with this object
        amx = uses_amx()

        def f(t, transpose=False):
            t = _f32(t.t() if transpose else t)
            keep.append(t)
            return _ptr(t)

        def mat(w):  # a linear layer's weight (out, in) as (in, out) in panels of 16 columns
            t = _f32(w.t())
            rows, cols = t.shape
            t = t.reshape(rows, cols // 16, 16).transpose(0, 1).contiguous()
            kind = 0
            bf16 = torch.equal(t.to(torch.bfloat16).to(torch.float32), t)
            if bf16 and amx:
                # for the tiles (engine.cpp's amx_range): a panel's inputs in pairs, K padded to 32
                rows = (rows + 31) // 32 * 32
                t = torch.cat([t, t.new_zeros(len(t), rows - len(t[0]), 16)], 1).reshape(len(t), rows // 2, 2, 16)
                t, kind = t.transpose(2, 3).contiguous().to(torch.bfloat16), 2
            elif bf16:
                # bf16 panels in interleaved pairs (engine.cpp's Mat), a zero panel after an odd last one
                t = torch.cat([t, t.new_zeros(len(t) % 2, rows, 16)]).reshape(-1, 2, rows, 16)
                t, kind = t.permute(0, 2, 3, 1).contiguous().to(torch.bfloat16), 1
            keep.append(t)
            return _Mat(t.data_ptr(), kind, rows)

        layers = (_Layer * cfg.n_dec_layers)()
        for L, layer in zip(layers, model.decoder):
            a, c, ffn = layer.self_attn, layer.cross_attn, layer.ff
            L.ln1_w, L.ln1_b = f(layer.ln1.weight), f(layer.ln1.bias)
            L.qkv_w, L.qkv_b = mat(a.qkv.weight), f(a.qkv.bias)
            L.out_w, L.out_b = mat(a.out.weight), f(a.out.bias)
            L.ln2_w, L.ln2_b = f(layer.ln2.weight), f(layer.ln2.bias)
            L.cq_w, L.cq_b = mat(c.q.weight), f(c.q.bias)
            L.cout_w, L.cout_b = mat(c.out.weight), f(c.out.bias)
            L.ln3_w, L.ln3_b = f(layer.ln3.weight), f(layer.ln3.bias)
            L.up_w, L.up_b = mat(ffn.up.weight), f(ffn.up.bias)
            L.down_w, L.down_b = mat(ffn.down.weight), f(ffn.down.bias)
        e = _Engine()
        e.d, e.H, e.L, e.ff, e.n_layers = cfg.d_model, cfg.n_heads, cfg.block_len, cfg.d_ff, cfg.n_dec_layers
        e.layers = layers
        e.tgt_emb, e.dec_ln_w, e.dec_ln_b = f(model.tgt_emb.weight), f(model.dec_ln.weight), f(model.dec_ln.bias)
        e.lm_w = mat(model.lm_head.weight)
        heads = model.heads
        if heads is not None:
            e.G, e.f = heads.G, heads.f
            down = heads.down.weight if heads.premasked else heads.down.weight * heads.tri_mask.to(heads.down.weight.dtype)
            e.heads_up_w, e.heads_up_b = mat(heads.up.weight), f(heads.up.bias)
            e.heads_down_w, e.heads_down_b = mat(down), f(heads.down.bias)
            e.heads_ln_w = f(torch.stack([n.weight for n in heads.norms]))
            e.heads_ln_b = f(torch.stack([n.bias for n in heads.norms]))
            if heads.nbr_prior is not None:
                e.has_nbr_prior, e.nbr_draft = 1, int(cfg.nbr_draft)
                e.nbr_prior = f(heads.nbr_prior)
        if model.lr_prior is not None:
            e.has_lr_prior, e.lr_prior = 1, f(model.lr_prior)
        self.bf16 = all(getattr(L, n).bf16 for L in layers for n in ("qkv_w", "out_w", "cq_w", "cout_w", "up_w", "down_w"))
        # bf16 keys and values; on the tiles, attention too where a head's width is whole tile rows
        e.kv_bf16 = (2 if amx and (cfg.d_model // cfg.n_heads) % 32 == 0 else 1) if self.bf16 else 0
        self.struct, self._keep, self._layers = e, keep, layers
        self.fingerprint = _fingerprint(model)


def _fingerprint(model: ImageTransformerSR) -> tuple:
    """Changes whenever a parameter or buffer is replaced or modified in place (an optimizer step,
    load_state_dict, for_inference): the packed copy is then stale."""
    return tuple((t.data_ptr(), t._version, t.dtype) for t in (*model.parameters(), *model.buffers()))


_packed: "weakref.WeakKeyDictionary[ImageTransformerSR, Weights]" = weakref.WeakKeyDictionary()


def packed(model: ImageTransformerSR) -> Weights:
    """The model's weights in the engine's layout, packed once and repacked only after the
    model's weights change (kept beside the model, not on it: a deepcopy does not carry it)."""
    w = _packed.get(model)
    if w is None or w.fingerprint != _fingerprint(model):
        w = _packed[model] = Weights(model)
    return w


def _keys(k: torch.Tensor, H: int, bf16: bool) -> torch.Tensor:
    """Keys (B, n, d) per head as engine.cpp's attention reads them (key_at): float32 in tiles of
    32 keys, (B, H, n / 32, hd, 32); bfloat16 in groups of 16 keys whose dimensions go in pairs,
    (B, H, n / 16, hd / 2, 16, 2), as the tiles read them."""
    B, n, d = k.shape
    hd = d // H
    if not bf16:
        return k.reshape(B, n // 32, 32, H, hd).permute(0, 3, 1, 4, 2).contiguous()
    return k.reshape(B, n // 16, 16, H, hd // 2, 2).permute(0, 3, 1, 4, 2, 5).to(torch.bfloat16).contiguous()


def _values(v: torch.Tensor, H: int, bf16: bool) -> torch.Tensor:
    """Values (B, n, d) per head (value_at): float32 (B, H, n, hd); bfloat16 with the keys in
    pairs, (B, H, n / 2, hd, 2)."""
    B, n, d = v.shape
    hd = d // H
    if not bf16:
        return v.reshape(B, n, H, hd).transpose(1, 2).contiguous()
    return v.reshape(B, n // 2, 2, H, hd).permute(0, 3, 1, 4, 2).to(torch.bfloat16).contiguous()


class Batch:
    """The per-image state of one batch: KV caches, the encoder's cross-attention K/V, each
    position's input embedding, and the decoded tokens, block map and counters."""

    def __init__(self, model: ImageTransformerSR, src: torch.Tensor, k: int, prior_weight: float = 1.0,
                 guard: float = 0.0, guard_slope: float = 0.0):
        if not 1 <= k <= MAX_TOKENS:
            raise ValueError(f"the native engine feeds 1..{MAX_TOKENS} tokens per call, got k={k}")
        weights = packed(model)
        cfg = weights.cfg
        B = src.shape[0]
        self.weights, self.B, self.k = weights, B, k
        d = cfg.d_model
        cache_len = 4 * cfg.block_len + 64  # the ring (engine.cpp) and the reads past a window's end; tiles of 32
        self.model = model
        self.pos_emb, self.cell, self.enc_k, self.enc_v = self._inputs(src)
        H = cfg.n_heads
        empty = torch.zeros(B, cache_len, d)
        self.k_cache = [_keys(empty, H, weights.bf16) for _ in range(cfg.n_dec_layers)]
        self.v_cache = [_values(empty, H, weights.bf16) for _ in range(cfg.n_dec_layers)]
        e = _Engine.from_buffer_copy(weights.struct)
        self._ptr_arrays = [(ctypes.c_void_p * len(xs))(*[x.data_ptr() for x in xs])
                            for xs in (self.k_cache, self.v_cache, self.enc_k, self.enc_v)]
        e.k_cache, e.v_cache, e.enc_k, e.enc_v = [ctypes.cast(a, ctypes.POINTER(ctypes.c_void_p)) for a in self._ptr_arrays]
        e.B, e.cache_len, e.n_src = B, cache_len, SRC_LEN
        e.pos_emb, e.cell = _ptr(self.pos_emb), _ptr(self.cell, ctypes.POINTER(ctypes.c_int32))
        e.prior_weight = float(prior_weight)
        # the cell guard on p1 (decoding.cell_guard; slope 0: off)
        e.guard, e.guard_slope = float(guard), float(guard_slope) if guard else 0.0
        G_f = model.heads.f if model.heads is not None else 16
        self.work = torch.empty(library().engine_work_floats(B, d, cfg.d_ff, G_f))
        e.work = _ptr(self.work)
        e.threads = threads_for_this_thread()
        self.struct = e
        self.toks_len = SEQ_LEN + MAX_TOKENS
        self.tokens = torch.zeros(B, self.toks_len, dtype=torch.int64)
        self.block_map = torch.zeros(B, SEQ_LEN, dtype=torch.uint8)
        self.t = torch.zeros(B, dtype=torch.int64)
        self.props = torch.zeros(B, k, dtype=torch.int64)
        self.hist = torch.zeros(B, k, dtype=torch.int64)
        self.calls = torch.ones(B, dtype=torch.int64)  # the first, prefix-free call
        self._noise = None  # sampling's noise tables (sample_with)

    def _inputs(self, src: torch.Tensor) -> tuple:
        """What the engine reads of each image's input: each position's input embedding, the 8x8
        intensity under it, and the encoder's cross-attention keys and values per layer."""
        model, B, H = self.model, src.shape[0], self.weights.cfg.n_heads
        with torch.no_grad():
            pos = torch.arange(SEQ_LEN).expand(B, -1)
            pe = model.row_emb(model.tgt_r) + model.col_emb(model.tgt_c) + model.ch_emb(model.tgt_ch)
            pe = pe.expand(B, -1, -1)
            if model.lr_emb is not None:
                pe = pe + model.lr_emb(model.cell_intensity(src, pos) + VOCAB * model.tgt_ch)
            cell = model.cell_intensity(src, pos).to(torch.int32).contiguous()
            kv = model.cross_kv(model.encode(src))
        return (_f32(pe), cell, [_keys(_f32(k_), H, self.weights.bf16) for k_, _ in kv],
                [_values(_f32(v_), H, self.weights.bf16) for _, v_ in kv])

    def load(self, rows: torch.Tensor, src: torch.Tensor) -> None:
        """New images into the slots `rows` (int64) of a batch that goes on decoding its others:
        their inputs in place (the engine holds pointers to these tensors) and their counters
        reset; start() then makes their first call."""
        pos_emb, cell, enc_k, enc_v = self._inputs(src)
        self.pos_emb[rows], self.cell[rows] = pos_emb, cell
        for ours, theirs in zip(self.enc_k + self.enc_v, enc_k + enc_v):
            ours[rows] = theirs
        for x in (self.tokens, self.block_map, self.t, self.props, self.hist):
            x[rows] = 0
        self.calls[rows] = 1

    def options(self, rule="exact", eps=0, top_k=1, min_block=1, window=0, temperature=0.0,
                recycle=False) -> _Options:
        """A call's settings. recycle (the exact rule): proposals past a rejected one are p1's own
        argmax from the call that rejected it (decoding.DecodeOptions.propose, "recycle")."""
        if rule == "sample" and (self._noise is None or not temperature > 0):
            raise ValueError("the sample rule needs a temperature > 0 and the noise tables (sample_with)")
        if recycle and (rule != "exact" or min_block != 1):
            raise ValueError("recycled proposals are for the exact rule with min_block 1")
        return _Options(self.k, RULES[rule], eps, top_k, min_block, window, temperature, int(recycle))

    def time_stages(self) -> torch.Tensor:
        """From now on, every call adds the processor's cycle count of each of its stages (STAGES)
        to the returned (len(STAGES),) float64 tensor: where the calls' time goes."""
        self.stage_ticks = torch.zeros(len(STAGES), dtype=torch.float64)
        self.struct.stage_ticks = ctypes.cast(self.stage_ticks.data_ptr(), ctypes.POINTER(ctypes.c_double))
        return self.stage_ticks

    def sample_with(self, noise: tuple) -> None:
        """Sampling's noise tables (sampling.sampling_noise: the sure tokens' Gumbel noise (B,
        3072, 256), and for k > 1 the acceptance uniforms (B, 3072) and the drafts' Gumbel noise
        (B, 3072, 256)), which the "sample" rule reads."""
        first, accept, draft = (_f32(x) if x is not None else None for x in noise)
        if first is None or first.shape != (self.B, SEQ_LEN, VOCAB) or (self.k > 1 and (accept is None or draft is None)):
            raise ValueError("sampling needs the noise of every position of every image (and, for k > 1, the drafts')")
        self.qlog = torch.zeros(self.B, MAX_TOKENS - 1, VOCAB)
        self._noise = (first, accept, draft)
        e = self.struct
        e.noise_first, e.qlog = _ptr(first), _ptr(self.qlog)
        if self.k > 1:
            e.noise_accept, e.noise_draft = _ptr(accept), _ptr(draft)

    def start(self, opts: _Options, rows: torch.Tensor | None = None) -> None:
        rows = torch.arange(self.B) if rows is None else rows
        library().engine_start(ctypes.byref(self.struct), ctypes.byref(opts), len(rows), _ptr(rows, _I64),
                               _ptr(self.tokens, _I64), self.toks_len, _ptr(self.props, _I64))

    def iterate(self, opts: _Options, rows: torch.Tensor, n: int, propose: bool = True,
                max_calls: int = 1) -> tuple[int, int]:
        """Blockwise steps (calls) of the images rows[:n] (int64), which it compacts in place to
        the images still decoding (order kept): up to max_calls of them in one crossing into the
        engine, fewer if an image finishes (at least one while any image decodes). Returns how many
        images are still decoding, and the calls made."""
        made = ctypes.c_int(0)
        live = library().engine_iterate(ctypes.byref(self.struct), ctypes.byref(opts), n, _ptr(rows, _I64),
                                        _ptr(self.t, _I64), _ptr(self.props, _I64), _ptr(self.tokens, _I64),
                                        self.toks_len, _ptr(self.block_map, ctypes.POINTER(ctypes.c_uint8)),
                                        _ptr(self.hist, _I64), _ptr(self.calls, _I64), int(propose),
                                        int(max_calls), ctypes.byref(made))
        return live, made.value

    def draft(self, opts: _Options, b: int, h: torch.Tensor, pos: torch.Tensor, first: torch.Tensor,
              tokens: torch.Tensor) -> torch.Tensor:
        """Blocks of k proposals (m, k) of image b from its states h (m, d) predicting positions
        pos (m,), with sure tokens first (m,), heads reading the decoded tokens `tokens` (at
        their positions; before each pos only). m is at most the batch size."""
        m = len(pos)
        if m > self.B:
            raise ValueError(f"draft takes at most {self.B} states at a time, got {m}")
        if opts.rule == RULES["sample"]:
            raise ValueError("draft proposes argmax blocks (the exact-mode replay), not samples")
        props = torch.zeros(m, self.k, dtype=torch.int64)
        props[:, 0] = first
        buf = torch.zeros(self.toks_len, dtype=torch.int64)
        buf[: len(tokens)] = tokens[: self.toks_len]
        h, pos = _f32(h), pos.to(torch.int32).contiguous()
        library().engine_draft(ctypes.byref(self.struct), ctypes.byref(opts), b, m, _ptr(h),
                               _ptr(pos, ctypes.POINTER(ctypes.c_int32)), _ptr(buf, _I64), _ptr(props, _I64))
        return props

    def step(self, b: int, prev: torch.Tensor, pos0: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder states (n, d) and p1's logits (n, 256) of image b for tokens prev (n,) fed at
        positions pos0.. (K/V written into the cache, as a decoding call does)."""
        prev = prev.to(torch.int64).contiguous()
        n = len(prev)
        if n > MAX_TOKENS:
            raise ValueError(f"a call takes at most {MAX_TOKENS} tokens, got {n}")
        h = torch.empty(n, self.weights.cfg.d_model)
        z = torch.empty(n, VOCAB)
        library().engine_step(ctypes.byref(self.struct), b, n, _ptr(prev, _I64), pos0, _ptr(h), _ptr(z))
        return h, z


# ---------------------------------------------------------------- which engine decodes

ENGINES = ("auto", "native", "torch", "static")


def not_native(model: ImageTransformerSR) -> str | None:
    """Why the native engine cannot decode this model here, or None where it can."""
    if next(model.parameters()).device.type != "cpu":
        return "the native engine runs on the CPU"
    if supports(model):
        return supports(model)
    if not available():
        return build_problem()
    return None


def engine_for(model: ImageTransformerSR, opts, engine: str = "auto") -> str:
    """Which engine decodes: on a CPU "native" (engine.cpp: a whole blockwise step of a batch in
    one call, float32 arithmetic) wherever it can; on a GPU "static" (static.py: fixed shapes,
    CUDA graphs) wherever it can; else "torch" (the PyTorch step: head1='layer' models, trees on
    a CPU, sampling on a GPU, machines without a C++ compiler)."""
    from .static import static_problem

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {ENGINES}")
    if engine == "static":
        if static_problem(opts):
            raise ValueError(static_problem(opts))
        return "static"
    if engine == "auto" and next(model.parameters()).device.type == "cuda" and not static_problem(opts):
        return "static"
    # on a CPU a call's cost grows with its candidates: trees do not pay in the native engine
    why = "tree verification runs on the torch and static engines" if opts.tree else not_native(model)
    if engine == "native" and why:
        raise ValueError(why)
    return "torch" if (engine == "torch" or why) else "native"


# ---------------------------------------------------------------- decoding on the engine

CALLS_PER_CROSSING = 256  # at most, from Python into the engine: ~0.01 s at batch 1, ~0.5 s at batch 64


def call_options(batch: Batch, opts) -> _Options:
    """The engine's settings for a call from decode options (sampling: after batch.sample_with)."""
    if opts.temperature > 0:
        return batch.options("sample", temperature=opts.temperature)
    window = opts.eps if opts.propose == "window" and opts.eps > 0 else 0
    return batch.options(opts.rule, opts.eps, opts.top_k, opts.min_block, window, recycle=opts.propose == "recycle")


def decode_native(model, lr, opts, progress, progress_every, proposer, seeds=None) -> DecodeResult:
    """decode on the native engine: one call per blockwise step of the whole batch, several calls
    a crossing from Python (Batch.iterate's max_calls); the loop here only notes when images
    finish, reports progress and hands proposals to a `proposer` if one is given. Sampling reads
    the same per-image noise tables as the torch engine (sampling_noise)."""
    t0 = time.perf_counter()
    src = torch.from_numpy(to_tokens(lr)).cpu()
    B, k = len(lr), opts.k
    batch = Batch(model, src, k, opts.prior_weight, opts.guard, GUARD_SLOPE)
    if opts.temperature > 0:
        batch.sample_with(sampling_noise(B, opts, "cpu", seeds, speculative=k > 1))
    copts = call_options(batch, opts)
    rows = torch.arange(B, dtype=torch.int64)
    batch.start(copts, rows)
    if proposer is not None and k > 1:
        batch.props[:, 1:] = proposer(batch.t.clone(), rows.clone(), k)
    finish = np.zeros(B)
    live, n_calls = B, 1
    t = batch.t.numpy()  # a view: the engine updates it in place
    while live:
        was = live
        # as many calls in one crossing as nothing here needs between them (an outside proposer
        # every call, progress every progress_every), up to CALLS_PER_CROSSING (Ctrl-C is seen
        # between crossings); the engine returns when an image finishes
        calls = 1 if proposer is not None and k > 1 else CALLS_PER_CROSSING
        if progress is not None:
            calls = min(calls, progress_every - n_calls % progress_every)
        live, made = batch.iterate(copts, rows, live, propose=proposer is None, max_calls=calls)
        n_calls += made
        if live < was:  # the images that finished in the last call
            finish[(t >= SEQ_LEN) & (finish == 0)] = time.perf_counter() - t0
        if proposer is not None and k > 1 and live:
            r = rows[:live].clone()
            batch.props[r, 1:] = proposer(batch.t[r], r, k).to(torch.int64)
        if progress is not None and n_calls % progress_every == 0:
            progress(batch.tokens[:, :SEQ_LEN].numpy().copy(), batch.t.numpy().copy(), batch.block_map.numpy().copy(), n_calls)
    seconds = time.perf_counter() - t0
    tokens = batch.tokens[:, :SEQ_LEN].numpy().copy()
    stats = [DecodeStats(int(batch.calls[i]), batch.hist[i].tolist(), float(finish[i])) for i in range(B)]
    if progress is not None:
        progress(tokens, batch.t.numpy().copy(), batch.block_map.numpy().copy(), n_calls)
    return DecodeResult(from_tokens(tokens), stats, batch.block_map.numpy().copy(), seconds, n_calls,
                        {"engine": "native"})


class ContinuousBatch:
    """Continuous batching on the native engine: up to `slots` images with the same options decode
    together, each in a slot of its own; an image joins between calls (its first call then) and
    leaves when its last intensity is decoded, while the others go on. Each image's output is the
    one it gets decoded alone: its arithmetic reads only its own row (engine.cpp). Images are
    known by the caller's tags."""

    def __init__(self, model: ImageTransformerSR, opts, slots: int):
        if engine_for(model, opts) != "native":
            raise ValueError("continuous batching runs on the native engine: "
                             + (not_native(model) or "trees run on the torch and static engines"))
        self.opts, self.slots = opts, slots
        self.batch = Batch(model, torch.zeros(slots, SRC_LEN, dtype=torch.int64), opts.k, opts.prior_weight,
                           opts.guard, GUARD_SLOPE)
        if opts.temperature > 0:  # every slot's noise, filled in as images join
            speculative = opts.k > 1
            self.batch.sample_with((torch.zeros(slots, SEQ_LEN, VOCAB), torch.zeros(slots, SEQ_LEN) if speculative else None,
                                    torch.zeros(slots, SEQ_LEN, VOCAB) if speculative else None))
        self.copts = call_options(self.batch, opts)
        self.rows = torch.zeros(slots, dtype=torch.int64)  # rows[:live]: the slots decoding, in order
        self.live = 0
        self.tags: list = [None] * slots
        self.started = [0.0] * slots
        self.shared = [0] * slots  # the most images a slot's image decoded beside (itself included)

    @property
    def free(self) -> int:
        return self.slots - self.live

    def admit(self, lrs: np.ndarray, tags: list, seeds: list | None = None) -> None:
        """Images (n, 8, 8, 3) uint8 into free slots, their first call made; seeds: sampling's
        per-image seed (decoding.sampling_noise), as decode() gets them."""
        n = len(lrs)
        if n > self.free:
            raise ValueError(f"{n} images for {self.free} free slots")
        taken = set(self.rows[:self.live].tolist())
        slots = torch.tensor([s for s in range(self.slots) if s not in taken][:n], dtype=torch.int64)
        self.batch.load(slots, torch.from_numpy(to_tokens(lrs)))
        if self.opts.temperature > 0:
            for table, rows in zip(self.batch._noise, sampling_noise(n, self.opts, "cpu", seeds,
                                                                       speculative=self.opts.k > 1)):
                if table is not None:
                    table[slots] = rows
        self.batch.start(self.copts, slots)
        now = time.perf_counter()
        for s, tag in zip(slots.tolist(), tags):
            self.tags[s], self.started[s], self.shared[s] = tag, now, 0
        self.rows[self.live:self.live + n] = slots
        self.live += n

    def run(self, max_calls: int) -> list[tuple[object, DecodeResult]]:
        """Calls of every decoding image, up to max_calls in one crossing (fewer where an image
        finishes); returns the images that finished, each (tag, its DecodeResult)."""
        if not self.live:
            return []
        before = self.rows[:self.live].tolist()
        for s in before:
            self.shared[s] = max(self.shared[s], len(before))
        self.live, _ = self.batch.iterate(self.copts, self.rows, self.live, max_calls=max_calls)
        still = set(self.rows[:self.live].tolist())
        return [(self.tags[s], self.result(s)) for s in before if s not in still]

    def result(self, slot: int) -> DecodeResult:
        b = self.batch
        seconds = time.perf_counter() - self.started[slot]
        stats = DecodeStats(int(b.calls[slot]), b.hist[slot].tolist(), seconds)
        tokens = b.tokens[slot:slot + 1, :SEQ_LEN].numpy().copy()
        return DecodeResult(from_tokens(tokens), [stats], b.block_map[slot:slot + 1].numpy().copy(), seconds,
                            int(b.calls[slot]), {"engine": "native", "batch": self.shared[slot]})

    def progress(self) -> list[tuple[object, np.ndarray, int, np.ndarray, int, float]]:
        """Each decoding image's (tag, tokens, decoded length, block map, calls, seconds)."""
        b, now = self.batch, time.perf_counter()
        return [(self.tags[s], b.tokens[s, :SEQ_LEN].numpy().copy(), int(b.t[s]), b.block_map[s].numpy().copy(),
                 int(b.calls[s]), now - self.started[s]) for s in self.rows[:self.live].tolist()]

    def drop(self, tags) -> None:
        """Stop decoding these images (e.g. their callers left); their slots free."""
        keep = [s for s in self.rows[:self.live].tolist() if self.tags[s] not in tags]
        self.rows[:len(keep)] = torch.tensor(keep, dtype=torch.int64)
        self.live = len(keep)
