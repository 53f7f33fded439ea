"""The generation loop: plain decoding (`--spec none`) and speculative decoding (chain / DDTree).

Speculative step: draft proposes a top-K table for the positions after the pending bonus token → the
tree is built (chain: top-1 spine; ddtree: budget B) → the engine verifies every slot → the walk
accepts a root-to-node path and picks the next bonus → the engine commits the path. Each step emits
the accepted tokens and the new bonus, so the emitted stream equals plain decoding token for token at
T = 0 (and, with the exact sampled walk, has the same distribution at T > 0: one uniform draw per
emitted token through the same sampler, so with one seed both paths even agree token for token
whenever the logits agree).

Stopping matches plain decoding exactly: after max_tokens emitted tokens, after an EOS (emitted), or
when the context is full; a step that accepts past a stop is truncated. The tree depth is capped at
the tokens still wanted, so no verify work is spent beyond max_tokens.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from lucebox_cli.config import RunConfig
from lucebox_cli.engines.base import Engine, Tree, greedy_step, greedy_verify
from lucebox_cli.errors import UsageError
from lucebox_cli.spec.accept import Accepted, greedy_walk, sampled_walk
from lucebox_cli.spec.chain import build_chain
from lucebox_cli.spec.ddtree import MAX_DEPTH, DraftTree, build_ddtree
from lucebox_cli.spec.drafts import Draft
from lucebox_cli.spec.sampling import check_params, sample

SPEC_MODES = ("none", "chain", "ddtree")
DDTREE_TOP_K = 8  # draft alternatives per depth (K in the DDTree paper)


@dataclass
class SpecResult:
    """Tokens and statistics of one generation. AL counts emitted tokens per verify step."""

    tokens: list[int]
    mode: str
    draft: Optional[str]
    budget: Optional[int]
    steps: int  # target forwards after prefill (decode steps, or verify calls)
    accept_lengths: list[int]  # per verify step: tokens emitted (accepted + bonus)
    stop_reason: str  # max_tokens | eos | context
    prompt_tokens: int
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def al_mean(self) -> float:
        return float(np.mean(self.accept_lengths)) if self.accept_lengths else 1.0

    @property
    def al_hist(self) -> dict[int, int]:
        """Acceptance length → number of steps."""
        values, counts = np.unique(np.asarray(self.accept_lengths, dtype=np.int64), return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts)}

    @property
    def tok_per_s(self) -> float:
        """Generated tokens per second of decode wall time (prefill excluded)."""
        t = self.timings.get("decode_s", 0.0)
        return len(self.tokens) / t if t > 0 else 0.0

    def stats(self) -> dict:
        """The numbers the stats line, --json and bench rows show."""
        return {
            "mode": self.mode,
            "draft": self.draft,
            "budget": self.budget,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": len(self.tokens),
            "steps": self.steps,
            "al_mean": round(self.al_mean, 4),
            "al_hist": {str(k): v for k, v in self.al_hist.items()},
            "tok_per_s": round(self.tok_per_s, 3),
            "stop_reason": self.stop_reason,
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
        }


class _Sampler:
    """spec.sampling.sample for plain steps (greedy at T = 0), the matching walk for verified trees."""

    def __init__(self, cfg: RunConfig):
        check_params(cfg.temperature, cfg.top_k, cfg.top_p)
        self.cfg = cfg
        self.greedy = cfg.temperature == 0
        self.rng = np.random.default_rng(cfg.seed)

    def pick(self, logits: np.ndarray) -> int:
        c = self.cfg
        return sample(logits, c.temperature, c.top_k, c.top_p, rng=self.rng)

    def step(self, engine: Engine, token: int) -> int:
        """A plain decode step and its pick; at T = 0 only the argmax is asked for (no host logits)."""
        if self.greedy:
            return greedy_step(engine, token)
        return self.pick(engine.step(token))

    def verify(self, engine: Engine, tree: Tree):
        """The tree's target output; at T = 0 the argmax per slot suffices (logits may stay on the device)."""
        return greedy_verify(engine, tree) if self.greedy else engine.verify(tree)

    def walk(self, tree: Tree, verified) -> Accepted:
        if self.greedy:
            return greedy_walk(tree, verified.argmax)
        if verified.logits is None:
            raise UsageError("this engine returns only argmax from verify; sampling needs logits",
                             hint="use --temperature 0, or --spec none")
        c = self.cfg
        return sampled_walk(tree, verified.logits, self.rng, c.temperature, c.top_k, c.top_p)


