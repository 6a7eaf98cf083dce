import numpy as np
import pytest
import torch

from sr_blockwise import metrics


@pytest.fixture(scope="module")
def faces():
    rng = np.random.default_rng(0)
    # smooth-ish images, so SSIM and the perceptual distance have structure to compare
    base = rng.integers(0, 256, (3, 8, 8, 3)).astype(np.float64)
    real = np.repeat(np.repeat(base, 4, 1), 4, 2).astype(np.uint8)
    noise = rng.normal(0, 1, real.shape)
    slightly = np.clip(real + 4 * noise, 0, 255).astype(np.uint8)
    very = np.clip(real + 40 * noise, 0, 255).astype(np.uint8)
    return real, slightly, very


@pytest.fixture(scope="module")
def perceptual():
    return metrics.Perceptual("auto")


def test_identical_images(faces, perceptual):
    real = faces[0]
    assert np.all(np.isinf(metrics.psnr(real, real)))
    assert np.allclose(metrics.ssim(real, real), 1.0)
    assert np.allclose(perceptual(real, real), 0.0, atol=1e-6)


def test_more_noise_is_worse(faces, perceptual):
    real, slightly, very = faces
    assert np.all(metrics.psnr(real, slightly) > metrics.psnr(real, very))
    assert np.all(metrics.ssim(real, slightly) > metrics.ssim(real, very))
    assert np.all(perceptual(real, slightly) < perceptual(real, very))
    assert np.all(metrics.ssim(real, very) < 1)


def test_single_image_and_shape_checks(faces):
    real, slightly, _ = faces
    assert metrics.psnr(real[0], slightly[0]).shape == (1,)
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.psnr(real, slightly[:2])
    with pytest.raises(ValueError, match="RGB"):
        metrics.ssim(real[..., 0], slightly[..., 0])


def test_psnr_known_value():
    a = np.zeros((1, 32, 32, 3), np.uint8)
    b = np.full_like(a, 16)  # MSE 256 -> 10 log10(255^2 / 256) dB
    assert metrics.psnr(a, b)[0] == pytest.approx(10 * np.log10(255 ** 2 / 256))


def test_perceptual_is_labelled_and_offline(perceptual):
    ok, why = metrics.lpips_status()
    assert perceptual.kind == ("lpips" if ok else "stlpips")
    d = perceptual.describe()
    assert d["label"] and d["input_size"] == metrics.PERCEPTUAL_SIZE
    if not ok:
        assert "ST-LPIPS" in perceptual.label and why in d["note"]
        with pytest.raises(ValueError, match="not available offline"):
            metrics.Perceptual("lpips")


def test_stlpips_uses_its_shipped_weights(monkeypatch):
    # nothing may reach for the network, and the AlexNet trunk must be the trained one, not random
    def no_download(*a, **k):
        raise AssertionError("tried to download weights")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    p = metrics.Perceptual("stlpips")
    from pathlib import Path
    from stlpips_pytorch import stlpips
    saved = torch.load(Path(stlpips.__file__).parent / "weights/vST0.0/alex_shift_tolerant.pth",
                       map_location="cpu", weights_only=True)
    assert torch.equal(p.net.net.slice1[0].weight, saved["net.slice1.0.weight"])
    assert torch.equal(p.net.lins[4].model[1].weight, saved["lin4.model.1.weight"])


def test_stlpips_vgg_uses_its_shipped_weights_and_tells_blocks_from_faces(monkeypatch, celeba_npz):
    """The VGG trunk loads offline and strictly; unlike the AlexNet one, it rates the shipped
    decoder's greedy face closer to the real one than nearest-neighbour blocks (on the first test
    face, measured 0.29 against 0.34; the AlexNet trunk says 0.23 against 0.17)."""
    def no_download(*a, **k):
        raise AssertionError("tried to download weights")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    p = metrics.Perceptual("stlpips-vgg")
    assert "VGG" in p.label
    from pathlib import Path
    from stlpips_pytorch import stlpips
    saved = torch.load(Path(stlpips.__file__).parent / "weights/vST0.0/vgg_shift_tolerant.pth",
                       map_location="cpu", weights_only=True)
    assert torch.equal(p.net.lins[0].model[1].weight, saved["lin0.model.1.weight"])
    from sr_blockwise.checkpoints import load_model
    from sr_blockwise.data import downsample_8, load_faces
    from sr_blockwise.decoding import greedy
    real = load_faces(celeba_npz, part="test").images[:1]
    lr = downsample_8(real)
    face = greedy(load_model("cpu-finetuned"), lr).images
    blocks = metrics.nearest_baseline(lr)[0]
    assert p(real, face)[0] < p(real, blocks)[0]


def test_nearest_baseline():
    lr = np.random.default_rng(2).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    up, secs = metrics.nearest_baseline(lr)
    assert up.shape == (2, 32, 32, 3) and secs >= 0
    assert (up[:, 4:8, 8:12] == lr[:, 1:2, 2:3]).all()


def test_bicubic_baseline():
    lr = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    up, secs = metrics.bicubic_baseline(lr)
    assert up.shape == (2, 32, 32, 3) and up.dtype == np.uint8 and secs >= 0
    flat = np.full((1, 8, 8, 3), 77, np.uint8)
    assert np.all(metrics.bicubic_baseline(flat)[0] == 77)


def test_mean():
    assert metrics.mean([1.0, 3.0]) == 2.0
    assert metrics.mean([1.0, np.inf]) == np.inf
    assert metrics.mean([]) is None
