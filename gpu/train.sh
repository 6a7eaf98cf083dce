#!/usr/bin/env bash
# A time-boxed training run on a GPU (gpu/README.md): the base model with its frozen
# heads, then base and heads fine-tuned jointly; each stage's weights (no optimizer state, its
# matrices in bf16) and log land in $OUT as soon as the stage ends, even when it failed part-way,
# so a run cut short still brings back what it finished. Beside them, on the same GPU, the shipped
# weights are fine-tuned on the same faces (WARM_FROM). Each run brings back its checkpoint of the
# best validation score (train.py keeps it as best.pt), else its last one. Every setting is an environment
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
BASE_MIN=${BASE_MIN:-5}     # minutes of the base stage (its heads train on the detached state)
FT_MIN=${FT_MIN:-3}         # at most this many minutes of joint fine-tuning...
DEADLINE_S=${DEADLINE_S:-490} # ...and it ends this many seconds after the script started
MAX_STEPS=${MAX_STEPS:-1000000000}
EVAL_MIN=${EVAL_MIN:-0.5}     # validation bits/dim (256 faces) this often: a second on a GPU
THREADS=${THREADS:-4}         # CPU threads a training process takes (16 cores there, two processes)
PACKED=${PACKED:-.gpu/faces}
SCRATCH=${SCRATCH:-1}         # 0: no new model, only the warm start (e.g. continuing one)
PROFILE=${PROFILE:-}          # batch sizes (e.g. 128,256,512): first, where a training step's time
                              # goes (gpu/profile_step.py, about a minute a preset; it comes out of the deadline)
PROFILE_STEPS=${PROFILE_STEPS:-10}  # timed steps per batch size
# beside it, on the same GPU: the shipped weights fine-tuned on the same faces, a safer bet than a
# new model trained from scratch in minutes ("" leaves it out); its lr is ~constant (Noam far past
# its warmup), about 5x what it ended at on the CPU, for a batch 8x larger
WARM_FROM=${WARM_FROM-weights/cpu-finetuned.json}
WARM_PRESET=${WARM_PRESET:-cpu}
WARM_ARGS=${WARM_ARGS---lr 1e-3 --warmup 500 --schedule-offset 10000}  # split on spaces: no quotes inside
FP32=${FP32:-0}               # 1: train and profile in float32, not under bf16 autocast (the CPU
                              # dry run: bf16 products are slow on CPUs without bf16 instructions)
