"""Tree verification: exact trees decode greedy's output, a node's state is its path's chain
state, trees are built from rank accuracies as promised."""
import numpy as np
import pytest
import torch

from conftest import agreeable_tiny, make_tiny
from sr_blockwise.data import to_tokens
from sr_blockwise.decoding import DecodeOptions, decode
from sr_blockwise.decoding.tree import GENERIC_ACCURACY, Tree, build_tree, expected_tokens, rank_accuracy, tree_for
from sr_blockwise.heads import draft_heads, draft_tree
from sr_blockwise.model import SEQ_LEN


def test_a_tree_holds_the_likeliest_paths_and_every_parent():
    acc = [[0.5, 0.2, 0.1], [0.4, 0.3, 0.1], [0.9, 0.05, 0.0]]
    tree = build_tree(acc, 8, max_depth=3)
    assert tree.size == 8 and tree.paths[0] == () and tree.depth <= 3
    assert all(p[:-1] in tree.paths for p in tree.paths if p)  # prefix-closed
    assert [len(p) for p in tree.paths] == sorted(len(p) for p in tree.paths)
    prob = {p: float(np.prod([acc[d][r] for d, r in enumerate(p)])) for p in tree.paths}
    left_out = [p + (r,) for p in tree.paths if len(p) < 3 for r in range(3) if p + (r,) not in tree.paths]
    assert min(v for p, v in prob.items() if p) >= max(float(np.prod([acc[d][r] for d, r in enumerate(p)]))
                                                      for p in left_out)
    assert expected_tokens(tree, acc) == pytest.approx(1 + sum(v for p, v in prob.items() if p))
    # with one candidate per head the tree is the chain, its expectation the chain's
    chain = build_tree([[0.5], [0.5], [0.5]], 10, max_depth=3)
    assert chain.paths == ((), (0,), (0, 0), (0, 0, 0)) and expected_tokens(chain, [[0.5]] * 3) == 1.875
    assert build_tree(acc, 100, max_depth=1).depth == 1


def test_a_trees_tensors_say_who_is_whose_ancestor():
    tree = Tree(((), (0,), (1,), (0, 0), (1, 0)))
    T = tree.tensors("cpu")
    assert T["parent"].tolist() == [0, 0, 0, 1, 2] and T["depth"].tolist() == [0, 1, 1, 2, 2]
    assert [(n.tolist(), p.tolist(), r.tolist(), w) for n, p, r, w in T["levels"]] == \
        [([1, 2], [0, 0], [0, 1], 2), ([3, 4], [1, 2], [0, 0], 1)]
    assert T["ancestors"][4].tolist() == [True, False, True, False, True]
    assert T["path_at"][4].tolist() == [0, 2, 4] and T["path_at"][1].tolist() == [0, 1, 1]


def test_a_tree_of_rank_zero_nodes_proposes_the_heads_block():
    m = make_tiny(3).for_inference(torch.bfloat16)  # random neighbour priors: paths matter
    lr = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    src = torch.from_numpy(to_tokens(lr))
    cache = m.new_cache(src)
    h = m.step(cache, torch.full((3, 1), -1), torch.zeros(3, dtype=torch.long))[:, 0]
    tokens = torch.randint(0, 256, (3, SEQ_LEN))
    pos = torch.tensor([0, 100, 200])
    block = draft_heads(m, h, 6, src, pos, tokens)
    chain = draft_tree(m, h, src, pos, tokens, Tree.chain(6).tensors("cpu")["levels"], block[:, 0])
    torch.testing.assert_close(chain, block, rtol=0, atol=0)
    wide = build_tree([[0.5, 0.4, 0.3]] * 5, 40, 5).tensors("cpu")
    nodes = draft_tree(m, h, src, pos, tokens, wide["levels"], block[:, 0])
    for d in range(1, 6):  # siblings are distinct values
        for p in set(wide["parent"][wide["depth"] == d].tolist()):
            kids = nodes[:, (wide["parent"] == p) & (wide["depth"] == d)]
            assert all(len(set(row.tolist())) == kids.shape[1] for row in kids)


