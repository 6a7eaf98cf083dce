"""Data: the paper's crop, the 8x8 inputs, photo sizes, the fixed split, bad files."""
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sr_blockwise.cli import main
from sr_blockwise.data import (FULL_READ_PIXELS, REDUCED_MIN_SIDE, BadImage, array_to_image, check_input,
                               downsample_8, from_tokens, image_to_input, load_faces, match_input, open_rgb,
                               photo_to_32, read_input, to_rgb, to_tokens)


def test_downsample_is_the_4x4_box_average():
    img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    lr = downsample_8(img)
    assert lr.shape == (8, 8, 3)
    assert lr[2, 5, 1] == round(img[8:12, 20:24, 1].astype(float).mean() + 1e-9)


def test_match_input_restores_the_input_and_keeps_what_already_matches():
    rng = np.random.default_rng(2)
    real = rng.integers(50, 206, (3, 32, 32, 3), dtype=np.uint8)
    lr = downsample_8(real)
    # an output whose colours drifted, and one cell collapsed into saturated red
    out = np.clip(real.astype(int) + rng.integers(-40, 41, (3, 1, 1, 3)), 0, 255).astype(np.uint8)
    out[1, 12:16, 4:8] = (255, 0, 0)
    fixed = match_input(out, lr)
    assert fixed.shape == out.shape and fixed.dtype == np.uint8
    # its 4x4 means are the input's again (to a level: rounding), so downsampling gives the input back
    assert np.abs(downsample_8(fixed).astype(int) - lr).max() <= 1
    assert np.abs(downsample_8(out).astype(int) - lr).max() > 20
    # the collapsed cell becomes the input's colour, flat
    np.testing.assert_array_equal(fixed[1, 12:16, 4:8], np.broadcast_to(lr[1, 3, 1], (4, 4, 3)))
    # elsewhere the texture stays: where no clipping at 0 / 255 was needed, a 4x4 block of a
    # channel moved by one shift (to a level: rounding)
    def blocks(x):
        return x.astype(int).reshape(3, 8, 4, 8, 4, 3).transpose(0, 1, 3, 5, 2, 4).reshape(3, 8, 8, 3, 16)
    shift, o, f = blocks(fixed) - blocks(out), blocks(out), blocks(fixed)
    free = ((o > 0) & (o < 255) & (f > 0) & (f < 255)).all(-1)
    assert free.mean() > 0.9 and (np.ptp(shift, -1)[free] <= 1).all()
    # an image that already matches its input moves by at most a level (lr8 is rounded), also
    # one with black and white in it
    assert np.abs(match_input(real, lr).astype(int) - real).max() <= 1
    full = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert np.abs(match_input(full, downsample_8(full)).astype(int) - full).max() <= 1


def test_tokens_roundtrip_in_raster_order():
    img = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    t = to_tokens(img)
    assert t.shape == (2, 3072) and t[0, 3 * 33 + 2] == img[0, 1, 1, 2]
    np.testing.assert_array_equal(from_tokens(t), img)


def test_celeba_crop_matches_the_prepared_array(celeba_npz):
    """Our crop of a real aligned CelebA jpg reproduces the shipped 32x32 array."""
    root = celeba_npz.parent / "celeba" / "img_align_celeba"
    faces = load_faces(celeba_npz)
    jpg = sorted(root.iterdir())[0]
    i = int(np.flatnonzero(faces.ids == int(jpg.stem))[0])
    ours = photo_to_32(Image.open(jpg)).astype(int)
    assert np.abs(ours - faces.images[i]).mean() < 2.0


def test_split_is_fixed_disjoint_and_holds_out_test(celeba_npz):
    faces = load_faces(celeba_npz)
    tr, va, te = (set(faces.part(p).ids.tolist()) for p in ("train", "val", "test"))
    assert not (tr & te) and not (tr & va) and not (va & te)
    assert len(te) > 500 and all(i % 16 == 0 for i in te)
    assert len(tr) + len(va) + len(te) == len(faces)


def test_image_to_input_handles_modes_and_sizes():
    for mode in ("RGBA", "L", "P", "RGB"):
        lr, face = image_to_input(Image.new(mode, (300, 200)))
        assert lr.shape == (8, 8, 3) and face.shape == (32, 32, 3)
    tiny = np.random.default_rng(2).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    lr, face = image_to_input(Image.fromarray(tiny))
    np.testing.assert_array_equal(lr, tiny)
    assert face is None


def test_bad_files_give_reasons(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    text = tmp_path / "text.png"
    text.write_text("not an image")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buf, "JPEG")
    trunc = tmp_path / "trunc.jpg"
    trunc.write_bytes(buf.getvalue()[:200])
    for p, why in ((empty, "empty"), (text, "not a readable image"), (trunc, "not a readable image")):
        with pytest.raises(BadImage, match=why):
            open_rgb(p)


def test_check_input_refuses_bad_arrays():
    with pytest.raises(ValueError, match="shape"):
        check_input(np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="dtype"):
        check_input(np.zeros((8, 8, 3), np.float32))
    assert check_input(np.zeros((8, 8, 3), np.int64)).dtype == np.uint8


