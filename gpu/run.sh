#!/usr/bin/env bash
# One time-boxed GPU run: decoding measured first (gpu/bench_decode.py: call cost by candidates verified,
# s/face and faces/s by mode, exact == greedy checked), then training (gpu/train.sh) until the
# deadline. Everything lands in $OUT: decode/bench_decode.json and its log, then train.sh's files.
#   python gpu/pack.py test-faces .gpu/test-faces.npz   # here, beside `pack` for training
#   OUT=... ./gpu/run.sh                                 # there
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the results}
PY=${PY:-python3}
BENCH_S=${BENCH_S:-200}       # at most this many seconds of decoding measurements
TOTAL_S=${TOTAL_S:-520}       # the whole run
BENCH_ARGS=${BENCH_ARGS:-}    # more flags for bench_decode.py (split on spaces)
mkdir -p "$OUT/decode"
faces=()
[ -f .gpu/test-faces.npz ] && faces=(--data .gpu/test-faces.npz)
# shellcheck disable=SC2086
timeout "$BENCH_S" "$PY" gpu/bench_decode.py "${faces[@]}" --out "$OUT/decode" $BENCH_ARGS 2>&1 | tee "$OUT/decode/bench.log"
left=$((TOTAL_S - SECONDS - 30))  # what the decoding left, less a margin to copy results
[ "$left" -gt 60 ] || { echo "no time left to train"; exit 0; }
DEADLINE_S=${DEADLINE_S:-$left} exec ./gpu/train.sh