def test_each_nodes_state_is_its_paths_chain_state(agreeable):
    """One call over a tree gives every node the state `step` gives its path fed as a chain,
    bit for bit in bf16: what keeps exact trees exact."""
    m, lr, g = agreeable
    src = torch.from_numpy(to_tokens(lr))
    y = torch.from_numpy(to_tokens(g.images))
    B = len(lr)
    tree = build_tree([[0.5, 0.3, 0.2]] * 4, 20, 4)
    T = tree.tensors("cpu")
    for t in (0, 126, 1000):  # from the start, across a block boundary, mid-image
        cache = m.new_cache(src)
        prev = torch.cat([torch.full((B, 1), -1), y[:, :-1]], 1)
        for s in range(0, t + 1, 16):  # the confirmed prefix's keys, positions 0..t
            m.step(cache, prev[:, s:min(s + 16, t + 1)], torch.full((B,), s))
        nodes = torch.randint(0, 256, (B, tree.size))
        nodes[:, 0] = y[:, t]
        h, _ = m.step_tree(cache, nodes, torch.full((B,), t + 1), T["depth"], T["ancestors"])
        for i in (1, 5, tree.size - 1):
            path = nodes[:, T["path_at"][i][:int(T["depth"][i]) + 1]]
            chain = m.step(cache, path, torch.full((B,), t + 1))[:, -1]
            torch.testing.assert_close(h[:, i], chain, rtol=0, atol=0)


def test_exact_trees_decode_greedys_output_in_any_batch(agreeable):
    m, lr, g = agreeable
    opts = DecodeOptions.parse("exact:k=10:tree=64")
    r = decode(m, lr, opts)
    np.testing.assert_array_equal(r.images, g.images)
    assert r.extra == {"engine": "torch", "tree": 64}
    np.testing.assert_array_equal(decode(m, lr[1:], opts).images[0], g.images[1])
    for s in r.stats:
        assert sum((n + 1) * c for n, c in enumerate(s.block_hist)) == SEQ_LEN
        assert s.calls - sum(s.block_hist) in (0, 1)
        assert sum(c > 0 for c in s.block_hist) >= 3  # paths of several lengths were accepted


def test_guarded_exact_trees_decode_guarded_greedys_output(agreeable):
    m, lr, _ = agreeable
    want = decode(m, lr[:1], DecodeOptions(guard=2), engine="torch")
    np.testing.assert_array_equal(decode(m, lr[:1], DecodeOptions.parse("exact:k=6:tree=24:guard=2")).images,
                                  want.images)


def test_an_oracle_tree_accepts_its_deepest_path_every_call(agreeable):
    m, lr, _ = agreeable
    r = decode(m, lr[:1], DecodeOptions.parse("oracle:k=5:tree=12"))
    depth = tree_for(m, DecodeOptions.parse("oracle:k=5:tree=12")).depth
    assert r.stats[0].block_hist[depth] == SEQ_LEN // (depth + 1)


def test_approximate_trees_keep_each_token_within_eps_of_p1s_choice(agreeable):
    """Every token an eps tree keeps is within eps of p1's argmax given the tokens before it:
    check by a teacher-forced pass over the output."""
    m = agreeable_tiny(torch.float64)  # the full forward's argmax is the cached one's
    lr = agreeable[1]
    r = decode(m, lr, DecodeOptions.parse("eps=3:k=6:tree=32"))
    y = torch.from_numpy(to_tokens(r.images))
    src = torch.from_numpy(to_tokens(lr))
    h = m(src, y)
    p1 = m.logits(h, src).argmax(-1)
    assert ((p1 - y).abs() <= 3).all() and (p1 != y).any()


