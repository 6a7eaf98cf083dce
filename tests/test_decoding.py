"""Decoding properties: exact blockwise == greedy, acceptance rules, batch invariance, errors."""
import os

import numpy as np
import pytest
import torch

from conftest import make_tiny
from sr_blockwise.decoding import engine as native
from sr_blockwise.decoding import (GUARD_SLOPE, DecodeOptions, sampling_noise, accepted_length, cell_guard, decode,
                                   exact_block_stats, greedy, options_for, residual_logits,
                                   speculative_accepted_length, window_centre)
from sr_blockwise.data import to_tokens
from sr_blockwise.model import SEQ_LEN


needs_engine = pytest.mark.skipif(not native.available(), reason=str(native.build_problem()))


def oracle_proposer(target_tokens: np.ndarray, wrong_rate: float, seed: int = 0):
    """Proposes the given sequence's next tokens, corrupting some, so blocks of every length get
    accepted and rejected (random heads of an untrained model almost never agree)."""
    target = torch.as_tensor(np.concatenate([target_tokens, np.zeros((len(target_tokens), 32), np.int64)], 1))
    g = torch.Generator().manual_seed(seed)

    def propose(t, rows, k):
        idx = t[:, None] + torch.arange(1, k)
        p = target[rows[:, None], idx]
        wrong = torch.rand(p.shape, generator=g) < wrong_rate
        return torch.where(wrong, torch.randint(0, 256, p.shape, generator=g), p)

    return propose


@pytest.fixture(scope="module")
def setup64():
    m = make_tiny(7).for_inference(torch.float64)
    lr = np.random.default_rng(7).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    return m, lr, greedy(m, lr)


def test_greedy_makes_one_call_per_token(setup64):
    m, lr, g = setup64
    assert all(s.calls == SEQ_LEN and s.block_hist == [SEQ_LEN] for s in g.stats)
    assert g.images.shape == (3, 32, 32, 3) and g.images.dtype == np.uint8


@pytest.mark.parametrize("k", [1, 2, 4, 6, 10])
def test_exact_blockwise_equals_greedy(setup64, k):
    m, lr, g = setup64
    prop = oracle_proposer(to_tokens(g.images), wrong_rate=0.15, seed=k)
    r = decode(m, lr, DecodeOptions(k=k, rule="exact"), proposer=prop)
    np.testing.assert_array_equal(r.images, g.images)
    alone = decode(m, lr[1:2], DecodeOptions(k=k, rule="exact"), proposer=oracle_proposer(to_tokens(g.images[1:2]), 0.15))
    np.testing.assert_array_equal(alone.images[0], g.images[1])
    for s in r.stats:
        assert sum((n + 1) * c for n, c in enumerate(s.block_hist)) == SEQ_LEN
        assert s.calls - sum(s.block_hist) in (0, 1)  # one call per block, plus the first
        if k > 2:
            assert s.mean_block > 1.5 and s.block_hist[k - 1] > 0  # long blocks were exercised


@needs_engine
@pytest.mark.parametrize("opts", [DecodeOptions(k=1), DecodeOptions(k=4), DecodeOptions(k=4, rule="eps", eps=2)])
def test_several_engine_calls_a_crossing_decode_what_one_a_crossing_does(opts):
    """The native loop runs calls in the engine until an image finishes (engine_iterate's
    max_calls); with progress reports every call it returns after each. The same images, calls
    and blocks either way, and progress sees every progress_every-th call."""
    m = make_tiny(11).for_inference(torch.float32)
    lr = np.random.default_rng(11).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    seen = []
    many = decode(m, lr, opts)
    one = decode(m, lr, opts, progress=lambda tokens, t, bmap, calls: seen.append(calls), progress_every=1)
    assert many.extra["engine"] == one.extra["engine"] == "native"
    np.testing.assert_array_equal(many.images, one.images)
    assert [s.block_hist for s in many.stats] == [s.block_hist for s in one.stats]
    assert many.calls == one.calls and seen[:-1] == list(range(2, one.calls + 1))  # call 1: the start
    spaced = []
    decode(m, lr, opts, progress=lambda tokens, t, bmap, calls: spaced.append(calls), progress_every=50)
    assert spaced[:-1] == list(range(50, one.calls + 1, 50)) and spaced[-1] == one.calls


def test_exact_with_the_models_own_heads_equals_greedy(setup64):
    m, lr, g = setup64
    r = decode(m, lr, DecodeOptions(k=4))
    np.testing.assert_array_equal(r.images, g.images)
    assert sum(sum(s.block_hist[1:]) for s in r.stats) > 0  # some multi-token blocks were accepted


def test_eps_zero_is_exact_and_eps_bounds_every_token(setup64):
    m, lr, g = setup64
    prop = lambda: oracle_proposer(to_tokens(g.images), 0.3, seed=1)
    exact = decode(m, lr, DecodeOptions(k=6, rule="exact"), proposer=prop())
    eps0 = decode(m, lr, DecodeOptions(k=6, rule="eps", eps=0), proposer=prop())
    np.testing.assert_array_equal(eps0.images, exact.images)
    assert [s.block_hist for s in eps0.stats] == [s.block_hist for s in exact.stats]
    # proposals off by up to 5 levels: with eps=3 some are accepted that exact would reject
    base = oracle_proposer(to_tokens(g.images), 0.0)
    near = lambda t, rows, k: (base(t, rows, k) + torch.randint(-5, 6, (len(rows), k - 1))).clamp(0, 255)
    r = decode(m, lr, DecodeOptions(k=6, rule="eps", eps=3), proposer=near)
    assert np.mean([s.mean_block for s in r.stats]) > 1.1
    # teacher-force the output: every token is within eps of p1's argmax given its own prefix
    with torch.no_grad():
        out = torch.from_numpy(to_tokens(r.images))
        src = torch.from_numpy(to_tokens(lr))
        best = m.logits(m(src, out), src).argmax(-1)
    assert (out - best).abs().max() <= 3
    assert (out != best).any()  # the rule did accept non-greedy tokens


