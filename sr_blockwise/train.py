"""Training: the base model, blockwise heads on a frozen base, and joint fine-tuning.

Stages (--stage):
  base      next-intensity loss for the base; the heads train at the same time on the *detached*
            decoder state, so they never change the base: this is "heads on a frozen base" for
            free, sharing the one trunk forward.
  heads     base frozen (no gradient, trunk run under no_grad), only the heads train.
  finetune  base and heads jointly (the paper's fine-tuned setting); --distill FILE trains on the
            base model's own greedy outputs (sequence-level distillation).
With --distill in the heads stage the targets stay the frozen base's greedy outputs, so the last
--eval-images of them are held out and the log's val_block is exact mode's mean accepted block at
k = n_blockwise on them (by replay, decoding.exact_block_stats): the heads' own learning curve,
where val bits/dim would not move.
Head loss: sum over all heads (default) or one random head per step (the paper's choice), on a
random subset of positions (--head-frac) so the heads cost a fraction of the trunk. Each head's
loss is the cross-entropy of its target, or with --head-window W the negative log of the head's
probability mass within W levels of the target: what the eps=W rule accepts, so the heads need
not spend capacity on which of the 2W+1 values it is (pair it with window proposals).

Resumable: a checkpoint (model, optimizer, step, data order, RNG) every few minutes and on Ctrl-C,
written atomically; --resume continues. Runs under torchrun (DDP, gloo on CPU, nccl on CUDA).
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from .checkpoints import WeightsError, read_checkpoint
from .data import downsample_8, load_faces, to_tokens
from .model import SEQ_LEN, VOCAB, ImageTransformerSR, ModelConfig, preset

CACHE_DIR = Path(os.environ.get("SR_BLOCKWISE_CACHE", Path.home() / ".cache" / "sr-blockwise"))


@dataclass
class TrainConfig:
    run: str = "cpu-base"  # checkpoints go to CACHE_DIR/run
    preset: str = "cpu"
    stage: str = "base"  # base | heads | finetune
    data: str | None = None  # default: ../shared/data/celeba32.npz
    distill: str | None = None  # .npz of greedy outputs (images, lr) for distillation
    init_from: str | None = None  # a checkpoint or shipped weights to start from (new optimizer)
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 500
    # a warm start (--init-from) continues the lr schedule of the run its weights came from, as if
    # at this step of it, instead of warming up and decaying all over again (0: a fresh schedule)
    schedule_offset: int = 0
    weight_decay: float = 0.0
    head_loss: str = "sum"  # sum | random
    head_frac: float = 0.25  # fraction of positions the head loss uses
    head_weight: float = 1.0  # weight of the head loss against p1's
    head_window: int = 0  # 0: cross-entropy; W > 0: -log P(|x - target| <= W) (window_nll)
    max_steps: int = 10**9
    max_minutes: float = 1e9
    ckpt_minutes: float = 5.0
    eval_minutes: float = 10.0
    eval_images: int = 64
    seed: int = 0
    device: str = "cpu"
    bf16: bool = True
    threads: int = 0  # 0: torch default

    def __post_init__(self):
        if self.stage not in ("base", "heads", "finetune"):
            raise ValueError(f"stage must be base, heads or finetune, got {self.stage!r}")
        if self.head_loss not in ("sum", "random"):
            raise ValueError(f"head_loss must be sum or random, got {self.head_loss!r}")
        if self.head_window < 0:
            raise ValueError(f"head_window must be >= 0 intensity levels, got {self.head_window}")


FRESH_ADAM_RAMP = 100  # steps of linear ramp for a warm start's fresh optimizer (schedule_offset)
TABLE_LR_MULT = 20.0  # the nbr_prior tables' learning rate, as a multiple of the network's


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Noam-style: linear warmup, then 1/sqrt decay (no end date, so runs can be resumed).
    With schedule_offset the curve is read at step + offset, behind a short linear ramp: a fresh
    Adam's first steps, before its moment estimates settle, should not take the full rate."""
    step = max(step, 1)
    ramp = min(1.0, step / FRESH_ADAM_RAMP) if cfg.schedule_offset else 1.0
    s = step + cfg.schedule_offset
    return cfg.lr * ramp * min(s / cfg.warmup, math.sqrt(cfg.warmup / s))