def test_trees_are_refused_where_they_do_not_apply(agreeable):
    m, lr, _ = agreeable
    for spec, msg in [("exact:k=4:tree=1", "2..1024"), ("exact:k=1:tree=8", "k >= 2"),
                      ("sample:k=4:T=1:tree=8", "speculative sampling"), ("exact:k=4:tree=8:min-block=2", "min-block")]:
        with pytest.raises(ValueError, match=msg):
            DecodeOptions.parse(spec)
    with pytest.raises(ValueError, match="torch and static engines"):
        decode(m, lr, DecodeOptions.parse("exact:k=4:tree=8"), engine="native")
    assert DecodeOptions.parse("exact:tree=8:k=4").spec == "exact:k=4:tree=8"
    # exact recycles p1's choices on the tree's rank-0 path, exact-heads proposes the heads' alone
    assert DecodeOptions.parse("exact:k=4:tree=8").propose == "recycle"
    assert DecodeOptions.parse("exact-heads:k=4:tree=8").propose == "argmax"
    assert DecodeOptions.parse("exact-heads:k=4:tree=8").spec == "exact-heads:k=4:tree=8"


def test_recycled_tokens_follow_the_rank_0_chain_below_the_deepest_passing_node():
    """Below the accepted node: its rank-0 child (rejected) and that child's rank-0 descendants;
    p1's choices there are the next tree's rank-0 path, as many as that chain is deep."""
    from sr_blockwise.decoding.tree import recycled
    tree = Tree(((), (0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
    T = tree.tensors("cpu")
    assert T["first_child"].tolist() == [1, 3, 4, 5, -1, -1] and T["spine"] == [0, 1, 3, 5]
    choices = torch.tensor([[10, 11, 12, 13, 14, 15]] * 3)
    best = torch.tensor([0, 2, 5])  # the root, (1,) whose child (1, 0) ends its chain, a leaf
    tokens, count = recycled(T, best, choices)
    assert count.tolist() == [3, 1, 0]
    assert tokens[0].tolist() == [11, 13, 15] and tokens[1, 0].item() == 14


def test_exact_trees_with_recycled_proposals_decode_greedys_output_and_accept_more(agreeable):
    m, lr, g = agreeable
    heads, recycling = (decode(m, lr, DecodeOptions.parse(f"{mode}:k=6:tree=16"))
                        for mode in ("exact-heads", "exact"))
    np.testing.assert_array_equal(recycling.images, g.images)
    assert sum(s.calls for s in recycling.stats) < sum(s.calls for s in heads.stats)


def test_rank_accuracy_counts_the_best_ranked_passing_candidate(agreeable):
    m, lr, g = agreeable
    exact = rank_accuracy(m, lr, g.images, DecodeOptions.parse("exact:k=4"), ranks=256)
    assert len(exact) == m.cfg.n_blockwise - 1 and all(sum(row) == pytest.approx(1) for row in exact)
    loose = rank_accuracy(m, lr, g.images, DecodeOptions.parse("eps=255:k=4"), ranks=4)
    assert all(row == [1.0, 0.0, 0.0, 0.0] for row in loose)  # rank 0 always passes, so only it counts
    m.tree_accuracy = {"exact": exact}
    try:
        assert tree_for(m, DecodeOptions.parse("exact:k=3:tree=5")) == build_tree(exact, 5, 2)
    finally:
        m.tree_accuracy = {}


def test_shipped_weights_bring_their_measured_tables_and_trees_are_built_from_them():
    from sr_blockwise.checkpoints import load_model
    m = load_model("cpu-finetuned", dtype=torch.float32)
    assert set(m.tree_accuracy) >= {"exact", "eps=2", "eps-window=2"}
    assert len(m.tree_accuracy["exact"]) == m.cfg.n_blockwise - 1
    opts = DecodeOptions.parse("eps=2:k=10:tree=64")
    assert tree_for(m, opts) == build_tree(m.tree_accuracy["eps=2"], 64, 9) != build_tree(GENERIC_ACCURACY, 64, 9)