def test_window_centre_maximizes_the_mass_within_eps():
    # a lone spike (argmax) against a broader bump that holds more mass within +-2
    p = torch.full((256,), 1e-6)
    p[10] = 0.2
    p[100:105] = 0.16
    logits = p.log()[None]
    assert int(logits.argmax()) == 10 and int(window_centre(logits, 2)[0]) == 102
    assert int(window_centre(logits, 0)[0]) == 10  # a 1-wide window is the argmax
    z = torch.randn(50, 256, dtype=torch.float64) * 3
    for eps in (1, 2, 5):
        probs = z.softmax(-1)
        mass = torch.stack([probs[:, max(0, v - eps): v + eps + 1].sum(-1) for v in range(256)], -1)
        got = window_centre(z, eps)
        assert torch.allclose(mass.gather(1, got[:, None])[:, 0], mass.max(-1).values)


def test_window_proposals_keep_every_token_within_eps(setup64):
    m, lr, g = setup64
    r = decode(m, lr, DecodeOptions(k=6, rule="eps", eps=4, propose="window"))
    with torch.no_grad():
        out = torch.from_numpy(to_tokens(r.images))
        src = torch.from_numpy(to_tokens(lr))
        best = m.logits(m(src, out), src).argmax(-1)
    assert (out - best).abs().max() <= 4
    # eps=0 window proposals are argmax proposals: exact
    eps0 = decode(m, lr, DecodeOptions(k=6, rule="eps", eps=0, propose="window"))
    np.testing.assert_array_equal(eps0.images, g.images)
    with pytest.raises(ValueError, match="window"):
        decode(m, lr, DecodeOptions(k=6, rule="exact", propose="window"))


def test_accepted_length_rules():
    props = torch.tensor([[5, 10, 20, 30]])
    logits = torch.full((1, 4, 256), -10.0)
    for j, v in enumerate([10, 22, 99, 0]):  # p1's argmax at each verify position
        logits[0, j, v] = 10.0
    logits[0, 1, 20] = 9.0  # 20 is p1's second choice at position 1
    acc = lambda **kw: int(accepted_length(props, logits, DecodeOptions(k=4, **kw))[0])
    assert acc(rule="exact") == 2  # sure token + 10
    assert acc(rule="eps", eps=2) == 3  # 20 vs 22 within 2; 30 vs 99 not
    assert acc(rule="topk", top_k=2) == 3
    assert acc(rule="oracle") == 4
    assert acc(rule="exact", min_block=4) == 4


def _same_blocks(decoded, replayed):
    return [(a.calls, a.block_hist) for a in decoded] == [(b.calls, b.block_hist) for b in replayed]


def test_replay_gives_the_heads_exact_decodings_blocks_for_every_k(setup64):
    m, lr, g = setup64
    rep = exact_block_stats(m, lr, g.images, [2, 4, 10], chunk=48)
    for k in (2, 4, 10):
        r = decode(m, lr, DecodeOptions(k=k, propose="argmax"))  # exact-heads: the heads' proposals alone
        assert _same_blocks(r.stats, rep[k]), k
    assert sum(sum(s.block_hist[1:]) for s in rep[4]) > 0  # multi-token blocks were replayed too
    noisy = g.images.copy()
    noisy[0, 5, 5, 0] ^= 1
    with pytest.raises(ValueError, match="greedy"):
        exact_block_stats(m, lr, noisy, [2])


def test_replay_matches_exact_decoding_of_the_shipped_weights(celeba_npz):
    """The property evaluate's replay rests on, where it is used: the shipped weights in bf16 on a
    real test face, whose heads accept blocks of several tokens."""
    from sr_blockwise.checkpoints import load_model
    from sr_blockwise.data import downsample_8, load_faces
    m = load_model("cpu-finetuned")
    lr = downsample_8(load_faces(celeba_npz, part="test").images[:1])
    g = greedy(m, lr)
    r = decode(m, lr, DecodeOptions(k=6, propose="argmax"))  # exact-heads
    np.testing.assert_array_equal(r.images, g.images)
    rep = exact_block_stats(m, lr, g.images, [6])
    assert _same_blocks(r.stats, rep[6]) and rep[6][0].mean_block > 1.1
    # exact mode proper recycles the verifications' logits: the same output in fewer calls
    recycled = decode(m, lr, DecodeOptions(k=6))
    np.testing.assert_array_equal(recycled.images, g.images)
    assert recycled.stats[0].mean_block > 1.15 * rep[6][0].mean_block


def test_bf16_exact_equals_bf16_greedy():
    """In the shipped dtype: per-query windows and a float64 output projection keep 1-token and
    k-token calls numerically alike."""
    m = make_tiny(8).for_inference(torch.bfloat16)
    lr = np.random.default_rng(8).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    g = greedy(m, lr)
    r = decode(m, lr, DecodeOptions(k=6), proposer=oracle_proposer(to_tokens(g.images), 0.2))
    np.testing.assert_array_equal(r.images, g.images)