def window_nll(logits: torch.Tensor, target: torch.Tensor, w: int) -> torch.Tensor:
    """(..., 256) logits, (...) targets (-100: ignored, loss 0) -> (...) -log P(|x - target| <= w):
    the log-probabilities of the 2w+1 values around the target (fewer at 0 and 255), summed."""
    logp = logits.log_softmax(-1)
    near = target.clamp(min=0)[..., None] + torch.arange(-w, w + 1, device=target.device)
    inside = (near >= 0) & (near < logits.shape[-1])
    lp = logp.gather(-1, near.clamp(0, logits.shape[-1] - 1)).masked_fill(~inside, float("-inf"))
    return (-lp.logsumexp(-1)).masked_fill(target < 0, 0.0)


class TrainingLoss(nn.Module):
    """The model plus its training loss, as one module, so that DistributedDataParallel sees every
    parameter use (the output projection and heads too) inside forward."""

    def __init__(self, model: ImageTransformerSR, cfg: TrainConfig):
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, src, tgt, gen: torch.Generator):
        """Returns (p1 loss in nats/token, head loss, per-head losses (G,) tensor or None)."""
        m, cfg = self.model, self.cfg
        if cfg.stage == "heads":
            with torch.no_grad():
                h = m(src, tgt)
        else:
            h = m(src, tgt)
        base_loss = F.cross_entropy(m.logits(h, src).float().flatten(0, 1), tgt.flatten())
        G = m.cfg.n_groups
        if G == 0 or m.heads is None:
            return base_loss, torch.zeros((), device=h.device), None
        hh = h.detach() if cfg.stage == "base" else h
        n_pos = max(1, int(SEQ_LEN * cfg.head_frac))
        pos = to_device(torch.randperm(SEQ_LEN, generator=gen)[:n_pos], h.device)
        hs = hh[:, pos]  # (B, P, d)
        off0 = 1 if m.cfg.head1 == "base" else 0  # group i predicts the token (i + off0) ahead
        gi = int(torch.randint(G, (1,), generator=gen)) if cfg.head_loss == "random" else G - 1
        if cfg.head_loss == "random":
            groups = [gi]
            z = m.heads(hs, gi + 1)[:, :, gi : gi + 1]  # nested: group gi needs only groups <= gi
        else:
            groups = list(range(G))
            z = m.heads(hs, G)
        # in the base stage the heads must not move p1 either: they read the shared output
        # projection without training it
        W = m.lm_head.weight.detach() if cfg.stage == "base" else m.lm_head.weight
        logits = F.linear(z, W).float()  # (B, P, g, 256)
        group_ids = to_device(torch.tensor(groups), h.device)
        tpos = pos[:, None] + group_ids + off0  # (P, g) predicted positions
        if m.lr_prior is not None:  # the same prior p1 uses, at each head's own position
            prior = m.prior(src, tpos.expand(len(src), -1, -1))
            logits = logits + (prior.detach() if cfg.stage == "base" else prior)
        if m.cfg.nbr_prior:  # heads 2..K's own prior over offsets from decoded neighbours
            # head1="layer": group 0 is p1, which has none; counted here, not on the device (a read
            # from a GPU waits for it), and sliced off, as groups are in order
            n_p1 = sum(g + off0 + 1 < 2 for g in groups)
            j = group_ids[n_p1:] + off0 + 1  # head number: 2..K
            nbr = m.heads.neighbour_prior(tgt, tpos[:, n_p1:].expand(len(src), -1, -1), j)
            logits = logits + F.pad(nbr, (0, 0, n_p1, 0))
        # every head's loss in one call (a call per head, slicing the logits, spent ~0.4 s of a
        # fine-tuning step filling the slices' gradients with zeros, profiled): the mean over
        # each head's valid targets
        valid = (tpos < SEQ_LEN).expand(len(src), -1, -1)  # (B, P, g)
        target = tgt[:, tpos.clamp(max=SEQ_LEN - 1)].masked_fill(~valid, -100)
        if cfg.head_window:
            ce = window_nll(logits, target, cfg.head_window)
        else:
            ce = F.cross_entropy(logits.flatten(0, 2), target.flatten(), ignore_index=-100, reduction="none")
        per_head = ce.view_as(target).sum((0, 1)) / valid.sum((0, 1))
        head_loss = per_head.sum() if cfg.head_loss == "sum" else per_head[0] * G
        return base_loss, head_loss, per_head.detach()


