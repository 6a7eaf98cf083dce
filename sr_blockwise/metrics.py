"""Image quality metrics for 32x32 faces: PSNR, SSIM (scikit-image), a perceptual distance, and
the bicubic baseline.

Settings, fixed so that numbers from different runs compare:
- PSNR: skimage.metrics.peak_signal_noise_ratio on uint8 RGB, data_range=255, per image.
  Identical images give +inf.
- SSIM: skimage.metrics.structural_similarity on uint8 RGB, data_range=255, channel_axis=-1
  (mean of the three channels), gaussian_weights=True, sigma=1.5, use_sample_covariance=False:
  the settings of Wang et al. 2004 (11x11 Gaussian window), per image.
- Perceptual distance: LPIPS (AlexNet, v0.1) when the `lpips` package and torchvision's AlexNet
  weights are already on disk, otherwise ST-LPIPS (shift-tolerant AlexNet, Ghildyal & Liu 2022,
  weights shipped in `stlpips_pytorch`). Never downloads. Faces are upsampled 32 -> 64 bilinear
  first: both metrics were calibrated on 64x64 patches. Lower is better; identical images give 0.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

PSNR_SETTINGS = {"data_range": 255}
SSIM_SETTINGS = {"data_range": 255, "channel_axis": -1, "gaussian_weights": True, "sigma": 1.5,
                 "use_sample_covariance": False}
PERCEPTUAL_SIZE = 64  # LPIPS / ST-LPIPS were trained on 64x64 patches
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # torchvision's AlexNet weights, as named in the hub cache


def _pairs(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"images to compare differ in shape: {a.shape} vs {b.shape}")
    if a.ndim == 3:
        a, b = a[None], b[None]
    if a.ndim != 4 or a.shape[-1] != 3:
        raise ValueError(f"expected (N, H, W, 3) or (H, W, 3) RGB images, got {a.shape}")
    return a.astype(np.uint8), b.astype(np.uint8)


def psnr(real, test) -> np.ndarray:
    """Per-image PSNR in dB of `test` against `real` (N,H,W,3) uint8; +inf where identical."""
    from skimage.metrics import peak_signal_noise_ratio
    real, test = _pairs(real, test)
    with np.errstate(divide="ignore"):  # identical images: log10(x/0) = inf, on purpose
        return np.array([peak_signal_noise_ratio(r, t, **PSNR_SETTINGS) for r, t in zip(real, test)])


def ssim(real, test) -> np.ndarray:
    """Per-image SSIM of `test` against `real` (N,H,W,3) uint8; 1 where identical."""
    from skimage.metrics import structural_similarity
    real, test = _pairs(real, test)
    return np.array([structural_similarity(r, t, **SSIM_SETTINGS) for r, t in zip(real, test)])


# ---------------------------------------------------------------- perceptual distance

def lpips_status() -> tuple[bool, str]:
    """Whether plain LPIPS can run offline, and why not."""
    if importlib.util.find_spec("lpips") is None:
        return False, "the lpips package is not installed"
    import torch
    ckpt = Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE
    if not ckpt.is_file():  # lpips would ask torchvision to download it: we never do
        return False, f"torchvision's AlexNet weights are not in the torch hub cache ({ckpt})"
    return True, f"AlexNet weights found at {ckpt}"


def _load_stlpips(trunk: str = "alex"):
    import torch
    from stlpips_pytorch import stlpips
    # pretrained=False builds the shift-tolerant trunk from scratch (no torchvision download);
    # we then load the package's own weights file strictly, so a trunk left random cannot slip by
    # (the package's own loader uses strict=False)
    net = stlpips.LPIPS(net=trunk, variant="shift_tolerant", pretrained=False, verbose=False)
    path = Path(stlpips.__file__).parent / "weights" / "vST0.0" / f"{trunk}_shift_tolerant.pth"
    state = torch.load(path, map_location="cpu", weights_only=True)
    # `lins` is a ModuleList alias of lin0..lin4: same tensors under a second name
    state.update({"lins." + k[3:]: v for k, v in state.items() if k.startswith("lin") and k[3].isdigit()})
    net.load_state_dict(state, strict=True)
    return net


class Perceptual:
    """A perceptual distance between batches of uint8 faces. `kind` is "lpips" or "stlpips";
    `label` names it in every output."""

    # stlpips-vgg: the same package's VGG trunk, a second opinion. The AlexNet one rates plain
    # nearest-neighbour blocks better than our decoder's faces; the VGG one does not (README)
    LABELS = {"lpips": "LPIPS (AlexNet, v0.1)",
              "stlpips": "ST-LPIPS (shift-tolerant AlexNet, vST0.0)",
              "stlpips-vgg": "ST-LPIPS (shift-tolerant VGG, vST0.0)"}

    def __init__(self, kind: str = "auto", device: str = "cpu"):
        import torch
        ok, why = lpips_status()
        if kind == "auto":
            kind = "lpips" if ok else "stlpips"
        if kind == "lpips":
            if not ok:
                raise ValueError(f"plain LPIPS is not available offline: {why}")
            import lpips
            net = lpips.LPIPS(net="alex", verbose=False)
        elif kind in ("stlpips", "stlpips-vgg"):
            net = _load_stlpips("vgg" if kind == "stlpips-vgg" else "alex")
        else:
            raise ValueError(f"unknown perceptual metric {kind!r}: use auto, lpips, stlpips or stlpips-vgg")
        self.kind, self.device = kind, device
        self.label = self.LABELS[kind]
        self.why = "" if kind == "lpips" else f"plain LPIPS not used: {why}"
        self.net = net.eval().to(device)
        self.torch = torch

    def to_input(self, x: np.ndarray):
        """uint8 (N,32,32,3) -> float (N,3,64,64) in [-1, 1], bilinear upsampled."""
        t = self.torch.from_numpy(np.ascontiguousarray(x)).permute(0, 3, 1, 2).float() / 127.5 - 1
        t = self.torch.nn.functional.interpolate(t, size=(PERCEPTUAL_SIZE, PERCEPTUAL_SIZE),
                                                 mode="bilinear", align_corners=False)
        return t.to(self.device)

    def __call__(self, real, test, batch_size: int = 64) -> np.ndarray:
        real, test = _pairs(real, test)
        out = []
        with self.torch.no_grad():
            for i in range(0, len(real), batch_size):
                d = self.net(self.to_input(real[i:i + batch_size]), self.to_input(test[i:i + batch_size]))
                out.append(d.flatten().float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "input_size": PERCEPTUAL_SIZE,
                "resize": "bilinear 32->64, align_corners=False", "range": "[-1, 1]",
                "note": self.why}


# ---------------------------------------------------------------- the bicubic baseline

def bicubic_baseline(lr: np.ndarray) -> tuple[np.ndarray, float]:
    """Bicubic upscaling (Pillow) of (N,8,8,3) inputs to 32x32, and its wall time in seconds."""
    from .data import bicubic_upscale
    t0 = time.perf_counter()
    out = bicubic_upscale(lr, 32)
    return out, time.perf_counter() - t0


def nearest_baseline(lr: np.ndarray) -> tuple[np.ndarray, float]:
    """Nearest-neighbour upscaling (each input pixel a 4x4 block) of (N,8,8,3) inputs, and its wall
    time. A second no-model row: it shows what a perceptual metric makes of plain blocks (the
    shift-tolerant AlexNet ST-LPIPS rates them better than our decoder's faces, see README)."""
    t0 = time.perf_counter()
    out = np.asarray(lr).repeat(4, axis=-3).repeat(4, axis=-2)
    return out, time.perf_counter() - t0


def mean(values) -> float | None:
    """Mean of per-image values; +inf stays inf (identical images), empty gives None."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()) if v.size else None
