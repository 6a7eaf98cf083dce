"""The built-in example faces and `sr-blockwise examples`, the quick start's first step."""
from __future__ import annotations

import numpy as np
from PIL import Image

from sr_blockwise import cli
from sr_blockwise.examples import builtin_examples


def test_examples_command_writes_each_builtin_face_as_a_readable_png(tmp_path, capsys):
    assert cli.main(["examples", str(tmp_path / "faces")]) == 0
    names = [ex.name for ex in builtin_examples()]
    written = sorted(p.name for p in (tmp_path / "faces").iterdir())
    assert written == sorted(names) and "astronaut-8x8.png" in written
    for ex in builtin_examples():  # the file holds the example's pixels, losslessly
        with Image.open(tmp_path / "faces" / ex.name) as im:
            assert im.format == "PNG" and np.array_equal(np.asarray(im), np.asarray(ex.image))
    assert f"wrote {len(names)} example faces" in capsys.readouterr().out


def test_examples_command_adds_held_out_celeba_faces(tmp_path, celeba_npz):
    assert cli.main(["examples", str(tmp_path), "--celeba", "2", "--data", str(celeba_npz)]) == 0
    celeba = sorted(p.name for p in tmp_path.glob("celeba-*.png"))
    assert len(celeba) == 2 and all(Image.open(tmp_path / n).size == (32, 32) for n in celeba)


def test_examples_command_refuses_celeba_faces_it_cannot_find(tmp_path, capsys):
    assert cli.main(["examples", str(tmp_path / "out"), "--celeba", "2", "--data", str(tmp_path / "none.npz")]) == 2
    assert "no CelebA faces at" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing half-written