@torch.no_grad()
def bits_per_dim(model: ImageTransformerSR, images32: np.ndarray, batch_size: int = 8,
                 bf16: bool = True, device: str = "cpu") -> float:
    """Held-out negative log-likelihood of p1 in bits per intensity."""
    m = model
    was_training = m.training
    m.eval()
    total, count = 0.0, 0
    for i in range(0, len(images32), batch_size):
        x = images32[i : i + batch_size]
        src = torch.from_numpy(to_tokens(downsample_8(x))).to(device)
        tgt = torch.from_numpy(to_tokens(x)).to(device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            h = m(src, tgt)
        total += F.cross_entropy(m.logits(h, src).float().flatten(0, 1), tgt.flatten(), reduction="sum").item()
        count += tgt.numel()
    m.train(was_training)
    return total / count / math.log(2)


def held_out_block(model: ImageTransformerSR, lr8: np.ndarray, greedy32: np.ndarray, batch_size: int = 32) -> float:
    """Exact mode's mean accepted block at k = n_blockwise on a frozen base's greedy outputs, by
    replay: on a bf16 inference copy, the dtype the targets were decoded in (the replay refuses
    outputs that are not the copy's greedy ones, e.g. after the base moved)."""
    import copy

    from .decoding import exact_block_stats, pooled_block_hist
    k = model.cfg.n_blockwise
    m = copy.deepcopy(model).cpu().for_inference()
    stats = []
    for i in range(0, len(lr8), batch_size):
        stats += exact_block_stats(m, lr8[i : i + batch_size], greedy32[i : i + batch_size], [k])[k]
    return pooled_block_hist(stats)[1]


def save_checkpoint(path: Path, model: ImageTransformerSR, opt, step: int, cfg: TrainConfig, extra: dict) -> None:
    m = model
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(),  # dropout continues exactly after a resume
                "model_config": m.cfg.to_dict(), "train_config": asdict(cfg), **extra}, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-save never leaves a broken checkpoint


GROWABLE = ("lr_skip", "lr_prior", "nbr_prior", "nbr_draft")  # what a warm start may add


def init_model(cfg: TrainConfig) -> ImageTransformerSR:
    if cfg.init_from:
        from .checkpoints import load_model
        model = load_model(cfg.init_from, dtype=torch.float32, for_inference=False)
        want = preset(cfg.preset)
        for f in ("d_model", "n_heads", "d_ff", "n_enc_layers", "n_dec_layers", "block_len"):
            if getattr(model.cfg, f) != getattr(want, f):
                raise ValueError(f"--init-from {cfg.init_from}: its {f}={getattr(model.cfg, f)} does not "
                                 f"match preset {cfg.preset!r} ({getattr(want, f)})")
        # grow a model that lacks the preset's input skip or prior: new parts start at zero
        grow = {f: True for f in GROWABLE
                if getattr(want, f) and not getattr(model.cfg, f)}
        if grow:
            torch.manual_seed(cfg.seed)  # the grown model is drawn as a fresh one of this run would be
            grown = ImageTransformerSR(replace(model.cfg, **grow))
            state = model.state_dict()
            old_tab = state.pop("heads.nbr_prior", None)
            missing, unexpected = grown.load_state_dict(state, strict=False)
            new_parts = {"lr_emb.weight", "lr_prior", "heads.nbr_prior"}
            assert set(missing) <= new_parts and not unexpected, (missing, unexpected)
            if old_tab is not None:  # nbr_draft adds a third reference (zero); the two others keep
                with torch.no_grad():  # their tables, the left one now read one pixel back
                    grown.heads.nbr_prior[:, : old_tab.shape[1]] = old_tab
            model = grown
        return model
    torch.manual_seed(cfg.seed)  # the same run config gives the same initial weights
    return ImageTransformerSR(preset(cfg.preset))


