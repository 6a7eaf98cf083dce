# how well a head's own confidence foretells whether its proposal is accepted (exact and eps=2, k=6)
import numpy as np, torch
from dataclasses import replace
import sr_blockwise.decoding as D
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces
torch.set_num_threads(2)
m = load_model("cpu-finetuned", dtype=torch.float32)
lr = downsample_8(load_faces(part="test").images[1:5])
rec = {"conf": [], "n": []}
aw, al = D.adaptive_widths, D.accepted_length
D.adaptive_widths = lambda conf, opts: (rec["conf"].append(conf.clone()), aw(conf, opts))[1]
D.accepted_length = lambda p, l, o: (rec["n"].append(al(p, l, o)), rec["n"][-1])[1]
def auc(score, y):
    from scipy.stats import rankdata
    r = rankdata(score); n1 = y.sum(); n0 = len(y) - n1
    return (r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
for mode in ("exact", "approx"):
    rec["conf"].clear(); rec["n"].clear()
    D.decode(m, lr, replace(D.options_for(mode, 6, 2, prior_weight=2.0), min_confidence=1e-300))
    c = torch.cat(rec["conf"]).numpy(); n = torch.cat(rec["n"]).numpy()
    print(f"{mode}: {len(n)} steps, mean block {n.mean():.2f}")
    for j in range(1, 4):  # head j+1 accepted given heads before it were
        sel = n >= j
        y = n[sel] >= j + 1
        s = c[sel, j - 1]
        bins = np.quantile(s, [0, .25, .5, .75, 1])
        rates = [y[(s >= lo) & (s <= hi)].mean() for lo, hi in zip(bins[:-1], bins[1:])]
        print(f"  head {j+1}: accepted {y.mean():.1%} of {sel.sum()} steps; AUC of its confidence {auc(s, y):.3f}; "
              f"acceptance by confidence quartile " + " / ".join(f"{r:.0%}" for r in rates)
              + " (quartile edges " + " ".join(f"{b:.3f}" for b in bins) + ")")
