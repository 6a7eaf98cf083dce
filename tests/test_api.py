"""The Python API, sr_blockwise.Upscaler: the shipped weights on real held-out CelebA faces where
the property is about them (one batch of two, one face alone), the random tiny model from conftest
elsewhere."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import two_faces
from sr_blockwise import Upscaler, cli
from sr_blockwise import faces as F
from sr_blockwise.api import ImageStats
from sr_blockwise.data import match_input, read_input
from sr_blockwise.decoding import DEFAULT_GUARD, decode, options_for

FAST = {"mode": "approx", "k": 8, "eps": 150}  # the random tiny model accepts long blocks here: fast
FACES = ("182752.jpg", "182832.jpg")  # held-out: CelebA test partition, id % 16 == 0


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared: one thread decodes fastest
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tiny_weights, one_thread):
    return Upscaler(tiny_weights, device="cpu")


def photo(rng, h=50, w=40):
    small = rng.integers(0, 256, (h // 10 + 1, w // 10 + 1, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))


def pixels(img) -> np.ndarray:
    assert isinstance(img, Image.Image) and img.size == (32, 32) and img.mode == "RGB"
    return np.asarray(img)


def test_import_is_light():
    code = ("import sys, sr_blockwise, sr_blockwise.api; print('torch' in sys.modules); "
            "print(sr_blockwise.Upscaler is sr_blockwise.api.Upscaler)")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == ["False", "True"]


def test_a_list_gives_a_list_and_the_batch_does_not_matter(tiny, rng):
    images = [photo(rng), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), photo(rng, 64, 64),
              photo(rng, 30, 90), photo(rng)]
    outs, stats = tiny.upscale(images, batch_size=3, return_stats=True, **FAST)  # batches of 3 and 2
    assert isinstance(outs, list) and len(outs) == len(stats) == 5
    assert all(isinstance(s, ImageStats) and s.calls > 0 and s.mean_block >= 1 and s.seconds > 0 for s in stats)
    alone, st = tiny.upscale(images[3], return_stats=True, **FAST)  # one image in: one out
    np.testing.assert_array_equal(pixels(alone), pixels(outs[3]))
    assert st.calls == stats[3].calls and st.mean_block == stats[3].mean_block
    # a tuple and an (N, H, W, C) array are lists too; an empty list gives an empty one
    again = tiny.upscale(np.stack([images[0], images[4]]), batch_size=1, **FAST)
    assert [pixels(x).tolist() for x in again] == [pixels(outs[0]).tolist(), pixels(outs[4]).tolist()]
    assert tiny.upscale((), **FAST) == [] and tiny.upscale([], return_stats=True, **FAST) == ([], [])


def test_pil_numpy_and_a_file_give_the_same_face(tiny, rng, tmp_path):
    arr = photo(rng, 60, 45)
    Image.fromarray(arr).save(tmp_path / "face.png")
    outs = tiny.upscale([arr, Image.fromarray(arr), tmp_path / "face.png", str(tmp_path / "face.png")], **FAST)
    for out in outs[1:]:
        np.testing.assert_array_equal(pixels(out), pixels(outs[0]))
    # grey and RGBA arrays are the PIL images of their shape
    grey, rgba = arr[..., 0], np.dstack([arr, arr[..., :1]])
    for a, mode in ((grey, "L"), (rgba, "RGBA")):
        np.testing.assert_array_equal(Upscaler.prepare(a), Upscaler.prepare(Image.fromarray(a, mode)))


def test_the_output_is_the_decoders_matched_to_the_input(tiny, rng):
    """match_input=False: the decoder's own output at the weights' default guidance and the
    default cell guard; True (the default): that output back-projected onto the 8x8 input.
    prior_weight and guard reach the decoder."""
    arr = photo(rng)
    lr = read_input(arr)[0]
    ref = decode(tiny.model, lr[None], tiny.options(**FAST)).images[0]
    np.testing.assert_array_equal(pixels(tiny.upscale(arr, match_input=False, **FAST)), ref)
    np.testing.assert_array_equal(pixels(tiny.upscale(arr, **FAST)), match_input(ref, lr))
    as_trained = options_for(FAST["mode"], FAST["k"], FAST["eps"], prior_weight=1.0)  # no guard
    other = decode(tiny.model, lr[None], as_trained).images[0]
    np.testing.assert_array_equal(pixels(tiny.upscale(arr, match_input=False, prior_weight=1.0, guard=0, **FAST)),
                                  other)
    guarded = decode(tiny.model, lr[None], options_for(FAST["mode"], FAST["k"], FAST["eps"], prior_weight=1.0,
                                                       guard=DEFAULT_GUARD)).images[0]
    assert not np.array_equal(guarded, other)
    np.testing.assert_array_equal(pixels(tiny.upscale(arr, match_input=False, prior_weight=1.0, **FAST)), guarded)


def test_a_sample_depends_on_its_image_and_seed_only(tiny, rng):
    """In a list or alone, an image's sample is decode's for that image alone at that seed (as the
    demo decodes it); a list of seeds gives each image its own."""
    a, b = photo(rng), photo(rng, 70, 50)
    kw = {"mode": "sample", "k": 4, "temperature": 0.8, "match_input": False}
    pair = tiny.upscale([a, b], seed=7, **kw)
    ref = decode(tiny.model, read_input(b)[0][None], tiny.options("sample", k=4, temperature=0.8, seed=7))
    np.testing.assert_array_equal(pixels(pair[1]), ref.images[0])
    other = tiny.upscale([b], seed=[8], **kw)[0]
    assert not np.array_equal(pixels(other), pixels(pair[1]))


@pytest.mark.parametrize("image, message", [
    (np.zeros((20, 20, 3), np.float32), "expected uint8 intensities 0..255, got dtype float32"),
    (np.zeros((0, 20, 3), np.uint8), "image is 20x0: it has no pixels"),
    (Image.new("RGB", (0, 0)), "image is 0x0: it has no pixels"),
    (np.zeros((20, 20, 5), np.uint8), "shape"),
    (object(), "expected an image file, a PIL image or a numpy array, got object"),
    (None, "got NoneType"),
    ("no-such-photo.jpg", "no-such-photo.jpg: not a readable image"),
])
def test_bad_inputs_raise_value_errors_before_any_decoding(tiny, monkeypatch, image, message):
    monkeypatch.setattr(tiny, "decode", lambda *a, **kw: pytest.fail("decoded"))
    with pytest.raises(ValueError, match=message):
        tiny.upscale(image, **FAST)
    with pytest.raises(ValueError, match=f"image 1: .*{message}"):  # in a list: which one
        tiny.upscale([np.zeros((8, 8, 3), np.uint8), image], **FAST)


def test_bad_settings_raise_value_errors(tiny):
    img = np.zeros((8, 8, 3), np.uint8)
    for kw, message in [({"mode": "fast"}, "unknown mode"), ({"k": 99}, "k must be in 1..10"),
                        ({"batch_size": 0}, "batch_size"), ({"seed": [1, 2]}, "2 seeds for 1 images"),
                        # arguments the mode would not read are refused, as the batch command's flags
                        ({"eps": 3}, "only mode 'approx'"), ({"mode": "approx", "temperature": 0.5}, "only mode 'sample'"),
                        ({"mode": "greedy"}, "greedy decoding takes one token per call"),
                        ({"seed": 5}, r"seed=5: only mode 'sample' draws with a seed \(mode 'exact' does not read it\)")]:
        with pytest.raises(ValueError, match=message):
            tiny.upscale(img, **{"k": 4, **kw})
        if "batch_size" not in kw and "seed" not in kw:  # the same, for a photo with no face to decode
            with pytest.raises(ValueError, match=message):
                tiny.upscale_faces(np.full((60, 90, 3), 200, np.uint8), if_none="skip", **{"k": 4, **kw})
    # every image's sampling seed is checked before any decoding, not only the first one
    for seeds in ([0, -1], [0, 2**50], [0, 1.7], [0, None], 2.5):
        with pytest.raises(ValueError, match="seed must be a whole number in 0.."):
            tiny.upscale([img, img], mode="sample", k=4, seed=seeds, batch_size=1)
    with pytest.raises(ValueError, match="no weights"):
        Upscaler("no-such-weights")
    with pytest.raises(ValueError, match="dtype"):
        Upscaler("no-such-weights", dtype="int8")


def test_bad_files_read_as_the_batch_command_reports_them(tiny, tiny_weights, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.png").write_bytes(b"")
    (bad / "notes.png").write_text("not an image\n")
    Image.new("RGB", (40, 40)).save(bad / "cut.jpg")
    (bad / "cut.jpg").write_bytes((bad / "cut.jpg").read_bytes()[:300])
    assert cli.main(["upscale", str(bad), "-o", str(tmp_path / "out"), "--weights", tiny_weights, "--threads", "1",
                     "--quiet", "--metrics", str(tmp_path / "m.json")]) == 1
    reasons = {Path(r["input"]).name: r["reason"] for r in json.loads((tmp_path / "m.json").read_text())["images"]}
    assert len(reasons) == 3
    for name, reason in reasons.items():
        with pytest.raises(ValueError) as e:
            tiny.upscale(bad / name)
        assert str(e.value) == f"{bad / name}: {reason}"


# ---------------------------------------------------------------- shipped weights, real faces

@pytest.fixture(scope="module")
def faces(celeba_npz) -> list[Path]:
    return [celeba_npz.parent / "celeba" / "img_align_celeba" / name for name in FACES]


def test_shipped_weights_give_the_batch_commands_faces(faces, tmp_path, one_thread):
    """Two real held-out faces through the API (exact mode, k=2, the batch command's defaults:
    the largest face, aligned), decoded together, equal the batch command's outputs and
    statistics; the second decoded alone (from its file) gives the same face. CelebA-aligned
    photos keep the paper's crop."""
    from sr_blockwise.faces import faces_of
    up = Upscaler("cpu-finetuned")
    lrs = [Image.fromarray(faces_of(Image.open(f).convert("RGB"))[0][0].lr) for f in faces]
    outs, stats = up.upscale(lrs, batch_size=2, return_stats=True)
    assert cli.main(["upscale", *map(str, faces), "-o", str(tmp_path / "out"), "--weights", "cpu-finetuned",
                     "--threads", "1", "--quiet", "--metrics", str(tmp_path / "m.json")]) == 0
    rows = {Path(r["input"]).name: r for r in json.loads((tmp_path / "m.json").read_text())["images"]}
    for f, out, st in zip(faces, outs, stats):
        np.testing.assert_array_equal(pixels(out), np.asarray(Image.open(tmp_path / "out" / f"{f.stem}.png")))
        assert rows[f.name]["calls"] == st.calls and rows[f.name]["mean_block"] == round(st.mean_block, 4)
        assert st.mean_block > 1.2  # blockwise: fewer calls than greedy's 3072
    (alone,) = up.upscale_faces(faces[1], faces="largest")
    np.testing.assert_array_equal(pixels(alone.image), pixels(outs[1]))


