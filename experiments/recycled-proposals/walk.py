"""Would the previous call's own logits propose better than the heads? Walks decoding call by call
on the native engine's step and draft (batch 1, one face at a time): each call feeds a block,
p1's logits accept a prefix under the rule; the next block's proposals are the heads' (the paper),
or, at the positions the call went on to verify past its rejected proposal, p1's argmax there
("recycled": the first of them, or all). Prints mean blocks per rule, k and policy, and whether
the output stayed the heads' run's (exact mode: greedy's).

    PYTHONPATH=. python experiments/recycled-proposals/walk.py --faces 4
"""
import argparse

import numpy as np
import torch

from sr_blockwise import checkpoints
from sr_blockwise.decoding import engine
from sr_blockwise.data import downsample_8, load_faces
from sr_blockwise.decoding import DEFAULT_PRIOR_WEIGHT
from sr_blockwise.model import SEQ_LEN as S

p = argparse.ArgumentParser()
p.add_argument("--faces", type=int, default=4)
p.add_argument("--weights", default="cpu-finetuned")
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(args.threads)
model = checkpoints.load_model(args.weights, dtype=torch.float32)
lr = downsample_8(load_faces(part="test").images[:args.faces])
srcs = torch.from_numpy(lr.reshape(len(lr), -1).astype(np.int64))


def walk(src, k, eps, recycle):
    b = engine.Batch(model, src[None], k, prior_weight=DEFAULT_PRIOR_WEIGHT)
    opts = b.options("exact" if eps == 0 else "eps", eps=eps)
    tokens = torch.zeros(S + 16, dtype=torch.int64)
    h, z = b.step(0, torch.tensor([-1]), 0)
    props = b.draft(opts, 0, h[0:1], torch.tensor([0]), torch.tensor([int(z[0].argmax())]), tokens)[0]
    t, calls = 0, 0
    while t < S:
        n = min(k, S - t)
        h, z = b.step(0, props[:n], t + 1)  # the block at positions t.., p1's logits at t + 1 ..
        calls += 1
        best = z.argmax(1)
        a = 1
        while a < n and abs(int(props[a]) - int(best[a - 1])) <= eps:
            a += 1
        tokens[t:t + a] = props[:a]
        t += a
        if t >= S:
            break
        nxt = b.draft(opts, 0, h[a - 1:a], torch.tensor([t]), torch.tensor([int(best[a - 1])]), tokens)[0]
        for i in range(min(recycle, n - a)):  # p1's argmax at positions t + 1 .., read past the rejected token
            nxt[1 + i] = best[a + i]
        props = nxt
    return tokens[:S].numpy(), calls


print(f"{args.weights}, {args.faces} held-out faces, batch 1, guidance {DEFAULT_PRIOR_WEIGHT:g}\n")
print("| rule | k | proposals | mean block | output = the heads' run's |\n|---|---|---|---|---|")
for k, eps in ((2, 0), (4, 0), (6, 0), (2, 2), (6, 2)):
    ref = None
    for recycle, label in ((0, "heads"), (1, "first recycled"), (16, "all recycled")):
        outs, calls = zip(*(walk(s, k, eps, recycle) for s in srcs))
        ref = outs if ref is None else ref
        same = all((a == r).all() for a, r in zip(outs, ref))
        print(f"| {'exact' if eps == 0 else f'eps={eps}'} | {k} | {label} | {S * len(srcs) / sum(calls):.3f} | {same} |",
              flush=True)