NATIVE = pytest.param("native", marks=needs_engine)


def test_a_failed_engine_build_says_why_and_decoding_falls_back(monkeypatch):
    """Where the compiler refuses engine.cpp, build_problem gives its first error, and decode
    says so where the native engine is asked for and otherwise runs on the PyTorch engine."""
    from sr_blockwise.decoding import engine_for, not_native

    def refused():
        raise RuntimeError("building the native engine failed:\nengine.cpp: In function 'f':\n"
                           "engine.cpp:38:43: error: target specific option mismatch\n  38 | ...")
    m = make_tiny(3)
    lr = np.random.default_rng(3).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    monkeypatch.setattr(native, "library", refused)
    why = "building the native engine failed: engine.cpp:38:43: error: target specific option mismatch"
    assert native.build_problem() == not_native(m) == why
    assert engine_for(m, DecodeOptions()) == "torch"
    with pytest.raises(ValueError, match="error: target specific option mismatch"):
        engine_for(m, DecodeOptions(), "native")
    assert decode(m, lr, DecodeOptions(k=4)).images.shape == (1, 32, 32, 3)  # on the PyTorch engine


def test_the_native_engine_builds_here():
    """engine.cpp builds on any x86-64 processor GCC targets (AVX-512 and AMX where there are, AVX2
    vectors else), so decoding does not fall back to the PyTorch engine, many times slower. On CI
    a failed build fails here: elsewhere the engine's tests would only be skipped."""
    problem = native.build_problem()
    if problem and not os.environ.get("CI"):
        pytest.skip(problem)
    assert problem is None


@pytest.mark.parametrize("engine", [NATIVE, "torch"])
@pytest.mark.parametrize("k", [1, 4])
def test_sampling_is_seeded_and_batch_invariant(engine, k):
    m = make_tiny(9).for_inference(torch.float32)
    lr = np.random.default_rng(9).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    opts = options_for("sample", k=k, temperature=1.0, seed=3)
    a = decode(m, lr, opts, engine=engine)
    assert a.extra["engine"] == engine
    assert not np.array_equal(a.images, greedy(m, lr).images)
    # the same seed gives the same sample, here in another call and batch
    first = decode(m, lr[:1], opts, engine=engine)
    np.testing.assert_array_equal(first.images[0], a.images[0])
    # with explicit per-image seeds, the second image alone equals itself in the batch
    both = decode(m, lr, opts, seeds=[11, 12], engine=engine)
    second = decode(m, lr[1:], opts, seeds=[12], engine=engine)
    np.testing.assert_array_equal(second.images[0], both.images[1])
    assert second.stats[0].block_hist == both.stats[1].block_hist


@needs_engine
@pytest.mark.parametrize("T", [1.0, 0.5])
def test_native_plain_sampling_is_the_gumbel_max_of_its_own_logits(T):
    """k=1 on the native engine: every token is argmax(z / T + g) for p1's logits z at its prefix
    (the engine's own, teacher-forced over the sample) and that position's noise g from
    sampling_noise, i.e. a draw from softmax(z / T) with the torch engine's noise."""
    m = make_tiny(10).for_inference(torch.float32)
    lr = np.random.default_rng(10).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    opts = DecodeOptions(k=1, temperature=T, seed=4, prior_weight=1.5)
    out = decode(m, lr, opts, engine="native")
    tokens = torch.from_numpy(to_tokens(out.images))[0]
    g = sampling_noise(1, opts, "cpu")[0][0]
    batch = native.Batch(m, torch.from_numpy(to_tokens(lr)), 16, opts.prior_weight)
    prev = torch.cat([torch.tensor([-1]), tokens[:-1]])
    z = torch.cat([batch.step(0, prev[s:s + 16], s)[1] for s in range(0, SEQ_LEN, 16)])
    assert torch.equal((z / T + g).argmax(-1), tokens)
    assert not torch.equal(z.argmax(-1), tokens)  # a sample, not the greedy choice


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_speculative_rule_gives_tokens_distributed_as_p(temperature):
    """One position, many times: a draft x ~ q kept with probability min(1, p(x)/q(x)), else a
    token drawn from max(0, p - q), is distributed as p, however far q is from p."""
    g = torch.Generator().manual_seed(0)
    p_logits = torch.randn(256, generator=g, dtype=torch.float64) * 3
    q_logits = p_logits + torch.randn(256, generator=g, dtype=torch.float64) * 3  # a poor draft
    N, T = 60_000, temperature

    def gumbel():
        return -torch.log(-torch.log(torch.rand(N, 256, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)))

    x = (q_logits / T + gumbel()).argmax(-1)
    props = torch.stack([torch.zeros_like(x), x], 1)
    n = speculative_accepted_length(props, p_logits.expand(N, 2, 256), q_logits.expand(N, 1, 256),
                                    torch.rand(N, 1, generator=g, dtype=torch.float64), T)
    resampled = (residual_logits(p_logits, q_logits, T) + gumbel()).argmax(-1)
    y = torch.where(n == 2, x, resampled)
    p = (p_logits / T).softmax(-1)
    tv = lambda tokens: 0.5 * (torch.bincount(tokens, minlength=256) / N - p).abs().sum().item()
    assert tv(y) < 0.02, tv(y)
    assert tv(x) > 0.15  # the drafts alone are far from p: the test can fail
    assert 0.1 < (n == 2).double().mean() < 0.9  # both branches were exercised


