import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers share the 2 cores: a thread each, also in
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # subprocesses (two each oversubscribe them)

import numpy as np
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from sr_blockwise.checkpoints import save_weights
from sr_blockwise.data import DEFAULT_DATA
from sr_blockwise.decoding import greedy
from sr_blockwise.model import ImageTransformerSR, preset


def make_tiny(seed: int = 0, **overrides) -> ImageTransformerSR:
    torch.manual_seed(seed)
    m = ImageTransformerSR(preset("tiny", **overrides)).eval()
    if m.lr_emb is not None:  # zero at init; random here so that tests exercise the skip path
        torch.nn.init.normal_(m.lr_emb.weight, std=0.1)
    if m.lr_prior is not None:  # likewise the prior
        torch.nn.init.normal_(m.lr_prior, std=1.0)
    if m.heads is not None and m.heads.nbr_prior is not None:  # and the heads' neighbour prior
        torch.nn.init.normal_(m.heads.nbr_prior, std=1.0)
    return m


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> str:
    """A random `tiny` model saved as shipped weights would be: path of its .json."""
    out = tmp_path_factory.mktemp("weights") / "tiny-random"
    return str(save_weights(make_tiny(0), out, {"note": "random tiny model for tests"}))


@pytest.fixture(scope="session")
def celeba_npz():
    path = DEFAULT_DATA / "celeba32.npz"
    if not path.exists():  # CI has ../shared/data: there a missing folder is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"CelebA data not found at {path}")
    return path


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def two_faces():
    """scikit-image's astronaut beside a smaller copy of herself: two faces of different sizes."""
    import skimage.data
    from PIL import Image
    a = Image.fromarray(skimage.data.astronaut())
    photo = Image.new("RGB", (832, 512), (128, 128, 128))
    photo.paste(a, (0, 0))
    photo.paste(a.resize((320, 320), Image.Resampling.BOX), (512, 96))
    return photo


def agreeable_tiny(dtype=torch.bfloat16):
    """A tiny model whose heads often agree with p1, one or two ranks down as often (a random
    model's almost never do): every intensity's input prior falls off with its distance from the
    input's, and the heads have no neighbour prior; so trees accept paths of every length."""
    m = make_tiny(3)
    with torch.no_grad():
        m.lr_prior.copy_(-0.3 * torch.arange(-255, 256).abs().float().expand(3, -1))
        m.heads.nbr_prior.zero_()
    return m.for_inference(dtype)


@pytest.fixture(scope="session")
def agreeable():
    """agreeable_tiny in bf16, two random inputs, and their greedy decode on the torch engine."""
    m = agreeable_tiny()
    lr = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    return m, lr, greedy(m, lr, engine="torch")