def _model_of_run(ck_config: dict, want: ModelConfig, ckpt_path) -> ImageTransformerSR:
    """The model a resumed run continues: its own config, when it differs from the preset's only
    in features a warm start grows (a preset that gained one since must not stop old runs
    resuming); any other difference is refused."""
    own = ModelConfig.from_dict(ck_config)
    if replace(own, **{f: getattr(want, f) for f in GROWABLE}) != want:
        raise ValueError(f"{ckpt_path}: checkpoint config {ck_config} does not match "
                         f"this run's model config {want.to_dict()}")
    return ImageTransformerSR(own)


@torch.no_grad()
def init_lr_prior(model: ImageTransformerSR, images32: np.ndarray, lr8: np.ndarray | None = None,
                  scale: float = 1.0, max_images: int = 4096) -> None:
    """Set lr_prior to `scale` x the log of the training data's histogram of (intensity - its
    input cell's intensity), per channel (add-one smoothed). A fresh prior is zero and would take
    thousands of Adam steps to grow to log-probability size; this starts it where it belongs.
    lr8: the 8x8 inputs paired with images32 (default: their box average; distillation pairs
    model outputs with the real inputs). scale 1 measured best for greedy decoding (PSNR 16.9 dB
    vs 10.0 at 0.3, 8 faces, on a model grown from one trained without the prior)."""
    if model.lr_prior is None:
        return
    lr8 = downsample_8(images32[:max_images]) if lr8 is None else lr8[:max_images]
    tgt = torch.from_numpy(to_tokens(images32[:max_images]))
    pos = torch.arange(SEQ_LEN).expand(len(tgt), -1)
    off = tgt - model.cell_intensity(torch.from_numpy(to_tokens(lr8)), pos) + VOCAB - 1
    counts = np.stack([np.bincount(off[:, model.tgt_ch == c].flatten().numpy(), minlength=2 * VOCAB - 1)
                       for c in range(3)]) + 1.0
    logp = np.log(counts / counts.sum(1, keepdims=True))
    model.lr_prior.copy_(torch.from_numpy(scale * logp))


def make_optimizer(model: ImageTransformerSR, cfg: TrainConfig) -> tuple[torch.optim.AdamW, tuple[list, list]]:
    """AdamW over the trainable parameters, and the two parts their gradients are clipped in
    apart (base, heads). The neighbour prior's tables take a larger step: they start at zero and
    must grow to log-probability size (a few nats), which at the network's rate would take
    thousands of steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    head_params = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("heads.")]
    base_params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("heads.")]
    tables = [p for n, p in model.named_parameters() if p.requires_grad and n == "heads.nbr_prior"]
    groups = [{"params": [p for p in params if all(p is not t for t in tables)], "lr_mult": 1.0}]
    if tables:
        groups.append({"params": tables, "lr_mult": TABLE_LR_MULT})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay)
    return opt, (base_params, head_params)


def train_step(loss_fn: nn.Module, opt: torch.optim.Optimizer, clip_parts: tuple[list, list], src: torch.Tensor,
               tgt: torch.Tensor, gen: torch.Generator, step: int, cfg: TrainConfig) -> tuple:
    """One optimizer step at `step` (0-based); returns the detached (p1 loss, head loss,
    per-head losses), still on the device: reading them waits for it."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step + 1, cfg) * g["lr_mult"]
    with torch.autocast(device_type=cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
        base_loss, head_loss, per_head = loss_fn(src, tgt, gen)
    w_base = 0.0 if cfg.stage == "heads" else 1.0
    loss = w_base * base_loss + cfg.head_weight * head_loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    # clipped apart, so that a large head gradient cannot shrink the base's step
    for part in clip_parts:
        if part:
            torch.nn.utils.clip_grad_norm_(part, 1.0)
    opt.step()
    return base_loss.detach(), head_loss.detach(), per_head


def slow_bf16_note(cfg: TrainConfig) -> str | None:
    """A warning where bf16 autocast would train on an x86 processor without bf16 instructions
    (AVX-512 BF16 or AMX): there torch's bf16 products ran ~100x slower than float32's
    (experiments/avx2-kernels/bench_decode.log, its last line), so float32 trains faster."""
    from .decoding.engine import cpu_flags
    flags = set(cpu_flags().split())
    if not cfg.bf16 or not cfg.device.startswith("cpu") or b"avx2" not in flags:
        return None
    if flags & {b"avx512_bf16", b"amx_bf16"}:
        return None
    return ("warning: this processor has no bf16 instructions (avx512_bf16, amx_bf16): bf16 autocast "
            "trains far slower than float32 here; pass --fp32")


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True) -> dict:
    return Training(cfg, resume, progress).run()


