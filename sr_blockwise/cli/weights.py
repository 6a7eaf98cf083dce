"""`sr-blockwise weights`: the shipped weights and their held-out scores."""
from __future__ import annotations

from pathlib import Path


def cmd_weights(a):
    from ..checkpoints import WEIGHTS_DIR, list_weights

    ws = list_weights(Path(a.dir) if a.dir else WEIGHTS_DIR)
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
    p = sub.add_parser("weights", help="list the shipped weights and their held-out scores")
    p.add_argument("--dir", default=None)
    p.set_defaults(func=cmd_weights)
