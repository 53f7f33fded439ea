"""Row-slab packing in quant/convert.py: a tensor packed a slab of rows at a time gives the same
bytes as packed whole (every block format packs rows independently), for every type and for whole
conversions, from HF folders (F32 and BF16) and from F32 GGUFs; and the pass-through rule of
models/qwen35.py that decides which tensors may be read in slabs agrees with hf_to_internal."""

from __future__ import annotations

import numpy as np
import pytest

from lucebox_cli.gguf_io import GGUFModel
from lucebox_cli.models import qwen35
from lucebox_cli.quant import convert
from test_quant_mix import _shrink_tokenizer
from tiny_models import make_tiny_checkpoint

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("ggml_type", TYPES)
def test_slabs_pack_like_the_whole_tensor(ggml_type):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((50, 512)) * rng.uniform(1e-3, 10, (50, 1))).astype(np.float32)
    x[3] = 0.0
    x[17, 100] = 1e4
    whole = convert.encode(x, ggml_type)
    # 7 does not divide 50: the last slab is short
    slabbed = convert.encode_rows(lambda a, b: x[a:b], x.shape, ggml_type, slab_rows=7)
    assert slabbed.shape == whole.shape
    np.testing.assert_array_equal(slabbed, whole)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    path = make_tiny_checkpoint(root / "hf", hidden=256, n_layers=4, tied=False, hv_ratio=2, vocab=1000,
                                dtype=request.param)
    _shrink_tokenizer(path)
    return path


def _tensors(path) -> dict[str, tuple[str, bytes]]:
    with GGUFModel(path) as m:
        return {n: (m.tensor_info(n).ggml_type, m.raw(n).tobytes()) for n in m.tensor_names}


@pytest.mark.parametrize("qtype", ["Q4_K_M", "BF16"])
def test_conversion_in_slabs_equals_whole(folder, tmp_path, monkeypatch, qtype):
    whole = convert.quantize(folder, tmp_path / "whole.gguf", qtype).out
    calls = []
    encode = convert.encode
    monkeypatch.setattr(convert, "encode", lambda x, t: calls.append(x.shape) or encode(x, t))
    monkeypatch.setattr(convert, "SLAB_ROWS", 300)
    slabbed = convert.quantize(folder, tmp_path / "slabbed.gguf", qtype).out
    # 1000-row embedding and head: 3 slabs of 300 and one of 100, each
    assert calls.count((100, 256)) == 2 and calls.count((300, 256)) >= 6
    assert _tensors(slabbed) == _tensors(whole)
    f32 = convert.quantize(folder, tmp_path / "f32.gguf", "F32").out
    from_gguf = convert.quantize(f32, tmp_path / "from-gguf.gguf", qtype).out
    assert _tensors(from_gguf) == _tensors(whole)


def test_passthrough_rule_matches_the_fix_ups(folder):
    cfg = qwen35.Qwen35Config.from_hf_config(qwen35.read_hf_config(folder))
    assert cfg.value_per_key == 2
    ckpt = qwen35.HFCheckpoint(folder)
    passed = set()
    for name in ckpt.names:
        x = ckpt.load(name)
        converted = qwen35.hf_to_internal(name, x, cfg)
        if qwen35.hf_passthrough(name, cfg):
            (internal, y), = converted
            np.testing.assert_array_equal(y, x, err_msg=name)
            passed.add(internal.split(".", 2)[-1] if internal.startswith("blk.") else internal)
        rows = ckpt.rows(name, 1, 3) if x.ndim else x
        np.testing.assert_array_equal(rows, x[1:3] if x.ndim else x, err_msg=name)
    assert passed == {"token_embd.weight", "output.weight", "ffn_gate.weight", "ffn_up.weight",
                      "ffn_down.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                      "attn_output.weight", "ssm_norm.weight"}
