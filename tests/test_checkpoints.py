"""Weights I/O: round trip, and refusal (with a reason) of anything that does not match."""
import json
import os

import pytest
import torch

from conftest import make_tiny
from sr_blockwise.checkpoints import WeightsError, list_weights, load_model, save_weights
from sr_blockwise.cli import main
from sr_blockwise.model import preset


def test_roundtrip_gives_the_same_model(tmp_path):
    m = make_tiny(3)
    (tmp_path / "w.tmp").write_bytes(b"")  # what a killed run of safetensors' own writer left
    (tmp_path / "w.tmp").chmod(0o600)
    js = save_weights(m, tmp_path / "w", {"test_bits_per_dim": 7.9})
    m2 = load_model(js, dtype=torch.float32, for_inference=False)
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    assert list_weights(tmp_path)[0]["meta"]["test_bits_per_dim"] == 7.9
    # both files as readable as the umask lets any new file be (safetensors' own writer made 0600)
    mode = lambda p: p.stat().st_mode & 0o777
    assert mode(tmp_path / "w.safetensors") == mode(js)
    # loaded by the .safetensors path, cast for decoding: the same forward as the source model
    # (a whole decode of each took two minutes of the suite; the decoder is tested elsewhere)
    g = torch.Generator().manual_seed(3)
    src, tgt = torch.randint(0, 256, (2, 192), generator=g), torch.randint(0, 256, (2, 3072), generator=g)
    a, b = m.for_inference(torch.float32), load_model(tmp_path / "w.safetensors", dtype=torch.float32)
    assert not b.training
    with torch.no_grad():
        k = m.cfg.n_blockwise
        torch.testing.assert_close(a.head_logits(a(src, tgt), k, src, tokens=tgt),
                                   b.head_logits(b(src, tgt), k, src, tokens=tgt), rtol=0, atol=0)


def test_wrong_or_damaged_weights_are_refused(tmp_path):
    js = save_weights(make_tiny(0), tmp_path / "w")
    with pytest.raises(WeightsError, match="config does not match"):
        load_model(js, expect=preset("cpu"))
    card = json.loads(js.read_text())
    card["config"]["d_model"] = 64
    card["config"]["n_heads"] = 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(card))
    with pytest.raises(WeightsError, match="shape"):
        load_model(bad)
    st = tmp_path / "w.safetensors"
    data = bytearray(st.read_bytes())
    data[-1] ^= 0xFF
    st.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match="sha256"):
        load_model(js)
    with pytest.raises(WeightsError, match="no weights named"):
        load_model("no-such-weights")
    # a path that is there but is no weights says what it is
    (tmp_path / "adir.json").mkdir()
    for there, what in [(tmp_path, "a folder"), (tmp_path / "adir.json", "a folder"), ("/dev/null", "not a regular file")]:
        with pytest.raises(WeightsError, match=f"{what}; weights are a card"):
            load_model(there)



def test_weights_that_name_draft_emb_load_when_it_is_off_and_are_refused_when_on(tmp_path):
    """draft_emb (the heads reading embedded drafts) was measured and not kept: weights that say
    "draft_emb": false (cpu-finetuned does) load; weights that need it are refused with the
    reason, not decoded wrongly."""
    m = make_tiny(1)
    js = save_weights(m, tmp_path / "w")
    card = json.loads(js.read_text())
    for on in (False, True):
        card["config"]["draft_emb"] = on
        (tmp_path / "w.json").write_text(json.dumps(card))
        if on:
            with pytest.raises(WeightsError, match="draft_emb.*not kept"):
                load_model(tmp_path / "w.json")
        else:
            got = load_model(tmp_path / "w.json", dtype=torch.float32, for_inference=False)
            assert got.cfg == m.cfg and all(torch.equal(a, b) for a, b in zip(got.state_dict().values(),
                                                                            m.state_dict().values()))

class Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_a_checkpoint_with_pickled_objects_is_refused(tmp_path):
    p = tmp_path / "evil.pt"
    torch.save({"model_config": {}, "model": {}, "payload": Evil()}, p)
    with pytest.raises(WeightsError, match="not a usable training checkpoint") as e:
        load_model(p)
    assert "weights_only" not in str(e.value)  # torch's advice to load it unsafely is not passed on
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(WeightsError, match="corrupt, or not a checkpoint of this project"):
        load_model(junk)


