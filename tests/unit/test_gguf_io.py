"""GGUF read/write: round trips per tensor type, metadata, streaming, and every corruption path."""

from __future__ import annotations

import errno
import os

import gguf
import numpy as np
import pytest

from lucebox_cli import gguf_io
from lucebox_cli.errors import BadModelFile, LuceboxError
from lucebox_cli.gguf_io import FloatTensor, GGUFModel, QuantTensor, TensorPlan, TensorStream, write_gguf

META = {
    "qwen35.block_count": 4,
    "qwen35.rope.freq_base": 10000000.0,
    "qwen35.attention.layer_norm_rms_epsilon": 0.5,
    "qwen35.rope.dimension_sections": [11, 11, 10, 0],
    "qwen35.attention.recurrent_layers": [True, True, True, False],
    "general.name": "tiny ✓",
    "tokenizer.ggml.tokens": ["a", "Ġb", "<|im_end|>"],
    "tokenizer.ggml.add_bos_token": False,
}


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w32": rng.standard_normal((5, 64)).astype(np.float32),
        "w16": rng.standard_normal((3, 32)).astype(np.float32),
        "wbf": rng.standard_normal((7, 33)).astype(np.float32),
        "norm": rng.standard_normal(17).astype(np.float32),
        "q8": rng.standard_normal((4, 96)).astype(np.float32),
    }


def _write_sample(path, **kw):
    a = _arrays()
    q8 = gguf.quants.quantize(a["q8"], gguf.GGMLQuantizationType.Q8_0)
    tensors = [
        ("w32", a["w32"]),
        ("w16", FloatTensor(a["w16"], "F16")),
        ("wbf", (a["wbf"], "BF16")),
        ("norm", a["norm"]),
        ("q8", QuantTensor("Q8_0", (4, 96), q8)),
    ]
    return write_gguf(path, "qwen35", META, tensors, **kw), a, q8


def test_round_trip_types_and_metadata(tmp_path):
    path, a, q8 = _write_sample(tmp_path / "m.gguf")
    m = GGUFModel(path)
    assert m.architecture == "qwen35"
    assert m.tensor_names == ["w32", "w16", "wbf", "norm", "q8"]
    for key, value in META.items():
        assert m.metadata[key] == value, key
    info = m.tensor_info("w32")
    assert (info.ggml_type, info.shape, info.nbytes) == ("F32", (5, 64), 5 * 64 * 4)
    assert all(m.tensor_info(n).offset % 32 == 0 for n in m.tensor_names)
    np.testing.assert_array_equal(m.dequant("w32"), a["w32"])
    np.testing.assert_array_equal(m.dequant("norm"), a["norm"])
    np.testing.assert_array_equal(m.dequant("w16"), a["w16"].astype(np.float16).astype(np.float32))
    bf = gguf.quants.dequantize(gguf.quants.quantize(a["wbf"], gguf.GGMLQuantizationType.BF16),
                                gguf.GGMLQuantizationType.BF16)
    assert m.tensor_info("wbf").ggml_type == "BF16"
    np.testing.assert_array_equal(m.dequant("wbf"), bf)
    assert m.tensor_info("q8").ggml_type == "Q8_0" and m.tensor_info("q8").shape == (4, 96)
    np.testing.assert_array_equal(m.raw("q8"), q8.reshape(-1))
    np.testing.assert_array_equal(m.dequant("q8"), gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
    assert m.dequant("w32").dtype == np.float32 and m.dequant("q8").dtype == np.float32


def test_official_reader_agrees(tmp_path):
    # Our writer and parser are our own (for speed); the gguf package's reader is the referee.
    path, a, q8 = _write_sample(tmp_path / "m.gguf")
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "qwen35"
    assert r.fields["qwen35.block_count"].types == [gguf.GGUFValueType.UINT32]
    assert r.fields["qwen35.rope.dimension_sections"].contents() == [11, 11, 10, 0]
    assert r.fields["tokenizer.ggml.tokens"].contents() == META["tokenizer.ggml.tokens"]
    ours = GGUFModel(path)
    for t in r.tensors:
        info = ours.tensor_info(t.name)
        assert (info.offset, info.nbytes, info.ggml_type) == (t.data_offset, t.n_bytes, t.tensor_type.name)
        assert info.shape == tuple(reversed(t.shape.tolist()))
    np.testing.assert_array_equal(r.tensors[0].data, a["w32"])


def test_float_value_rounding(tmp_path):
    # Floats are FLOAT32 on disk (what llama.cpp expects), so 1e-6 comes back as its f32 value.
    write_gguf(tmp_path / "f.gguf", "qwen35", {"k.eps": 1e-6, "k.big": 2**40, "k.neg": -3},
               [("t", np.zeros(32, np.float32))])
    m = GGUFModel(tmp_path / "f.gguf")
    assert m.metadata["k.eps"] == pytest.approx(1e-6, rel=1e-7)
    assert m.metadata["k.big"] == 2**40 and m.metadata["k.neg"] == -3


# Byte offsets of the fp16 super-block scales (d, dmin) in each K-quant block.
_FP16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_dequant_k_quants_match_gguf(tmp_path, qtype):
    block, size = gguf_io.block_geometry(qtype)
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, size=(2 * 2, size), dtype=np.uint8)
    # Random bytes can spell inf/nan scales; pin them to finite values.
    for off in _FP16_FIELDS[qtype]:
        blocks[:, off : off + 2] = np.array([0.25], np.float16).view(np.uint8)
    blocks = blocks.reshape(2, 2 * size)
    write_gguf(tmp_path / "k.gguf", "qwen35", {}, [("k", QuantTensor(qtype, (2, 2 * block), blocks))])
    m = GGUFModel(tmp_path / "k.gguf")
    want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(m.dequant("k"), want)