@needs_engine
@pytest.mark.parametrize("overrides", [{}, {"nbr_draft": False}])
def test_recycled_exact_mode_is_greedy_with_longer_blocks_on_both_engines(overrides):
    """Exact mode recycles a verification's logits past its rejected proposal: the output stays
    greedy's, the blocks get longer than the heads' alone, and the two engines, which compute a
    small float32 model's logits alike, recycle the same proposals (the same blocks). The torch
    engine runs at k=4 only: its recycling has no case for k, and its decodes cost seconds each."""
    m = make_tiny(3, **overrides).for_inference(torch.float32)
    lr = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    g = greedy(m, lr)
    for k in (2, 4):
        blocks = {}
        for propose in ("recycle", "argmax"):
            for engine in ("native", "torch") if k == 4 else ("native",):
                r = decode(m, lr, DecodeOptions(k=k, propose=propose), engine=engine)
                np.testing.assert_array_equal(r.images, g.images)
                blocks[propose, engine] = [s.block_hist for s in r.stats]
        if k == 4:
            assert blocks["recycle", "native"] == blocks["recycle", "torch"]
            assert blocks["argmax", "native"] == blocks["argmax", "torch"]
        mean = lambda hists: np.mean([np.dot(h, np.arange(1, k + 1)) / sum(h) for h in hists])
        assert mean(blocks["recycle", "native"]) > 1.1 * mean(blocks["argmax", "native"])


@needs_engine
def test_an_outside_proposer_overrides_recycling():
    """A proposer given to decode proposes every block whole, recycling or not: on both engines the
    same blocks as with the heads' proposals switched off, and greedy's output."""
    m = make_tiny(3).for_inference(torch.float32)
    lr = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    g = greedy(m, lr)
    for engine in ("native", "torch"):
        runs = [decode(m, lr, DecodeOptions(k=6, propose=p), engine=engine,
                       proposer=oracle_proposer(to_tokens(g.images), wrong_rate=0.3, seed=1))
                for p in ("recycle", "argmax")]
        for r in runs:
            np.testing.assert_array_equal(r.images, g.images)
        assert [s.block_hist for s in runs[0].stats] == [s.block_hist for s in runs[1].stats]
        assert all(s.mean_block > 1.5 for s in runs[0].stats)  # the proposer's blocks, not p1's


@needs_engine
@pytest.mark.parametrize("eps, guard", [(2, 0), (20, 0), (2, 4)])
def test_window_proposals_agree_between_engines(eps, guard):
    """The engine's window centres (float32, 16 values at a time, zeros past both ends) are the
    PyTorch path's (window_centre): the same blocks and outputs on a small float32 model; with the
    cell guard too (the engine's add_cell_guard is decoding.cell_guard)."""
    m = make_tiny(3).for_inference(torch.float32)
    lr = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    opts = DecodeOptions.parse(f"eps-window={eps}:k=4:guard={guard}")
    a, b = decode(m, lr, opts, engine="native"), decode(m, lr, opts, engine="torch")
    np.testing.assert_array_equal(a.images, b.images)
    assert [s.block_hist for s in a.stats] == [s.block_hist for s in b.stats]
    assert all(s.mean_block > 1.05 for s in a.stats)


@needs_engine
def test_recycled_proposals_are_p1s_argmax_past_the_rejection():
    """Call by call on the native engine: after a call keeps a < k tokens, the next block is p1's
    argmax at the last kept position (the sure token) and then p1's argmax at the positions after
    it that the call computed, read past the rejected proposal; a second batch stepping the same
    tokens gives the call's logits."""
    m = make_tiny(4).for_inference(torch.float32)
    src = torch.from_numpy(to_tokens(np.random.default_rng(4).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)))
    k = 4
    b, mirror = native.Batch(m, src, k), native.Batch(m, src, k)
    opts = b.options("exact", recycle=True)
    rows = torch.zeros(1, dtype=torch.int64)
    b.start(opts, rows)
    mirror.step(0, torch.tensor([-1]), 0)
    rejections = 0
    for _ in range(40):
        t, props = int(b.t[0]), b.props[0].clone()
        b.iterate(opts, rows, 1)
        z = mirror.step(0, props, t + 1)[1]  # the call's logits: positions t + 1 .. t + k
        a = int(b.t[0]) - t
        assert torch.equal(b.tokens[0, t:t + a], props[:a]) and int(b.props[0, 0]) == int(z[a - 1].argmax())
        if a < k:
            rejections += 1
            assert torch.equal(b.props[0, 1:1 + k - a], z[a:].argmax(-1))
    assert rejections >= 10


@needs_engine
@pytest.mark.parametrize("k, T, guard", [(4, 1.0, 0), (4, 0.8, 0), (6, 0.5, 0), (4, 1.0, 4)])
def test_native_sampling_draws_what_the_torch_engine_draws(k, T, guard):
    """The engines share the noise tables and the rule (speculative acceptance, the residual after a
    rejection), so on a small float32 model, whose logits the two compute alike to ~1e-6, they
    draw the same samples with the same blocks (no near-tie flips on these seeds), with the cell
    guard too."""
    m = make_tiny(9).for_inference(torch.float32)
    lr = np.random.default_rng(9).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    opts = DecodeOptions(k=k, temperature=T, seed=3, guard=guard)
    a, b = decode(m, lr, opts, engine="native"), decode(m, lr, opts, engine="torch")
    np.testing.assert_array_equal(a.images, b.images)
    assert [s.block_hist for s in a.stats] == [s.block_hist for s in b.stats]
    assert all(1.1 < s.mean_block < k for s in a.stats)  # drafts both kept and rejected