def test_upscale_faces_returns_each_face_with_box_and_landmarks(tiny):
    photo = two_faces()
    found = tiny.upscale_faces(photo, **FAST)
    assert len(found) == 2 and found[0].face.size > found[1].face.size  # largest first
    for r in found:
        left, top, right, bottom = r.box
        assert r.image.size == (32, 32) and r.landmarks.shape == (5, 2) and r.score > 0.9
        assert all(left <= x <= right and top <= y <= bottom for x, y in r.landmarks)
        # the result is the library's decode of the aligned face's 8x8 input
        ref = tiny.upscale(Image.fromarray(r.face.lr), **FAST)
        assert (np.asarray(r.image) == np.asarray(ref)).all()
    assert found[1].box[0] > 512  # the small copy is on the right
    (largest,) = tiny.upscale_faces(photo, faces="largest", **FAST)
    assert largest.box == found[0].box
    # pasted back at the model's scale: the largest face sets it, and is pasted at 32 px at most
    whole, plan = tiny.paste_back(photo, found, return_plan=True)
    assert plan.face == 0 and whole.size == F.pasted_size(photo.size, plan.scale) and whole.width < 832
    assert 30 < found[0].face.size * whole.width / photo.width <= 32 + 1e-6
    assert "face 0" in plan.note and (np.asarray(whole) == np.asarray(tiny.paste_back(photo, found))).all()
    canvas = F.paste_canvas(photo, plan.scale)
    assert (np.asarray(whole)[:2] == canvas[:2]).all() and not (np.asarray(whole) == canvas).all()
    # a scale given: the photo 4x, as asked
    whole = tiny.paste_back(photo, found, scale=4)
    assert whole.size == (832 * 4, 512 * 4)
    plain = np.asarray(photo.resize(whole.size, Image.Resampling.BICUBIC))
    assert (np.asarray(whole)[:40] == plain[:40]).all()  # above every face: untouched
    assert not (np.asarray(whole) == plain).all()
    # a face given by hand; a photo without a face
    (boxed,) = tiny.upscale_faces(photo, boxes=[(600, 200, 620, 220)], **FAST)
    assert boxed.landmarks is None and boxed.box == (600, 200, 620, 220)
    wall = np.full((60, 90, 3), 200, np.uint8)
    assert tiny.upscale_faces(wall, if_none="skip") == []
    with pytest.raises(ValueError, match="no face found"):
        tiny.upscale_faces(wall, if_none="error")
    (centre,) = tiny.upscale_faces(wall, **FAST)
    assert centre.face.how == "centre square"


