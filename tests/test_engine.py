"""The native engine: it computes the model's function, and a query's state does not depend on the
call or the batch it comes in (what makes exact mode equal greedy decoding by construction)."""
import numpy as np
import pytest
import torch

from conftest import make_tiny
from sr_blockwise.decoding import engine
from sr_blockwise.decoding import DecodeOptions, decode
from sr_blockwise.model import SEQ_LEN, ImageTransformerSR, preset

pytestmark = pytest.mark.skipif(not engine.available(), reason=str(engine.build_problem()))


def _image(seed, B=2):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (B, 192), generator=g)
    tgt = torch.randint(0, 256, (B, SEQ_LEN), generator=g)
    return src, tgt, torch.cat([torch.full((B, 1), -1), tgt[:, :-1]], 1)


# the kernels for bf16 weights: float32 multiply-adds (every processor), and AMX tiles where the
# processor has them; each test with bf16 weights runs on both where it can
KERNELS = ["multiply-adds", "tiles"]


def _use(kernel: str, monkeypatch):
    """Pack bf16 matrices for `kernel` (multiply-adds: as on a processor without AMX)."""
    if kernel == "tiles" and not engine.uses_amx():
        pytest.skip("this processor (or its kernel) gives the engine no AMX tiles")
    monkeypatch.setattr(engine, "uses_amx", lambda: kernel == "tiles")


def test_the_tiles_are_used_where_the_processor_has_them():
    if not {b"amx_tile", b"amx_bf16"} <= set(engine.cpu_flags().split()):
        pytest.skip("no AMX on this processor")
    assert engine.uses_amx()  # else the kernel refused the tiles' state: decoding falls back silently


def _bf16_kind(bf16_weights: bool) -> int:
    """How the engine keeps a bfloat16 matrix: 0 float32; 1 bf16 panel pairs for its float32
    multiply-adds; 2 bf16 panels for the processor's AMX tiles, which round the inputs to bf16."""
    return (2 if engine.uses_amx() else 1) if bf16_weights else 0


def _in_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().to(x.dtype)


def _round_inputs(module):
    """As the engine's products on the AMX tiles do: inputs rounded to bfloat16."""
    module.register_forward_pre_hook(lambda mod, inputs: (_in_bf16(inputs[0]),))


def _assert_near(got, want, atol, rounded, attention_rounded=False):
    err = (got.double() - want).abs()
    if rounded:  # an input the two round differently (float32 against float64 next to a bf16
        # rounding boundary) moves a few outputs by about a bf16 step's worth; with attention on
        # the tiles its queries and weights too (measured: 1.2-2.1% of the states beyond atol on
        # these small models; 22% if the reference leaves the queries' rounding out, 42% the
        # weights')
        share, worst = (0.05, 20) if attention_rounded else (0.01, 10)
        assert (err > atol).double().mean() < share and err.max() < worst * atol, err.max()
    else:
        assert err.max() < atol, err.max()


def _round_attention_as_the_tiles(m: ImageTransformerSR, monkeypatch):
    """As the engine's attention on the tiles (and autocast) does: queries and the softmax's
    weights rounded to bfloat16 (keys and values already are). Patches the decoder's attention;
    Tensor.softmax only for the caller's forward pass (the decoder's self-attention's weights)."""
    for layer in m.decoder:
        layer.cross_attn.q.register_forward_hook(lambda mod, i, o: _in_bf16(o))
        attn = layer.cross_attn

        def attend(q, k, v, mask=None, attn=attn):
            q, k, v = attn.split(q), attn.split(k), attn.split(v)
            w = torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, dim=-1)
            return attn.merge(_in_bf16(w) @ v)
        monkeypatch.setattr(attn, "attend", attend)
    softmax = torch.Tensor.softmax
    monkeypatch.setattr(torch.Tensor, "softmax", lambda x, dim: _in_bf16(softmax(x, dim)))