@pytest.mark.parametrize("engine", [NATIVE, "torch"])
def test_speculative_sampling_matches_plain_sampling(setup64, engine):
    """k > 1 sampling: drafts are accepted (blocks > 1), the samples are as likely under the
    model as plain samples (greedy's are far likelier), and an image's sample does not depend
    on its batch."""
    m, lr, g = setup64
    src = torch.from_numpy(to_tokens(lr))

    def nll(images, T):  # mean -log p(token | prefix) at temperature T, teacher-forced
        out = torch.from_numpy(to_tokens(images))
        with torch.no_grad():
            logp = (m.logits(m(src, out), src) / T).log_softmax(-1)
        return -logp.gather(-1, out[..., None]).mean().item()

    # the torch engine at one temperature: the engines draw the same samples at others
    # (test_native_sampling_draws_what_the_torch_engine_draws)
    for T in (1.0, 0.5) if engine == "native" else (1.0,):
        plain = decode(m, lr, DecodeOptions(k=1, temperature=T, seed=5), engine=engine)
        spec = decode(m, lr, DecodeOptions(k=4, temperature=T, seed=5), engine=engine)
        assert spec.extra["engine"] == plain.extra["engine"] == engine
        assert all(s.mean_block > 1.1 for s in spec.stats), [s.mean_block for s in spec.stats]
        assert not np.array_equal(spec.images, plain.images)
        assert abs(nll(spec.images, T) - nll(plain.images, T)) < 0.05
        assert nll(g.images, T) < nll(plain.images, T) - 1
    alone = decode(m, lr[2:], DecodeOptions(k=4, temperature=T, seed=5), seeds=[5 * 1_000_003 + 2], engine=engine)
    np.testing.assert_array_equal(alone.images[0], spec.images[2])
    assert alone.stats[0].block_hist == spec.stats[2].block_hist
    with pytest.raises(ValueError, match="speculative sampling's own rule"):
        decode(m, lr, DecodeOptions(k=4, temperature=1.0, rule="eps", eps=2))
    with pytest.raises(ValueError, match="not with a proposer"):
        decode(m, lr, DecodeOptions(k=4, temperature=1.0), proposer=oracle_proposer(to_tokens(g.images), 0.1))