case "$FP32" in 0|1) ;; *) echo "FP32=$FP32: 0 (bf16 autocast) or 1 (float32)" >&2; exit 2;; esac
OUT=${OUT:?set OUT to the folder for the weights and logs}
[ "$SCRATCH" = 0 ] && [ -z "$WARM_FROM" ] && { echo "SCRATCH=0 and no WARM_FROM: nothing to train" >&2; exit 2; }
# a fresh checkpoint folder per run: a rerun on a still-warm machine must not find old runs
CACHE=${SR_BLOCKWISE_CACHE:-$(mktemp -d -t sr-blockwise.XXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SR_BLOCKWISE_CACHE="$CACHE"

mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
echo "== $(date -u +%FT%TZ) device=$DEVICE preset=$PRESET batch=$BATCH lr=$LR warmup=$WARMUP fp32=$FP32 base=${BASE_MIN}min ft<=${FT_MIN}min deadline=${DEADLINE_S}s"
$PY gpu/pack.py unpack "$PACKED" "$CACHE/faces.npz" || exit 1

best_ck() {  # run name -> its checkpoint of the best validation score (at most EVAL_MIN old), else its last
    if [ -f "$CACHE/$1/best.pt" ]; then echo "$CACHE/$1/best.pt"; else echo "$CACHE/$1/last.pt"; fi
}

bring_back() {  # run name -> $OUT/NAME.pt (no optimizer state; matrices in bf16) + its log
    local ck
    ck=$(best_ck "$1")
    [ -f "$ck" ] || { echo "no checkpoint of $1 to bring back"; return 1; }
    $PY - "$ck" "$OUT/$1.pt" <<'EOF'
import sys, torch
from sr_blockwise.checkpoints import compact_state_dict
ck = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
ck.pop("opt", None)
ck["model"] = compact_state_dict(ck["model"])
torch.save(ck, sys.argv[2])
print(f"{sys.argv[1]} -> {sys.argv[2]}: step {ck['step']}, best val bits/dim {ck.get('best_val_bpd')}")
EOF
    cp "$CACHE/$1/log.csv" "$OUT/$1-log.csv" 2>/dev/null || true
}

common=(--threads "$THREADS" --data "$CACHE/faces.npz" --device "$DEVICE" --batch-size "$BATCH"
        --max-steps "$MAX_STEPS" --ckpt-minutes 1 --eval-minutes "$EVAL_MIN" --eval-images 256 --quiet)
precision=()
[ "$FP32" = 1 ] && precision=(--fp32)
common+=("${precision[@]}")
rc=0
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
if [ -n "$PROFILE" ]; then
    presets=()
    [ -n "$WARM_FROM" ] && presets+=("$WARM_PRESET")
    [ "$SCRATCH" = 0 ] || [ "$PRESET" = "$WARM_PRESET" -a -n "$WARM_FROM" ] || presets+=("$PRESET")
    for p in "${presets[@]}"; do
        $PY gpu/profile_step.py --preset "$p" --batches "$PROFILE" --steps "$PROFILE_STEPS" --profile-steps 3 --device "$DEVICE" "${precision[@]}" > "$OUT/profile-$p.txt" 2>&1 \
            || echo "profiling $p failed (see profile-$p.txt); training goes on"
        grep -E '^(\||==|device busy)' "$OUT/profile-$p.txt"
    done
fi
warm_pid=
if [ -n "$WARM_FROM" ]; then
    warm_min=$($PY -c "print(max(0.0, ($DEADLINE_S - $SECONDS - 60) / 60))")
    echo "== warm start from $WARM_FROM for ${warm_min} min, in the background"
    $PY -m sr_blockwise train --run warm-ft --stage finetune --init-from "$WARM_FROM" --head-frac 0.25 \
        --head-weight 0.5 --max-minutes "$warm_min" --seed 3 $WARM_ARGS --preset "$WARM_PRESET" "${common[@]}" \
        > "$OUT/warm-ft.out" 2>&1 &
    warm_pid=$!
fi
if [ "$SCRATCH" = 0 ]; then
    echo "== no new model (SCRATCH=0)"
else
    $PY -m sr_blockwise train --run gpu-base --stage base --lr "$LR" --warmup "$WARMUP" --head-frac 0.25 \
        --max-minutes "$BASE_MIN" --seed 1 --preset "$PRESET" "${common[@]}" || rc=1
    if bring_back gpu-base; then  # (if not, still wait for the warm start below)
        # what is left before the deadline, less a minute for start-up and bringing the weights back
        ft_min=$($PY -c "print(max(0.0, min($FT_MIN, ($DEADLINE_S - $SECONDS - 60) / 60)))")
        echo "== fine-tuning for ${ft_min} min (${SECONDS}s used)"
        $PY -m sr_blockwise train --run gpu-ft --stage finetune --init-from "$(best_ck gpu-base)" --lr 3e-4 \
            --warmup 50 --head-frac 0.25 --head-weight 0.5 --max-minutes "$ft_min" --seed 2 --preset "$PRESET" "${common[@]}" || rc=1
        bring_back gpu-ft || rc=1
    else
        rc=1
    fi
fi
if [ -n "$warm_pid" ]; then
    wait "$warm_pid" || { rc=1; echo "warm-ft failed"; }
    tail -n 5 "$OUT/warm-ft.out"
    bring_back warm-ft || rc=1
fi
echo "== $(date -u +%FT%TZ) done after ${SECONDS}s, rc=$rc"
ls -la "$OUT"
exit $rc