@pytest.mark.parametrize("seed, bf16_weights, d_ff, d_model, n_heads, kernel", [
    (0, False, 64, 32, 2, "multiply-adds"), (3, False, 64, 64, 2, "multiply-adds")] + [
    (seed, True, d_ff, d_model, 2, kernel) for seed, d_ff, d_model in ((1, 64, 32), (2, 48, 64)) for kernel in KERNELS] + [
    (4, True, 64, 64, 1, "tiles")])
def test_engine_states_and_logits_match_the_torch_model(seed, bf16_weights, d_ff, d_model, n_heads, kernel,
                                                        monkeypatch):
    """bf16_weights: every weight a bfloat16 value (a model trained in bf16), which the engine
    keeps in bfloat16 (the same numbers in half the bytes); it then keeps keys and values in
    bfloat16 too, as bf16 training made them, and where the processor has AMX its products take
    their inputs rounded to bfloat16, as autocast did in training, and so does attention where a
    head is 32 wide (d_model 64): the float64 reference rounds the same tensors where they are
    made (a few % of the outputs beyond atol at most: without the rounding about half are). d_ff 48: an
    odd number of panels; heads 16, 32 and 64 wide (64: two 32-dimension steps on the tiles)."""
    _use(kernel, monkeypatch)
    m = make_tiny(seed, d_ff=d_ff, d_model=d_model, n_heads=n_heads)
    m = (m.to(torch.bfloat16) if bf16_weights else m).double()
    packed = engine.packed(m).struct
    on_tiles = _bf16_kind(bf16_weights) == 2
    attention_on_tiles = on_tiles and (d_model // n_heads) % 32 == 0
    assert packed.lm_w.bf16 == _bf16_kind(bf16_weights)
    assert packed.kv_bf16 == (2 if attention_on_tiles else int(bf16_weights))
    if bf16_weights:
        d = m.cfg.d_model

        def kv_in_bf16(module, inputs, out, first=0):
            return torch.cat([out[..., :first], _in_bf16(out[..., first:])], -1)
        first = 0 if attention_on_tiles else d  # the queries too
        for layer in m.decoder:
            layer.self_attn.qkv.register_forward_hook(lambda mod, i, o: kv_in_bf16(mod, i, o, first=first))
            layer.cross_attn.kv.register_forward_hook(kv_in_bf16)
            if on_tiles:
                for lin in (layer.self_attn.qkv, layer.self_attn.out, layer.cross_attn.q, layer.cross_attn.out,
                            layer.ff.up, layer.ff.down):
                    _round_inputs(lin)
        if on_tiles:
            _round_inputs(m.lm_head)
    src, tgt, prev = _image(seed)
    with torch.no_grad():
        with monkeypatch.context() as patched:
            if attention_on_tiles:
                _round_attention_as_the_tiles(m, patched)
            full = m(src, tgt)
        logits = m.logits(full, src)
    batch = engine.Batch(m, src, k=4)
    g = torch.Generator().manual_seed(seed)
    for b in range(2):
        states, zs, t = [], [], 0
        while t < SEQ_LEN:  # uneven calls, straddling attention blocks
            n = min(int(torch.randint(1, 12, (1,), generator=g)), SEQ_LEN - t)
            h, z = batch.step(b, prev[b, t:t + n], t)
            states.append(h)
            zs.append(z)
            t += n
        _assert_near(torch.cat(states), full[b], 2e-4, on_tiles, attention_on_tiles)
        _assert_near(torch.cat(zs), logits[b], 2e-3, on_tiles, attention_on_tiles)


@pytest.mark.parametrize("bf16_weights, kernel", [(False, "multiply-adds")] + [(True, k) for k in KERNELS])
def test_a_querys_state_is_the_same_alone_or_in_a_verify_call_with_rejected_tokens(bf16_weights, kernel,
                                                                                    monkeypatch):
    """Greedy feeds one token per call; a verify call feeds k, some of them later rejected (their
    K/V is overwritten when the position comes again). On a random model of the shipped preset."""
    _use(kernel, monkeypatch)
    torch.manual_seed(0)
    m = ImageTransformerSR(preset("cpu")).eval()
    torch.nn.init.normal_(m.lr_emb.weight, std=0.1)
    if bf16_weights:
        m = m.to(torch.bfloat16).float()
    assert engine.packed(m).bf16 == bf16_weights
    src, tgt, prev = _image(3)
    T = 400
    alone_batch = engine.Batch(m, src, k=1)
    alone = torch.cat([alone_batch.step(1, prev[1, t:t + 1], t)[0] for t in range(T)])
    batch = engine.Batch(m, src, k=12)
    g = torch.Generator().manual_seed(1)
    t, states = 0, []
    while t < T:
        n = int(torch.randint(2, 12, (1,), generator=g))
        accepted = int(torch.randint(1, n + 1, (1,), generator=g))
        toks = prev[1, t:t + n].clone()
        toks[accepted:] = torch.randint(0, 256, (n - accepted,), generator=g)
        states.append(batch.step(1, toks, t)[0][:accepted])
        t += accepted
    assert torch.equal(torch.cat(states)[:T], alone)


@pytest.mark.parametrize("bf16_weights, threads, kernel", [(False, t, "multiply-adds") for t in (1, 2)] + [
    (True, t, k) for t in (1, 2) for k in KERNELS])
def test_an_images_output_does_not_depend_on_its_batch(bf16_weights, threads, kernel, monkeypatch):
    """threads 2: a batch of 2 images a thread goes by image at k > 1 (each thread decodes its own
    share alone); greedy, a smaller batch, and an image alone, by team (the threads share each
    product, and in calls of up to 8 rows each keeps its own copy of the residual stream). The
    same arithmetic every way; on the tiles, products of up to 30 rows (a partial last tile), and
    attention (heads 32 wide) in groups of up to 6 queries."""
    _use(kernel, monkeypatch)
    m = make_tiny(5, d_model=64)
    m = (m.to(torch.bfloat16) if bf16_weights else m).for_inference(torch.float32)
    assert engine.packed(m).struct.kv_bf16 == _bf16_kind(bf16_weights)  # attention on the kernel too
    assert 5 >= engine.IMAGES_PER_THREAD * 2  # 5 images go by image at 2 threads: shares of 2 and 3
    lr = np.random.default_rng(5).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for opts in (DecodeOptions(k=1), DecodeOptions(k=2), DecodeOptions(k=6), DecodeOptions(k=6, rule="eps", eps=2),
                     DecodeOptions(k=4, guard=4)):  # the guard reads each image's own earlier tokens
            alone = [decode(m, lr[i:i + 1], opts) for i in (0, 3)]
            for batch in (lr, lr[:3]):  # by image, and (3 images) by team
                together = decode(m, batch, opts)
                assert together.extra["engine"] == "native"
                for i, one in zip((0, 3), alone):
                    if i < len(batch):
                        assert np.array_equal(one.images[0], together.images[i])
                        assert one.stats[0].block_hist == together.stats[i].block_hist
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bf16_weights, kernel", [(False, "multiply-adds")] + [(True, k) for k in KERNELS])
def test_drafted_blocks_are_the_torch_heads_proposals(bf16_weights, kernel, monkeypatch):
    """bf16: the heads' matrices kept in bfloat16, an odd number of 16-column panels (9 heads'
    hidden layers of 16); on AMX tiles their inputs rounded to bfloat16, in the reference too."""
    _use(kernel, monkeypatch)
    m = make_tiny(6)
    m = (m.to(torch.bfloat16) if bf16_weights else m).double()
    assert engine.packed(m).struct.heads_up_w.bf16 == _bf16_kind(bf16_weights)
    src, tgt, prev = _image(6, B=1)
    k = m.cfg.n_blockwise
    batch = engine.Batch(m, src, k=k)
    pos = torch.tensor([0, 5, 97, 700, 3065])
    with torch.no_grad():
        full = m(src, tgt)
        first = m.logits(full[:, pos], src, pos[None]).argmax(-1)[0]
        if _bf16_kind(bf16_weights) == 2:  # the heads' products and p1's logits on the tiles
            linear = torch.nn.functional.linear
            monkeypatch.setattr(torch.nn.functional, "linear",
                                lambda x, *a: linear(_in_bf16(x), *a))
        want = torch.stack([m.draft_heads(full[:, p], k, src, pos[i:i + 1], tgt, first=first[i:i + 1])[0]
                            for i, p in enumerate(pos.tolist())])
    got = torch.cat([batch.draft(batch.options(), 0, full[0, p][None], pos[i:i + 1], first[i:i + 1], tgt[0])
                     for i, p in enumerate(pos.tolist())])
    assert torch.equal(got, want)


def test_several_calls_a_crossing_are_the_calls_one_at_a_time():
    """Batch.iterate(max_calls=10) makes 10 calls inside the engine, and leaves the tokens,
    positions and proposals that 10 single calls leave; it stops early after a call in which an
    image finished, and makes one call whatever max_calls < 1 says."""
    m = make_tiny(12, d_model=64).for_inference(torch.float32)
    src = _image(12)[0]

    def started():
        b = engine.Batch(m, src, k=4)
        opts = b.options("eps", eps=2)
        b.start(opts)
        return b, opts, torch.arange(2, dtype=torch.int64)
    one, opts1, rows1 = started()
    for _ in range(10):
        assert one.iterate(opts1, rows1, 2) == (2, 1)
    many, opts, rows = started()
    assert many.iterate(opts, rows, 2, max_calls=10) == (2, 10)
    for name in ("tokens", "t", "props", "calls", "hist", "block_map"):
        assert torch.equal(getattr(many, name), getattr(one, name)), name
    assert many.iterate(opts, rows, 2, max_calls=0) == (2, 1)
    live, made = many.iterate(opts, rows, 2, max_calls=10**6)
    assert live == 1 and 1 <= made < 10**6 and int((many.t >= SEQ_LEN).sum()) == 1


def test_the_engine_refuses_models_it_does_not_run():
    assert "attention blocks" in engine.supports(ImageTransformerSR(preset("tiny", block_len=48)))
    assert "model width" in engine.supports(ImageTransformerSR(preset("tiny", d_model=48, n_heads=3)))
    m = ImageTransformerSR(preset("tiny", head1="layer"))
    assert "head1" in engine.supports(m)
    with pytest.raises(ValueError, match="head1"):
        decode(m, np.zeros((1, 8, 8, 3), np.uint8), DecodeOptions(k=2), engine="native")
    r = decode(m, np.zeros((1, 8, 8, 3), np.uint8), DecodeOptions(k=1, temperature=1.0))
    assert r.extra["engine"] == "torch"  # the PyTorch step decodes what the engine does not run
    r = decode(make_tiny(0), np.zeros((1, 8, 8, 3), np.uint8), DecodeOptions(k=4, temperature=1.0))
    assert r.extra["engine"] == "native"  # sampling included


def test_changed_weights_are_packed_again():
    """The packed copy follows the model: after an in-place change (an optimizer step,
    load_state_dict) decoding uses the new weights, as a fresh copy of the model would."""
    import copy
    m = make_tiny(7).for_inference(torch.float32)
    lr = np.random.default_rng(7).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    before = decode(m, lr, DecodeOptions(k=1)).images
    with torch.no_grad():
        m.lm_head.weight.mul_(-1.0)  # a large in-place change: the argmaxes move
    fresh = copy.deepcopy(m)
    after = decode(m, lr, DecodeOptions(k=1)).images
    assert not np.array_equal(after, before)
    assert np.array_equal(after, decode(fresh, lr, DecodeOptions(k=1)).images)


@pytest.mark.parametrize("bf16_weights, kernel", [(False, "multiply-adds"), (True, "tiles")])
def test_output_does_not_depend_on_the_thread_count(bf16_weights, kernel, monkeypatch):
    """Two OpenMP threads on the main thread, one in a worker thread (threads_for_this_thread):
    each output is computed by one thread with the same operations, so the faces are the same.
    Tiles: a worker thread's own tile set-up and input buffer, as in the demo."""
    import threading
    _use(kernel, monkeypatch)
    m = make_tiny(8, d_model=64)
    m = (m.to(torch.bfloat16) if bf16_weights else m).for_inference(torch.float32)
    assert engine.packed(m).struct.lm_w.bf16 == _bf16_kind(bf16_weights)
    lr = np.random.default_rng(8).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    opts = DecodeOptions(k=6, rule="eps", eps=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert engine.threads_for_this_thread() == 2
        two = decode(m, lr, opts).images
    finally:
        torch.set_num_threads(threads)
    out = []
    worker = threading.Thread(target=lambda: out.append((engine.threads_for_this_thread(), decode(m, lr, opts).images)))
    worker.start()
    worker.join()
    assert out[0][0] == 1 and np.array_equal(out[0][1], two)


@pytest.mark.parametrize("bf16_weights", [False, True])
def test_images_that_join_a_running_batch_decode_as_alone(bf16_weights):
    """Continuous batching: images admitted between calls into slots that others left (their KV
    caches hold the last image's keys) give the output, block sizes and calls of each decoded
    alone, in every mode; a dropped image frees its slot and leaves the others as they were."""
    m = make_tiny(3, d_model=64)
    m = (m.to(torch.bfloat16) if bf16_weights else m).for_inference(torch.float32)
    lr = np.random.default_rng(3).integers(0, 256, (7, 8, 8, 3), dtype=np.uint8)
    seeds = [7 * 1_000_003 + i for i in range(7)]
    for opts in (DecodeOptions(k=1), DecodeOptions(k=4, propose="recycle", guard=8),
                 DecodeOptions(k=4, rule="eps", eps=2, propose="window"), DecodeOptions(k=4, temperature=0.9)):
        sampled = opts.temperature > 0
        stream = engine.ContinuousBatch(m, opts, slots=3)
        stream.admit(lr[:2], [0, 1], seeds[:2] if sampled else None)
        done, joined, crossings = {}, 2, 0
        while stream.live or joined < 7:
            if stream.free and joined < 7 and crossings % 5 == 0:  # between calls, while others decode
                n = min(stream.free, 7 - joined)
                stream.admit(lr[joined:joined + n], list(range(joined, joined + n)),
                             seeds[joined:joined + n] if sampled else None)
                joined += n
            done.update(stream.run(max_calls=9))
            crossings += 1
        assert max(r.extra["batch"] for r in done.values()) == 3  # the slots were shared
        for i in range(7):
            alone = decode(m, lr[i:i + 1], opts, seeds=seeds[i:i + 1] if sampled else None)
            assert np.array_equal(done[i].images[0], alone.images[0]), (opts, i)
            assert done[i].stats[0].block_hist == alone.stats[0].block_hist
            assert done[i].stats[0].calls == alone.stats[0].calls
    stream = engine.ContinuousBatch(m, DecodeOptions(k=4), slots=2)
    stream.admit(lr[:2], ["left", "stays"])
    stream.run(max_calls=3)
    stream.drop(["left"])
    assert stream.free == 1
    stream.admit(lr[2:3], ["new"])
    results = {}
    while stream.live:
        results.update(stream.run(max_calls=50))
    assert set(results) == {"stays", "new"}
    assert np.array_equal(results["stays"].images[0], decode(m, lr[1:2], DecodeOptions(k=4)).images[0])
    with pytest.raises(ValueError, match="continuous batching runs on the native engine"):
        engine.ContinuousBatch(m, DecodeOptions(k=4, tree=8), slots=2)