def test_bad_inputs_are_refused_with_reasons():
    m = make_tiny(0).for_inference(torch.float32)
    lr = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"shape \(8, 8, 3\)"):
        decode(m, np.zeros((16, 16, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        decode(m, np.zeros((8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="0..255"):
        decode(m, np.full((8, 8, 3), 300))
    with pytest.raises(ValueError, match="heads"):
        decode(m, lr, DecodeOptions(k=11))
    with pytest.raises(ValueError, match="eps"):
        decode(m, lr, DecodeOptions(k=2, rule="eps", eps=-1))
    with pytest.raises(ValueError, match="mode"):
        options_for("fast")
    for every in (0, -1, 2.5):  # a report every -1 calls would never come (and the loop never end)
        with pytest.raises(ValueError, match="progress_every"):
            decode(m, lr[None], progress=lambda *a: None, progress_every=every)


def test_prior_weight_changes_greedy_and_exact_still_equals_it(setup64):
    """Input guidance (prior_weight) is part of the model's distribution: greedy, exact blockwise
    decoding with the model's own heads and the replay all see the same weighted logits."""
    m, lr, g = setup64
    guided = decode(m, lr, DecodeOptions(k=1, prior_weight=3.0))
    assert not np.array_equal(guided.images, g.images)  # the weight does something
    r = decode(m, lr, DecodeOptions(k=4, prior_weight=3.0))
    np.testing.assert_array_equal(r.images, guided.images)
    prop = oracle_proposer(to_tokens(guided.images), wrong_rate=0.15, seed=3)
    r6 = decode(m, lr, DecodeOptions(k=6, rule="exact", prior_weight=3.0), proposer=prop)
    np.testing.assert_array_equal(r6.images, guided.images)
    heads = decode(m, lr, DecodeOptions(k=4, prior_weight=3.0, propose="argmax"))
    np.testing.assert_array_equal(heads.images, guided.images)
    assert _same_blocks(heads.stats, exact_block_stats(m, lr, guided.images, [4], prior_weight=3.0)[4])
    with pytest.raises(ValueError, match="greedy"):  # the unweighted model's states disagree
        exact_block_stats(m, lr, guided.images, [4])
    eps = decode(m, lr, DecodeOptions(k=4, rule="eps", eps=2, prior_weight=3.0))
    assert options_for("approx", 4, 2, prior_weight=3.0) == DecodeOptions(k=4, rule="eps", eps=2, prior_weight=3.0,
                                                                           propose="window")
    assert eps.images.shape == guided.images.shape


def test_prior_weight_pulls_the_shipped_model_toward_its_input(celeba_npz):
    """On a real test face the shipped weights' output moves toward the 8x8 input as the weight
    grows (large weights give the nearest-neighbour upscale)."""
    from sr_blockwise.checkpoints import load_model
    from sr_blockwise.data import downsample_8, load_faces
    m = load_model("cpu-finetuned")
    lr = downsample_8(load_faces(celeba_npz, part="test").images[1:2])
    nearest = lr.repeat(4, 1).repeat(4, 2).astype(int)
    dist = [np.abs(decode(m, lr, DecodeOptions(k=6, rule="eps", eps=2, prior_weight=w)).images - nearest).mean()
            for w in (1.0, 3.0, 12.0)]
    assert dist[0] > dist[1] > dist[2] and dist[2] < 2, dist


def test_prior_weight_is_refused_where_it_means_nothing():
    lr = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="lr_prior"):
        decode(make_tiny(0, lr_prior=False).for_inference(torch.float32), lr, DecodeOptions(prior_weight=2.0))
    with pytest.raises(ValueError, match="prior_weight"):
        decode(make_tiny(0).for_inference(torch.float32), lr, DecodeOptions(prior_weight=-1.0))


def test_the_cell_guard_is_its_definition():
    """cell_guard against the rule written out position by position: D sums (token - x) over the
    positions of the same 4x4 cell and channel before the position, whatever the tokens at and
    after it; every intensity v loses GUARD_SLOPE * max(0, |D + v - x| / 16 - guard)."""
    g = torch.Generator().manual_seed(0)
    B = 2
    src = torch.randint(0, 256, (B, 192), generator=g)
    tokens = torch.randint(0, 256, (B, SEQ_LEN + 4), generator=g)
    # a cell's first position (nothing before it), its last, a first-row and a mid-cell position
    pos = torch.tensor([[0, 3 * 96 + 3 * 3 + 2, 97, 5 * 96 + 30 * 3 + 1], [3071, 96 * 4, 2 * 96 + 17 * 3, 50]])
    logits = torch.randn(B, 4, 256, generator=g, dtype=torch.float64)
    got = cell_guard(logits, src, pos, tokens, 20.0)
    for b in range(B):
        for i, p in enumerate(pos[b].tolist()):
            row, col, ch = p // 96, (p // 3) % 32, p % 3
            x = int(src[b, (row // 4) * 24 + (col // 4) * 3 + ch])
            D = sum(int(tokens[b, r * 96 + c * 3 + ch]) - x
                    for r in range(row // 4 * 4, row // 4 * 4 + 4) for c in range(col // 4 * 4, col // 4 * 4 + 4)
                    if r * 96 + c * 3 + ch < p)
            want = logits[b, i] - GUARD_SLOPE * ((D + torch.arange(256) - x).abs() / 16 - 20.0).clamp(min=0)
            torch.testing.assert_close(got[b, i], want.to(torch.float64))
    later = tokens.clone()
    later[:, 3 * 96 + 3 * 3 + 2:] = 255 - later[:, 3 * 96 + 3 * 3 + 2:]  # from the second position on
    assert torch.equal(cell_guard(logits[:1, :2], src[:1], pos[:1, :2], later[:1], 20.0), got[:1, :2])
    assert torch.equal(cell_guard(logits, src, pos, tokens, 0), logits)
    # a cell's last pixel after 15 pixels 40 levels above its input pixel (D / 16 = 37.5): the
    # guard pulls below the input, and values further above lose more
    zero = torch.zeros(1, 256, dtype=torch.float64)
    z = cell_guard(zero, torch.full((1, 192), 100), torch.tensor([3 * 96 + 3 * 3]), torch.full((1, SEQ_LEN), 140), 20.0)
    assert z[0, 255] < z[0, 200] < z[0, 100] < z[0, 0] < 0
    assert torch.equal(cell_guard(zero, torch.full((1, 192), 100), torch.tensor([0]), torch.full((1, SEQ_LEN), 140), 20.0), zero)


@pytest.mark.parametrize("engine", [NATIVE, "torch"])
def test_guarded_exact_and_approximate_decoding_follow_guarded_greedy(setup64, engine):
    """The cell guard is part of p1's distribution: it changes greedy decoding, and exact blockwise
    decoding (recycled and heads' proposals, the eps rule at eps 0, an outside proposer) still
    equals guarded greedy. The torch engine, whose decodes cost seconds each, runs recycled
    proposals and the proposer; the native engine every variant."""
    m, lr, g = setup64
    guarded = decode(m, lr, DecodeOptions(k=1, guard=4), engine=engine)
    assert not np.array_equal(guarded.images, g.images)  # the guard does something
    variants = [DecodeOptions(k=4, guard=4)] + ([DecodeOptions(k=3, guard=4, propose="argmax"),
                                                 DecodeOptions(k=4, rule="eps", eps=0, guard=4)]
                                                if engine == "native" else [])
    for opts in variants:
        np.testing.assert_array_equal(decode(m, lr, opts, engine=engine).images, guarded.images)
    prop = oracle_proposer(to_tokens(guarded.images), wrong_rate=0.15, seed=3)
    r = decode(m, lr, DecodeOptions(k=6, guard=4), proposer=prop, engine=engine)
    np.testing.assert_array_equal(r.images, guarded.images)
    assert all(s.mean_block > 1.5 for s in r.stats)


# ---------------------------------------------------------------- the decode-mode grammar

from hypothesis import given, settings, strategies as st  # noqa: E402

from sr_blockwise.decoding import RULES, PROPOSALS  # noqa: E402

_numbers = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def valid_options(draw):
    """Every kind of valid DecodeOptions: each mode, with or without guidance, min_block, seeds, trees."""
    k = draw(st.integers(1, 16))
    w = draw(st.one_of(st.just(1.0), _numbers))
    guard = draw(st.one_of(st.just(0.0), _numbers))
    kind = draw(st.sampled_from(["exact", "exact-heads", "eps", "window", "topk", "oracle", "sample"]))
    if kind == "sample":
        return DecodeOptions(k=k, temperature=draw(_numbers.filter(lambda t: t > 0)),
                             seed=draw(st.integers(0, 2**32 - 1)), prior_weight=w, guard=guard)
    tree = draw(st.one_of(st.just(0), st.integers(2, 1024))) if k > 1 else 0
    mb = draw(st.integers(1, k)) if not tree else 1
    fields = {"exact": {}, "exact-heads": {"propose": "argmax"}, "oracle": {"rule": "oracle"},
              "eps": {"rule": "eps", "eps": draw(st.integers(0, 255))},
              "window": {"rule": "eps", "eps": draw(st.integers(0, 255)), "propose": "window"},
              "topk": {"rule": "topk", "top_k": draw(st.integers(1, 256))}}[kind]
    return DecodeOptions(k=k, min_block=mb, prior_weight=w, guard=guard, tree=tree, **fields)


@settings(max_examples=400, deadline=None)
@given(valid_options())
def test_spec_round_trips(opts):
    spec = opts.spec
    assert DecodeOptions.parse(spec) == opts
    assert DecodeOptions.parse(spec.upper()) == opts  # names and keys in any case
    assert DecodeOptions.parse(spec).spec == spec


@settings(max_examples=400, deadline=None)
@given(st.builds(DecodeOptions, k=st.integers(-1, 17), rule=st.sampled_from(RULES + ("beam",)),
                 eps=st.integers(-1, 3), top_k=st.integers(0, 3), min_block=st.integers(0, 4),
                 temperature=st.one_of(st.just(0.0), st.floats(-1, 2)), seed=st.integers(-2, 2),
                 propose=st.sampled_from(PROPOSALS + (None,)), prior_weight=st.one_of(st.just(1.0), st.floats(-1, 3)),
                 guard=st.one_of(st.just(0.0), st.floats(-1, 64)), tree=st.sampled_from([0, 0, -1, 1, 2, 5, 2000])))
def test_any_options_are_refused_with_a_reason_or_round_trip(opts):
    """Options with a setting that changes nothing (eps outside the eps rule, a seed without a
    temperature...) or out of range are refused; every other one has a spec that reads back."""
    try:
        opts.validate()
    except ValueError as e:
        assert str(e)
        with pytest.raises(ValueError):
            opts.spec
        return
    assert DecodeOptions.parse(opts.spec) == opts


def test_spec_grammar_examples_and_messages():
    parse = DecodeOptions.parse
    assert parse("greedy") == DecodeOptions(k=1) == parse("exact:k=1") == parse("greedy", k=6)
    assert parse("exact:k=6") == DecodeOptions(k=6) == parse("exact", k=6) == parse("exact:k=6", k=2)
    # a caller's k and guidance fill in what the spec leaves out, never what it says
    assert parse("eps=2", k=4, prior_weight=2.0) == DecodeOptions(k=4, rule="eps", eps=2, prior_weight=2.0)
    assert parse("eps=2:k=6:w=3", k=4, prior_weight=2.0) == DecodeOptions(k=6, rule="eps", eps=2, prior_weight=3.0)
    assert parse("eps=2:k=6:w=2.5") == DecodeOptions(k=6, rule="eps", eps=2, prior_weight=2.5)
    assert parse("eps-window=2:k=6").propose == "window"
    # exact recycles the verifications' logits; exact-heads proposes with the heads alone (the paper)
    assert parse("exact:k=6").propose == "recycle" and parse("exact-heads:k=6") == DecodeOptions(k=6, propose="argmax")
    assert DecodeOptions(k=6, propose="argmax").spec == "exact-heads:k=6" and parse("exact-heads:k=1") == parse("greedy")
    assert DecodeOptions(k=6, min_block=2).propose == "argmax" == DecodeOptions(k=6, rule="eps", eps=2).propose
    assert parse("Top_K=3:k=4") == parse("topk=3:k=4") == DecodeOptions(k=4, rule="topk", top_k=3)
    assert parse("min-block=2:k=4") == DecodeOptions(k=4, min_block=2) == parse("exact:min-block=2:k=4")
    assert parse("oracle:k=4").rule == "oracle"
    # sample: settings in any order; k=1 is plain sampling, k>1 speculative
    s = parse("sample:T=0.8:k=4:seed=7")
    assert s == DecodeOptions(k=4, temperature=0.8, seed=7) and s.spec == "sample:k=4:T=0.8:seed=7"
    assert parse("sample:k=1:T=1").spec == "sample:k=1:T=1"
    assert DecodeOptions(k=6, prior_weight=2.0).spec == "exact:k=6:w=2"
    assert DecodeOptions(k=2, prior_weight=2.0, guard=32).spec == "exact:k=2:w=2:guard=32" == \
        parse("exact:guard=32:w=2:k=2").spec
    assert parse("exact:k=2", guard=32) == DecodeOptions(k=2, guard=32) == parse("exact:k=2:guard=32", guard=8)
    assert parse("exact:k=2:guard=0") == DecodeOptions(k=2) and DecodeOptions(k=2, guard=0).spec == "exact:k=2"
    assert options_for("sample", 4, 2, 0.8, 3, 2.0) == parse("sample:k=4:w=2:T=0.8:seed=3")
    assert options_for("approx", 6, 2) == parse("eps-window=2:k=6") and options_for("greedy", 6) == parse("greedy")
    assert options_for("exact") == parse("exact:k=2") and options_for("approx").k == options_for("sample").k == 4
    for bad, msg in [("", "empty"), ("beam:k=2", "unknown decode mode 'beam'"), ("exact", "block size"),
                     ("greedy:k=3", "greedy decodes one token"), ("eps=x:k=2", "eps=x is not a whole number"),
                     ("eps=-1:k=2", "eps must be >= 0"), ("eps=256:k=2", "eps must be in 0..255"), ("top-k=0:k=2", "top-k must be >= 1"),
                     ("exact:k=2.5", "k=2.5 is not a whole number"), ("exact:k=0", "block size must be >= 1"),
                     ("exact:k=2:q=1", "unknown setting 'q=1'"), ("exact:k=2:k=3", "k is given twice"),
                     ("sample:k=4", "needs a temperature"), ("sample:k=4:T=0", "T > 0"),
                     ("sample:k=4:T=hot", "T=hot is not a number"), ("exact:k=4:T=0.8", "for the sample mode"),
                     ("greedy:seed=3", "for the sample mode"), ("min-block=5:k=2", "min_block must be in 1..k=2"),
                     ("exact:k=2:w=-1", "input guidance"), ("exact:k=2:w=inf", "not a number"),
                     ("exact:k=2:guard=-1", "guard"), ("exact:k=2:guard=nan", "not a number"),
                     ("exact:k=2:min-block=1:min-block=2", "given twice"),
                     # torch's generators take 64 bits: a larger seed would fail mid-decode
                     ("sample:k=4:T=1:seed=-5", "seed must be a whole number in 0.."),
                     (f"sample:k=4:T=1:seed={2**32}", "seed must be a whole number in 0..")]:
        with pytest.raises(ValueError, match=msg):
            parse(bad)
    with pytest.raises(ValueError, match="eps rule's tolerance"):
        DecodeOptions(k=4, eps=2).spec
    for bad in (dict(rule="eps", eps=2), dict(min_block=2), dict(k=1), dict(temperature=1.0)):
        with pytest.raises(ValueError, match="recycled proposals|sampling"):
            DecodeOptions(**({"k": 4} | bad | {"propose": "recycle"})).validate()
    with pytest.raises(ValueError, match="seed=3 is for sampling"):
        decode(make_tiny(0), np.zeros((8, 8, 3), np.uint8), DecodeOptions(k=1, seed=3))


def test_mode_settings_are_checked_in_one_wording_spelled_as_each_front_end_names_them():
    """mode_options is the one check of the user-facing modes: the batch command's flags and the
    APIs' keywords get the same sentence, each naming the setting its own way; a setting the mode
    does not read is refused, not dropped."""
    from sr_blockwise.decoding import mode_options, options_per_mode
    cases = [({"mode": "greedy", "k": 4}, "--k 4", "k=4", "greedy decoding takes one token per call"),
             ({"mode": "exact", "eps": 3}, "--eps 3", "eps=3", "only {approx} accepts proposals within eps levels"),
             ({"mode": "approx", "temperature": 0.5}, "--temperature 0.5", "temperature=0.5", "only {sample} draws"),
             ({"mode": "exact", "seed": 0}, "--seed 0", "seed=0", "only {sample} draws with a seed"),
             ({"mode": "exact", "k": 0}, "--k 0", "k=0", "the block size must be >= 1"),
             ({"mode": "approx", "eps": 300}, "--eps 300", "eps=300", "the tolerance must be in 0..255"),
             ({"mode": "sample", "temperature": 0.0}, "--temperature 0", "temperature=0", "above 0"),
             ({"mode": "sample", "seed": -1}, "--seed -1", "seed=-1", "a whole number"),
             ({"mode": "exact", "guard": -1.0}, "--guard -1", "guard=-1", "intensity levels >= 0"),
             ({"mode": "exact", "prior_weight": float("nan")}, "--prior-weight nan", "prior_weight=nan", "input guidance")]
    for kw, flag, keyword, sentence in cases:
        for flags, name, approx, sample in ((True, flag, "--mode approx", "--mode sample"),
                                            (False, keyword, "mode 'approx'", "mode 'sample'")):
            with pytest.raises(ValueError) as e:
                mode_options(**kw, flags=flags)
            said = str(e.value)
            assert said.startswith(f"{name}: ") and sentence.format(approx=approx, sample=sample) in said, said
    # defaults: the mode's k, the apps' guidance and guard; sampling unguarded
    from sr_blockwise.decoding import DEFAULT_GUARD, DEFAULT_PRIOR_WEIGHT
    assert mode_options("approx") == options_for("approx", 4, 2, prior_weight=DEFAULT_PRIOR_WEIGHT, guard=DEFAULT_GUARD)
    assert mode_options("sample", seed=3).guard == 0 and mode_options("sample", seed=3).seed == 3
    # a page's settings hold every mode's at once: each mode takes only what it reads
    page = options_per_mode(["greedy", "exact", "approx", "sample"], k=4, eps=3, temperature=0.8, seed=5,
                            prior_weight=1.0, guard=8.0)
    assert page["greedy"].k == 1 and page["exact"].k == page["approx"].k == 4 and page["approx"].eps == 3
    assert (page["sample"].temperature, page["sample"].seed, page["sample"].guard) == (0.8, 5, 0.0)
    assert page["exact"].guard == page["approx"].guard == 8.0 and page["exact"].seed == 0
