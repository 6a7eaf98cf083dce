"""What a run keeps on disk: finished decode batches (DecodeStore, so a stopped run resumes) and
the result JSON."""
from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..decoding import engine
from ..decoding import DecodeOptions, DecodeStats, decode


STORE_VERSION = 1  # layout of a DecodeStore batch file

# the code a stored batch's output and timing depend on: a change to it invalidates the store
_PACKAGE = Path(__file__).parent.parent
_DECODING = sorted((_PACKAGE / "decoding").glob("*.py")) + [_PACKAGE / "decoding" / "engine.cpp"]
CODE_VERSION = hashlib.sha256(b"".join(f.read_bytes() for f in [*_DECODING, _PACKAGE / "model.py", _PACKAGE / "heads.py"])
                              ).hexdigest()[:16]

class DecodeStore:
    """Finished decode batches on disk, one .npz each, so that a long evaluation (hours on a CPU)
    can be stopped and resumed. A batch's key is the hash of everything its output and timing
    depend on: the store format, the decoding code (CODE_VERSION), the weights file's sha256, the
    row (job) and its decode options, dtype, device, torch version and threads, whether the native
    engine multiplies on AMX tiles (its outputs differ from the multiply-adds'), and the 8x8 input
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
                                       torch.__version__, torch.get_num_threads(), list(lr.shape),
                                       engine.available() and engine.uses_amx()]).encode())
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

