"""Model properties: block-local attention, cached vs full forward, nested heads, configs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import make_tiny
from sr_blockwise.model import SEQ_LEN, ImageTransformerSR, ModelConfig, local_mask, offset_log_prior, preset


def test_block_local_attention_equals_masked_full_attention():
    m = make_tiny(1).double()
    layer = m.decoder[0]
    x = torch.randn(2, SEQ_LEN, m.cfg.d_model, dtype=torch.float64)
    by_blocks = layer.local_self_attention(x)
    # reference: ordinary attention over all 3072 positions with the explicit local mask
    q, k, v = layer.self_attn.qkv(x).chunk(3, dim=-1)
    pos = torch.arange(SEQ_LEN)
    mask = local_mask(pos, pos, m.cfg.block_len)
    full = layer.self_attn.out(layer.self_attn.attend(q, k, v, mask))
    torch.testing.assert_close(by_blocks, full, rtol=0, atol=1e-12)


def test_local_mask_shape_of_the_window():
    L = 4
    mask = local_mask(torch.arange(12), torch.arange(12), L)
    assert mask[5].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]  # prev block + causal
    assert mask[9].nonzero().flatten().tolist() == [4, 5, 6, 7, 8, 9]  # block 0 no longer seen
    assert mask[2].nonzero().flatten().tolist() == [0, 1, 2]


@pytest.mark.parametrize("seed,lr_skip", [(0, True), (1, True), (2, False)])
def test_cached_incremental_forward_matches_full_forward(seed, lr_skip):
    m = make_tiny(seed, lr_skip=lr_skip).double()
    B = 3
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (B, 192), generator=g)
    tgt = torch.randint(0, 256, (B, SEQ_LEN), generator=g)
    with torch.no_grad():
        full = m(src, tgt)
        cache = m.new_cache(src, max_extra=10)
        prev = torch.cat([torch.full((B, 1), -1), tgt[:, :-1]], 1)
        states, t = [], 0
        while t < SEQ_LEN:  # uneven chunks, straddling block boundaries
            n = min(int(torch.randint(1, 11, (1,), generator=g)), SEQ_LEN - t)
            states.append(m.step(cache, prev[:, t : t + n], torch.full((B,), t)))
            t += n
        cached = torch.cat(states, 1)
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-10)


def test_stale_cache_entries_are_overwritten():
    """Rejected proposals leave K/V behind; feeding the true tokens later must overwrite them."""
    m = make_tiny(2).double()
    src = torch.randint(0, 256, (1, 192))
    tgt = torch.randint(0, 256, (1, SEQ_LEN))
    prev = torch.cat([torch.full((1, 1), -1), tgt[:, :-1]], 1)
    with torch.no_grad():
        full = m(src, tgt)
        cache = m.new_cache(src)
        out = []
        t = 0
        while t < 400:
            junk = torch.randint(0, 256, (1, 8))
            m.step(cache, junk, torch.tensor([t]))  # a speculative block that gets rejected
            out.append(m.step(cache, prev[:, t : t + 3], torch.tensor([t])))
            t += 3
    torch.testing.assert_close(torch.cat(out, 1)[:, :400], full[:, :400], rtol=0, atol=1e-10)


def test_bf16_state_does_not_depend_on_the_call_a_query_comes_in():
    """What exact mode needs in the shipped dtype: a query's decoder state is bit for bit the same
    whether it is fed alone (greedy) or first in an n-token verify call whose later tokens are
    rejected junk, across block boundaries and a batch. On a random model of the shipped `cpu`
    preset in bf16: with bf16 SDPA attention (before attention64) 115 of 400 states differed."""
    torch.manual_seed(0)
    m = ImageTransformerSR(preset("cpu"))
    torch.nn.init.normal_(m.lr_emb.weight, std=0.1)
    m.for_inference(torch.bfloat16)
    B, T = 2, 400
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, 256, (B, 192), generator=g)
    prev = torch.cat([torch.full((B, 1), -1), torch.randint(0, 256, (B, T + 16), generator=g)], 1)
    with torch.no_grad():
        alone_cache = m.new_cache(src)
        alone = torch.cat([m.step(alone_cache, prev[:, t : t + 1], torch.full((B,), t)) for t in range(T)], 1)
        cache, t, states = m.new_cache(src), 0, []
        while t < T:
            n = int(torch.randint(2, 12, (1,), generator=g))
            accepted = int(torch.randint(1, n + 1, (1,), generator=g))
            toks = prev[:, t : t + n].clone()
            toks[:, accepted:] = torch.randint(0, 256, (B, n - accepted), generator=g)
            states.append(m.step(cache, toks, torch.full((B,), t))[:, :accepted])
            t += accepted
    assert alone.dtype == torch.bfloat16
    assert torch.equal(torch.cat(states, 1)[:, :T], alone)
    for a, b in zip(alone_cache.k, cache.k):
        assert torch.equal(a[:, :, :T], b[:, :, :T])


def test_step_on_a_subset_of_rows_matches_all_rows():
    m = make_tiny(3).double()
    src = torch.randint(0, 256, (4, 192))
    toks = torch.randint(0, 256, (4, 5))
    with torch.no_grad():
        c1, c2 = m.new_cache(src), m.new_cache(src)
        a = m.step(c1, toks, torch.tensor([0, 7, 130, 500]))
        rows = torch.tensor([1, 3])
        b = m.step(c2, toks[rows], torch.tensor([7, 500]), rows=rows)
    torch.testing.assert_close(a[rows], b, rtol=0, atol=1e-12)


def test_nested_heads_give_the_same_first_k_heads():
    m = make_tiny(4).double()
    h = torch.randn(5, m.cfg.d_model, dtype=torch.float64)
    src, pos = torch.randint(0, 256, (5, 192)), torch.tensor([0, 7, 100, 3066, 3071])
    toks = torch.randint(0, 256, (5, SEQ_LEN))
    with torch.no_grad():
        all_k = m.head_logits(h, m.cfg.n_blockwise, src, pos, toks)
        for k in (1, 2, 4, 6):
            torch.testing.assert_close(m.head_logits(h, k, src, pos, toks), all_k[:, :k], rtol=0, atol=1e-12)
        torch.testing.assert_close(all_k[:, 0], m.logits(h, src, pos))
        with pytest.raises(ValueError, match="nbr_prior"):
            m.head_logits(h, 3, src, pos)
        # head j carries the prior of the position it predicts (p1's position + j - 1)
        # (and head j >= 2 its neighbour prior, tested below)
        no_prior = make_tiny(4, lr_prior=False, nbr_prior=False, nbr_draft=False).double().head_logits(h, 3)
        torch.testing.assert_close(all_k[:, 2] - no_prior[:, 2], m.prior(src, (pos + 2).clamp(max=SEQ_LEN - 1))
                                   + m.heads.neighbour_prior(toks, pos + 2, torch.tensor(3)))
        with pytest.raises(ValueError, match="lr_prior"):
            m.logits(h)


def _check_neighbour_prior(m, pos, toks, want_at, unread_from):
    """What nbr_prior adds to m's head logits at p1 positions pos (B, n), from tokens toks: nothing
    for p1; for head j (target u = t + j - 1 inside the image) want_at(tab, x, j, u, r, c, ch) with
    x the image's tokens, (r, c, ch) u's row, column, channel; and tokens from unread_from(t, u) on
    never change head j's logits (scrambled, not a bit moves)."""
    K = m.cfg.n_blockwise
    B, n = pos.shape
    h = torch.randn(B, n, m.cfg.d_model, dtype=torch.float64)
    src = torch.randint(0, 256, (B, 192))
    plain = make_tiny(9, nbr_prior=False, nbr_draft=False).double()
    tab = m.heads.nbr_prior
    with torch.no_grad():
        got = m.head_logits(h, K, src, pos, toks) - plain.head_logits(h, K, src, pos)
        for b in range(B):
            for i in range(n):
                t0 = int(pos[b, i])
                assert got[b, i, 0].abs().max() == 0  # p1: untouched
                for j in range(2, K + 1):
                    u = t0 + j - 1
                    want = torch.zeros(256, dtype=torch.float64)
                    if u < SEQ_LEN:
                        want += want_at(tab, toks[b], j, u, u // 96, (u // 3) % 32, u % 3)
                        later = toks[b:b + 1].clone()
                        first = unread_from(t0, u)
                        later[0, first:] = torch.randint(0, 256, (SEQ_LEN - first,))
                        one = (h[b:b + 1, i], K, src[b:b + 1], pos[b:b + 1, i])
                        torch.testing.assert_close(m.head_logits(*one, later)[0, j - 1],
                                                   m.head_logits(*one, toks[b:b + 1])[0, j - 1], rtol=0, atol=0)
                    torch.testing.assert_close(got[b, i, j - 1], want, rtol=0, atol=1e-12)


def test_nbr_prior_scores_offsets_from_decoded_neighbours_only():
    """Head j (predicting p1's position t + j - 1) adds table[j-2, 0, ch] at (value - the nearest
    same-channel intensity to the left that is decoded, i.e. before t) and table[j-2, 1, ch] at
    (value - the one above); nothing for a missing neighbour, nothing for p1, and tokens at or
    after t (not decoded yet) never matter."""
    def want_at(tab, x, j, u, r, c, ch):
        v, want = torch.arange(256), torch.zeros(256, dtype=torch.float64)
        back = -(-j // 3)  # nearest decoded pixel of the row: u - 3*back < t
        if c >= back:
            want += tab[j - 2, 0, ch, v - x[u - 3 * back] + 255]
        if r >= 1:
            want += tab[j - 2, 1, ch, v - x[u - 96] + 255]
        return want

    toks = torch.randint(0, 256, (2, SEQ_LEN))
    pos = torch.tensor([[0, 1, 96, 200, 3065, 3071], [3, 97, 500, 1000, 2000, 3070]])
    _check_neighbour_prior(make_tiny(9, nbr_draft=False).double(), pos, toks, want_at, lambda t, u: t)


def test_nbr_draft_reads_the_pixel_just_left_and_the_pixels_previous_channel():
    """With nbr_draft, head j (target u = t + j - 1) adds table[j-2, 0, ch] at (value - the
    intensity at u-3, decoded or proposed), table[j-2, 1, ch] at (value - the one above) and, for
    G and B, table[j-2, 2, ch] at (value - clamp(x[u-1] + x[u-3] - x[u-4]))); nothing for a missing
    reference or for p1, and nothing at or after u ever matters."""
    def want_at(tab, x, j, u, r, c, ch):
        v, want = torch.arange(256), torch.zeros(256, dtype=torch.float64)
        if c >= 1:
            want += tab[j - 2, 0, ch, v - x[u - 3] + 255]
        if r >= 1:
            want += tab[j - 2, 1, ch, v - x[u - 96] + 255]
        if c >= 1 and ch > 0:
            ref = (x[u - 1] + x[u - 3] - x[u - 4]).clamp(0, 255)
            want += tab[j - 2, 2, ch, v - ref + 255]
        return want

    m = make_tiny(9).double()
    assert m.cfg.nbr_draft
    toks = torch.randint(0, 256, (2, SEQ_LEN))
    toks[0, 100:110] = torch.tensor([250, 250, 250, 255, 3, 255, 0, 255, 5, 7])  # clamped references
    pos = torch.tensor([[0, 1, 96, 101, 3071], [3, 97, 500, 2000, 3066]])
    _check_neighbour_prior(m, pos, toks, want_at, lambda t, u: u)


@pytest.mark.parametrize("nbr_draft", [True, False])
@pytest.mark.parametrize("window", [False, True])
def test_draft_heads_propose_what_head_logits_give_on_those_proposals(nbr_draft, window):
    """Decoding makes a block's proposals one head at a time (with nbr_draft a head reads the
    proposals before it); each must be the choice of `head_logits` (the logits training and
    replay use) when the decoded tokens are followed by the block's own proposals."""
    from sr_blockwise.decoding import window_centre
    m = make_tiny(3, nbr_draft=nbr_draft).double()
    K = m.cfg.n_blockwise
    pos = torch.tensor([0, 1, 95, 96, 290, 3065, 3070, 3071])
    b = len(pos)
    h = torch.randn(b, m.cfg.d_model, dtype=torch.float64)
    src, toks = torch.randint(0, 256, (b, 192)), torch.randint(0, 256, (b, SEQ_LEN + K))
    choose = (lambda z, i: window_centre(z, 2)) if window else None
    with torch.no_grad():
        for k in (1, 2, 6, K):
            props = m.draft_heads(h, k, src, pos, toks, choose)
            filled = toks.clone()
            for r in range(b):
                filled[r, pos[r]:pos[r] + k] = props[r]
            z = m.head_logits(h, k, src, pos, filled)
            want = z.argmax(-1) if not window else torch.cat([z[:, :1].argmax(-1), window_centre(z[:, 1:], 2)], 1)
            assert torch.equal(props, want), k
            assert torch.equal(props[:, 0], m.logits(h, src, pos).argmax(-1))  # p1 is the sure token
        # speculative sampling's drafts: a given first token, heads sampling by Gumbel noise, and
        # the logits they sampled from (what verification compares p1 with)
        first = torch.randint(0, 256, (b,))
        for k in (2, 6, K):
            noise = torch.rand(b, k - 1, 256, dtype=torch.float64) * 3
            props, zq = m.draft_heads(h, k, src, pos, toks, lambda z, i: (z + noise[:, i]).argmax(-1),
                                      with_logits=True, first=first)
            filled = toks.clone()
            for r in range(b):
                filled[r, pos[r]:pos[r] + k] = props[r]
            z = m.head_logits(h, k, src, pos, filled)
            assert torch.equal(props[:, 0], first)
            torch.testing.assert_close(zq, z[:, 1:], rtol=0, atol=0)
            assert torch.equal(props[:, 1:], (z[:, 1:] + noise).argmax(-1)), k


@pytest.mark.parametrize("n_lookups", [5, 3000])  # a few (decoding's gather) and many (training's windows)
def test_offset_log_prior_reads_entry_value_minus_ref_and_sends_gradients_there(n_lookups):
    table = torch.randn(2, 3, 511, dtype=torch.float64, requires_grad=True)
    row, ref = torch.randint(0, 6, (2, n_lookups)), torch.randint(0, 256, (2, n_lookups))
    out = offset_log_prior(table, row, ref)
    want = table.detach().flatten(0, 1)[row.unsqueeze(-1), torch.arange(256) - ref.unsqueeze(-1) + 255]
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    weight = torch.randn_like(out)
    (out * weight).sum().backward()
    grad = torch.zeros(6, 511, dtype=torch.float64)
    grad.index_put_((row.unsqueeze(-1).expand_as(out), (torch.arange(256) - ref.unsqueeze(-1) + 255)), weight,
                    accumulate=True)
    torch.testing.assert_close(table.grad.flatten(0, 1), grad)


def test_paper_head1_layer_option_routes_p1_through_heads():
    m = make_tiny(5, head1="layer", lr_prior=False, nbr_prior=False, nbr_draft=False).double()
    h = torch.randn(3, m.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m.head_logits(h, 3)[:, 0], m.logits(h))
        assert not torch.allclose(m.logits(h), m.lm_head(h))


def test_presets_and_bad_configs():
    assert preset("paper").d_model == 512 and preset("paper").n_dec_layers == 8
    assert preset("cpu").n_blockwise == 10
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=130, n_heads=4)
    with pytest.raises(ValueError, match="block_len"):
        ModelConfig(block_len=100)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
    with pytest.raises(ValueError, match="unknown model config"):
        ModelConfig.from_dict({**preset("tiny").to_dict(), "colour": 1})


def test_lr_skip_reads_the_input_cell_under_each_position():
    """With lr_skip, the decoder input at (row, col, ch) depends on the 8x8 input only through
    the intensity of cell (row//4, col//4, ch)."""
    m = make_tiny(6).double()
    src = torch.randint(0, 256, (1, 192))
    prev = torch.randint(0, 256, (1, SEQ_LEN))
    pos = torch.arange(SEQ_LEN)[None]
    x0 = m.embed_targets(prev, pos, src)
    src2 = src.clone()
    cell = (2 * 8 + 5) * 3 + 1  # input row 2, col 5, green
    src2[0, cell] = (src[0, cell] + 100) % 256
    changed = (m.embed_targets(prev, pos, src2) != x0).any(-1)[0].nonzero().flatten()
    r, c, ch = changed // 96, (changed // 3) % 32, changed % 3
    assert len(changed) == 16 and (r // 4 == 2).all() and (c // 4 == 5).all() and (ch == 1).all()


def test_lr_prior_scores_the_offset_from_the_input_cell():
    m = make_tiny(8)
    src = torch.randint(0, 256, (2, 192))
    pos = torch.tensor([[0, 1, 2, 100], [3000, 3001, 3002, 3071]])
    p = m.prior(src, pos)
    assert p.shape == (2, 4, 256)
    for b in range(2):
        for j in range(4):
            t = int(pos[b, j])
            r, c, ch = t // 96, (t // 3) % 32, t % 3
            cell = int(src[b, (r // 4) * 24 + (c // 4) * 3 + ch])
            want = m.lr_prior[ch, torch.arange(256) - cell + 255]
            torch.testing.assert_close(p[b, j], want, rtol=0, atol=0)