def test_face_boxes_and_paste_back_refuse_what_they_cannot_use(tiny):
    """Bad boxes and paste-back results are ValueErrors that say what is wanted, before any work;
    faces="none" takes the centre square, as the batch command's --faces none."""
    wall = np.full((60, 90, 3), 200, np.uint8)
    for boxes in ([(1, 2, 3)], ["180,60,270,175"], [(1, 2, 3, None)], 5, [(0, 0, 10, True)], [(0, 0, np.inf, 10)],
                  [(0, np.nan, 10, 10)]):
        with pytest.raises(ValueError, match=r"a face box is \(left, top, right, bottom\), four numbers"):
            tiny.upscale_faces(wall, boxes=boxes, **FAST)
    (one,) = tiny.upscale_faces(wall, boxes=np.array([10, 10, 40, 40]), **FAST)  # one box, as an array
    assert one.box == (10, 10, 40, 40)
    # corners in either order, as the demo takes a box: the same face
    for corners in ((40, 40, 10, 10), (10, 40, 40, 10), (40, 10, 10, 40)):
        (same,) = tiny.upscale_faces(wall, boxes=corners, **FAST)
        assert same.box == one.box and (np.asarray(same.image) == np.asarray(one.image)).all()
    with pytest.raises(ValueError, match="right > left"):  # no width: not a box whichever the order
        tiny.upscale_faces(wall, boxes=(40, 10, 40, 40), **FAST)
    (centre,) = tiny.upscale_faces(wall, faces="none", **FAST)
    with pytest.raises(ValueError, match="choose from largest, all, none"):
        tiny.upscale_faces(wall, faces="every")
    assert centre.face.how == "centre square"
    for results, named in ((None, "NoneType"), (tiny.upscale(wall, **FAST), "Image"),
                           ([Image.fromarray(wall)], "a list holding Image")):
        with pytest.raises(ValueError, match=f"the FaceResults that upscale_faces returned.*got {named}"):
            tiny.paste_back(wall, results)
    # one FaceResult, not in a list: the 60 px centre square pasted at 32 px
    assert tiny.paste_back(wall, centre).size == F.pasted_size((90, 60), 32 / 60) == (48, 32)
    for scale in (0, -1, math.nan, "4", True):
        with pytest.raises(ValueError, match="scale: the pasted photo's size / the photo's, a number above 0"):
            tiny.paste_back(wall, centre, scale=scale)