def test_streaming_plan_and_progress(tmp_path):
    a = _arrays()
    plan = [TensorPlan("x", "F16", (5, 64)), TensorPlan("y", "F32", (17,))]
    seen = []

    def data():
        # Yielded lazily: the writer must not need it before the header is written.
        yield "x", FloatTensor(a["w32"], "F16")
        yield "y", a["norm"]

    write_gguf(tmp_path / "s.gguf", "qwen35", {}, TensorStream(plan, data()),
               progress=lambda done, total, name: seen.append((done, total, name)))
    m = GGUFModel(tmp_path / "s.gguf")
    np.testing.assert_array_equal(m.dequant("y"), a["norm"])
    assert seen == [(640, 708, "x"), (708, 708, "y")]


def test_stream_out_of_plan_leaves_nothing(tmp_path):
    plan = [TensorPlan("x", "F32", (4, 32))]
    with pytest.raises(ValueError, match="out of plan"):
        write_gguf(tmp_path / "s.gguf", "qwen35", {}, TensorStream(plan, [("x", np.zeros((4, 16), np.float32))]))
    assert os.listdir(tmp_path) == []


def test_interrupted_write_leaves_no_file(tmp_path):
    def data():
        yield "a", np.ones((2, 32), np.float32)
        raise KeyboardInterrupt  # the user pressed Ctrl-C mid-conversion

    plan = [TensorPlan("a", "F32", (2, 32)), TensorPlan("b", "F32", (2, 32))]
    with pytest.raises(KeyboardInterrupt):
        write_gguf(tmp_path / "out.gguf", "qwen35", {}, TensorStream(plan, data()))
    assert os.listdir(tmp_path) == []


def test_existing_file_is_replaced_atomically(tmp_path):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    plan = [TensorPlan("a", "F32", (2, 32))]

    def failing():
        raise RuntimeError("boom")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError):
        write_gguf(path, "qwen35", {}, TensorStream(plan, failing()))
    assert GGUFModel(path).tensor_names[0] == "w32"  # the old file is untouched
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


def test_refuses_to_overwrite_input(tmp_path):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    with pytest.raises(LuceboxError, match="input file"):
        write_gguf(path, "qwen35", {}, [("a", np.zeros(32, np.float32))], inputs=[path])
    with pytest.raises(LuceboxError, match="already exists"):
        write_gguf(path, "qwen35", {}, [("a", np.zeros(32, np.float32))], overwrite=False)


def test_disk_full_is_a_clear_error(tmp_path, monkeypatch):
    def full(self, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_io, "_write_tensor_data", full)
    with pytest.raises(LuceboxError, match="disk full") as info:
        write_gguf(tmp_path / "m.gguf", "qwen35", {}, [("a", np.zeros(32, np.float32))])
    assert info.value.hint
    assert os.listdir(tmp_path) == []


# -- corrupt files ------------------------------------------------------------------------------


def test_truncated_file_names_the_tensor(tmp_path):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    data = path.read_bytes()
    last = GGUFModel(path).tensor_info("q8")
    (tmp_path / "t.gguf").write_bytes(data[: last.offset + 10])
    with pytest.raises(BadModelFile, match="'q8'.*truncated"):
        GGUFModel(tmp_path / "t.gguf")


@pytest.mark.parametrize("keep", [3, 20, 100, 300])
def test_truncated_header(tmp_path, keep):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    (tmp_path / "t.gguf").write_bytes(path.read_bytes()[:keep])
    with pytest.raises(BadModelFile):
        GGUFModel(tmp_path / "t.gguf")


