# Do speculative samples (k=6) have plain samples' (k=1) likelihood under the model? Mean -log p
# per token (teacher-forced, float32, guidance 2) of samples of held-out test faces 8-15 (batch 8,
# bf16, 2 threads, T=1), for several seeds: the difference between k values against the spread
# between seeds.
#   .venv/bin/python experiments/speculative-sampling/nll_spread.py   (log: nll_spread.log)
import numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces, to_tokens
from sr_blockwise.decoding import DecodeOptions, decode

torch.set_num_threads(2)
lr = downsample_8(load_faces(part="test").images[8:16])
m, ref = load_model("cpu-finetuned", dtype=torch.bfloat16), load_model("cpu-finetuned", dtype=torch.float32)
src = torch.from_numpy(to_tokens(lr))
res = {}
for seed in range(4):
    for k in (1, 6):
        r = decode(m, lr, DecodeOptions(k=k, temperature=1.0, seed=100 + seed, prior_weight=2.0))
        out = torch.from_numpy(to_tokens(r.images))
        with torch.no_grad():
            logp = ref.logits(ref(src, out), src, None, 2.0).float().log_softmax(-1)
        res[seed, k] = -logp.gather(-1, out[..., None]).mean().item()
        print(f"seed {100 + seed} k={k}: -log p {res[seed, k]:.4f}, block {np.mean([s.mean_block for s in r.stats]):.2f}", flush=True)
for k in (1, 6):
    v = [res[s, k] for s in range(4)]
    print(f"k={k}: mean {np.mean(v):.4f}, seed-to-seed sd {np.std(v, ddof=1):.4f}")
d = [res[s, 6] - res[s, 1] for s in range(4)]
print(f"k=6 - k=1: {np.mean(d):+.4f} (sd of a difference {np.std(d, ddof=1):.4f})")
