"""Shipped weights: NAME.safetensors + NAME.json (model config, sha256, training facts, scores).

Loading never unpickles: safetensors for shipped weights, torch.load(weights_only=True) for the
resumable training checkpoints. A file whose sha256, tensor names or shapes do not match its
config is refused with the reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from .model import ImageTransformerSR, ModelConfig

WEIGHTS_DIR = Path(os.environ.get("SR_BLOCKWISE_WEIGHTS", Path(__file__).resolve().parent.parent / "weights"))
DEFAULT_WEIGHTS = "cpu-finetuned"


class WeightsError(ValueError):
    """Weights that cannot be used; the message says why."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def portable_path(path) -> str | None:
    """A path as a weights card records it: relative to the current folder or to the home folder
    where it lies below one, else its last two parts (a card names no folder of the machine that
    made it)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute():
        return str(path)
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            return prefix + str(p.relative_to(base))
        except ValueError:
            pass
    return str(Path(*p.parts[-2:]))


def compact_state_dict(state: dict) -> dict:
    """A state dict for carrying a model home (gpu/train.sh): matrices in bf16, halving the
    bytes, but the priors, the output projection and all vectors in float32, since decoding keeps
    those wide on purpose (ImageTransformerSR.for_inference)."""
    def keep_wide(name: str, v: torch.Tensor) -> bool:
        return v.ndim <= 1 or "prior" in name or name.startswith("lm_head")
    return {k: v.to(torch.bfloat16) if v.is_floating_point() and not keep_wide(k, v) else v
            for k, v in state.items()}


def save_weights(model: ImageTransformerSR, out: str | Path, meta: dict | None = None) -> Path:
    """Write out.safetensors and out.json; returns the .json path. The name is kept whole
    (cpu-frozen.v2 -> cpu-frozen.v2.json, not cpu-frozen.json)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    st = out.with_name(out.name + ".safetensors")
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = st.with_suffix(".tmp")
    # written by Python, not safetensors' save_file, which makes the file readable by its owner only;
    # as a new file, not over one a killed run left, whose permissions it would keep
    tmp.unlink(missing_ok=True)
    tmp.write_bytes(safetensors_bytes(tensors))
    os.replace(tmp, st)
    card = {"name": out.name, "config": model.cfg.to_dict(), "sha256": sha256_of(st),
            "file": st.name, "meta": meta or {}}
    js = out.with_name(out.name + ".json")
    js.write_text(json.dumps(card, indent=1) + "\n")
    return js


def resolve(name_or_path: str | Path) -> Path:
    """A weights name (in weights/), a .json/.safetensors path, or a training checkpoint .pt."""
    p = Path(name_or_path)
    # a bare name means shipped weights first, so a stray file in the working folder cannot shadow them
    candidates = [WEIGHTS_DIR / f"{name_or_path}.json"] if p.name == str(name_or_path) else []
    candidates += [p, p.with_name(p.name + ".json")]
    for c in candidates:
        if c.suffix in (".json", ".pt") and c.is_file():
            return c
        if c.suffix == ".safetensors" and c.with_suffix(".json").is_file():
            return c.with_suffix(".json")
    if p.suffix == ".safetensors" and p.is_file():
        raise WeightsError(f"{p}: tensors are loaded through their weights card, a .json beside them "
                           f"({p.with_suffix('.json').name}, whose \"file\" names the tensor file, with the "
                           "model's config and the file's sha256): pass the card")
    known = ", ".join(w["name"] for w in list_weights()) or "none"
    if p.exists():  # a folder, a device, a file of another kind: it is there, but is no weights
        what = "a folder" if p.is_dir() else "not a regular file" if not p.is_file() else "not a weights file"
        raise WeightsError(f"{name_or_path}: {what}; weights are a card (.json, with its .safetensors "
                           f"beside it), a training checkpoint (.pt) or a shipped name ({known})")
    raise WeightsError(f"no weights named or at {name_or_path!r} (shipped: {known})")


