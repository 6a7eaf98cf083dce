#!/usr/bin/env bash
# One short training run on the lent GPU machine (gpu/README.md): the base model with its frozen
# heads, then base and heads fine-tuned jointly; each stage's weights (no optimizer state, its
# matrices in bf16) and log land in $OUT as soon as the stage ends, even when it failed part-way,
# so a run cut short still brings back what it finished. Every setting is an environment
# variable, so the same script runs on this machine's CPU with the tiny preset as a dry run
# (tests/test_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
PRESET=${PRESET:-gpu}
BATCH=${BATCH:-64}
LR=${LR:-1e-3}
WARMUP=${WARMUP:-300}
BASE_MIN=${BASE_MIN:-5.5}     # minutes of the base stage (its heads train on the detached state)
FT_MIN=${FT_MIN:-1.5}         # at most this many minutes of joint fine-tuning...
DEADLINE_S=${DEADLINE_S:-530} # ...and it ends this many seconds after the script started
MAX_STEPS=${MAX_STEPS:-1000000000}
EVAL_MIN=${EVAL_MIN:-0.5}     # validation bits/dim (256 faces) this often: a second on a GPU
PACKED=${PACKED:-.gpu/faces}
OUT=${OUT:?set OUT to the folder that comes back}
# a fresh checkpoint folder per run: a rerun on a still-warm machine must not find old runs
CACHE=${SR_BLOCKWISE_CACHE:-$(mktemp -d /tmp/sr-blockwise.XXXX)}
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # training turns on deterministic algorithms (warn-only)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SR_BLOCKWISE_CACHE="$CACHE"

mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "== $(date -u +%FT%TZ) device=$DEVICE preset=$PRESET batch=$BATCH lr=$LR warmup=$WARMUP base=${BASE_MIN}min ft<=${FT_MIN}min deadline=${DEADLINE_S}s"
$PY gpu/pack.py unpack "$PACKED" "$CACHE/faces.npz" || exit 1

bring_back() {  # run name -> $OUT/NAME.pt (no optimizer state; matrices in bf16) + its log
    [ -f "$CACHE/$1/last.pt" ] || { echo "no checkpoint of $1 to bring back"; return 1; }
    $PY - "$CACHE/$1/last.pt" "$OUT/$1.pt" <<'EOF'
import sys, torch
from sr_blockwise.checkpoints import compact_state_dict
ck = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
ck.pop("opt", None)
ck["model"] = compact_state_dict(ck["model"])
torch.save(ck, sys.argv[2])
print(f"{sys.argv[2]}: step {ck['step']}, best val bits/dim {ck.get('best_val_bpd')}")
EOF
    cp "$CACHE/$1/log.csv" "$OUT/$1-log.csv" 2>/dev/null || true
}

common=(--preset "$PRESET" --data "$CACHE/faces.npz" --device "$DEVICE" --batch-size "$BATCH"
        --max-steps "$MAX_STEPS" --ckpt-minutes 1 --eval-minutes "$EVAL_MIN" --eval-images 256 --quiet)
rc=0
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
$PY -m sr_blockwise train --run gpu-base --stage base --lr "$LR" --warmup "$WARMUP" --head-frac 0.25 \
    --max-minutes "$BASE_MIN" --seed 1 "${common[@]}" || rc=1
bring_back gpu-base || exit 1
# what is left before the deadline, less a minute for start-up and bringing the weights back
ft_min=$($PY -c "print(max(0.0, min($FT_MIN, ($DEADLINE_S - $SECONDS - 60) / 60)))")
echo "== fine-tuning for ${ft_min} min (${SECONDS}s used)"
$PY -m sr_blockwise train --run gpu-ft --stage finetune --init-from "$CACHE/gpu-base/last.pt" --lr 3e-4 \
    --warmup 50 --head-frac 0.25 --head-weight 0.5 --max-minutes "$ft_min" --seed 2 "${common[@]}" || rc=1
bring_back gpu-ft || rc=1
echo "== $(date -u +%FT%TZ) done after ${SECONDS}s, rc=$rc"
ls -la "$OUT"
exit $rc