class Training:
    """One training run, in stages: the processes joined (under torchrun), the run's folder
    checked, the data read, the model made (or resumed), the run's files begun, then the steps
    (with evaluations and checkpoints) and the end (a last checkpoint and score)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, progress: bool = True):
        self.cfg, self.resume, self.show_progress = cfg, resume, progress

    def run(self) -> dict:
        self.join()
        self.check_run()
        self.read_data()
        self.make_model()
        self.open_run()
        self.steps()
        return {"step": self.step, "run_dir": str(self.run_dir),
                **{k: v for k, v in self.last.items() if k != "per_head"}}

    # ------------------------------------------------ before the first step

    def join(self) -> None:
        """Under torchrun (DDP), this process's rank and device; the threads; a slow-bf16 note."""
        cfg = self.cfg
        self.ddp = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
        self.rank, self.world = 0, 1
        if self.ddp:
            dist.init_process_group("nccl" if cfg.device.startswith("cuda") else "gloo")
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            if cfg.device.startswith("cuda"):
                cfg.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
                torch.cuda.set_device(cfg.device)  # nccl's collectives run on the current device
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if self.rank == 0 and (note := slow_bf16_note(cfg)):
            print(note, file=sys.stderr)

    def check_run(self) -> None:
        """--resume needs the run's checkpoint; a fresh run never overwrites one."""
        self.run_dir = CACHE_DIR / self.cfg.run
        self.ckpt_path = self.run_dir / "last.pt"
        if self.resume and not self.ckpt_path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {self.ckpt_path}")
        if not self.resume and self.ckpt_path.exists():
            raise FileExistsError(f"{self.ckpt_path} exists: pass --resume to continue it, or use another --run "
                                  "(an existing checkpoint is never overwritten by a fresh run)")

    def read_data(self) -> None:
        """The training faces (or the distillation targets), the validation faces, and in the heads
        stage with --distill the held-out targets the heads are scored on."""
        cfg = self.cfg
        faces = load_faces(cfg.data)
        train_set, val_set = faces.part("train"), faces.part("val")
        if len(train_set) == 0:
            why = ("a folder of photos, and an .npz prepared from one, has no partition labels and is all "
                   "held-out test faces: train on CelebA with its list_eval_partition.txt, or an .npz prepared "
                   "from it" if len(faces) and (np.asarray(faces.split) < 0).all() else
                   f"{len(val_set)} validation and {len(faces.part('test'))} test faces, none of the training partition")
            raise ValueError(f"{cfg.data or 'default data'}: the training split is empty ({why})")
        train_imgs, train_lr = train_set.images, downsample_8(train_set.images)
        if cfg.distill:  # distillation: inputs stay the real 8x8, targets are the base model's outputs
            with np.load(cfg.distill, allow_pickle=False) as d:
                train_imgs, train_lr = d["images"], d["lr"]
            if len(train_imgs) == 0:
                raise ValueError(f"{cfg.distill}: no distillation targets")
        self.val_imgs = val_set.images[: cfg.eval_images]  # no val part (e.g. a photo folder): no eval
        self.held_out = None  # (8x8 inputs, greedy outputs) the heads are scored on, heads stage + distill
        if cfg.distill and cfg.stage == "heads" and cfg.eval_images:
            if len(train_imgs) <= cfg.eval_images:
                raise ValueError(f"{cfg.distill}: {len(train_imgs)} targets leave none to train on after "
                                 f"holding out --eval-images {cfg.eval_images}")
            self.held_out = train_lr[-cfg.eval_images:], train_imgs[-cfg.eval_images:]
            train_imgs, train_lr = train_imgs[: -cfg.eval_images], train_lr[: -cfg.eval_images]
            self.val_imgs = self.val_imgs[:0]  # the frozen base's bits/dim cannot move: score the heads instead
        self.train_imgs, self.train_lr = train_imgs, train_lr

    def make_model(self) -> None:
        """The model and optimizer, fresh or as the checkpoint left them, and the loss (DDP-wrapped)."""
        cfg, ckpt_path = self.cfg, self.ckpt_path
        ck = read_checkpoint(ckpt_path) if self.resume else None
        self.fresh = ck is None
        model = init_model(cfg)
        if ck is not None and ck["model_config"] != model.cfg.to_dict():
            model = _model_of_run(ck["model_config"], model.cfg, ckpt_path)
        # a fresh (or grown) prior starts from the data; never in the heads stage, whose base is frozen
        if not self.resume and cfg.stage != "heads" and model.lr_prior is not None and not model.lr_prior.any():
            init_lr_prior(model, self.train_imgs, self.train_lr)
        model.train()
        model.to(cfg.device)
        if cfg.stage == "heads":
            for name, p in model.named_parameters():
                p.requires_grad = name.startswith("heads.")
        self.model = model
        self.opt, self.clip_parts = make_optimizer(model, cfg)
        self.step, self.best = 0, float("inf")
        if ck is not None:
            _check_resumable(ck["train_config"], cfg, ckpt_path, say=self.rank == 0)
            model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["opt"])
            self.step, self.best = ck["step"], ck.get("best_val_bpd", float("inf"))
            if (self.run_dir / "best.pt").exists():  # last.pt may predate best.pt's score (a hard kill)
                try:
                    self.best = min(self.best, read_checkpoint(self.run_dir / "best.pt").get("best_val_bpd", self.best))
                except WeightsError as e:  # read for its score only: last.pt's stands in
                    print(f"warning: {e}; going on with last.pt's best score", file=sys.stderr)
            if "torch_rng" in ck:
                torch.set_rng_state(ck["torch_rng"])
        self.loss_fn = TrainingLoss(model, cfg)
        if self.ddp:
            self.loss_fn = torch.nn.parallel.DistributedDataParallel(self.loss_fn, find_unused_parameters=True)

    def open_run(self) -> None:
        """The run's folder and settings written; the steps an epoch takes."""
        cfg, run_dir = self.cfg, self.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.fresh:  # a fresh run: a best.pt left by an earlier run of this name is not its best
            (run_dir / "best.pt").unlink(missing_ok=True)
        self.log_path = run_dir / "log.csv"
        if self.rank == 0:
            (run_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=1))
        n = len(self.train_imgs)
        self.per_epoch = n // (cfg.batch_size * self.world)
        if self.per_epoch == 0:
            raise ValueError(f"{n} training images are fewer than one batch of {cfg.batch_size} x {self.world} "
                             "processes")

    # ------------------------------------------------ the steps

    def steps(self) -> None:
        """Steps until --max-steps, --max-minutes or a Ctrl-C / SIGTERM (the step in hand is
        finished, then a checkpoint is written)."""
        cfg = self.cfg
        self.stop = False

        def on_sigint(sig, frame):
            self.stop = True  # finish the step, checkpoint, exit

        old_handlers = signal.signal(signal.SIGINT, on_sigint), signal.signal(signal.SIGTERM, on_sigint)
        if self.rank == 0 and self.held_out is not None and self.step == 0:  # the heads' score before training
            _append_log(self.log_path, {"step": 0, "minutes": 0.0,
                                        "val_block": held_out_block(self.model, *self.held_out)})
        self.t_start = time.time()
        self.last_ckpt = self.last_eval = time.time()
        self.steps_this_run = 0
        self.imgs_seen = 0
        self.bar = tqdm(total=cfg.max_steps if cfg.max_steps < 10**9 else None, initial=self.step,
                        disable=not self.show_progress or self.rank != 0, unit="step", dynamic_ncols=True)
        self.last, self.losses = {}, None
        # on CUDA, deterministic mode swaps in slower kernels, and a short GPU run is never resumed
        restore_determinism = deterministic_algorithms() if cfg.device == "cpu" else (lambda: None)
        try:
            while self.step < cfg.max_steps and not _should_stop(
                    self.stop or (time.time() - self.t_start) / 60 >= cfg.max_minutes, self.ddp, cfg.device):
                self.one_step()
        finally:
            restore_determinism()
            signal.signal(signal.SIGINT, old_handlers[0])
            signal.signal(signal.SIGTERM, old_handlers[1])
            self.finish()

    def one_step(self) -> None:
        """One optimizer step on this process's share of the batch; the log, an evaluation and a
        checkpoint when they are due."""
        cfg, rank, world = self.cfg, self.rank, self.world
        epoch, i = divmod(self.step, self.per_epoch)
        # data order is a pure function of (seed, epoch, step): resuming continues exactly
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(len(self.train_imgs))
        idx = perm[(i * world + rank) * cfg.batch_size : (i * world + rank + 1) * cfg.batch_size]
        src = to_device(to_tokens(self.train_lr[idx]), cfg.device)
        tgt = to_device(to_tokens(self.train_imgs[idx]), cfg.device)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        self.losses = train_step(self.loss_fn, self.opt, self.clip_parts, src, tgt, gen, self.step, cfg)
        self.step += 1
        self.steps_this_run += 1
        self.imgs_seen += len(idx) * world
        self.bar.update(1)
        now = time.time()
        want_eval = rank == 0 and now - self.last_eval > cfg.eval_minutes * 60
        # reading a loss waits for the device to finish the step: on a GPU, doing so every step
        # would stop the CPU from queueing the next one while the GPU works
        if self.step % 10 == 0 or want_eval:
            self.last = self.summary()
            self.bar.set_postfix(bpd=f"{self.last['bpd_train']:.3f}", heads=f"{self.last['head_loss']:.2f}",
                                 ips=f"{self.last['imgs_per_s']:.2f}")
        if want_eval:
            self.evaluate()
        if rank == 0 and (self.step % 10 == 0 or want_eval):
            _append_log(self.log_path, self.last)
        if rank == 0 and now - self.last_ckpt > cfg.ckpt_minutes * 60:
            save_checkpoint(self.ckpt_path, self.model, self.opt, self.step, cfg, {"best_val_bpd": self.best})
            self.last_ckpt = time.time()

    def evaluate(self) -> None:
        """Validation bits/dim (the best kept apart in best.pt), or the heads' held-out block."""
        cfg, last, step = self.cfg, self.last, self.step
        if len(self.val_imgs):
            last["val_bpd"] = bits_per_dim(self.model, self.val_imgs, bf16=cfg.bf16, device=cfg.device)
            if last["val_bpd"] < self.best:  # kept apart: a long run on few faces can overfit
                self.best = last["val_bpd"]
                save_checkpoint(self.run_dir / "best.pt", self.model, self.opt, step, cfg, {"best_val_bpd": self.best})
            tqdm.write(f"step {step}: val bits/dim {last['val_bpd']:.4f}")
        if self.held_out is not None:  # (then val_imgs is empty: the base is frozen)
            last["val_block"] = held_out_block(self.model, *self.held_out)
            tqdm.write(f"step {step}: held-out exact block (k={self.model.cfg.n_blockwise}) {last['val_block']:.3f}")
        self.last_eval = time.time()

    def summary(self) -> dict:
        """The latest step, for the log and the progress bar."""
        elapsed = time.time() - self.t_start
        losses = self.losses
        return {"step": self.step, "minutes": elapsed / 60, "lr": lr_at(self.step, self.cfg),
                "bpd_train": losses[0].item() / math.log(2), "head_loss": losses[1].item(),
                "imgs_per_s": self.imgs_seen / elapsed,
                "per_head": None if losses[2] is None else losses[2].tolist()}

    def finish(self) -> None:
        """However the steps ended: a checkpoint of the last step, the summary of it, and a heads
        run's last score."""
        rank = self.rank
        self.bar.close()
        if rank == 0 and self.steps_this_run:
            save_checkpoint(self.ckpt_path, self.model, self.opt, self.step, self.cfg, {"best_val_bpd": self.best})
        if self.losses is not None and self.last.get("step") != self.step:
            with contextlib.suppress(RuntimeError):  # after a device error: keep the first exception
                self.last = self.summary()
        # after the save, so that it cannot lose it: every heads run ends with a score
        if rank == 0 and self.steps_this_run and self.held_out is not None and "val_block" not in self.last:
            self.last["val_block"] = held_out_block(self.model, *self.held_out)
            _append_log(self.log_path, self.last)
        if self.ddp:
            dist.destroy_process_group()


