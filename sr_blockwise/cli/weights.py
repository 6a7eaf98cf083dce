"""`sr-blockwise weights`: the shipped weights and their held-out scores."""
from __future__ import annotations

from pathlib import Path


def cmd_weights(a):
    from ..checkpoints import WEIGHTS_DIR, list_weights

    folder = Path(a.dir) if a.dir else WEIGHTS_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"--dir {folder}: no such folder" if a.dir else
                                f"the shipped weights' folder {folder} is missing: reinstall the package")
    ws = list_weights(folder)
    if not ws:
        print(f"no weights in {a.dir or WEIGHTS_DIR}")
        return 1
    print(f"{'name':<16} {'K':>3} {'d':>4} {'params':>7}  {'test bits/dim':>13}  note")
    for w in ws:
        c, m = w["config"], w["meta"]
        bpd = m.get("test_bits_per_dim")
        print(f"{w['name']:<16} {c['n_blockwise']:>3} {c['d_model']:>4} {m.get('params', 0) / 1e6:>6.2f}M  "
              f"{bpd if bpd is None else format(bpd, '.4f'):>13}  {m.get('description', '')}")
    return 0


def register(sub):
    p = sub.add_parser("weights", help="list the shipped weights and their held-out scores",
                       description="List the weights in a folder (NAME.safetensors + NAME.json): name, "
                                   "blockwise heads K, model width d, parameters, bits/dim on held-out "
                                   "faces and the card's note. A shipped one loads as --weights NAME, one elsewhere as "
                                   "--weights FOLDER/NAME.json.")
    p.add_argument("--dir", default=None, help="the folder to list (default: the shipped weights/)")
    p.set_defaults(func=cmd_weights)
