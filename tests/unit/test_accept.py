"""The greedy walk: accepted path, bonus token, and losslessness against a deterministic oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lucebox_cli.engines.base import Tree
from lucebox_cli.spec.accept import child_table, greedy_walk
from lucebox_cli.spec.ddtree import build_ddtree

VOCAB = 6


def _oracle(prefix: tuple[int, ...]) -> int:
    """A deterministic 'target': next greedy token as a function of the whole prefix."""
    h = 17
    for t in prefix:
        h = (h * 31 + t + 7) % 1_000_003
    return h % VOCAB


def _argmax_for(tree: Tree, context: tuple[int, ...]) -> np.ndarray:
    # the target at slot i sees the committed context plus the slot's ancestry (root included)
    return np.array([_oracle(context + tuple(tree.tokens[tree.path_to(i)].tolist())) for i in range(tree.size)])


def test_hand_tree():
    # root 5; children 1 (slot 1) and 2 (slot 2); slot 1 has child 3 (slot 3)
    tree = Tree(np.array([5, 1, 2, 3]), np.array([-1, 0, 0, 1]))
    assert greedy_walk(tree, np.array([2, 3, 4, 0])).path == [0, 2]
    res = greedy_walk(tree, np.array([1, 3, 4, 0]))
    assert res.path == [0, 1, 3] and res.bonus == 0 and res.length == 3
    assert greedy_walk(tree, np.array([4, 3, 4, 0])).path == [0]
    assert greedy_walk(tree, np.array([4, 3, 4, 0])).bonus == 4


def test_duplicate_sibling_tokens_follow_the_first():
    tree = Tree(np.array([0, 3, 3]), np.array([-1, 0, 0]))
    assert child_table(tree)[0] == {3: 1}
    assert greedy_walk(tree, np.array([3, 1, 2])).path == [0, 1]


@settings(max_examples=80, deadline=None)
@given(
    context=st.lists(st.integers(0, VOCAB - 1), max_size=6).map(tuple),
    seed=st.integers(0, 10_000),
    budget=st.integers(0, 30),
    k=st.integers(1, 4),
)
def test_walk_emits_the_oracle_continuation(context, seed, budget, k):
    rng = np.random.default_rng(seed)
    lp = np.sort(np.log(rng.dirichlet(np.ones(VOCAB), size=8)), axis=1)[:, ::-1][:, :k]
    ids = np.stack([rng.permutation(VOCAB)[:k] for _ in range(8)])
    root = _oracle(context)
    tree = build_ddtree(root, lp, ids, budget).tree
    res = greedy_walk(tree, _argmax_for(tree, context))
    # the path is a root-to-node chain of the tree
    assert res.path[0] == 0 and all(tree.parents[b] == a for a, b in zip(res.path, res.path[1:]))
    emitted = tree.tokens[res.path[1:]].tolist() + [res.bonus]
    expected, prefix = [], context + (root,)
    for _ in emitted:
        expected.append(_oracle(prefix))
        prefix += (expected[-1],)
    assert emitted == expected
    # maximal: the walk stops only where no child holds the target's token
    last = res.path[-1]
    assert res.bonus not in child_table(tree)[last]