def test_a_tensor_file_without_its_card_says_what_to_pass(tmp_path):
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes(b"x")
    with pytest.raises(WeightsError, match=r"loaded through their weights card.*\(lone.json.*pass the card"):
        load_model(lone)


def test_cards_name_no_folder_of_the_machine_that_made_them(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    from sr_blockwise.checkpoints import WEIGHTS_DIR, portable_path

    for js in sorted(Path(WEIGHTS_DIR).glob("*.json")):
        assert not re.search(r'"(/|[A-Za-z]:\\)', js.read_text()), js.name
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert portable_path(tmp_path / "repo" / "runs" / "last.pt") == "runs/last.pt"
    assert portable_path(tmp_path / "home" / ".cache" / "r" / "last.pt") == "~/.cache/r/last.pt"
    assert portable_path("/elsewhere/scratch.x1/faces.npz") == "scratch.x1/faces.npz"
    assert portable_path("weights/cpu-frozen.json") == "weights/cpu-frozen.json"
    assert portable_path(None) is None


def test_export_refuses_what_is_not_a_training_checkpoint(tmp_path, tiny_weights, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(bytes(range(256)) * 8)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.pt").write_bytes(junk.read_bytes())
    for argv, message in [([str(junk), "--name", "j"], "not a usable training checkpoint (corrupt"),
                          ([tiny_weights, "--name", "j"], "export takes a training checkpoint (.pt)"),
                          ([str(junk), "--name", "../j"], "a file name, without folders"),
                          (["no-such-run", "--name", "j"], "no checkpoint at no-such-run"),
                          ([str(junk), "--name", "kept"], "kept.json exists: choose another --name"),
                          ([str(tmp_path / "run"), "--name", "j"], "run/last.pt: not a usable training")]:  # a run's folder
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / "kept.json").write_text("{}")  # weights already there are not overwritten
        assert main(["export", *argv, "--out-dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and "weights_only" not in err, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["kept.json"]


def test_a_name_with_a_dot_is_kept_whole(tmp_path):
    js = save_weights(make_tiny(0), tmp_path / "cpu-frozen.v2")
    assert js.name == "cpu-frozen.v2.json" and (tmp_path / "cpu-frozen.v2.safetensors").is_file()
    assert not (tmp_path / "cpu-frozen.json").exists() and load_model(js) is not None


def test_export_takes_a_checkpoint_without_a_training_record(tmp_path, celeba_npz, capsys):
    """A .pt holding only the model and its config (saved by hand, not by `train`) is exported:
    its card has an empty training record, a held-out score, and the same weights."""
    m = make_tiny(4)
    torch.save({"model": m.state_dict(), "model_config": m.cfg.to_dict()}, tmp_path / "bare.pt")
    assert main(["export", str(tmp_path / "bare.pt"), "--name", "bare", "--out-dir", str(tmp_path / "out"),
                 "--data", str(celeba_npz), "--eval-images", "2"]) == 0
    js = tmp_path / "out" / "bare.json"
    assert "wrote" in capsys.readouterr().out
    meta = list_weights(tmp_path / "out")[0]["meta"]
    assert meta["train_config"] == {} and meta["steps"] is None and meta["test_images_scored"] == 2
    assert meta["test_bits_per_dim"] > 0
    for (k, a), (_, b) in zip(m.state_dict().items(), load_model(js, dtype=torch.float32,
                                                                  for_inference=False).state_dict().items()):
        assert torch.equal(a, b), k


def test_weights_lists_the_shipped_ones_and_refuses_a_missing_folder(capsys):
    assert main(["weights"]) == 0
    out = capsys.readouterr().out
    assert "cpu-finetuned" in out and "cpu-frozen" in out
    assert main(["weights", "--dir", "/nonexistent-weights"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly():
    """`sr-blockwise weights | head -0`: the reader gone before anything is written; the command
    stops with the shell's code for it (141), no traceback."""
    import subprocess
    import sys
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "sr_blockwise", "weights"], stdout=w, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    os.close(w)
    assert p.returncode == 141 and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def test_a_broken_pipe_that_is_not_the_output_is_a_failure(monkeypatch):
    """Only a closed reader of the output ends quietly: a pipe or socket of the command's own
    that breaks is an error to show."""
    import sr_blockwise.cli as cli

    def breaks(argv=None):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(cli, "run_command", breaks)  # under pytest's capture: stdout is no closed pipe
    with pytest.raises(BrokenPipeError):
        cli.main(["weights"])