def test_a_huge_photos_faces_come_in_its_own_pixels(tiny, tmp_path):
    """A 48 MP photo is read at reduced size; boxes and landmarks still come in its own pixels."""
    import skimage.data
    big = Image.new("RGB", (8000, 6000), (120, 130, 110))
    big.paste(Image.fromarray(skimage.data.astronaut()).resize((2048, 2048), Image.Resampling.BICUBIC), (3000, 2000))
    big.save(tmp_path / "big.jpg", quality=85)
    del big
    (r,) = tiny.upscale_faces(tmp_path / "big.jpg", **FAST)
    small, = tiny.upscale_faces(skimage.data.astronaut(), **FAST)  # the same face at 1/4 size
    assert np.abs(np.array(r.box) - (np.array(small.box) * 4 + [3000, 2000, 3000, 2000])).max() < 40
    assert np.abs(r.landmarks - (small.landmarks * 4 + [3000, 2000])).max() < 40
    (boxed,) = tiny.upscale_faces(tmp_path / "big.jpg", boxes=[r.box], **FAST)
    assert np.allclose(boxed.box, r.box)


def test_the_default_block_size_is_the_same_everywhere():
    """The batch command and the API leave k to decoding.DEFAULT_K, per mode (the fastest setting
    measured); the demo, which decodes exact and approximate mode at one k, starts at approximate
    mode's."""
    import inspect

    from sr_blockwise.decoding import DEFAULT_K, MODES
    from sr_blockwise.serving.live import page_defaults
    from sr_blockwise.upscale import Config
    assert Config.k is None and set(DEFAULT_K) == set(MODES)
    up = Upscaler("cpu-finetuned")
    for method in (Upscaler.options, Upscaler.upscale):
        assert inspect.signature(method).parameters["k"].default is None
    for mode in MODES:
        assert up.options(mode).k == DEFAULT_K[mode]
    assert up.options("approx").propose == "window" and up.options("exact").propose == "recycle"
    assert page_defaults(up.model)[0] == DEFAULT_K["approx"]
    # the cell guard: on by default where it was measured, off for samples, and 0 turns it off
    from sr_blockwise.decoding import DEFAULT_GUARD
    assert [up.options(mode).guard for mode in MODES] == [DEFAULT_GUARD if m != "sample" else 0 for m in MODES]
    assert up.options("exact", guard=0).guard == 0 and up.options("sample", guard=8).guard == 8
    assert Config.guard is None and inspect.signature(Upscaler.upscale).parameters["guard"].default is None


