"""DDTree and chain construction: structure, budget, chain seed, best-first order, ancestor mask."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucebox_cli.spec.chain import build_chain
from lucebox_cli.spec.ddtree import MAX_DEPTH, build_ddtree


def _table(seed: int, depth: int, k: int, vocab: int = 97) -> tuple[np.ndarray, np.ndarray]:
    """A realistic draft table: top-K of a log-softmax per depth, sorted, distinct ids per row."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.0, size=(depth, vocab))
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    ids = np.argsort(-logp, axis=1)[:, :k]
    return np.take_along_axis(logp, ids, axis=1), ids


def _all_nodes(lp: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every node of the full K-ary tree as rank tuple → score (for brute-force checks)."""
    depth, k = lp.shape
    nodes = {}
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            nodes[ranks] = float(sum(lp[i, r] for i, r in enumerate(ranks)))
    return nodes


def _rank_path(dt, slot: int) -> tuple[int, ...]:
    return tuple(int(dt.rank[s]) for s in dt.tree.path_to(slot)[1:])


def test_small_hand_example():
    # depth 3, K 2: spine 10 20 30; then the depth-1 sibling 11 (log .35 = -1.05) beats 30's sibling 31
    # (log .6 .9 .4 = -1.53); then 11's first child 20 (-1.05 + log .9 = -1.16) beats 31 again
    lp = np.log(np.array([[0.6, 0.35], [0.9, 0.05], [0.5, 0.4]]))
    ids = np.array([[10, 11], [20, 21], [30, 31]])
    dt = build_ddtree(7, lp, ids, budget=6)
    assert dt.tree.tokens.tolist() == [7, 10, 20, 30, 11, 20, 31]
    assert dt.tree.parents.tolist() == [-1, 0, 1, 2, 0, 4, 2]
    assert dt.depth.tolist() == [0, 1, 2, 3, 1, 2, 3]
    assert dt.rank.tolist() == [0, 0, 0, 0, 1, 0, 1]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(1, 16),
    k=st.integers(1, 8),
    budget=st.integers(0, 64),
)
def test_structure_budget_and_chain_seed(seed, depth, k, budget):
    lp, ids = _table(seed, depth, k)
    dt = build_ddtree(5, lp, ids, budget)
    tree = dt.tree
    n_depth = min(depth, MAX_DEPTH)
    possible = sum(k**d for d in range(1, n_depth + 1))
    assert tree.size == min(budget, possible) + 1
    assert tree.tokens[0] == 5 and tree.parents[0] == -1
    # parents precede children; depth and token bookkeeping agree with the table
    assert np.all(tree.parents[1:] < np.arange(1, tree.size))
    assert np.array_equal(dt.depth, tree.depth)
    assert dt.depth.max() <= n_depth
    for s in range(1, tree.size):
        assert tree.tokens[s] == ids[dt.depth[s] - 1, dt.rank[s]]
        assert dt.score[s] == pytest.approx(dt.score[tree.parents[s]] + lp[dt.depth[s] - 1, dt.rank[s]])
    # the chain seed: slots 1..min(L, B) are the top-1 spine
    spine = min(n_depth, budget)
    assert tree.tokens[1 : spine + 1].tolist() == ids[:spine, 0].tolist()
    assert tree.parents[1 : spine + 1].tolist() == list(range(spine))
    # no two siblings hold the same rank (hence, with distinct ids per row, the same token)
    seen = {(int(tree.parents[s]), int(dt.rank[s])) for s in range(1, tree.size)}
    assert len(seen) == tree.size - 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 4), k=st.integers(1, 3), budget=st.integers(0, 40))
def test_best_first_takes_the_best_nodes_after_the_spine(seed, depth, k, budget):
    lp, ids = _table(seed, depth, k)
    dt = build_ddtree(0, lp, ids, budget)
    nodes = _all_nodes(lp)
    spine = {tuple([0] * d) for d in range(1, min(depth, budget) + 1)}
    taken = {_rank_path(dt, s) for s in range(1, dt.size)}
    rest_taken = [nodes[r] for r in taken - spine]
    not_taken = [nodes[r] for r in nodes.keys() - taken]
    # scores only fall along a path and along ranks, so best-first = the global top-m outside the spine
    if rest_taken and not_taken:
        assert min(rest_taken) >= max(not_taken) - 1e-12


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 4), k=st.integers(1, 3), budget=st.integers(0, 40))
def test_without_seed_is_pure_best_first(seed, depth, k, budget):
    lp, ids = _table(seed, depth, k)
    dt = build_ddtree(0, lp, ids, budget, chain_seed=False)
    nodes = _all_nodes(lp)
    taken = {_rank_path(dt, s) for s in range(1, dt.size)}
    assert len(taken) == dt.size - 1 == min(budget, len(nodes))
    chosen = [nodes[r] for r in taken]
    left = [nodes[r] for r in nodes.keys() - taken]
    if chosen and left:
        assert min(chosen) >= max(left) - 1e-12


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(1, 40), k=st.integers(1, 8))
def test_mask_is_the_ancestor_closure(seed, budget, k):
    lp, ids = _table(seed, 15, k)
    tree = build_ddtree(1, lp, ids, budget).tree
    mask = tree.ancestor_mask()
    for i in range(tree.size):
        assert set(np.flatnonzero(mask[i]).tolist()) == set(tree.path_to(i))


def test_unsorted_rows_are_ranked_by_log_prob():
    lp = np.log(np.array([[0.1, 0.7, 0.2]]))
    ids = np.array([[1, 2, 3]])
    dt = build_ddtree(0, lp, ids, budget=3)
    assert dt.tree.tokens.tolist() == [0, 2, 3, 1]
    assert dt.rank.tolist() == [0, 0, 1, 2]


def test_depth_is_capped_at_fifteen():
    lp, ids = _table(3, 20, 1)
    dt = build_ddtree(0, lp, ids, budget=40)
    assert dt.size == MAX_DEPTH + 1 and dt.depth.max() == MAX_DEPTH


def test_chain_is_the_top1_spine():
    lp, ids = _table(4, 15, 8)
    ch = build_chain(9, lp, ids)
    assert ch.tree.tokens.tolist() == [9] + ids[:, 0].tolist()
    assert ch.tree.parents.tolist() == list(range(-1, 15))
    assert ch.score[-1] == pytest.approx(lp[:, 0].sum())
    # a chain is the DDTree with budget = depth
    dt = build_ddtree(9, lp, ids, budget=15)
    assert dt.tree.tokens.tolist() == ch.tree.tokens.tolist()
    assert build_chain(9, lp[:4], ids[:4]).size == 5
    assert build_chain(9, lp[:, 0], ids[:, 0], max_depth=3).size == 4
