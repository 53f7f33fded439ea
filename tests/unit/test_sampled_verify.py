"""Exact sampled verification (T > 0): the emitted tokens have the target's sampling distribution.

Statistical test: a 5-token Markov target (next-token distribution depends on the last two tokens), a
deliberately wrong draft, DDTree trees, and the sampled walk repeated until two tokens are emitted per
trial. The joint of the first two tokens (25 cells) is compared with the exact target joint by a
chi-square test at alpha = 1e-3, with enough draws that moving 1% of probability mass between two
cells is rejected (checked on the same counts). Plus an end-to-end check: with one seed, speculative
and plain sampling consume one uniform per emitted token through the same sampler, so on an engine
whose tree and sequential logits agree bitwise they emit the same tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from spec_toy import ToyEngine

from lucebox_cli.config import RunConfig
from lucebox_cli.engines.base import Tree
from lucebox_cli.spec.accept import sampled_walk
from lucebox_cli.spec.ddtree import build_ddtree
from lucebox_cli.spec.drafts import ReplayDraft
from lucebox_cli.spec.loop import speculative_generate
from lucebox_cli.spec.sampling import probs

V = 5
TRIALS = 60_000
ALPHA_Z = 3.09  # one-sided normal quantile for alpha = 1e-3


def _chi2_critical(df: int, z: float = ALPHA_Z) -> float:
    # Wilson–Hilferty: chi2_df ≈ df (1 − 2/(9df) + z sqrt(2/(9df)))³ (no scipy in the environment)
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _chi2(counts: np.ndarray, expected_p: np.ndarray) -> float:
    expected = expected_p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


class _Markov:
    """Target logits as a function of the last two tokens of the context."""

    def __init__(self, seed: int):
        self.table = np.random.default_rng(seed).normal(0, 1.2, size=(V, V, V)).astype(np.float32)

    def logits(self, context: tuple[int, ...]) -> np.ndarray:
        return self.table[context[-2], context[-1]]


def _tree_logits(target: _Markov, context: tuple[int, ...], tree: Tree) -> np.ndarray:
    # slot i sees the context, the root (the previous bonus) and its ancestry
    return np.stack([target.logits(context + tuple(tree.tokens[tree.path_to(i)])) for i in range(tree.size)])


def _exact_joint(target: _Markov, context: tuple[int, ...], temp: float, top_k: int, top_p: float) -> np.ndarray:
    p1 = probs(target.logits(context), temp, top_k, top_p)
    return np.stack([p1[a] * probs(target.logits(context + (a,)), temp, top_k, top_p) for a in range(V)])


@pytest.mark.parametrize(
    "temp,top_k,top_p,good_draft",
    [(1.0, 0, 1.0, False), (0.7, 4, 0.9, True)],
    ids=["T1-wrong-draft", "T0.7-k4-p0.9-good-draft"],
)
def test_sampled_walk_reproduces_the_target_joint(temp, top_k, top_p, good_draft):
    target = _Markov(seed=1)
    rng = np.random.default_rng(2024)
    # a wrong draft favours tokens in reverse order of the target's preference; a good one agrees
    sign = -1.0 if good_draft else 1.0
    draft_lp = np.log(np.array([0.5, 0.3, 0.2]))
    context0 = (1, 3)
    # the first emitted token is the bonus of the prefill: sampled from the target as plain decoding does
    p0 = probs(target.logits(context0), temp, top_k, top_p)
    cum0 = np.cumsum(p0)
    # the tree depends only on the first token: build each once, with its per-slot target logits
    trees = {}
    for first in range(V):
        ids = np.stack([np.argsort(sign * target.logits(context0 + (first,)))[:3] for _ in range(4)])
        tree = build_ddtree(first, np.tile(draft_lp, (4, 1)), ids, budget=6).tree
        trees[first] = (tree, _tree_logits(target, context0, tree))
    counts = np.zeros((V, V))
    for _ in range(TRIALS):
        first = int(min(np.searchsorted(cum0, rng.random() * cum0[-1], side="right"), V - 1))
        tree, logits = trees[first]
        acc = sampled_walk(tree, logits, rng, temp, top_k, top_p)
        second = int(tree.tokens[acc.path[1]]) if len(acc.path) > 1 else acc.bonus
        counts[first, second] += 1
    exact = _exact_joint(target, context0, temp, top_k, top_p)
    cells = exact.reshape(-1) > 0
    obs, exp = counts.reshape(-1)[cells], exact.reshape(-1)[cells]
    assert counts.reshape(-1)[~cells].sum() == 0, "a token outside the top-k/top-p support was emitted"
    crit = _chi2_critical(int(cells.sum()) - 1)
    assert _chi2(obs, exp) < crit
    # power: the same counts reject a target that moved 1% of the mass between its two largest cells
    order = np.argsort(-exp)
    biased = exp.copy()
    biased[order[0]] -= 0.01
    biased[order[1]] += 0.01
    assert _chi2(obs, biased) > crit


def test_branches_are_taken_when_sampling():
    # the walk really moves down the tree (the test above is not only testing bonus draws)
    target, rng = _Markov(seed=1), np.random.default_rng(0)
    context = (1, 3, 0)
    ids = np.stack([np.argsort(-target.logits(context))[:3] for _ in range(4)])
    tree = build_ddtree(0, np.tile(np.log([0.5, 0.3, 0.2]), (4, 1)), ids, budget=8).tree
    logits = _tree_logits(target, (1, 3), tree)
    lengths = [len(sampled_walk(tree, logits, rng, 1.0).path) for _ in range(400)]
    assert max(lengths) >= 3 and np.mean(lengths) > 1.3


@pytest.mark.parametrize("spec", ["chain", "ddtree"])
def test_sampled_spec_equals_plain_sampling_with_one_seed(spec):
    engine = ToyEngine(seed=23, logit_scale=1.5)
    for seed in range(4):
        prompt = [seed + 1, 7, 11]
        cfg = RunConfig(model="toy", max_tokens=40, temperature=0.8, top_k=20, top_p=0.95, seed=seed)
        plain = speculative_generate(engine, None, cfg, prompt)
        res = speculative_generate(engine, ReplayDraft(0.2, seed=seed), cfg.replace(spec=spec), prompt)
        assert res.tokens == plain.tokens
        assert res.steps < plain.steps  # some proposals were accepted, not only bonus draws
