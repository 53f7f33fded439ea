"""`lucebox quantize` gives the same file as llama.cpp's quantizer applied to our F32 conversion:
every tensor's type and bytes, on tiny random Qwen3.5 checkpoints of several shapes."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from lucebox_cli.gguf_io import GGUFModel
from lucebox_cli.quant.convert import quantize
from lucebox_cli.quant.mixes import FTYPES, choose_types, use_more_bits
from tiny_models import make_tiny_checkpoint

# (hidden, n_layers, tied, hv_ratio): 256 keeps K-quants on the hidden-wide rows, 320 and 192 force
# the 32-block fallbacks everywhere, 200 (not a multiple of 32) forces the F16 fallback.
MODELS = {
    "h256-L4-tied": (256, 4, True, 1),
    "h256-L8-untied-hv2": (256, 8, False, 2),
    "h320-L12-tied": (320, 12, True, 1),
    "h192-L8-untied": (192, 8, False, 1),
    "h200-L4-tied": (200, 4, True, 1),
}
MIXES = ["Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_K", "Q5_K", "F16", "BF16"]


def _shrink_tokenizer(folder, n_tokens: int = 1000) -> None:
    """Keep the first ids of the real tokenizer (+ its special tokens renumbered after them): the
    250k-token vocabulary only slows every header read and write, and does not touch tensor bytes."""
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < n_tokens}
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = [m for m in tok["model"]["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    for k, added in enumerate(tok["added_tokens"]):
        added["id"] = n_tokens + k
    path.write_text(json.dumps(tok))


def _llama_quantize(src, dst, qtype: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    _, pure, ftype = FTYPES[qtype]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.pure = pure
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed ({rc})"


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    hidden, n_layers, tied, hv_ratio = MODELS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder = make_tiny_checkpoint(root / "hf", hidden=hidden, n_layers=n_layers, tied=tied,
                                  hv_ratio=hv_ratio, vocab=1024, seed=n_layers)
    _shrink_tokenizer(folder)
    f32 = root / "model-F32.gguf"
    quantize(folder, f32, "F32")
    return folder, f32, root


def _assert_same_tensors(ours_path, ref_path):
    ours, ref = GGUFModel(ours_path), GGUFModel(ref_path)
    assert sorted(ours.tensor_names) == sorted(ref.tensor_names)
    wrong_type, wrong_bytes = [], []
    for name in ref.tensor_names:
        a, b = ours.tensor_info(name), ref.tensor_info(name)
        if (a.ggml_type, a.shape) != (b.ggml_type, b.shape):
            wrong_type.append(f"{name}: ours {a.ggml_type}{list(a.shape)}, llama.cpp {b.ggml_type}{list(b.shape)}")
        elif not np.array_equal(ours.raw(name), ref.raw(name)):
            wrong_bytes.append(f"{name} ({a.ggml_type})")
    assert not wrong_type, "types differ:\n" + "\n".join(wrong_type)
    assert not wrong_bytes, "bytes differ:\n" + "\n".join(wrong_bytes)
    return ours, ref


@pytest.mark.parametrize("qtype", MIXES)
def test_same_types_and_bytes_as_llama_cpp(model, qtype):
    # ours from our F32 GGUF (the GGUF → GGUF path) vs llama.cpp from the same file
    folder, f32, root = model
    ours_path = quantize(f32, root / f"ours-{qtype}.gguf", qtype).out
    ref_path = root / f"ref-{qtype}.gguf"
    _llama_quantize(f32, ref_path, qtype)
    ours, ref = _assert_same_tensors(ours_path, ref_path)
    assert ours.tensor_names == ref.tensor_names  # same order too: llama.cpp's (layer, name)


def test_hf_folder_to_q4_k_m_equals_llama_cpp_on_our_f32(model):
    # the acceptance check: HF folder → Q4_K_M directly, vs llama.cpp on our F32 output
    folder, f32, root = model
    ours = quantize(folder, root / "direct-Q4_K_M.gguf", "Q4_K_M").out
    ref = root / "ref-direct-Q4_K_M.gguf"
    _llama_quantize(f32, ref, "Q4_K_M")
    _assert_same_tensors(ours, ref)


def test_more_bits_rule_on_real_layer_counts():
    # 0.8B: 24 layers; attn_v/attn_qkv counter runs over all 24 (one per layer), like ffn_down's
    shapes = [(f"blk.{i}.{k}.weight", (1024, 1024), "F32") for i in range(24) for k in
              (("attn_v" if (i + 1) % 4 == 0 else "attn_qkv"), "ffn_down")]
    types = choose_types(shapes + [("token_embd.weight", (248320, 1024), "F32")], "Q4_K_M", 24)
    more = [i for i in range(24) if use_more_bits(i, 24)]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    for i in range(24):
        kind = "attn_v" if (i + 1) % 4 == 0 else "attn_qkv"
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.{kind}.weight"] == want
        assert types[f"blk.{i}.ffn_down.weight"] == want
    assert types["token_embd.weight"] == "Q6_K"


@pytest.mark.slow
def test_full_vocab_tied_embedding_q4_k_m(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "hf", hidden=256, n_layers=4, tied=True)
    _shrink_tokenizer(folder)
    f32 = quantize(folder, tmp_path / "m-F32.gguf", "F32").out
    ours = quantize(folder, tmp_path / "ours.gguf", "Q4_K_M").out
    _llama_quantize(f32, tmp_path / "ref.gguf", "Q4_K_M")
    _assert_same_tensors(ours, tmp_path / "ref.gguf")