def test_prepare_from_a_folder_skips_bad_files(tmp_path, capsys, monkeypatch):
    src = tmp_path / "photos"
    (src / "sub").mkdir(parents=True)
    Image.new("RGB", (178, 218), "blue").save(src / "000001.jpg")
    Image.new("LA", (50, 80)).save(src / "sub" / "grey.png")
    (src / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    out = tmp_path / "out.npz"
    assert main(["prepare", str(src), "-o", str(out), "--quiet"]) == 0
    faces = load_faces(out)
    assert len(faces) == 2
    said = capsys.readouterr().out
    assert "skipped 1" in said and "no partition labels, so all are held-out test faces" in said
    assert f"pass --data {out}" in said  # the other commands read the shared data unless told
    assert main(["prepare", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert main(["prepare", str(src), "-o", str(tmp_path / "out.txt")]) == 2
    assert "must end in .npz" in capsys.readouterr().err
    assert main(["prepare", str(src), "-o", str(out), "--quiet"]) == 0
    assert "(replacing the file there)" in capsys.readouterr().out
    # training on it says why it cannot
    monkeypatch.setattr("sr_blockwise.train.CACHE_DIR", tmp_path / "cache")
    assert main(["train", "--preset", "tiny", "--run", "t", "--data", str(out), "--max-steps", "1"]) == 2
    assert "no partition labels and is all held-out test faces" in capsys.readouterr().err


def test_celeba_folder_part_filters_before_reading(celeba_npz):
    root = celeba_npz.parent / "celeba"
    test = load_faces(root, part="test")
    assert len(test) > 0 and all(i % 16 == 0 for i in test.ids) and (test.split == 2).all()
    assert len(test) < 5999 / 8  # only the held-out photos were read


def test_no_celeba_pixels_are_tracked():
    """Evaluation grids and prepared arrays hold CelebA faces: they stay out of git (results/ is
    ignored, and a grid force-added to experiments/ or data/ is caught here). Plots may be tracked."""
    import shutil
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    bad = [f for f in tracked if f.endswith((".npz", ".npy")) or Path(f).name.startswith("grid_")
           or f.startswith(("data/", "results/", "experiments/")) and f.lower().endswith((".jpg", ".jpeg", ".png", ".webp"))
           and not Path(f).name.startswith(("mean_block", "quality_vs", "speedup_vs", "learning-curve"))]
    assert bad == []


@pytest.mark.parametrize("value, mode, ext", [(32768, "I;16", "png"), (1000, "I;16", "png"),
                                              (32768, "I;16", "tif"), (50000, "I", "tif")])
def test_16bit_greyscale_is_scaled_not_clipped(tmp_path, value, mode, ext):
    """16-bit grey (Pillow modes I;16 and I) keeps its top 8 bits: mid-grey stays mid-grey, not white."""
    path = tmp_path / f"g.{ext}"
    img = Image.fromarray(np.full((40, 40), value, np.uint16))
    (img if mode == "I;16" else img.convert("I")).save(path)
    with Image.open(path) as opened:
        assert opened.mode == mode
    lr, face = image_to_input(open_rgb(path))
    assert (lr == value >> 8).all() and (face == value >> 8).all()


# ---------------------------------------------------------------- photo sizes

def full_read(path) -> np.ndarray:
    """The 8x8 input of a photo decoded at full resolution, whatever its size."""
    with Image.open(path) as img:
        img.load()
        return image_to_input(to_rgb(img))[0]


def scene(rng, w, h, blobs=40) -> Image.Image:
    """A photo-like image: a smooth random field with sharp-edged shapes on it."""
    from PIL import ImageDraw
    img = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((w, h), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(blobs):
        x, y = rng.integers(0, w), rng.integers(0, h)
        draw.ellipse((x, y, x + w // 25, y + h // 30), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return img


def test_ordinary_photos_give_the_same_input_as_a_full_read(tmp_path, rng):
    """Photos up to FULL_READ_PIXELS are decoded whole: their 8x8 inputs are bit for bit those of
    a full-resolution read, whatever the format, mode or EXIF orientation."""
    big = scene(rng, 4000, 3000)
    rotated = big.resize((640, 480))
    exif = rotated.getexif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    rgba = big.resize((300, 200)).convert("RGBA")
    rgba.putalpha(100)
    files = {"12mp.jpg": (big, {"quality": 90}), "photo.png": (big.resize((1200, 900)), {}),
             "rotated.jpg": (rotated, {"exif": exif}), "rgba.png": (rgba, {}),
             "grey.webp": (big.resize((500, 700)).convert("L"), {}), "p.gif": (big.resize((90, 90)).convert("P"), {})}
    for name, (img, kw) in files.items():
        img.save(tmp_path / name, **kw)
        lr, _ = read_input(tmp_path / name)
        np.testing.assert_array_equal(lr, full_read(tmp_path / name), err_msg=name)
    assert read_input(tmp_path / "rotated.jpg")[0].shape == (8, 8, 3)
    assert 4000 * 3000 <= FULL_READ_PIXELS


def test_a_real_face_gives_the_input_it_always_gave(celeba_npz):
    """A held-out CelebA photo's 8x8 input, as the project has always made it (its SHA-256)."""
    import hashlib
    jpg = celeba_npz.parent / "celeba" / "img_align_celeba" / "182752.jpg"
    lr, face = read_input(jpg)
    assert hashlib.sha256(lr.tobytes()).hexdigest()[:16] == "e112c465fd6639e7"
    assert hashlib.sha256(face.tobytes()).hexdigest()[:16] == "11a3325e95761db2"


@pytest.fixture(scope="module")
def photo_48mp(tmp_path_factory):
    """An 8000x6000 (48 MP) phone-sized JPEG, shot in portrait: EXIF orientation 6."""
    path = tmp_path_factory.mktemp("big") / "48mp.jpg"
    img = scene(np.random.default_rng(1), 8000, 6000)
    exif = img.getexif()
    exif[0x0112] = 6
    img.save(path, quality=90, exif=exif)
    return path


def test_a_48_megapixel_jpeg_is_read_at_reduced_size(photo_48mp):
    img = open_rgb(photo_48mp)
    assert img.info["full_size"] == (6000, 8000)  # the photo as shown: portrait
    assert img.width < img.height and REDUCED_MIN_SIDE <= img.width < 6000
    lr, face = image_to_input(img)
    full = full_read(photo_48mp).astype(int)
    assert np.abs(lr.astype(int) - full).mean() <= 0.5 and np.abs(lr.astype(int) - full).max() <= 2


def test_a_48_megapixel_jpeg_is_read_in_bounded_memory(photo_48mp):
    """Peak memory of reading it (a fresh process's maxrss) stays a fraction of its full decode,
    144 MB of RGB."""
    resource = pytest.importorskip("resource")
    code = ("import resource, sys; from sr_blockwise.data import read_input\n"
            "rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "before = rss(); read_input(sys.argv[1]); print((rss() - before) / 1024)")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code, str(photo_48mp)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert float(out.stdout) < 48  # MB, a third of the full decode alone


def test_large_png_and_bilevel_images_are_reduced_too(tmp_path):
    img = Image.new("L", (7000, 6000), 30)
    img.paste(200, (0, 0, 3500, 6000))  # left half light
    img.save(tmp_path / "big.png", compress_level=1)
    Image.new("1", (8000, 6000), 1).save(tmp_path / "white.png")
    reduced = open_rgb(tmp_path / "big.png")
    assert reduced.info["full_size"] == (7000, 6000) and max(reduced.size) < 7000
    np.testing.assert_array_equal(read_input(tmp_path / "big.png")[0], full_read(tmp_path / "big.png"))
    assert (read_input(tmp_path / "white.png")[0] == 255).all()


def test_images_over_pillows_decompression_bomb_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)  # refused above twice this
    Image.new("RGB", (1500, 1500)).save(tmp_path / "bomb.png")
    with pytest.raises(BadImage, match="too large"):
        open_rgb(tmp_path / "bomb.png")
    # between the limit and twice it Pillow only warns; such a photo is read, and the warning,
    # one per photo of a batch, is not shown (in a process of its own: pytest resets the filters
    # that importing the package sets)
    Image.new("RGB", (1200, 1200)).save(tmp_path / "large.png")
    code = ("from PIL import Image; from sr_blockwise.data import open_rgb; Image.MAX_IMAGE_PIXELS = 1_000_000; "
            f"print(open_rgb({str(tmp_path / 'large.png')!r}).size)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 0 and r.stdout.strip() == "(1200, 1200)", r.stderr
    assert "DecompressionBombWarning" not in r.stderr


# ---------------------------------------------------------------- inputs of the Python API

def test_arrays_give_the_input_of_the_same_pil_image(rng):
    rgb = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
    rgba = rng.integers(0, 256, (40, 30, 4), dtype=np.uint8)
    grey = rng.integers(0, 256, (40, 30), dtype=np.uint8)
    for a in (rgb, rgba, grey, grey[..., None], rgb.astype(np.int64)):
        pil = Image.fromarray(a.astype(np.uint8).squeeze())
        np.testing.assert_array_equal(read_input(a)[0], read_input(pil)[0])
    assert array_to_image(rgba).mode == "RGBA" and array_to_image(grey).mode == "L"


@pytest.mark.parametrize("source, message", [
    (np.zeros((20, 20, 3), np.float32), "got dtype float32"),
    (np.zeros((20, 20), bool), "got dtype bool"),
    (np.full((20, 20), 300, np.int32), "0..255, got range 300..300"),
    (np.zeros((0, 20, 3), np.uint8), "image is 20x0: it has no pixels"),
    (np.zeros((20, 20, 2), np.uint8), "shape"),
    (Image.new("RGB", (0, 0)), "no pixels"),
    (object(), "expected an image file, a PIL image or a numpy array, got object"),
    (None, "got NoneType"),
])
def test_unusable_sources_raise_value_errors(source, message):
    with pytest.raises(ValueError, match=message):
        read_input(source)
