"""The study's images as files: PNG bytes, atomic writes, hashes, the attention checks' broken faces."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image


def broken_image(img32: np.ndarray, seed: int) -> np.ndarray:
    """An obviously broken face for attention checks: 4x4 tiles shuffled, colours inverted."""
    rng = np.random.default_rng(seed)
    tiles = img32.reshape(8, 4, 8, 4, 3).transpose(0, 2, 1, 3, 4).reshape(64, 4, 4, 3)
    tiles = tiles[rng.permutation(64)]
    return 255 - tiles.reshape(8, 8, 4, 4, 3).transpose(0, 2, 1, 3, 4).reshape(32, 32, 3)


def png_bytes(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.asarray(img, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a killed build leaves no half-written image


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def data_uri(img: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)
