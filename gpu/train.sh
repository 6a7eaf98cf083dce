#!/usr/bin/env bash
# One short training run on the lent GPU machine (gpu/README.md): the base model with its frozen
# heads, then base and heads fine-tuned jointly; each stage's weights (bf16, no optimizer state)
# and log land in $OUT as soon as the stage ends, so a run stopped at its time limit still
# brings back what it finished. Every setting is an environment variable, so the same script
# runs on this machine's CPU with the tiny preset as a dry run (tests/test_gpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
PRESET=${PRESET:-gpu}
BATCH=${BATCH:-64}
LR=${LR:-1e-3}
WARMUP=${WARMUP:-300}
BASE_MIN=${BASE_MIN:-5.5}     # minutes of the base stage (its heads train on the detached state)
FT_MIN=${FT_MIN:-1.5}         # minutes of joint fine-tuning
MAX_STEPS=${MAX_STEPS:-1000000000}
EVAL_MIN=${EVAL_MIN:-1}
PACKED=${PACKED:-.gpu/faces}
OUT=${OUT:?set OUT to the folder that comes back}
CACHE=${SR_BLOCKWISE_CACHE:-$HOME/.cache/sr-blockwise}  # where the runs' checkpoints go
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # training turns on deterministic algorithms (warn-only)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SR_BLOCKWISE_CACHE="$CACHE"

mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "== $(date -u +%FT%TZ) device=$DEVICE preset=$PRESET batch=$BATCH lr=$LR warmup=$WARMUP base=${BASE_MIN}min ft=${FT_MIN}min"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
$PY gpu/pack.py unpack "$PACKED" "$CACHE/faces.npz"

bring_back() {  # run name -> $OUT/NAME.pt (model in bf16, no optimizer) + $OUT/NAME-log.csv
    $PY - "$CACHE/$1/last.pt" "$OUT/$1.pt" <<'EOF'
import sys, torch
ck = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
ck.pop("opt", None)
ck["model"] = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in ck["model"].items()}
torch.save(ck, sys.argv[2])
print(f"{sys.argv[2]}: step {ck['step']}")
EOF
    cp "$CACHE/$1/log.csv" "$OUT/$1-log.csv" 2>/dev/null || true
}

common=(--preset "$PRESET" --data "$CACHE/faces.npz" --device "$DEVICE" --batch-size "$BATCH"
        --max-steps "$MAX_STEPS" --ckpt-minutes 1 --eval-minutes "$EVAL_MIN" --eval-images 256 --quiet)
$PY -m sr_blockwise train --run gpu-base --stage base --lr "$LR" --warmup "$WARMUP" --head-frac 0.25 \
    --max-minutes "$BASE_MIN" --seed 1 "${common[@]}"
bring_back gpu-base
$PY -m sr_blockwise train --run gpu-ft --stage finetune --init-from "$CACHE/gpu-base/last.pt" --lr 3e-4 \
    --warmup 50 --head-frac 0.25 --head-weight 0.5 --max-minutes "$FT_MIN" --seed 2 "${common[@]}"
bring_back gpu-ft
echo "== $(date -u +%FT%TZ) done"
ls -la "$OUT"