class _Emitter:
    """Collects emitted tokens, applies the stop rules, forwards tokens to the caller."""

    def __init__(self, max_tokens: int, eos_ids: Iterable[int], on_token: Optional[Callable[[int], None]]):
        self.max_tokens = int(max_tokens)
        self.eos = frozenset(int(t) for t in eos_ids)
        self.on_token = on_token
        self.tokens: list[int] = []
        self.stop_reason: Optional[str] = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def emit(self, token: int) -> bool:
        """Emit one token; True when generation must stop after it."""
        self.tokens.append(int(token))
        if self.on_token is not None:
            self.on_token(int(token))
        if token in self.eos:
            self.stop_reason = "eos"
        elif self.remaining <= 0:
            self.stop_reason = "max_tokens"
        return self.stop_reason is not None


def speculative_generate(
    engine: Engine,
    draft: Optional[Draft],
    cfg: RunConfig,
    prompt_ids: Sequence[int],
    on_token: Optional[Callable[[int], None]] = None,
    eos_ids: Iterable[int] = (),
) -> SpecResult:
    """Generate up to cfg.max_tokens after `prompt_ids` with cfg.spec ∈ {none, chain, ddtree}.

    The engine is reset first. EOS ids stop generation only when cfg.stop_at_eos.
    """
    if cfg.spec not in SPEC_MODES:
        raise UsageError(f"unknown --spec {cfg.spec!r}", hint="use one of: " + ", ".join(SPEC_MODES))
    if cfg.spec != "none" and draft is None:
        raise UsageError(f"--spec {cfg.spec} needs a draft", hint="add --draft DRAFT (or --draft replay:0.1)")
    if cfg.spec == "ddtree" and cfg.budget < 1:
        raise UsageError(f"--budget must be at least 1 (got {cfg.budget})")
    if len(prompt_ids) == 0:
        raise UsageError("the prompt is empty", hint="give --prompt TEXT or --prompt-ids 1,2,3")
    prompt = [int(t) for t in prompt_ids]
    emitter = _Emitter(cfg.max_tokens, eos_ids if cfg.stop_at_eos else (), on_token)
    sampler = _Sampler(cfg)
    timings = {"draft_setup_s": 0.0}
    spec = cfg.spec != "none"
    if spec:
        t0 = time.perf_counter()
        draft.start(engine, prompt, horizon=cfg.max_tokens + draft.block_size)
        timings["draft_setup_s"] = time.perf_counter() - t0
    engine.reset()
    t0 = time.perf_counter()
    logits = engine.prefill(prompt)
    t1 = time.perf_counter()
    timings["prefill_s"] = t1 - t0
    steps, lengths = 0, []
    if cfg.max_tokens > 0 and not emitter.emit(sampler.pick(logits)):
        if spec:
            steps, lengths = _spec_steps(engine, draft, cfg, prompt, emitter, sampler, timings)
        else:
            steps = _plain_steps(engine, cfg, emitter, sampler)
    if emitter.stop_reason is None:
        emitter.stop_reason = "max_tokens"
    timings["decode_s"] = time.perf_counter() - t1
    return SpecResult(
        tokens=emitter.tokens,
        mode=cfg.spec,
        draft=draft.label if spec else None,
        budget=cfg.budget if cfg.spec == "ddtree" else None,
        steps=steps,
        accept_lengths=lengths if spec else [1] * steps,
        stop_reason=emitter.stop_reason,
        prompt_tokens=len(prompt),
        timings=timings,
    )


