"""DDTree: a draft tree built best-first from per-depth top-K draft log-probabilities.

The block-diffusion draft gives, for each of the next L positions, one marginal distribution that does
not depend on the tokens before it. A node at depth d with rank r carries token ids[d-1, r]; its score is
the sum of the draft log-probs of the ranks along its path. The tree is seeded with the top-1 spine
(depths 1..min(L, B)) because pure best-first spends the budget on shallow siblings and truncates the
spine (Lucebox measured AL ~4 → ~9 from the seed); the rest of the budget goes best-first through a
max-heap of frontier candidates (next sibling, first child).

Slot 0 is the root (the pending bonus token). Slots are numbered in insertion order, so parents precede
children. Plain Python with heapq: for B ≤ 64 and K ≤ 8 this costs tens of microseconds, below the cost
of one numba dispatch + first-call compile, and it runs once per decode step.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from lucebox_cli.engines.base import Tree

MAX_DEPTH = 15


@dataclass(frozen=True)
class DraftTree:
    """A tree ready for verify(), with the draft bookkeeping of each slot."""

    tree: Tree
    depth: np.ndarray  # [N] int64, root 0
    rank: np.ndarray  # [N] int64, draft rank of the slot's token at its depth (root 0)
    score: np.ndarray  # [N] float64, cumulative draft log-prob along the path (root 0)

    @property
    def size(self) -> int:
        return self.tree.size


def sorted_table(logprobs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ([L, K] log-probs, [L, K] ids) with every row sorted by decreasing log-prob.

    Drafts usually hand over sorted top-K already; sorting again is cheap and makes rank 0 the top-1
    whatever the source. The sort is stable so equal log-probs keep the draft's order.
    """
    lp = np.asarray(logprobs, dtype=np.float64)
    tok = np.asarray(ids, dtype=np.int64)
    if lp.ndim == 1:
        lp, tok = lp[:, None], tok[:, None]
    if lp.shape != tok.shape or lp.ndim != 2:
        raise ValueError(f"log-prob table {lp.shape} and id table {tok.shape} must both be [L, K]")
    if lp.shape[1] < 2 or bool(np.all(lp[:, :-1] >= lp[:, 1:])):
        return lp, tok
    order = np.argsort(-lp, axis=1, kind="stable")
    return np.take_along_axis(lp, order, axis=1), np.take_along_axis(tok, order, axis=1)


def build_ddtree(
    root_token: int,
    logprobs: np.ndarray,
    ids: np.ndarray,
    budget: int,
    max_depth: int = MAX_DEPTH,
    chain_seed: bool = True,
) -> DraftTree:
    """Build a DDTree of at most `budget` nodes below the root from a [L, K] top-K table.

    `budget` counts nodes besides the root; depth is capped at min(L, max_depth). With `chain_seed`
    off, the construction is pure best-first (kept for comparison in tests and benchmarks).
    """
    lp_arr, tok_arr = sorted_table(logprobs, ids)
    n_depth = min(lp_arr.shape[0], max_depth)
    n_rank = lp_arr.shape[1]
    budget = max(0, int(budget)) if n_depth > 0 else 0
    # Python lists: scalar indexing into numpy arrays would dominate the loop below
    lp, tok = lp_arr.tolist(), tok_arr.tolist()

    tokens = [int(root_token)]
    parents = [-1]
    depths = [0]
    ranks = [0]
    scores = [0.0]
    # heap entries: (-score, tie, depth, rank, parent slot); `tie` keeps pops deterministic
    heap: list[tuple[float, int, int, int, int]] = []
    tie = 0

    def add(depth: int, rank: int, parent: int) -> int:
        tokens.append(tok[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        scores.append(scores[parent] + lp[depth - 1][rank])
        return len(tokens) - 1

    def push(depth: int, rank: int, parent: int) -> None:
        nonlocal tie
        if depth > n_depth or rank >= n_rank:
            return
        heapq.heappush(heap, (-(scores[parent] + lp[depth - 1][rank]), tie, depth, rank, parent))
        tie += 1

    if chain_seed:
        parent = 0
        for depth in range(1, min(n_depth, budget) + 1):
            push(depth, 1, parent)
            parent = add(depth, 0, parent)
        # the spine's last node has an unexpanded first child only when the budget cut the spine short
        # of the full depth, and then the budget is already spent
    else:
        push(1, 0, 0)

    while len(tokens) - 1 < budget and heap:
        _, _, depth, rank, parent = heapq.heappop(heap)
        slot = add(depth, rank, parent)
        push(depth, rank + 1, parent)
        push(depth + 1, 0, slot)

    return DraftTree(
        tree=Tree(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64)),
        depth=np.asarray(depths, dtype=np.int64),
        rank=np.asarray(ranks, dtype=np.int64),
        score=np.asarray(scores, dtype=np.float64),
    )
