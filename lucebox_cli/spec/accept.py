"""Walking a verified tree: which slots the target accepts, and the next bonus token.

Greedy: from the root, take the target argmax at the current slot; if a child holds that token, move to
it and repeat. The emitted tokens are then exactly the target's own greedy continuation.

Sampled (T > 0): at each slot draw one token from the target distribution of that slot; follow the child
holding the draw, else the draw is the bonus. Every emitted token is a draw from the target's conditional
given the emitted prefix, so the output has the target's sampling distribution on any tree (the pairwise
min(1, p/q) test is biased on trees built from draft marginals, which is why it is not used here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lucebox_cli.engines.base import Tree
from lucebox_cli.spec.sampling import draw, probs


@dataclass(frozen=True)
class Accepted:
    """Result of a walk: `path` (slot 0 first) is what gets committed; `bonus` is the next root."""

    path: list[int]
    bonus: int

    @property
    def length(self) -> int:
        """Acceptance length of the step: committed tokens (root included) = emitted tokens."""
        return len(self.path)


def child_table(tree: Tree) -> list[dict[int, int]]:
    """Per slot, token → first child slot holding it (the first wins if a draft repeats a token)."""
    children: list[dict[int, int]] = [{} for _ in range(tree.size)]
    tokens, parents = tree.tokens, tree.parents
    for slot in range(1, tree.size):
        children[int(parents[slot])].setdefault(int(tokens[slot]), slot)
    return children


def greedy_walk(tree: Tree, argmax: np.ndarray) -> Accepted:
    """Follow the children matching the target argmax; `argmax` is [N], one token per slot."""
    children = child_table(tree)
    slot = 0
    path = [0]
    while True:
        target = int(argmax[slot])
        nxt = children[slot].get(target)
        if nxt is None:
            return Accepted(path, target)
        path.append(nxt)
        slot = nxt


def sampled_walk(
    tree: Tree,
    logits: np.ndarray,
    rng: np.random.Generator,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Accepted:
    """Exact sampled verification: per visited slot, one draw from the target distribution there.

    `logits` is [N, V]. The distribution and the draw are spec.sampling's (probs, draw), the ones
    plain sampling uses, so with one seed both consume one uniform per emitted token.
    """
    children = child_table(tree)
    slot = 0
    path = [0]
    while True:
        token = draw(probs(logits[slot], temperature, top_k, top_p), rng)
        nxt = children[slot].get(token)
        if nxt is None:
            return Accepted(path, token)
        path.append(nxt)
        slot = nxt
