"""Exact-distribution test of speculative sampling on a truncated image (decoding.SEQ_LEN patched to L).
Randomized PIT of each sampled token under p1 (teacher-forced, same prior weight, temperature T)
must be iid Uniform(0,1) iff the joint distribution of the L tokens is plain sampling's.
Decodes on the PyTorch engine (engine="torch"), the one that reads the patched SEQ_LEN and
residual_logits (power.py)."""
import sys, time
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT / "tests")); sys.path.insert(0, str(ROOT))
import numpy as np, torch
from scipy import stats
from conftest import make_tiny
import sr_blockwise.decoding as D
from sr_blockwise.model import SEQ_LEN as FULL

import os; OFF = int(os.environ.get("OFF", 10000))
L = int(sys.argv[1]) if len(sys.argv) > 1 else 7
N = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
T = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
W = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
cfgname = sys.argv[5] if len(sys.argv) > 5 else "default"
ks = [int(x) for x in (sys.argv[6] if len(sys.argv) > 6 else "1,4").split(",")]
over = {"default": {}, "nonbr": dict(nbr_prior=False, nbr_draft=False), "nbr": dict(nbr_draft=False),
        "emb": dict(draft_emb=True, nbr_draft=False, nbr_prior=False)}[cfgname]
torch.set_num_threads(1)
D.SEQ_LEN = L
D.from_tokens = lambda x: x
m = make_tiny(3, **over).for_inference(torch.float64)
lr1 = np.random.default_rng(1).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
src = torch.from_numpy(D.to_tokens(lr1))

def pit(tok, rng):
    B = len(tok)
    tgt = torch.zeros(B, -(-L // 64) * 64, dtype=torch.long); tgt[:, :L] = torch.from_numpy(tok)
    s = src.expand(B, -1)
    with torch.no_grad():
        h = m(s, tgt)[:, :L]
        lg = m.logits(h, s, torch.arange(L).expand(B, -1), W).float() / T
    p = lg.softmax(-1).double()
    x = tgt[:, :L, None]
    cdf_below = p.cumsum(-1).gather(-1, x)[..., 0] - p.gather(-1, x)[..., 0]
    px = p.gather(-1, x)[..., 0]
    v = torch.from_numpy(rng.random(px.shape))
    return (cdf_below + v * px).numpy(), p

res = {}
for k in ks:
    t0 = time.time()
    r = D.decode(m, np.repeat(lr1, N, 0), D.DecodeOptions(k=k, temperature=T, prior_weight=W), seeds=list(range(OFF, OFF + N)), engine="torch")
    tok = r.images
    u, p = pit(tok, np.random.default_rng(k))
    mb = np.mean([s.mean_block for s in r.stats])
    print(f"k={k} {time.time()-t0:.1f}s mean_block={mb:.2f} hist={np.sum([s.block_hist for s in r.stats],0).tolist()}")
    if L <= 7: print("  p1 max prob per position (sample 0):", np.round(p[0].max(-1).values.numpy(), 3).tolist())
    if L <= 7: print("  KS p-values per position:", [round(stats.kstest(u[:, i], "uniform").pvalue, 3) for i in range(L)])
    c = np.corrcoef(u.T); off = c[np.triu_indices(L, 1)]
    print(f"  max |corr| between positions' PITs: {np.abs(off).max():.3f} (1/sqrt(N)={1/np.sqrt(N):.3f})")
    if L > 7:
        print("  pooled KS p over all positions:", stats.kstest(u.ravel(), "uniform").pvalue,
              " per-position KS p-values <0.01:", sum(stats.kstest(u[:, i], "uniform").pvalue < 0.01 for i in range(L)), "of", L,
              " min p:", min(stats.kstest(u[:, i], "uniform").pvalue for i in range(L)))
    res[k] = tok
if len(res) > 1:
    a, b = res[ks[0]], res[ks[-1]]
    for i in range(min(L, 4)):
        ca, cb = np.bincount(a[:, i], minlength=256), np.bincount(b[:, i], minlength=256)
        keep = (ca + cb) > 0
        print(f"pos {i}: 2-sample chi2 p={stats.chi2_contingency(np.stack([ca[keep], cb[keep]]))[1]:.3f}, distinct={keep.sum()}")
