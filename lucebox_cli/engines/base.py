"""The Engine protocol every backend implements, and the Tree that verify() consumes.

An engine owns the committed state of one sequence: KV cache rows, DeltaNet recurrent + conv state,
and (when asked for taps) the captured target features used by the DFlash draft. The spec loop, CLI
and bench talk to engines only through this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from lucebox_cli.errors import UsageError


@dataclass(frozen=True)
class Tree:
    """Slots of a speculative tree. Slot 0 is the root: the pending (bonus) token, not yet committed.

    parents[i] < i for i > 0 (parents precede children), parents[0] == -1. A slot's position is
    committed_length + depth[i]; siblings share a position.
    """

    tokens: np.ndarray  # [N] int64
    parents: np.ndarray  # [N] int64

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        if tokens.shape != parents.shape or tokens.size == 0:
            raise ValueError("tree needs as many parents as tokens, and at least the root")
        if parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= np.arange(1, parents.size)):
            raise ValueError("tree parents must satisfy parents[0] == -1 and 0 <= parents[i] < i")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "Tree":
        n = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64), np.arange(-1, n - 1, dtype=np.int64))

    @property
    def size(self) -> int:
        return int(self.tokens.size)

    @property
    def depth(self) -> np.ndarray:
        """[N] depth of each slot; the root has depth 0."""
        d = np.zeros(self.size, dtype=np.int64)
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return d

    def ancestor_mask(self) -> np.ndarray:
        """[N, N] bool: mask[i, j] is True iff slot j is slot i or one of its ancestors."""
        n = self.size
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            if i > 0:
                mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask

    def path_to(self, slot: int) -> list[int]:
        """Slots from the root down to `slot`, inclusive."""
        path = []
        while slot >= 0:
            path.append(int(slot))
            slot = int(self.parents[slot])
        return path[::-1]


@dataclass
class VerifyResult:
    """Target output for every slot of a tree. `logits` may be None for engines that only return argmax."""

    argmax: np.ndarray  # [N] int64
    logits: np.ndarray | None = None  # [N, V] float32


@dataclass
class EngineStats:
    """Counters an engine keeps for the stats line and bench rows."""

    committed: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    verify_calls: int = 0
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What every backend does. All token ids are Python ints or int64 arrays."""

    name: str

    @property
    def n_past(self) -> int:
        """Number of committed tokens (the next token's position)."""
        ...

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append the tokens to the committed state; return float32 logits [V] of the last one."""
        ...

    def step(self, token_id: int) -> np.ndarray:
        """Append one token (a decode step); return float32 logits [V] for the next position."""
        ...

    def verify(self, tree: Tree) -> VerifyResult:
        """Run the target over all slots of `tree` on top of the committed state, without committing.

        Slot i attends to the committed context plus its ancestors and itself, at position
        n_past + depth[i]; DeltaNet layers follow parent links. Per-slot state is kept until commit().
        """
        ...

    def commit(self, accepted_slots: Sequence[int]) -> None:
        """Commit a root-to-node path of the last verified tree (slot 0 first).

        Afterwards the engine state equals feeding tree.tokens[accepted_slots] one at a time.
        """
        ...

    def reset(self) -> None:
        """Forget every committed token (weights stay loaded)."""
        ...

    def close(self) -> None:
        """Release device memory and handles."""
        ...


# ---- greedy entry points ---------------------------------------------------------------------------
# An engine may also offer step_argmax(token_id) -> int and verify_argmax(tree) -> VerifyResult (logits
# None): the greedy answers without copying logits to the host (engines/dflash.py computes them on the
# device). Callers that only need argmax (the spec loop at T = 0, `bench speed`) go through these two
# functions, which fall back to step() / verify() for engines without them; the ids are the same.


def greedy_step(engine: Engine, token_id: int) -> int:
    """One decode step; the argmax of its logits (first maximum, NaN wins: np.argmax)."""
    fn = getattr(engine, "step_argmax", None)
    return int(fn(token_id)) if fn is not None else int(np.argmax(engine.step(token_id)))


def greedy_verify(engine: Engine, tree: Tree) -> VerifyResult:
    """verify(tree) for a greedy walk: argmax per slot; logits may be None."""
    fn = getattr(engine, "verify_argmax", None)
    return fn(tree) if fn is not None else engine.verify(tree)


def verify_without_logits(result: VerifyResult) -> VerifyResult:
    return replace(result, logits=None)


# ---- argument checks every engine makes the same way ----


def checked_tokens(token_ids: Sequence[int], vocab: int) -> np.ndarray:
    """[n] int64 ids, refusing an empty list and ids outside 0..vocab-1."""
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise UsageError("no tokens to run")
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise UsageError(f"token id outside the vocabulary 0..{vocab - 1}")
    return tokens


def check_room(n_past: int, n: int, max_context: int) -> None:
    if n_past + n > max_context:
        raise UsageError(
            f"context full: {n_past} + {n} tokens exceed max_context {max_context}",
            hint="raise max_context (LUCEBOX_MAX_CONTEXT) or shorten the prompt / --max-tokens",
        )


def checked_path(tree: "Tree | None", accepted_slots: Sequence[int]) -> list[int]:
    """The accepted slots as ints, refusing anything but a root-to-node path of the verified tree."""
    if tree is None:
        raise UsageError("commit() needs a verify() first")
    path = [int(s) for s in accepted_slots]
    ok = bool(path) and path[0] == 0 and all(0 < s < tree.size for s in path[1:])
    ok = ok and all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    if not ok:
        raise UsageError(f"accepted slots {path} are not a root-to-node path of the verified tree")
    return path
