"""`lucebox run` and api.generate end to end on tiny random checkpoints (HF folder and GGUF)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lucebox_cli import api
from lucebox_cli.cli.app import make_app
from lucebox_cli.config import RunConfig
from lucebox_cli.models.qwen35 import load_hf_checkpoint
from tiny_models import make_tiny_checkpoint

torch = pytest.importorskip("torch")
transformers_qwen = pytest.importorskip("transformers.models.qwen3_5")

STRUCTURES = {"Hk2-Hv2-tied": dict(hv_ratio=1, tied=True), "Hk2-Hv6-untied": dict(hv_ratio=3, tied=False)}
PROMPT = [9707, 11, 1879, 0, 248045, 872, 198]
REAL_LOAD_MODEL = api.load_model  # before the module's memoising patch


def run_cli(*args: str):
    result = CliRunner().invoke(make_app(), ["run", *args])
    return result


@pytest.fixture(scope="module", autouse=True)
def load_once():
    """Memoise api.load_model per path: the first call (the CLI's, in the first test) is the real one;
    later tests reuse it, because parsing the 248k-token tokenizer takes seconds."""
    real, cache = api.load_model, {}

    def cached(name):
        if str(name) not in cache:
            cache[str(name)] = real(name)
        return cache[str(name)]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "load_model", cached)
        yield


@pytest.fixture(scope="module", params=list(STRUCTURES), ids=list(STRUCTURES))
def checkpoint(request, tmp_path_factory):
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp(request.param), seed=11, **STRUCTURES[request.param])
    hf = transformers_qwen.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor(PROMPT)[None], max_new_tokens=16, do_sample=False)
    return folder, out[0, len(PROMPT) :].tolist()


def test_run_json_matches_hf_greedy(checkpoint):
    folder, want = checkpoint
    ids = ",".join(map(str, PROMPT))
    result = run_cli(str(folder), "--engine", "cpu", "--prompt-ids", ids, "--max-tokens", "16", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["prompt_tokens", "tokens", "text", "stats"]
    assert doc["prompt_tokens"] == PROMPT and doc["tokens"] == want
    assert doc["stats"]["generated_tokens"] == 16 and doc["stats"]["engine"] == "cpu"


def test_gguf_of_the_same_model_gives_the_same_ids(checkpoint, tmp_path):
    """F32 GGUF written from our internal weights; the tokenizer is embedded for the untied model only
    (it costs seconds each way), so the tied one also covers a GGUF without tokenizer."""
    from lucebox_cli import gguf_io

    folder, want = checkpoint
    cfg, weights = load_hf_checkpoint(folder)
    tok = api.load_model(str(folder)).tokenizer
    meta = None if cfg.tied else tok.to_gguf_metadata(vocab_size=cfg.vocab)
    path = gguf_io.write_gguf(tmp_path / "tiny.gguf", "qwen35", cfg.to_gguf_metadata(), sorted(weights.items()),
                              tokenizer=meta)
    model = api.load_model(str(path))
    assert model.format == "gguf" and model.cfg == cfg and (model.tokenizer is None) == cfg.tied
    ids = ",".join(map(str, PROMPT))
    result = run_cli(str(path), "--engine", "cpu", "--prompt-ids", ids, "--max-tokens", "16", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"] == want


def test_text_prompt_streams_and_reports(checkpoint):
    folder, _ = checkpoint
    result = run_cli(str(folder), "--prompt", "Hello, world", "--chat", "--max-tokens", "5")
    assert result.exit_code == 0, result.output
    assert "prompt " in result.stderr and "generated 5 tokens" in result.stderr and "tok/s" in result.stderr
    # --engine auto on a model no GPU engine serves falls back to cpu and says why
    assert "CPU reference engine" in result.stderr
    model = api.load_model(str(folder))
    cfg = RunConfig(model=str(folder), engine="cpu", max_tokens=5, chat=True)
    res = api.generate(cfg, prompt="Hello, world", model=model)
    assert result.stdout.rstrip("\n") == res.text
    assert res.prompt_tokens == model.tokenizer.encode_chat([{"role": "user", "content": "Hello, world"}])


def test_sampling_is_seeded_and_spec_is_lossless(checkpoint):
    folder, want = checkpoint
    model = api.load_model(str(folder))
    base = RunConfig(model=str(folder), engine="cpu", max_tokens=16, stop_at_eos=False)
    hot = base.replace(temperature=1.0, top_k=40, seed=5)
    opened = api.open_engine(hot, model)
    sampled = [api.generate(hot, PROMPT, opened=opened).tokens for _ in range(2)]
    sampled.append(api.generate(hot, PROMPT, model=model).tokens)
    assert sampled[0] == sampled[1] == sampled[2] and sampled[0] != want
    streamed: list[int] = []
    spec = base.replace(spec="ddtree", draft="replay:0.3", budget=6)
    res = api.generate(spec, PROMPT, model=model, on_token=lambda t, piece: streamed.append(t))
    assert res.tokens == want and [t for t in streamed if t >= 0] == want
    assert res.stats["mode"] == "ddtree" and res.stats["steps"] < 16


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt", "hi", "--prompt-ids", "1"], "exactly one"),
        (["--prompt-ids", "1,x"], "comma-separated"),
        (["--prompt-ids", "1", "--spec", "tree"], "--spec"),
        (["--prompt-ids", "1", "--engine", "tpu"], "--engine"),
        (["--prompt-ids", "1", "--engine", "cuda"], "CUDA|GPU|megakernel"),
        (["--prompt-ids", "1", "--spec", "chain"], "needs a draft"),
    ],
    ids=["two-prompts", "bad-ids", "bad-spec", "bad-engine", "no-cuda", "no-draft"],
)
def test_run_errors_are_one_line(checkpoint, args, message):
    folder, _ = checkpoint
    result = run_cli(str(folder), *args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    import re

    assert re.search(message, result.stderr), result.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    result = run_cli(str(tmp_path / "nope"), "--prompt-ids", "1")
    assert result.exit_code != 0 and "no such file" in result.stderr
    assert np.all([line.startswith(("error:", "hint:")) for line in result.stderr.strip().splitlines()])


def test_alias_resolves_through_the_local_cache(checkpoint, monkeypatch):
    """An alias goes registry.resolve -> hub.find_local (never the network) -> target/tokenizer dirs."""
    from lucebox_cli import hub

    folder, _ = checkpoint
    if "Hv6" not in folder.name:
        pytest.skip("the wiring is the same for both structures")
    files = tuple(
        hub.PulledFile("Qwen/Qwen3.5-0.8B", p.name, p.stat().st_size, p, role)
        for p in sorted(folder.iterdir())
        for role in (("tokenizer",) if p.name == "tokenizer.json" else ("target",))
    )
    repo = hub.RepoResult("Qwen/Qwen3.5-0.8B", "main", "0" * 40, ("target", "tokenizer"), folder)
    asked = []

    def find_local(spec, include=None, offline=None):
        asked.append(spec.alias or spec.name)
        return hub.PullResult(spec.name, (repo,), files, None, offline=True)

    monkeypatch.setattr(hub, "find_local", find_local)
    model = REAL_LOAD_MODEL("qwen3.5-0.8b")
    assert asked and model.path == folder and model.format == "safetensors"
    assert model.tokenizer is not None and model.draft_path is None
    assert model.eos_ids == (model.tokenizer.im_end_id, model.tokenizer.endoftext_id)


def test_no_gpu_is_said_before_engine_shape_limits(checkpoint, monkeypatch):
    # hidden 64 is also outside the megakernel's shapes, but the first reason a user needs is "no GPU".
    monkeypatch.setenv("LUCEBOX_FORCE_NO_GPU", "1")
    folder, _ = checkpoint
    result = run_cli(str(folder), "--prompt-ids", "1", "--engine", "cuda")
    assert result.exit_code != 0 and "no NVIDIA GPU" in result.stderr, result.stderr
    auto = run_cli(str(folder), "--prompt-ids", "1", "--max-tokens", "2", "--json")
    assert auto.exit_code == 0, auto.stderr
    assert "no NVIDIA GPU" in json.loads(auto.stdout)["stats"]["note"]
