# speculative sampling's per-head acceptance, teacher-forced on held-out test faces 1-4 (real tokens): mean sum_x min(p, q)
#   .venv/bin/python experiments/speculative-sampling/overlap.py   (log: overlap.log)
# speculative sampling's acceptance rate, teacher-forced: sum_x min(p, q) between head j's
# distribution for position t+j-1 and p1's for the same position, at temperature T
import numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces, to_tokens
torch.set_num_threads(2)
m = load_model("cpu-finetuned", dtype=torch.float32)
faces = load_faces(part="test").images[1:5]
lr = downsample_8(faces)
src = torch.from_numpy(to_tokens(lr)); tgt = torch.from_numpy(to_tokens(faces))
with torch.no_grad():
    h = m(src, tgt)
    for w in (1.0, 2.0):
        z = m.head_logits(h, 4, src, None, tgt, prior_weight=w).float()  # (B, 3072, 4, 256)
        for T in (1.0, 0.8, 0.6):
            p1 = (z[:, :, 0] / T).softmax(-1)
            out = []
            for j in (2, 3, 4):
                q = (z[:, : 3072 - (j - 1), j - 1] / T).softmax(-1)   # head j at t predicts t+j-1 (0-based next)
                p = p1[:, j - 1:]
                out.append(torch.minimum(p, q).sum(-1).mean().item())
            a = out
            blk = 1 + a[0] + a[0]*a[1] + a[0]*a[1]*a[2]
            print(f"w={w} T={T}: acceptance heads 2/3/4 " + " / ".join(f"{x:.3f}" for x in a) + f"; k=4 block ~{blk:.2f}", flush=True)