def test_api_errors_name_the_arguments_not_the_command_line_flags():
    from sr_blockwise.api import pick_device, torch_dtype
    with pytest.raises(ValueError, match=r"^device 'tpu'"):
        pick_device("tpu")
    with pytest.raises(ValueError, match=r"^dtype 'int8'"):
        torch_dtype("int8")


def test_the_readmes_api_example_runs(rng):
    """The README's Python API lines, run as written on one 8x8 image."""
    import re
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("The Python API", 1)[1]
    block = re.search(r"\n((?:    .*\n|\n)+)", section).group(1)
    names = {"image": Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))}
    exec("\n".join(line[4:] for line in block.splitlines()), names)
    assert names["face"].size == names["approx"].size == (32, 32)


def test_every_command_takes_both_dtype_spellings():
    """bf16 / bfloat16, fp32 / float32: each command with --dtype takes either spelling."""
    parsers = {p.prog: p for p in cli._every_parser(cli.build_parser())}
    for prog, args, bf16, fp32 in [("upscale", ["in", "-o", "out"], "bfloat16", "float32"),
                                   ("bench-decode", [], "bfloat16", "float32"), ("demo", [], "bfloat16", "float32"),
                                   ("evaluate", [], "bfloat16", "float32")]:
        parser = parsers[f"sr-blockwise {prog}"]
        for spelling in ("bf16", "bfloat16"):
            assert parser.parse_args(args + ["--dtype", spelling]).dtype == bf16, (prog, spelling)
        for spelling in ("fp32", "float32"):
            assert parser.parse_args(args + ["--dtype", spelling]).dtype == fp32, (prog, spelling)


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"sr-blockwise {version('sr-blockwise')}"


def test_every_commands_help_gives_its_defaults():
    """`--help` of every command and subcommand says each option's default (once: none of
    argparse's '(default: None)' after a help that already says it)."""
    import re

    parsers = list(cli._every_parser(cli.build_parser()))
    assert {"sr-blockwise upscale", "sr-blockwise rate serve", "sr-blockwise demo"} <= {p.prog for p in parsers}
    for parser in parsers:
        text = re.sub(r"\s+", "", parser.format_help())  # as wrapped, even inside a word
        assert "(default:None)" not in text and "default:default" not in text, parser.prog
        for action in parser._actions:
            if cli.worth_saying(action) and not cli.states_default(action.help or ""):
                want = re.sub(r"\s+", "", f"default: {cli.shown_default(action)}")
                assert want in text, (parser.prog, action.option_strings)
    # flags say what they do, not a default that reads as on; numbers, not names of constants
    from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT
    helps = {p.prog: re.sub(r"\s+", " ", p.format_help()) for p in parsers}
    assert "no bf16 autocast (default" not in helps["sr-blockwise train"]
    assert "(default: )" not in helps["sr-blockwise upscale"]
    assert f"default: {DEFAULT_PRIOR_WEIGHT:g}, sr_blockwise.decoding.DEFAULT_PRIOR_WEIGHT" in helps["sr-blockwise upscale"]


def test_a_ctrl_c_while_a_command_starts_ends_it_in_one_line(tmp_path):
    """Ctrl-C while the commands' modules and torch still load (before a command handles Ctrl-C
    itself) stops it with exit code 130 and one line, not an import traceback. The process sends
    itself SIGINT at the first import inside main, so the test does not race the imports."""
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    # Python's own Ctrl-C handler, as in a terminal: a test runner's worker may ignore SIGINT,
    # and a child inherits that
    child = ("import os, signal, sys\n"
             "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
             "from sr_blockwise.cli import main\n"
             "class CtrlC:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        sys.meta_path.remove(self)\n"
             "        os.kill(os.getpid(), signal.SIGINT)\n"
             "sys.meta_path.insert(0, CtrlC())\n"
             "sys.exit(main(sys.argv[1:]))\n")
    p = subprocess.Popen([sys.executable, "-c", child, "upscale", str(tmp_path / "none.png"), "-o", str(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "stopped (Ctrl-C)" in err and "Traceback" not in err, err
