"""Drafts: what proposes the next tokens for chain / DDTree verification.

A draft turns (committed context, pending bonus token) into a per-depth top-K table: log-probs [L, K]
(descending per row) and ids [L, K]. Two kinds plug into the loop:
- `DFlashDraftAdapter`: the DFlash block-diffusion draft (models/dflash_draft.py), fed with the target
  features of newly committed tokens;
- `ReplayDraft`: the target's own greedy continuation, corrupted at a chosen rate, so tests and
  benchmarks can set the acceptance length on any weights. Its output is always labelled "replay".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from lucebox_cli.engines.base import Engine
from lucebox_cli.errors import UsageError

BLOCK_SIZE = 16  # [bonus, MASK × 15]: 15 proposed depths


@runtime_checkable
class Draft(Protocol):
    """What the spec loop needs from a draft."""

    label: str  # shown in stats lines and bench rows ("replay:0.1", "dflash")
    block_size: int  # proposes block_size − 1 depths per step
    tap_layers: tuple[int, ...]  # target layers whose hidden states it reads (empty: none)

    def start(self, engine: Engine, prompt_ids: Sequence[int], horizon: int) -> None:
        """Called once per generation, before the prompt's prefill; `horizon` bounds new tokens."""
        ...

    def propose(
        self, engine: Engine, committed: Sequence[int], bonus: int, top_k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(log-probs [L, K], ids [L, K]) for the positions after `bonus`.

        `committed` are all committed tokens (prompt first), len == engine.n_past; `bonus` is pending.
        """
        ...


def parse_draft_arg(arg: Optional[str]) -> tuple[str, Optional[float]]:
    """`--draft` value → ("replay", rate) or ("path", None) for an alias / folder / .gguf; (none) if unset."""
    if arg is None or arg == "":
        return "none", None
    m = re.fullmatch(r"replay(?::(.*))?", arg.strip())
    if m is None:
        return "path", None
    text = m.group(1)
    try:
        rate = 0.0 if text in (None, "") else float(text)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise UsageError(f"bad replay draft {arg!r}: the corruption rate must be a number in [0, 1]",
                         hint="e.g. --draft replay:0.1 (10% of proposed tokens corrupted)")
    return "replay", rate


def _greedy_continuation(engine: Engine, prefix: Sequence[int], n: int) -> tuple[list[int], int]:
    """Reset `engine`, prefill `prefix`, decode n greedy tokens; returns them and the vocab size."""
    engine.reset()
    logits = np.asarray(engine.prefill(list(prefix)))
    out: list[int] = []
    for i in range(n):
        out.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = engine.step(out[-1])
    return out, int(logits.shape[-1])


def _others(rng: np.random.Generator, vocab: int, exclude: set[int], count: int) -> list[int]:
    """`count` distinct random token ids outside `exclude` (batched rejection sampling: vocab ≫ count)."""
    out: list[int] = []
    while len(out) < count:
        for t in rng.integers(0, vocab, size=count + 4).tolist():
            if t not in exclude:
                exclude.add(t)
                out.append(t)
                if len(out) == count:
                    break
    return out


@dataclass
class ReplayDraft:
    """Proposes the target's own greedy continuation, each token corrupted with probability `rate`.

    The continuation is computed by a reference pass at start(): on `oracle` (a separate engine
    instance) when given, else on the target engine itself, which is then reset before the loop's
    prefill. A corrupted position gets a random other token at rank 0 and, with probability 1 − rate,
    the true token at a random lower rank, so DDTree can accept branches off the spine (rate 1 puts the
    true token nowhere: accept-none). The other ranks hold random tokens with decreasing log-probs.
    When the committed text leaves the reference (sampling, or float-order differences), the oracle
    recomputes it; without an oracle the stale continuation is proposed (still a valid, weaker draft).
    """

    rate: float = 0.0
    seed: int = 0
    oracle: Optional[Engine] = None
    block_size: int = BLOCK_SIZE
    tap_layers: tuple[int, ...] = ()
    _prompt: list[int] = field(default_factory=list, repr=False)
    _ref: list[int] = field(default_factory=list, repr=False)
    _checked: int = field(default=0, repr=False)
    _vocab: int = field(default=0, repr=False)
    _horizon: int = field(default=0, repr=False)
    _rng: Optional[np.random.Generator] = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"replay:{self.rate:g}"

    def start(self, engine: Engine, prompt_ids: Sequence[int], horizon: int) -> None:
        self._prompt = [int(t) for t in prompt_ids]
        # corruption differs between prompts but is fixed by (seed, prompt)
        self._rng = np.random.default_rng([int(self.seed), len(self._prompt)] + self._prompt[-8:])
        self._horizon = max(int(horizon), 1)
        ref_engine = self.oracle if self.oracle is not None else engine
        self._ref, self._vocab = _greedy_continuation(ref_engine, self._prompt, self._horizon)
        self._checked = 0
        if self.oracle is None:
            engine.reset()

    def _follow(self, generated: list[int]) -> None:
        """Keep the reference a continuation of what was actually generated, when an oracle allows."""
        m = len(generated)
        ok = generated[self._checked : m] == self._ref[self._checked : m]
        if ok:
            self._checked = m
            return
        if self.oracle is None:
            return
        tail = max(self._horizon - m, 1)
        self._ref = generated + _greedy_continuation(self.oracle, self._prompt + generated, tail)[0]
        self._checked = m

    def propose(
        self, engine: Engine, committed: Sequence[int], bonus: int, top_k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        generated = [int(t) for t in committed[len(self._prompt) :]] + [int(bonus)]
        self._follow(generated)
        n_depth = self.block_size - 1
        truth = self._ref[len(generated) : len(generated) + n_depth]
        k = max(1, min(int(top_k), self._vocab - 2))
        ids = np.empty((n_depth, k), dtype=np.int64)
        for d in range(n_depth):
            ids[d] = self._row(truth[d] if d < len(truth) else None, k)
        # fixed decreasing log-probs: the tree shape depends only on the budget
        logprobs = np.tile(-0.25 - np.arange(k, dtype=np.float64), (n_depth, 1))
        return logprobs, ids

    def _row(self, true_token: Optional[int], k: int) -> list[int]:
        rng = self._rng
        exclude = set() if true_token is None else {true_token}
        if true_token is not None and rng.random() >= self.rate:
            return [true_token] + _others(rng, self._vocab, exclude, k - 1)
        row = _others(rng, self._vocab, exclude, k)
        if true_token is not None and k > 1 and rng.random() >= self.rate:
            row[int(rng.integers(1, k))] = true_token
        return row


class DFlashDraftAdapter:
    """The DFlash draft behind the Draft protocol.

    Before each proposal the draft's context K/V follows the engine's committed feature rows
    (projecting only rows committed since the last step); the block then sits at position n_past.
    """

    def __init__(self, draft, label: str = "dflash"):
        self.draft = draft
        self.label = label
        self.block_size = int(draft.config.block_size)
        self.tap_layers = tuple(int(i) for i in draft.config.target_layer_ids)

    def start(self, engine: Engine, prompt_ids: Sequence[int], horizon: int) -> None:
        self.draft.reset()

    def propose(
        self, engine: Engine, committed: Sequence[int], bonus: int, top_k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        self.draft.sync_context(engine_features(engine))
        return self.draft.propose(int(bonus), int(top_k), pos0=engine.n_past)


def engine_features(engine: Engine) -> np.ndarray:
    """[n_past, n_taps · hidden] captured target features of the committed positions.

    Engines that capture taps expose them as `features`; without taps the row width is 0.
    """
    features = getattr(engine, "features", None)
    if features is None or np.shape(features)[-1] == 0:
        raise UsageError(f"the {getattr(engine, 'name', '?')} engine does not capture the draft's target features",
                         hint="open the engine with the draft's tap layers, or use --draft replay[:RATE]")
    return np.asarray(features, dtype=np.float32)
