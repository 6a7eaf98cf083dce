# Decode time before / after session 24's float64 KV cache (keys cast once when written, and one
# image's window read as a slice): run once on each version of sr_blockwise (git stash / checkout),
# alternating, and compare within the pair. Shipped weights, guidance 2, 2 threads, test faces 1-8.
#   .venv/bin/python results/cache64_speed.py LABEL      (session 24: results/s24-demo/cache64_speed.log)
# Result, means of the two pairs: 0-9% faster except exact mode (5% slower), within the machine's
# noise, for 2-4x the KV memory (29 MB per image): reverted, not shipped. The patch was: KVCache in float64, the .double() at the cache write,
# and kw/vw sliced when B == 1.
import sys, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import decode, options_for
torch.set_num_threads(2)
lr = downsample_8(load_faces(part="test").images[1:9])
out = []
for dt, B, modes in ((torch.float32, 1, ("greedy", "exact", "approx")), (torch.bfloat16, 1, ("approx",)),
                     (torch.bfloat16, 8, ("greedy", "approx"))):
    m = load_model("cpu-finetuned", dtype=dt)
    decode(m, lr[:1], options_for("approx", 6, 2, prior_weight=2.0))  # warm-up
    for mode in modes:
        r = decode(m, lr[:B], options_for(mode, 6, 2, prior_weight=2.0))
        out.append(f"{str(dt)[6:]} batch {B} {mode}: {r.seconds / B:.2f} s/image")
print(sys.argv[1], "|", "; ".join(out), flush=True)
