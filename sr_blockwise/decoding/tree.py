"""Tree verification: several candidates per position, one call, the longest path that passes.

A chain verifies one proposal per position, so a block ends at the first head whose top choice
is wrong. A tree (as Medusa's, Cai et al. 2024) verifies each head's few best candidates: node
(r1, .., rd) is head d+1's rank-rd value given the tokens on its path, its parent (r1, .., rd-1).
One model call feeds every node, each attending to the confirmed prefix and its own ancestors
(`ImageTransformerSR.step_tree`), so each node's p1 logits are what a chain of its path would
give; the rule checks every node against its parent's p1 choice, the deepest path whose nodes
all pass is accepted, and its keys and values become the cache's. In exact mode the output is
still greedy decoding's.

Which nodes: the `size` paths with the highest chance of passing, built from each head's
measured rank accuracies (`rank_accuracy`: how often each rank is the best-ranked candidate that
passes; stored with the weights as `tree_accuracy`, one table per rule) as if heads were right
independently. `expected_tokens` gives that model's tokens per
call; `sr-blockwise trees` measures and stores the tables.

A tree pays where a call costs about the same for 1 or 64 candidates (an accelerator at small
batch); on a CPU a call's cost grows with the candidates it verifies.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..data import to_tokens
from ..heads import draft_tree
from ..model import SEQ_LEN, ImageTransformerSR
from .guard import cell_guard
from .options import DecodeOptions
from .results import DecodeResult
from .rules import ACCEPT, window_mass
from .torch_engine import commit, finish, prefill, take_last_tokens

RANKS = 8  # candidates per head that rank_accuracy measures and trees choose from
# For weights without a measured table: head d's rank-r candidate right with 0.3 * 0.6^r (about
# what small heads reach), the same at every depth.
GENERIC_ACCURACY = [[0.3 * 0.6 ** r for r in range(RANKS)] for _ in range(15)]


@dataclass(frozen=True)
class Tree:
    """A tree's nodes as paths of candidate ranks from the root (the sure token, ()), parents
    before children, by depth."""
    paths: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    def tensors(self, device) -> dict:
        """parent, depth (N,), ancestors (N, N) (node j is node i's ancestor or i itself), path_at
        (N, depth + 1): the node at each depth of a node's path (the node itself past it);
        first_child (N,): each node's rank-0 child (-1: none); spine: the rank-0 path's node at each
        depth (-1 past it); levels:
        for each depth from 1, (its nodes, their parents, their ranks, the largest rank + 1), as
        heads.draft_tree takes them."""
        return _tensors(self.paths, str(device))

    @staticmethod
    def chain(k: int) -> "Tree":
        """The chain of k tokens: the sure one and the heads' top choices."""
        return Tree(tuple((0,) * d for d in range(k)))


@lru_cache(maxsize=32)
def _tensors(paths, device):
    index = {p: i for i, p in enumerate(paths)}
    N, D = len(paths), max(len(p) for p in paths)
    parent = [index[p[:-1]] if p else 0 for p in paths]
    ancestors = torch.zeros(N, N, dtype=torch.bool)
    path_at = torch.zeros(N, D + 1, dtype=torch.long)
    for i, p in enumerate(paths):
        for d in range(D + 1):
            j = index[p[:d]] if d <= len(p) else i
            path_at[i, d] = j
            ancestors[i, j] = True
    first_child = [index.get(p + (0,), -1) for p in paths]
    t = {"parent": torch.tensor(parent), "depth": torch.tensor([len(p) for p in paths]),
         "ancestors": ancestors, "path_at": path_at, "first_child": torch.tensor(first_child)}
    t = {k: v.to(device) for k, v in t.items()}
    t["levels"] = []
    for d in range(1, D + 1):
        nodes = [i for i, p in enumerate(paths) if len(p) == d]
        ranks = [paths[i][-1] for i in nodes]
        t["levels"].append((torch.tensor(nodes, device=device), torch.tensor([parent[i] for i in nodes], device=device),
                            torch.tensor(ranks, device=device), max(ranks) + 1))
    t["spine"] = [index.get((0,) * d, -1) for d in range(D + 1)]  # the rank-0 path's node at each depth
    return t


def build_tree(accuracy, size: int, max_depth: int) -> Tree:
    """The `size` nodes (root included) most likely to pass, at most max_depth deep, where
    accuracy[d - 1][r] is the chance that head d+1's rank-r candidate passes given its path
    did, heads independent: best first from the root, so every node's parent is in."""
    max_depth = min(max_depth, len(accuracy))
    chosen, heap = [()], []

    def push(path, p):
        if len(path) < max_depth:
            for r, a in enumerate(accuracy[len(path)]):
                heapq.heappush(heap, (-p * a, path + (r,)))

    push((), 1.0)
    while len(chosen) < size and heap:
        negp, path = heapq.heappop(heap)
        chosen.append(path)
        push(path, -negp)
    return Tree(tuple(sorted(chosen, key=len)))  # stable: most likely first within a depth


def expected_tokens(tree: Tree, accuracy) -> float:
    """Tokens per call if heads were right independently with these accuracies: the sure token
    plus each node's chance that its whole path passes."""
    return 1 + sum(float(np.prod([accuracy[d][r] for d, r in enumerate(p)])) for p in tree.paths if p)


def accuracy_key(opts: DecodeOptions) -> str:
    """Which measured table a mode's tree is built from: the rule and how candidates are ranked."""
    if opts.rule == "eps":
        return f"eps-window={opts.eps}" if opts.propose == "window" else f"eps={opts.eps}"
    return "exact"  # top-k and oracle: the exact rule's table (top-k passes at least those)


def tree_for(model: ImageTransformerSR, opts: DecodeOptions) -> Tree:
    """opts' tree: opts.tree nodes, opts.k - 1 deep at most, from the weights' measured table
    for its rule (model.tree_accuracy), else GENERIC_ACCURACY."""
    table = getattr(model, "tree_accuracy", {}).get(accuracy_key(opts), GENERIC_ACCURACY)
    return _build_cached(tuple(map(tuple, table)), opts.tree, opts.k - 1)


@lru_cache(maxsize=64)
def _build_cached(table, size, depth):
    return build_tree(table, size, depth)


# ---------------------------------------------------------------- decoding with a tree

@torch.no_grad()
def decode_tree(model: ImageTransformerSR, lr, opts: DecodeOptions, progress, progress_every: int) -> DecodeResult:
    """decode with tree verification on the torch engine: prefill, then per call verify every
    node, commit the deepest passing path, and grow the next tree from its last state."""
    tree = tree_for(model, opts)
    T = tree.tensors(next(model.parameters()).device)
    s, h = prefill(model, lr, opts, None, tree.depth + 1)
    first = _p1(model, h, s.src, s.t, s.out, opts).argmax(-1)
    s.props = _grow(model, h, first, s, T, opts)
    while len(s.rows):
        take_last_tokens(s)
        if not len(s.rows):
            break
        h, kv, best, n, first = _verify(model, s, T, opts)
        given = recycled(T, best, first) if opts.propose == "recycle" else None
        h_next, first, given = _commit(model, s, T, h, kv, best, n, first, given)
        if len(s.rows):
            s.props = _grow(model, h_next, first, s, T, opts, given)
        if progress is not None and s.n_calls % progress_every == 0:
            progress(s.out[:, :SEQ_LEN].cpu().numpy(), s.t.cpu().numpy(), s.bmap[:, :SEQ_LEN].cpu().numpy(),
                     s.n_calls)
    result = finish(s, progress)
    result.extra["tree"] = tree.size
    return result


def _p1(model, h, src, t, out, opts):
    """p1's logits at states h (b, d) predicting positions t (b,), with the cell guard where opts has it."""
    z = model.logits(h, src, t, opts.prior_weight)
    return cell_guard(z, src, t, out, opts.guard) if opts.guard else z


def _grow(model, h, first, s, T, opts, given=None) -> torch.Tensor:
    """The next tree's node tokens (b, N) for the live images: the root is `first` (p1's
    choice), the others the heads' candidates along their paths (the rank-0 path's first ones
    the recycled tokens `given`, (tokens, counts), where opts recycles)."""
    rows = s.rows
    window = opts.propose == "window" and opts.eps > 0
    return draft_tree(model, h, s.src[rows], s.t[rows], s.out[rows], T["levels"], first, opts.prior_weight,
                      score=(lambda z: window_mass(z, opts.eps)) if window else None,
                      given=(*given, T["spine"]) if given is not None else None)


def _verify(model, s, T, opts):
    """One call feeds every live image's tree; -> (the states (b, N, d), the nodes' keys and
    values, each image's deepest passing node (b,), its accepted count (b,), p1's choice at
    every node (b, N))."""
    rows, B = s.rows, len(s.t)
    tr = s.t[rows]
    h, kv = model.step_tree(s.cache, s.props, tr + 1, T["depth"], T["ancestors"],
                            rows=None if len(rows) == B else rows)
    s.n_calls += 1
    s.calls[rows.cpu()] += 1
    pos = (tr + 1)[:, None] + T["depth"]
    logits = model.logits(h, s.src[rows], pos, opts.prior_weight)
    if opts.guard:
        logits = cell_guard(logits, s.src[rows], pos, None, opts.guard, read=path_reader(s.out[rows], s.props, T, tr))
    best = deepest_passing(s.props, logits, T, opts)
    n = torch.minimum(T["depth"][best] + 1, SEQ_LEN - tr)
    return h, kv, best, n, logits.argmax(-1)


def deepest_passing(nodes: torch.Tensor, logits: torch.Tensor, T: dict, opts: DecodeOptions) -> torch.Tensor:
    """Each image's deepest node (b,) whose whole path passes opts' rule: nodes (b, N) the tree's
    tokens, logits (b, N, 256) p1's after each node (each child is checked against its parent's);
    among equally deep ones the first (the likeliest)."""
    ok = ACCEPT[opts.rule](nodes[:, 1:], logits[:, T["parent"][1:]], opts)
    root = torch.ones(len(nodes), 1, dtype=torch.bool, device=nodes.device)  # the sure token
    ok = torch.cat([root, ok], 1)
    path_ok = ~((~ok)[:, None, :] & T["ancestors"]).any(-1)  # (b, N): every node on the path passes
    N = ok.shape[1]
    return torch.where(path_ok, T["depth"] * N - torch.arange(N, device=ok.device), -1).argmax(-1)


def recycled(T: dict, best: torch.Tensor, choices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact mode's recycled proposals in a tree: below each image's deepest passing node, its
    rank-0 child (rejected) and that child's rank-0 descendants; p1's choices there (choices (b,
    N)), though they read a rejected token, propose the positions after the next sure token
    better than the heads do (as the chain's recycled proposals). -> (tokens (b, depth), how many
    of them each image has (b,)); the shapes depend on the tree only."""
    b, D = len(best), len(T["spine"]) - 1
    ar = torch.arange(b, device=best.device)
    node, have = best, torch.ones(b, dtype=torch.bool, device=best.device)
    tokens, count = [], torch.zeros(b, dtype=torch.long, device=best.device)
    for _ in range(D):
        child = T["first_child"][node]
        have = have & (child >= 0)  # once a chain ends, it stays ended
        node = child.clamp(min=0)
        tokens.append(choices[ar, node])
        count += have.long()
    return torch.stack(tokens, 1), count


def path_reader(out: torch.Tensor, nodes: torch.Tensor, T: dict, t: torch.Tensor):
    """For the cell guard: a function from positions (b, N, 16) to the tokens there as each node's
    path has them: out's (b, S) before t (b,), the path's from t on."""
    b, N = nodes.shape
    path_tok = nodes.gather(1, T["path_at"].reshape(1, -1).expand(b, -1)).view(b, N, -1)

    def read(cell):
        confirmed = out.gather(1, cell.reshape(b, -1)).view_as(cell)
        on_path = path_tok.gather(2, (cell - t[:, None, None]).clamp(0, path_tok.shape[2] - 1))
        return torch.where(cell >= t[:, None, None], on_path, confirmed)
    return read


def _commit(model, s, T, h, kv, best, n, first, given=None):
    """Keep each image's accepted path: its keys and values in the cache, its tokens in the
    output (`commit`); -> (the states at the live images' last accepted nodes, p1's choice there:
    their next sure tokens, and the live images' share of `given`)."""
    rows, tr = s.rows, s.t[s.rows]
    path = T["path_at"][best]  # (b, depth + 1)
    model.keep_path(s.cache, kv, path, tr + 1, rows)
    b_ar = torch.arange(len(rows), device=h.device)
    nxt = first[b_ar, best]
    s.props = s.props.gather(1, path)
    h_next, _ = commit(s, h[b_ar[:, None], path], n, None)
    live = s.t[rows] < SEQ_LEN
    return h_next, nxt[live], tuple(x[live] for x in given) if given is not None else None


# ---------------------------------------------------------------- measuring the heads' rank accuracies

@torch.no_grad()
def rank_accuracy(model: ImageTransformerSR, lr, greedy_images, opts: DecodeOptions, ranks: int = RANKS,
                  chunk: int = 64) -> list[list[float]]:
    """acc[d - 1][r]: how often head d+1's rank-r candidate is its best-ranked one that passes
    opts' rule against greedy's token d after the sure one, when every token before it is
    greedy's (a teacher-forced pass over the greedy outputs `greedy_images` of lr at
    opts.prior_weight; as in training and in the exact-mode replay, the heads read the greedy
    tokens as their path). Best-ranked, because under the eps rule neighbouring candidates pass
    together, and a sibling only adds where the ones before it failed (under the exact rule at
    most one passes). Candidates are ranked as opts' tree ranks them (the logits; the window
    mass for eps-window)."""
    dev = next(model.parameters()).device
    src = torch.from_numpy(to_tokens(lr)).to(dev)
    y = torch.from_numpy(to_tokens(np.asarray(greedy_images))).to(dev)
    B, k = src.shape[0], model.cfg.n_blockwise
    cache = model.new_cache(src, max_extra=chunk)
    prev = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev), y[:, :-1]], 1)
    later = torch.cat([y, y[:, -1:].expand(B, k)], 1)
    window = opts.propose == "window" and opts.eps > 0
    passed = torch.zeros(k - 1, ranks, dtype=torch.float64)
    counted = torch.zeros(k - 1, dtype=torch.float64)
    for s in range(0, SEQ_LEN, chunk):
        h = model.step(cache, prev[:, s:s + chunk], torch.full((B,), s, device=dev))
        n = h.shape[1]
        pos = s + torch.arange(n, device=dev).expand(B, n)
        z = model.head_logits(h, k, src, pos, y, opts.prior_weight)[..., 1:, :]  # (B, n, k-1, 256)
        cand = (window_mass(z, opts.eps) if window else z).topk(ranks, dim=-1).indices
        want = torch.stack([later[:, s + j + 1:s + j + 1 + n] for j in range(k - 1)], -1)[..., None]
        ok = (cand - want).abs() <= (opts.eps if opts.rule == "eps" else 0)  # (B, n, k-1, R)
        ok &= ok.long().cumsum(-1) == 1  # the best-ranked passing candidate only
        inside = (pos[..., None] + torch.arange(1, k, device=dev) < SEQ_LEN)[..., None]
        passed += (ok & inside).sum((0, 1)).double().cpu()
        counted += inside.sum((0, 1))[:, 0].double().cpu()
    return (passed / counted[:, None]).tolist()
