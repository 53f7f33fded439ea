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


# ---- the CPU reference engine on tiny random Qwen3.5 checkpoints ----

CPU_VOCAB = 1024
CPU_PROMPTS = [list(np.random.default_rng(100 + s).integers(0, CPU_VOCAB, size=2 + 3 * s)) for s in range(3)]


def write_random_dflash(folder, hidden: int, vocab: int, target_layers, seed: int = 0):
    """A random z-lab DFlash folder (config.json + model.safetensors, HF names) for a tiny target."""
    import json

    from safetensors.numpy import save_file

    from lucebox_cli.models import dflash_draft as dd

    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_target_layers": 4, "rms_norm_eps": 1e-6, "rope_theta": 1e7, "vocab_size": vocab,
        "block_size": 16, "dflash_config": {"target_layer_ids": list(target_layers), "mask_token_id": vocab - 1},
    }
    top = {v: k for k, v in dd._TOP_NAMES.items()}
    per_layer = {v: k for k, v in dd._LAYER_NAMES.items()}
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in dd.DFlashConfig.from_hf(cfg).tensor_shapes().items():
        if name in top:
            hf = top[name]
        else:
            _, i, rest = name.split(".", 2)
            hf = f"layers.{i}.{per_layer[rest]}"
        if len(shape) == 1:
            tensors[hf] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[hf] = (rng.standard_normal(shape) * shape[1] ** -0.5).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module", params=[(1, True), (3, False)], ids=["hv1-tied", "hv3-untied"])
def cpu_model(request, tmp_path_factory):
    from tiny_models import make_tiny_checkpoint

    from lucebox_cli.models.qwen35 import load_hf_checkpoint

    hv_ratio, tied = request.param
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), hv_ratio=hv_ratio, tied=tied, vocab=CPU_VOCAB)
    return load_hf_checkpoint(folder)


def _cpu_engine(model, **kw):
    from lucebox_cli.engines.cpu import CPUEngine

    return CPUEngine(model[0], model[1], max_context=256, **kw)


def _cpu_state(engine) -> dict[str, np.ndarray]:
    """The committed state in use (the CPU engine's internals: KV rows 0..n−1, DeltaNet, conv, taps)."""
    n = engine.n_past
    out = {f"k{i}": c[:n] for i, c in engine._k_cache.items()}
    out.update({f"v{i}": c[:n] for i, c in engine._v_cache.items()})
    out.update({f"state{i}": s for i, s in engine._state.items()})
    out.update({f"conv{i}": c for i, c in engine._conv.items()})
    out["features"] = engine.features
    return out


def _rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = np.sqrt(np.mean(b**2)) if b.size else 0.0
    return float(np.sqrt(np.mean((a - b) ** 2)) / denom) if denom > 0 else float(np.abs(a - b).max(initial=0.0))


@pytest.mark.parametrize(
    "spec,budget", [("chain", 15), ("ddtree", 4), ("ddtree", 22)], ids=["chain", "ddtree-B4", "ddtree-B22"]
)
def test_cpu_lossless_replay(cpu_model, spec, budget):
    engine = _cpu_engine(cpu_model)
    for i, prompt in enumerate(CPU_PROMPTS):
        want = speculative_generate(engine, None, _cfg("none", max_tokens=32), prompt).tokens
        # accept-none verifies one tree per token, the slowest case: once per model is enough here
        for rate in (0.0, 0.3, 1.0) if budget == 4 else (0.0, 0.3):
            res = speculative_generate(engine, ReplayDraft(rate, seed=i), _cfg(spec, budget=budget, max_tokens=32), prompt)
            assert res.tokens == want, f"prompt {i} rate {rate}"
            if rate == 0.0:
                assert res.accept_lengths[:-1] == [min(budget, 15) + 1] * (len(res.accept_lengths) - 1)


