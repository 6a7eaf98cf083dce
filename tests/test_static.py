"""The static-shape engine: the torch engine's outputs and statistics from fixed-shape steps
that never wait for the host (run eagerly here, as on any device without CUDA graphs)."""
import numpy as np
import pytest

from sr_blockwise.decoding import DecodeOptions, decode
from sr_blockwise.decoding.static import StaticDecoder, static_problem


def test_static_exact_chains_and_trees_decode_greedys_output_in_any_batch(agreeable):
    m, lr, g = agreeable
    chain = decode(m, lr, DecodeOptions.parse("exact-heads:k=6"), engine="static")
    tree = decode(m, lr, DecodeOptions.parse("exact:k=10:tree=64"), engine="static")
    for r in (chain, tree):
        np.testing.assert_array_equal(r.images, g.images)
        assert r.extra["engine"] == "static" and not r.extra["graph"]
    assert tree.extra["tree"] == 64 and min(s.mean_block for r in (chain, tree) for s in r.stats) > 2
    alone = decode(m, lr[1:], DecodeOptions.parse("exact:k=10:tree=64"), engine="static")
    np.testing.assert_array_equal(alone.images[0], g.images[1])
    assert alone.stats[0].block_hist == tree.stats[1].block_hist and alone.stats[0].calls == tree.stats[1].calls


def test_a_static_step_keeps_what_the_torch_engine_keeps(agreeable):
    """Same blocks, block map and calls as the torch engine's step, image by image: an approximate
    tree (whose output is not greedy's) with the cell guard."""
    m, lr, _ = agreeable
    opts = DecodeOptions.parse("eps-window=3:k=6:tree=16:guard=2")
    ref, r = decode(m, lr[:1], opts, engine="torch"), decode(m, lr[:1], opts, engine="static")
    np.testing.assert_array_equal(r.images, ref.images)
    np.testing.assert_array_equal(r.block_map, ref.block_map)
    assert [s.block_hist for s in r.stats] == [s.block_hist for s in ref.stats]
    assert [s.calls for s in r.stats] == [s.calls for s in ref.stats]


def test_a_decoder_is_reused_for_new_inputs(agreeable):
    """A decoder (and on CUDA its captured graph) takes new inputs into the same tensors."""
    m, lr, g = agreeable
    d = StaticDecoder(m, 1, DecodeOptions.parse("exact:k=6:tree=12"))
    first = d.decode(lr[:1])
    np.testing.assert_array_equal(d.decode(lr[1:]).images[0], g.images[1])
    np.testing.assert_array_equal(d.decode(lr[:1]).images, first.images)


def test_what_the_static_engine_does_not_run_is_refused_with_a_reason(agreeable):
    m, lr, _ = agreeable
    for spec, why in [("sample:k=4:T=1", "sampling"), ("min-block=2:k=4", "min-block")]:
        assert why in static_problem(DecodeOptions.parse(spec))
        with pytest.raises(ValueError, match=why):
            decode(m, lr, DecodeOptions.parse(spec), engine="static")
    assert static_problem(DecodeOptions.parse("exact:k=4:tree=8")) is None
    assert static_problem(DecodeOptions.parse("exact:k=4")) is None  # recycled proposals: on the rank-0 path


def test_recycled_proposals_on_the_static_engine_are_the_other_engines(agreeable):
    """Exact mode's recycled proposals in a fixed-shape step (tree.recycled, on the rank-0 path):
    chains and trees keep the torch engine's blocks and calls and give greedy's output. (The
    native engine's float32 rounding may break a near tie among recycled proposals, which read a
    rejected token, otherwise: its blocks can differ, never its output.)"""
    m, lr, g = agreeable
    chain = DecodeOptions.parse("exact:k=6")
    r, ref = decode(m, lr, chain, engine="static"), decode(m, lr, chain, engine="torch")
    np.testing.assert_array_equal(r.images, g.images)
    assert [s.block_hist for s in r.stats] == [s.block_hist for s in ref.stats]
    assert [s.calls for s in r.stats] == [s.calls for s in ref.stats]
    tree = DecodeOptions.parse("exact:k=6:tree=16:guard=2")
    r, ref = decode(m, lr[:1], tree, engine="static"), decode(m, lr[:1], tree, engine="torch")
    np.testing.assert_array_equal(r.block_map, ref.block_map)
    assert [s.calls for s in r.stats] == [s.calls for s in ref.stats]
