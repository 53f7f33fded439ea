"""Speculative decoding is lossless: chain and DDTree emit exactly the `--spec none` tokens.

Two targets: the toy engine of spec_toy.py (fast, every path bitwise identical, commit done by the
state/ numpy twins) over many prompts, budgets and replay corruption rates; and the real CPU engine on
tiny random Qwen3.5 checkpoints, with replay and random DFlash drafts. After every commit the engine
state must equal the state of decoding the committed tokens one at a time.
"""

from __future__ import annotations

import numpy as np
import pytest
from spec_toy import ToyEngine

from lucebox_cli.config import RunConfig
from lucebox_cli.errors import UsageError
from lucebox_cli.spec.drafts import ReplayDraft, parse_draft_arg
from lucebox_cli.spec.loop import speculative_generate

PROMPTS = [list(np.random.default_rng(s).integers(0, 64, size=1 + s % 9)) for s in range(12)]


def _cfg(spec: str, **kw) -> RunConfig:
    kw.setdefault("max_tokens", 40)
    return RunConfig(model="toy", spec=spec, **kw)


def _plain(engine, prompt, **kw) -> list[int]:
    return speculative_generate(engine, None, _cfg("none", **kw), prompt).tokens


class _Recording(ToyEngine):
    """Toy engine that records committed paths and checks its state against sequential decoding."""

    def __init__(self, *a, check_state: bool = False, **kw):
        super().__init__(*a, **kw)
        self.paths: list[list[int]] = []
        self.check_state = check_state
        self._ref = ToyEngine(*a, **kw) if check_state else None
        self._fed: list[int] = []

    def prefill(self, token_ids):
        self._fed = [int(t) for t in token_ids]
        return super().prefill(token_ids)

    def verify(self, tree):
        self._last_tokens = tree.tokens
        return super().verify(tree)

    def commit(self, accepted_slots):
        super().commit(accepted_slots)
        self.paths.append(list(accepted_slots))
        self._fed += self._last_tokens[list(accepted_slots)].tolist()
        if self.check_state:
            self._ref.reset()
            self._ref.prefill(self._fed)
            mine, ref = self.snapshot(), self._ref.snapshot()
            for key in ref:
                # same function, same operands, same order on both paths: bitwise equality
                assert np.array_equal(mine[key], ref[key]), f"{key} differs after committing {accepted_slots}"


@pytest.mark.parametrize(
    "spec,budget",
    [("chain", 15), ("ddtree", 1), ("ddtree", 4), ("ddtree", 22), ("ddtree", 40)],
    ids=["chain", "ddtree-B1", "ddtree-B4", "ddtree-B22", "ddtree-B40"],
)
@pytest.mark.parametrize("rate", [0.0, 0.15, 0.5, 1.0], ids=lambda r: f"replay{r:g}")
def test_toy_lossless(spec, budget, rate):
    engine = _Recording(seed=3)
    # accept-none is the slowest case (one verify per token) and the least interesting: fewer prompts
    prompts = PROMPTS[:3] if rate == 1.0 else PROMPTS
    for i, prompt in enumerate(prompts):
        want = _plain(engine, prompt)
        res = speculative_generate(engine, ReplayDraft(rate, seed=i), _cfg(spec, budget=budget), prompt)
        assert res.tokens == want, f"prompt {i}"
        assert sum(res.accept_lengths) + 1 == len(res.tokens) == 40
        assert res.draft == f"replay:{rate:g}"
        if rate == 1.0:
            assert res.accept_lengths == [1] * 39
    if rate == 0.0:
        depth = 15 if spec == "chain" else min(budget, 15)
        # accept-all: every step but the last accepts the whole spine (+ bonus)
        assert all(p == list(range(depth + 1)) for p in engine.paths)


def test_toy_branches_off_the_spine_are_accepted():
    engine = _Recording(seed=5)
    for i, prompt in enumerate(PROMPTS):
        speculative_generate(engine, ReplayDraft(0.4, seed=i), _cfg("ddtree", budget=22), prompt)
    # slot j of a spine path is j; a larger slot at some depth means a sibling off the spine was accepted
    off_spine = [p for p in engine.paths if any(s != j for j, s in enumerate(p))]
    assert len(off_spine) >= 5