def test_cpu_lossless_random_dflash_draft(cpu_model, tmp_path):
    from lucebox_cli.models.dflash_draft import DFlashDraft
    from lucebox_cli.spec.drafts import DFlashDraftAdapter

    cfg, weights = cpu_model
    folder = write_random_dflash(tmp_path / "draft", cfg.hidden, CPU_VOCAB, target_layers=(1, 2))
    head = weights["token_embd.weight" if cfg.tied else "output.weight"]
    draft = DFlashDraftAdapter(DFlashDraft.from_path(folder, weights["token_embd.weight"], head))
    engine = _cpu_engine(cpu_model, tap_layers=draft.tap_layers)
    # a random draft is accepted about never: one full tree per token, so short runs
    for prompt in CPU_PROMPTS[:2]:
        want = speculative_generate(engine, None, _cfg("none", max_tokens=12), prompt).tokens
        for spec in ("chain", "ddtree"):
            res = speculative_generate(engine, draft, _cfg(spec, max_tokens=12), prompt)
            assert res.tokens == want and res.draft == "dflash"


@pytest.mark.parametrize("spec", ["chain", "ddtree"])
def test_cpu_state_after_every_commit_equals_sequential(cpu_model, spec):
    from lucebox_cli.engines.cpu import CPUEngine

    class Checked(CPUEngine):
        def prefill(self, token_ids):
            self.fed = [int(t) for t in token_ids]
            return super().prefill(token_ids)

        def verify(self, tree):
            self.last_tree = tree
            return super().verify(tree)

        def commit(self, accepted_slots):
            super().commit(accepted_slots)
            self.fed += self.last_tree.tokens[list(accepted_slots)].tolist()
            ref.reset()
            ref.prefill(self.fed[:n_prompt])
            for t in self.fed[n_prompt:]:
                ref.step(t)
            mine, want = _cpu_state(self), _cpu_state(ref)
            assert mine.keys() == want.keys()
            for key in want:
                # verify runs all slots through [N, hidden] matmuls, step() through [1, hidden] ones: BLAS
                # may sum in another order, so equality holds to fp32 rounding, not bitwise
                assert _rel_rms(mine[key], want[key]) < 1e-5, f"{key} after committing {accepted_slots}"
            self.checked += 1

    cfg, weights = cpu_model
    taps = (1, 2)
    engine = Checked(cfg, weights, max_context=256, tap_layers=taps)
    engine.checked = 0
    ref = CPUEngine(cfg, weights, max_context=256, tap_layers=taps)
    prompt = CPU_PROMPTS[1]
    n_prompt = len(prompt)
    res = speculative_generate(engine, ReplayDraft(0.3, seed=1), _cfg(spec, max_tokens=40), prompt)
    assert engine.checked == res.steps - 1 >= 5


# ---- `lucebox run --spec` end to end ----


def test_run_cli_spec_equals_none(tmp_path):
    import json

    from tiny_models import make_tiny_checkpoint
    from typer.testing import CliRunner

    from lucebox_cli.cli.app import make_app

    model = make_tiny_checkpoint(tmp_path / "m", hv_ratio=3, tied=False)
    draft = write_random_dflash(tmp_path / "d", hidden=64, vocab=248320, target_layers=(1, 2))
    base = ["run", str(model), "--engine", "cpu", "--prompt-ids", "9707,11,1879,25,220", "--max-tokens", "20",
            "--json"]

    def run(*extra):
        res = CliRunner().invoke(make_app(), base + list(extra))
        assert res.exit_code == 0, (res.output, res.exception)
        return json.loads(res.output)

    want = run()["tokens"]
    dflash = run("--draft", str(draft), "--spec", "ddtree", "--budget", "22")
    assert dflash["tokens"] == want and dflash["stats"]["draft"].startswith("dflash")
    replay = run("--draft", "replay:0.1", "--spec", "ddtree", "--budget", "22")
    stats = replay["stats"]
    assert replay["tokens"] == want and stats["draft"] == "replay:0.1"
    assert stats["al_mean"] > 3 and sum(stats["al_hist"].values()) == stats["steps"] and stats["tok_per_s"] > 0
