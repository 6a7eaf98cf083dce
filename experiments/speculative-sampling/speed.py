# Speculative sampling (k > 1 with temperature > 0) against plain sampling (k = 1), shipped
# weights, guidance 2, held-out test faces. Two settings: the demo's (batch 1, float32, 1 thread;
# faces 1-3) and the batch command's (batch 8, bf16, 2 threads; faces 8-15). Besides seconds and
# mean block: the samples' mean -log p per token under the model at that temperature
# (teacher-forced, float32), which must agree between k values: speculative sampling keeps the
# distribution of plain sampling.
#   .venv/bin/python experiments/speculative-sampling/speed.py --engine torch    (log: speed.log)
#   .venv/bin/python experiments/speculative-sampling/speed.py --engine native   (log: speed_native.log)
import argparse, time, numpy as np, torch
from sr_blockwise.checkpoints import load_model
from sr_blockwise.data import downsample_8, load_faces, to_tokens
from sr_blockwise.decoding import DecodeOptions, decode

p = argparse.ArgumentParser()
p.add_argument("--engine", choices=["native", "torch"], default="native", help="the decoding engine (decode's engine=)")
engine = p.parse_args().engine
faces = load_faces(part="test").images[:16]
lrs = downsample_8(faces)
W, KS, TS = 2.0, (1, 2, 4, 6), (1.0, 0.8)


def nll(model, lr, images, T):
    src, out = torch.from_numpy(to_tokens(lr)), torch.from_numpy(to_tokens(images))
    with torch.no_grad():
        logp = (model.logits(model(src, out), src, None, W).float() / T).log_softmax(-1)
    return -logp.gather(-1, out[..., None]).mean().item()


for name, dtype, threads, idx in (("batch 1, float32, 1 thread", torch.float32, 1, [[1], [2], [3]]),
                                  ("batch 8, bf16, 2 threads", torch.bfloat16, 2, [list(range(8, 16))])):
    torch.set_num_threads(threads)
    m = load_model("cpu-finetuned", dtype=dtype)
    ref = load_model("cpu-finetuned", dtype=torch.float32)
    decode(m, lrs[:1], DecodeOptions(k=6, temperature=1.0, prior_weight=W), engine=engine)  # warm-up
    print(f"\n{name}, {engine} engine: seconds per image (x plain sampling), mean block, -log p per token")
    print("| T | k | s/image | vs k=1 | block | -log p |")
    print("|---|---|---|---|---|---|")
    for T in TS:
        base = None
        for k in KS:
            secs, blocks, nlls = 0.0, [], []
            for group in idx:
                r = decode(m, lrs[group], DecodeOptions(k=k, temperature=T, seed=25, prior_weight=W), engine=engine)
                secs += r.seconds
                blocks += [s.mean_block for s in r.stats]
                nlls.append(nll(ref, lrs[group], r.images, T))
            per = secs / sum(len(g) for g in idx)
            base = base or per
            print(f"| {T} | {k} | {per:.2f} | {base / per:.2f}x | {np.mean(blocks):.2f} | {np.mean(nlls):.3f} |", flush=True)