def to_device(x: np.ndarray | torch.Tensor, device) -> torch.Tensor:
    """A CPU array (a batch, sampled positions) onto the training device. On CUDA through pinned
    memory, without blocking: a plain copy from pageable memory waits until the GPU has finished
    every step queued before it."""
    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
    return t.pin_memory().to(device, non_blocking=True) if str(device).startswith("cuda") else t.to(device)


def deterministic_algorithms():
    """Turn on torch's deterministic algorithms (warn only) for training steps; returns a function
    that restores the previous setting. Otherwise the priors' table lookups sum their gradients
    in a thread-dependent order (measured: no slower here); in a fixed order --resume continues
    bit for bit."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    return lambda: torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# settings that must not change across a resume: they decide the data order and the optimizer
RESUME_KEYS = ("preset", "stage", "data", "distill", "batch_size", "seed", "head_loss", "eval_images")


# settings a resumed run may change, said when it does: the schedule and the losses' weights
RETUNABLE_KEYS = ("lr", "warmup", "schedule_offset", "weight_decay", "head_frac", "head_weight", "head_window")


def _check_resumable(saved: dict, cfg: TrainConfig, path: Path, say: bool = True) -> None:
    diff = {k: (saved.get(k), getattr(cfg, k)) for k in RESUME_KEYS if saved.get(k) != getattr(cfg, k)}
    if diff:
        raise ValueError(f"{path}: cannot resume with different settings (checkpoint, now): {diff}")
    changed = [f"{k} {saved[k]} -> {getattr(cfg, k)}" for k in RETUNABLE_KEYS
               if k in saved and saved[k] != getattr(cfg, k)]
    if changed and say:
        print(f"note: resuming {path} with other settings than it was trained with: {', '.join(changed)}",
              file=sys.stderr)


def _should_stop(local: bool, ddp: bool, device: str = "cpu") -> bool:
    """Under DDP every rank must leave the loop at the same step, or the others hang in the
    gradient all-reduce: any rank that wants to stop stops them all. (On the training device:
    nccl reduces only CUDA tensors.)"""
    if not ddp:
        return local
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _append_log(path: Path, row: dict) -> None:
    fields = ["step", "minutes", "lr", "bpd_train", "head_loss", "imgs_per_s", "val_bpd", "val_block"]
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)
