"""Cost of one engine call (ms) before the AVX2 kernel changes (engine.cpp of commit 6666d24) and
now, in one run: each (engine, dtype) in its own process (a process loads one engine), the two
engines alternating for 3 rounds, the fastest of each cell kept (call_cost.log).

    PYTHONPATH=. .venv/bin/python experiments/avx2-kernels/call_cost.py
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS, BATCHES = (1, 2, 4, 7), (1, 16)


def measure(source: str, dtype: str) -> list[dict]:
    import torch
    from sr_blockwise.decoding import engine
    engine.SOURCE = Path(source)
    from sr_blockwise.bench import call_cost_table
    from sr_blockwise.checkpoints import load_model
    torch.set_num_threads(2)
    model = load_model("cpu-finetuned", dtype=getattr(torch, dtype))
    return call_cost_table(model, tokens=TOKENS, batches=BATCHES, reps=40, rounds=2)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "engine.cpp"
        before.write_text(subprocess.run(["git", "show", "6666d24:sr_blockwise/engine.cpp"], cwd=ROOT,
                                         capture_output=True, text=True, check=True).stdout)
        sources = {"before": str(before), "now": str(ROOT / "sr_blockwise" / "engine.cpp")}
        best = {}
        for _ in range(3):
            for dtype in ("bfloat16", "float32"):
                for name, src in sources.items():
                    out = subprocess.run([sys.executable, __file__, src, dtype], capture_output=True, text=True,
                                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
                    for r in json.loads(out.splitlines()[-1]):
                        key = (dtype, r["batch"], r["tokens"], name)
                        best[key] = min(best.get(key, 1e9), r["ms"])
    print("| dtype | batch | tokens | before ms | now ms | before / now | before vs 1 token | now vs 1 token |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in ("bfloat16", "float32"):
        for B in BATCHES:
            for n in TOKENS:
                b, w = best[(dtype, B, n, "before")], best[(dtype, B, n, "now")]
                b1, w1 = best[(dtype, B, 1, "before")], best[(dtype, B, 1, "now")]
                print(f"| {dtype} | {B} | {n} | {b:.3f} | {w:.3f} | {b / w:.2f}x | {b / b1:.2f} | {w / w1:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(json.dumps(measure(sys.argv[1], sys.argv[2])))
    else:
        main()
