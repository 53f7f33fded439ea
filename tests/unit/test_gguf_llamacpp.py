"""Our GGUF files against llama.cpp (llama-cpp-python): it must load what we write (complete qwen35
metadata and tokenizer), compute the same logits as our CPU engine, and tokenize the same way."""

from __future__ import annotations

import numpy as np
import pytest

from lucebox_cli.gguf_io import GGUFModel
from lucebox_cli.models.qwen35 import load_hf_checkpoint
from lucebox_cli.models.qwen35_gguf import load_model_gguf, write_model_gguf
from lucebox_cli.tokenizer import Tokenizer

llama_cpp = pytest.importorskip("llama_cpp")
tiny_models = pytest.importorskip("tiny_models")
cpu = pytest.importorskip("lucebox_cli.engines.cpu")

PROMPT = "def add(a, b):\n    return a + b  # 你好 😀\n"
STRUCTURES = {"hk=hv-tied": dict(hv_ratio=1, tied=True), "hv=3hk-untied": dict(hv_ratio=3, tied=False)}


def _rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


@pytest.fixture(scope="module", params=sorted(STRUCTURES))
def tiny(request, tmp_path_factory):
    """(HF folder, cfg, weights, tokenizer, path of our F32 GGUF) for one tiny structure."""
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny_models.make_tiny_checkpoint(root / "hf", n_layers=4, **STRUCTURES[request.param])
    cfg, weights = load_hf_checkpoint(folder)
    tok = Tokenizer.from_hf_folder(folder)
    path = write_model_gguf(root / "tiny-f32.gguf", cfg, weights, tok, types="F32", name="tiny")
    return folder, cfg, weights, tok, path


def _llama(path, n_ctx=64):
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, n_threads=2, verbose=False)


def _llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def test_llamacpp_logits_match_cpu_engine(tiny):
    _, cfg, weights, tok, path = tiny
    ids = tok.encode(PROMPT)
    ours = cpu.CPUEngine(cfg, weights, max_context=64).prefill(ids, all_logits=True)
    theirs = _llama_logits(_llama(path), ids)
    assert theirs.shape == ours.shape == (len(ids), cfg.vocab)
    errors = [_rel_rms(theirs[i], ours[i]) for i in range(len(ids))]
    assert max(errors) < 1e-3, errors


def test_llamacpp_tokenizes_like_us(tiny):
    _, _, _, tok, path = tiny
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in (PROMPT, "<|im_start|>user\nhi<|im_end|>\n", "  spaces\t\tand\n\n\nnewlines  ", "naïve 日本語"):
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text), text
    assert llm.token_eos() == 248046


def test_load_model_gguf_round_trip(tiny):
    _, cfg, weights, tok, path = tiny
    cfg2, weights2, tok2 = load_model_gguf(path)
    assert (cfg2.tied, cfg2.vocab, cfg2.hv, cfg2.hk, cfg2.layer_types) == (cfg.tied, cfg.vocab, cfg.hv, cfg.hk, cfg.layer_types)
    assert sorted(weights2) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(weights2[name], value, err_msg=name)
    assert tok2.encode(PROMPT) == tok.encode(PROMPT)
    meta = GGUFModel(path).metadata
    assert meta["general.file_type"] == 0 and meta["general.name"] == "tiny"


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["F16", "BF16"])
def test_llamacpp_loads_half_precision(tiny, tmp_path, ftype):
    _, cfg, weights, tok, _ = tiny
    path = write_model_gguf(tmp_path / f"tiny-{ftype}.gguf", cfg, weights, tok, types=ftype)
    model = GGUFModel(path)
    assert model.tensor_info("blk.0.ffn_up.weight").ggml_type == ftype
    assert model.tensor_info("blk.0.attn_norm.weight").ggml_type == "F32"
    cfg2, rounded, _ = load_model_gguf(path)
    ids = tok.encode(PROMPT)
    ours = cpu.CPUEngine(cfg2, rounded, max_context=64).prefill(ids, all_logits=True)
    theirs = _llama_logits(_llama(path), ids)
    # llama.cpp also rounds activations to the weight type inside matmuls: a looser bound.
    assert _rel_rms(theirs, ours) < 2e-2