def test_flipped_magic(tmp_path):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    (tmp_path / "bad.gguf").write_bytes(bytes(data))
    with pytest.raises(BadModelFile, match="not a GGUF file"):
        GGUFModel(tmp_path / "bad.gguf")


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(BadModelFile, match="not a GGUF"):
        GGUFModel(tmp_path / "empty.gguf")
    with pytest.raises(BadModelFile, match="no such file"):
        GGUFModel(tmp_path / "nope.gguf")


def test_garbage_after_magic(tmp_path):
    (tmp_path / "v.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(BadModelFile, match="version"):
        GGUFModel(tmp_path / "v.gguf")
    # A plausible version, then a key count so large the file ends long before it.
    (tmp_path / "g.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(range(256)) * 4)
    with pytest.raises(BadModelFile, match="byte offset"):
        GGUFModel(tmp_path / "g.gguf")


def test_missing_tensor_and_shape_mismatch(tmp_path):
    path, _, _ = _write_sample(tmp_path / "m.gguf")
    m = GGUFModel(path)
    with pytest.raises(BadModelFile, match="missing tensor 'blk.0.attn_q.weight'"):
        m.require("blk.0.attn_q.weight")
    with pytest.raises(BadModelFile, match=r"'w32' has shape \[5, 64\], expected \[64, 5\]"):
        m.require("w32", (64, 5))
    assert m.require("w32", (5, 64)).shape == (5, 64)
    with pytest.raises(BadModelFile, match="missing tensor"):
        m.dequant("nope")


def _rows_sample(path):
    """A 7-row, 512-wide tensor of every type dequant_rows must take (2 K-quant blocks per row)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    tensors = [("F32", x), ("F16", FloatTensor(x, "F16")), ("BF16", FloatTensor(x, "BF16")),
               ("Q8_0", QuantTensor("Q8_0", (7, 512), gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)))]
    for qtype in ("Q4_K", "Q6_K"):
        _, size = gguf_io.block_geometry(qtype)
        blocks = rng.integers(0, 256, size=(7 * 2, size), dtype=np.uint8)
        for off in _FP16_FIELDS[qtype]:
            blocks[:, off : off + 2] = np.array([0.25], np.float16).view(np.uint8)
        tensors.append((qtype, QuantTensor(qtype, (7, 512), blocks.reshape(7, 2 * size))))
    tensors.append(("vec", rng.standard_normal(32).astype(np.float32)))
    return GGUFModel(write_gguf(path, "qwen35", {}, tensors))


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K"])
def test_dequant_rows_matches_whole_tensor(tmp_path, qtype):
    m = _rows_sample(tmp_path / "r.gguf")
    assert m.tensor_info(qtype).ggml_type == qtype
    whole = m.dequant(qtype)
    for rows in ([3], [6, 0, 3, 3], np.array([1, 5], np.int32), []):
        got = m.dequant_rows(qtype, rows)
        assert got.dtype == np.float32 and got.shape == (len(rows), 512)
        np.testing.assert_array_equal(got, whole[np.asarray(rows, np.int64)])


def test_dequant_rows_refuses_bad_rows_and_vectors(tmp_path):
    m = _rows_sample(tmp_path / "r.gguf")
    with pytest.raises(IndexError, match=r"0\.\.6"):
        m.dequant_rows("Q4_K", [7])
    with pytest.raises(IndexError):
        m.dequant_rows("F16", [-1])
    with pytest.raises(ValueError, match="2-D"):
        m.dequant_rows("vec", [0])


def test_lazy_weights_dequantize_on_lookup_only(tmp_path, monkeypatch):
    m = _rows_sample(tmp_path / "r.gguf")
    calls = []
    real = GGUFModel.dequant
    monkeypatch.setattr(GGUFModel, "dequant", lambda self, name: calls.append(name) or real(self, name))
    w = gguf_io.LazyWeights(m)
    assert list(w) == m.tensor_names and len(w) == len(m.tensor_names) and "Q6_K" in w and "nope" not in w
    assert w.shape_of("Q4_K") == (7, 512) and [i.nbytes for i in w.infos()][0] == 7 * 512 * 4
    assert calls == []
    np.testing.assert_array_equal(w["Q8_0"], m.dequant("Q8_0"))
    assert calls == ["Q8_0", "Q8_0"]
    with pytest.raises(KeyError):
        w["nope"]
    with pytest.raises(TypeError):
        w["F32"] = np.zeros((7, 512), np.float32)  # read-only