def read_card(json_path: Path) -> dict:
    try:
        card = json.loads(Path(json_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsError(f"{json_path}: unreadable weights config ({e})") from None
    for key in ("config", "sha256", "file"):
        if key not in card:
            raise WeightsError(f"{json_path}: weights config lacks {key!r}")
    return card


def card_config(path: Path) -> tuple[dict, ModelConfig]:
    """A weights card (.json) and its model config, its tensor file there: what can be checked
    without reading the tensors (their sha256 is checked when they load)."""
    card = read_card(path)
    st = path.parent / card["file"]
    if not st.is_file():
        raise WeightsError(f"{path}: its tensor file {st.name} is missing")
    try:
        return card, ModelConfig.from_dict(card["config"])
    except (TypeError, ValueError, AttributeError) as e:
        raise WeightsError(f"{path}: bad model config ({e})") from None


def read_checkpoint(path: Path) -> dict:
    """A training checkpoint's contents, loaded weights-only: plain tensors and numbers, never
    pickled objects. WeightsError, with a one-line reason, for anything else."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt, cut short, or holding objects weights_only refuses to unpickle
        # torch's own message for these runs long and advises weights_only=False, which would
        # run whatever code the file holds: never for a file that fails here
        why = ("corrupt, or not a checkpoint of this project: it is not plain tensors and numbers"
               if isinstance(e, pickle.UnpicklingError) else f"{type(e).__name__}: {e}")
        raise WeightsError(f"{path}: not a usable training checkpoint ({why})") from None
    if not isinstance(ck, dict) or "model" not in ck or "model_config" not in ck:
        raise WeightsError(f"{path}: not a training checkpoint of this project (no model and config in it)")
    return ck


def load_model(name_or_path: str | Path = DEFAULT_WEIGHTS, dtype: torch.dtype = torch.bfloat16,
               device: str = "cpu", for_inference: bool = True, expect: ModelConfig | None = None,
               verify_sha: bool = True) -> ImageTransformerSR:
    path = resolve(name_or_path)
    if path.suffix == ".pt":  # a resumable training checkpoint
        ck = read_checkpoint(path)
        try:
            cfg, state = ModelConfig.from_dict(ck["model_config"]), ck["model"]
        except Exception as e:
            raise WeightsError(f"{path}: not a usable training checkpoint ({type(e).__name__}: {e})") from None
    else:
        card, cfg = card_config(path)
        st = path.parent / card["file"]
        if verify_sha and sha256_of(st) != card["sha256"]:
            raise WeightsError(f"{st}: sha256 does not match {path.name}: the file is corrupt or altered")
        state = load_file(str(st))
    if expect is not None and expect.to_dict() != cfg.to_dict():
        diff = {k: (v, expect.to_dict()[k]) for k, v in cfg.to_dict().items() if expect.to_dict()[k] != v}
        raise WeightsError(f"{path}: config does not match the expected one (have, want): {diff}")
    model = ImageTransformerSR(cfg)
    want = model.state_dict()
    missing, extra = set(want) - set(state), set(state) - set(want)
    if missing or extra:
        raise WeightsError(f"{path}: tensors do not match its config: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(extra)[:5]}")
    bad = [k for k in want if tuple(want[k].shape) != tuple(state[k].shape)]
    if bad:
        k = bad[0]
        raise WeightsError(f"{path}: tensor {k} has shape {tuple(state[k].shape)}, its config needs "
                           f"{tuple(want[k].shape)} ({len(bad)} mismatched)")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    if path.suffix != ".pt":
        model.tree_accuracy = card.get("tree_accuracy", {}).get("tables", {})  # `sr-blockwise trees --write`
    model.to(device)
    return model.for_inference(dtype) if for_inference else model


def list_weights(directory: Path = WEIGHTS_DIR) -> list[dict]:
    out = []
    for js in sorted(Path(directory).glob("*.json")):
        try:
            card = read_card(js)
        except WeightsError:
            continue
        out.append({"name": js.stem, "path": str(js), "config": card["config"], "meta": card.get("meta", {})})
    return out


def default_weights() -> str:
    """The shipped default, or the first shipped weights if the default is absent."""
    names = [w["name"] for w in list_weights()]
    if DEFAULT_WEIGHTS in names or not names:
        return DEFAULT_WEIGHTS
    return names[0]
