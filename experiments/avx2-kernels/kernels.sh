#!/usr/bin/env bash
# The engine's kernels before the AVX2 changes (commit 6666d24) and now, on one thread: each
# build run 5 times, interleaved, the fastest of each column kept (kernels.log).
#   bash experiments/avx2-kernels/kernels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git show 6666d24:sr_blockwise/engine.cpp > "$tmp/before.cpp"
cp sr_blockwise/engine.cpp "$tmp/now.cpp"
for v in before now; do
    g++ -O3 -march=native -fopenmp -std=c++17 -DENGINE_SOURCE="\"$tmp/$v.cpp\"" experiments/avx2-kernels/kernels.cpp -o "$tmp/$v"
done
for round in 1 2 3 4 5; do for v in before now; do echo "$v $("$tmp/$v")"; done; done > "$tmp/runs"
python3 - "$tmp/runs" <<'PY'
import sys
runs = {}
for line in open(sys.argv[1]):
    name, *vals = line.split()
    runs.setdefault(name, []).append([float(v) for v in vals])
best = {k: [min(c) for c in zip(*v)] for k, v in runs.items()}
cols = [f"linear {w} {k}x{n} rows {r}" for w in ("bf16", "fp32") for k, n in ((128, 512), (512, 128)) for r in (1, 2, 4, 7)]
cols += [f"attention {w} queries {r}" for w in ("bf16", "fp32") for r in (1, 2, 4, 7)]
print("| kernel (one thread, us) | before | now | before / now |")
print("|---|---|---|---|")
for i, c in enumerate(cols):
    b, n = best["before"][i], best["now"][i]
    print(f"| {c} | {b:.2f} | {n:.2f} | {b / n:.2f}x |")
PY