@pytest.mark.parametrize("spec", ["chain", "ddtree"])
def test_toy_state_after_every_commit_equals_sequential(spec):
    engine = _Recording(seed=7, check_state=True)
    for i, prompt in enumerate(PROMPTS[:4]):
        res = speculative_generate(engine, ReplayDraft(0.3, seed=i), _cfg(spec, max_tokens=48), prompt)
        assert res.tokens == _plain(ToyEngine(seed=7), prompt, max_tokens=48)
    # the feature ring (24 rows) wrapped and compaction crossed its end
    assert len(engine.paths) > 10 and engine.n_past > 24


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 16, 17, 33])
def test_toy_truncates_at_max_tokens(max_tokens):
    engine = ToyEngine(seed=11)
    for spec in ("chain", "ddtree"):
        for prompt in PROMPTS[:3]:
            want = _plain(engine, prompt, max_tokens=max_tokens)
            res = speculative_generate(engine, ReplayDraft(0.0), _cfg(spec, max_tokens=max_tokens), prompt)
            assert res.tokens == want and len(want) == max_tokens


def test_toy_stops_at_eos_inside_an_accepted_block():
    engine = ToyEngine(seed=13)
    for prompt in PROMPTS[:6]:
        full = _plain(engine, prompt)
        eos = full[9]  # accept-all replay puts it mid-block
        want = full[: full.index(eos) + 1]
        for spec in ("chain", "ddtree"):
            res = speculative_generate(engine, ReplayDraft(0.0), _cfg(spec), prompt, eos_ids=[eos])
            assert res.tokens == want and res.stop_reason == "eos"
        plain = speculative_generate(engine, None, _cfg("none"), prompt, eos_ids=[eos])
        assert plain.tokens == want
        # with stop_at_eos off, EOS is an ordinary token
        res = speculative_generate(engine, ReplayDraft(0.0), _cfg("ddtree", stop_at_eos=False), prompt, eos_ids=[eos])
        assert res.tokens == full


def test_toy_stops_when_the_context_is_full():
    engine = ToyEngine(seed=17, max_context=30)
    prompt = PROMPTS[5]
    want = speculative_generate(engine, None, _cfg("none", max_context=30), prompt)
    for spec in ("chain", "ddtree"):
        res = speculative_generate(engine, ReplayDraft(0.0), _cfg(spec, max_context=30), prompt)
        assert res.tokens == want.tokens and res.stop_reason == want.stop_reason == "context"
        assert len(res.tokens) == 30 - len(prompt) + 1


def test_replay_oracle_follows_divergence():
    # an oracle engine keeps proposals useful even when the reference was computed for another prompt
    engine, oracle = ToyEngine(seed=19), ToyEngine(seed=19)
    draft = ReplayDraft(0.0, oracle=oracle)
    res = speculative_generate(engine, draft, _cfg("chain"), PROMPTS[2])
    assert res.tokens == _plain(engine, PROMPTS[2])
    assert res.accept_lengths[:2] == [16, 16]


def test_result_stats_and_errors():
    engine = ToyEngine(seed=1)
    res = speculative_generate(engine, ReplayDraft(0.0), _cfg("ddtree", budget=22), PROMPTS[1])
    s = res.stats()
    assert s["steps"] == res.steps == len(res.accept_lengths)
    assert s["al_hist"] == {"16": 2, "7": 1} and s["al_mean"] == pytest.approx(13.0)
    assert s["draft"] == "replay:0" and s["budget"] == 22 and s["tok_per_s"] > 0
    with pytest.raises(UsageError):
        speculative_generate(engine, None, _cfg("ddtree"), PROMPTS[1])
    with pytest.raises(UsageError):
        speculative_generate(engine, None, _cfg("medusa"), PROMPTS[1])
    with pytest.raises(UsageError):
        speculative_generate(engine, None, _cfg("none"), [])


def test_parse_draft_arg():
    assert parse_draft_arg("replay:0.1") == ("replay", 0.1)
    assert parse_draft_arg("replay") == ("replay", 0.0)
    assert parse_draft_arg(None) == ("none", None)
    assert parse_draft_arg("qwen3.5-27b-draft") == ("path", None)
    for bad in ("replay:x", "replay:1.5", "replay:-0.1"):
        with pytest.raises(UsageError):
            parse_draft_arg(bad)