def _context_full(engine: Engine, cfg: RunConfig, emitter: _Emitter) -> bool:
    # the pending token goes to position n_past, which must exist
    if engine.n_past >= cfg.max_context:
        emitter.stop_reason = "context"
        return True
    return False


def _plain_steps(engine: Engine, cfg: RunConfig, emitter: _Emitter, sampler: _Sampler) -> int:
    loop = getattr(engine, "greedy_tokens", None)
    if sampler.greedy and loop is not None:
        return _greedy_loop_steps(engine, cfg, emitter, loop)
    steps = 0
    while not _context_full(engine, cfg, emitter):
        token = sampler.step(engine, emitter.tokens[-1])
        steps += 1
        if emitter.emit(token):
            break
    return steps


def _greedy_loop_steps(engine: Engine, cfg: RunConfig, emitter: _Emitter, loop: Callable) -> int:
    """_plain_steps at T = 0 through the engine's greedy loop (engines/dflash.py greedy_tokens: the steps
    queued ahead on the device), with the same stops: as many steps as tokens remain and the context holds
    (n_past < max_context before each), ending after an EOS the emitter stops on."""
    steps = 0
    n = min(emitter.remaining, cfg.max_context - engine.n_past)
    if n > 0:
        with contextlib.closing(loop(emitter.tokens[-1], n, stop_ids=emitter.eos)) as tokens:
            for token in tokens:
                steps += 1
                if emitter.emit(token):
                    break
    if emitter.stop_reason is None:
        _context_full(engine, cfg, emitter)
    return steps


def _build_tree(draft: Draft, engine: Engine, cfg: RunConfig, committed: list[int], bonus: int,
                max_depth: int) -> DraftTree:
    """The step's tree; a root-only tree when no depth is wanted (then verify is a plain decode step)."""
    if max_depth <= 0:
        return build_chain(bonus, np.zeros((0, 1)), np.zeros((0, 1), dtype=np.int64))
    top_k = 1 if cfg.spec == "chain" else DDTREE_TOP_K
    logprobs, ids = draft.propose(engine, committed, bonus, top_k)
    if cfg.spec == "chain":
        return build_chain(bonus, logprobs, ids, max_depth=max_depth)
    return build_ddtree(bonus, logprobs, ids, cfg.budget, max_depth=max_depth)


def _spec_steps(engine: Engine, draft: Draft, cfg: RunConfig, prompt: list[int], emitter: _Emitter,
                sampler: _Sampler, timings: dict[str, float]) -> tuple[int, list[int]]:
    for key in ("draft_s", "verify_s", "walk_s", "commit_s"):
        timings[key] = 0.0
    committed = list(prompt)
    lengths: list[int] = []
    while not _context_full(engine, cfg, emitter):
        bonus = emitter.tokens[-1]
        # deepest useful node: accepted depth d emits d + 1 tokens; positions stop at max_context − 1
        max_depth = min(MAX_DEPTH, draft.block_size - 1, emitter.remaining - 1,
                        cfg.max_context - 1 - engine.n_past)
        t0 = time.perf_counter()
        dtree = _build_tree(draft, engine, cfg, committed, bonus, max_depth)
        t1 = time.perf_counter()
        verified = sampler.verify(engine, dtree.tree)
        t2 = time.perf_counter()
        acc = sampler.walk(dtree.tree, verified)
        t3 = time.perf_counter()
        timings["draft_s"] += t1 - t0
        timings["verify_s"] += t2 - t1
        timings["walk_s"] += t3 - t2
        new = dtree.tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        emitted = 0
        for token in new:
            emitted += 1
            if emitter.emit(token):
                break
        lengths.append(emitted)
        if emitter.stop_reason is not None:
            break
        engine.commit(acc.path)
        timings["commit_s"] += time.perf_counter() - t3
        committed.extend(dtree.tree.tokens[acc.path].tolist())
    return len(lengths), lengths
