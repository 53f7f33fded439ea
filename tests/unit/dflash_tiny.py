"""Tiny random Qwen3.5 GGUFs at shapes the 27B CUDA ops take (tests of engines/dflash.py).

`make_tiny_q4km(dir, n_layers=4, hv_ratio=3, tied=False, vocab=4096, seed=0) -> Path` writes an HF
checkpoint with tiny_models' random-weight recipe but the ops' head sizes (head_dim 256, dk = dv = 128,
hidden 256, ffn 512, 4 query heads on 1 kv head, Hk = 2 key heads and Hv = hv_ratio * Hk value heads),
then quantizes it with lucebox's own Q4_K_M (bit-exact with llama.cpp). Every matrix K (hidden 256, ffn
512, Hv*128, heads*256) is a multiple of 256, so the file holds real K-quants (Q4_K, Q6_K), no fallbacks.
A small vocabulary keeps the CPU reference fast; token ids stay below it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
from tiny_models import _random_weights, _text_config, qwen35_tokenizer_json, write_safetensors

from lucebox_cli.engines.base import Tree

OPS_DIMS = dict(head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128, num_attention_heads=4,
                num_key_value_heads=1, linear_num_key_heads=2, intermediate_size=512)


def tiny_config(n_layers: int, hv_ratio: int, tied: bool, vocab: int, hidden: int = 256) -> dict:
    interval = 2 if n_layers < 8 else 4
    cfg = _text_config(hv_ratio, tied, n_layers, hidden, vocab, interval)
    cfg.update(OPS_DIMS)
    cfg["linear_num_value_heads"] = OPS_DIMS["linear_num_key_heads"] * hv_ratio
    return cfg


def make_tiny_q4km(dir: str | os.PathLike, *, n_layers: int = 4, hv_ratio: int = 3, tied: bool = False,
                   vocab: int = 4096, seed: int = 0, ftype: str = "Q4_K_M") -> Path:
    from lucebox_cli.quant.convert import quantize

    folder = Path(dir)
    out = folder.with_name(folder.name + f"-{ftype}.gguf")
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(n_layers, hv_ratio, tied, vocab)
    tensors = _random_weights(cfg, np.random.default_rng(seed))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", tensors)
    shutil.copyfile(qwen35_tokenizer_json(), folder / "tokenizer.json")
    quantize(folder, out, ftype, overwrite=True)
    shutil.rmtree(folder)  # the float checkpoint is 8x the GGUF; only the GGUF is used (and carried)
    return out


def branched_tree(seed: int, n: int, vocab: int = 4096) -> Tree:
    """A random n-slot tree for the 27B engine tests: a spine (60%) with branches to earlier slots."""
    rng = np.random.default_rng(seed)
    par = [-1] + [i - 1 if rng.random() < 0.6 else int(rng.integers(0, i)) for i in range(1, n)]
    return Tree(rng.integers(0, vocab, n), np.asarray(par))
