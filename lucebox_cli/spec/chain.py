"""Chain mode: the tree is the draft's top-1 spine, one node per depth (a DDTree with K = 1)."""

from __future__ import annotations

import numpy as np

from lucebox_cli.engines.base import Tree
from lucebox_cli.spec.ddtree import MAX_DEPTH, DraftTree, sorted_table


def build_chain(root_token: int, logprobs: np.ndarray, ids: np.ndarray, max_depth: int = MAX_DEPTH) -> DraftTree:
    """Root followed by the top-1 token of each depth, up to min(L, max_depth) nodes.

    Accepts [L] or [L, K] tables; only rank 0 is used, the log-probs give the slot scores.
    """
    lp, tok = sorted_table(logprobs, ids)
    n = min(lp.shape[0], max_depth)
    tokens = np.concatenate([[int(root_token)], tok[:n, 0]]).astype(np.int64)
    return DraftTree(
        tree=Tree.chain(tokens),
        depth=np.arange(n + 1, dtype=np.int64),
        rank=np.zeros(n + 1, dtype=np.int64),
        score=np.concatenate([[0.0], np.cumsum(lp[:n, 0])]),
    )
