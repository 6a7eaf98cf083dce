# Teacher-forced head accuracy on greedy outputs: for each head j = 2..10, the share of positions
# where its argmax proposal (with its priors, reading the greedy tokens as decoded) lies within
# eps levels of the greedy token there. eps=2 accepts a proposal only if every earlier one in the
# block was accepted, so head 2's rate bounds the mean block. Old = cpu-finetuned before its GPU
# fine-tuning (OLD_WEIGHTS, e.g. exported from git history), new = the shipped one.
# Command: OLD_WEIGHTS=old/cpu-finetuned.json .venv/bin/python experiments/heads/heads_within.py 16
import os, sys, numpy as np, torch, torch.nn.functional as F
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import load_faces, downsample_8, to_tokens
from sr_blockwise.decoding import decode, options_for
from sr_blockwise.model import SEQ_LEN
torch.set_num_threads(2)
N = int(sys.argv[1])
lr = downsample_8(load_faces(part="test").images[:N])
for name, path in {"old (CPU only)": os.environ.get("OLD_WEIGHTS", "old/cpu-finetuned.json"),
                   "new (shipped)": "weights/cpu-finetuned.json"}.items():
    m = load_model(path)  # bf16 inference copy, as decoding uses
    greedy = decode(m, lr, options_for("greedy", 6, 2)).images
    src, tgt = torch.from_numpy(to_tokens(lr)), torch.from_numpy(to_tokens(greedy))
    with torch.no_grad():
        h = m(src, tgt)  # (B, T, d): the state reading tokens < t, from which p1 predicts t
        K = m.cfg.n_blockwise
        prop = m.head_logits(h, K, src, tokens=tgt).argmax(-1)[..., 1:]  # (B, T, K-1): heads 2..K
        tpos = torch.arange(SEQ_LEN)[:, None] + torch.arange(1, K)  # head j predicts t + j - 1
        valid = tpos < SEQ_LEN
        target = tgt[:, tpos.clamp(max=SEQ_LEN - 1)]
        for eps in (0, 2):
            ok = ((prop - target).abs() <= eps) & valid
            rates = ok.sum((0, 1)).float() / valid.sum(0).float() / N
            print(f"{name} eps={eps}: heads 2..{K} within eps of greedy: "
                  + " ".join(f"{r:.3f}" for r in rates.tolist()), flush=True)
