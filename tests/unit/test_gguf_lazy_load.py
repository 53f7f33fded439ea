"""api.load_model on a GGUF reads the header only: `weights` is a lazy gguf_io.LazyWeights (a lookup
dequantizes), the CPU engine gets the same logits through it as from eagerly dequantized weights, and
`lucebox bench speed` takes parameters and size from the tensor infos (the file's block bytes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dflash_tiny import make_tiny_q4km
from typer.testing import CliRunner

from lucebox_cli import api
from lucebox_cli.bench.runner import weight_sizes
from lucebox_cli.cli.app import make_app
from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.gguf_io import GGUFModel, LazyWeights
from lucebox_cli.models.qwen35_gguf import load_model_gguf


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_tiny_q4km(tmp_path_factory.mktemp("lazy") / "m2", n_layers=2, hv_ratio=1)


@pytest.fixture
def dequant_calls(monkeypatch):
    calls: list[str] = []
    real = GGUFModel.dequant
    monkeypatch.setattr(GGUFModel, "dequant", lambda self, name: calls.append(name) or real(self, name))
    return calls


def test_load_model_dequantizes_nothing(gguf, dequant_calls):
    model = api.load_model(gguf)
    assert dequant_calls == []
    assert isinstance(model.weights, LazyWeights) and model.gguf is model.weights.model
    assert model.format == "gguf" and set(model.weights) == set(model.gguf.tensor_names)
    assert model.weights.shape_of("token_embd.weight") == (model.cfg.vocab, model.cfg.hidden)
    assert model.gguf.tensor_info("blk.0.ffn_down.weight").ggml_type in ("Q4_K", "Q6_K")
    emb = model.weights["token_embd.weight"]
    assert dequant_calls == ["token_embd.weight"] and emb.dtype == np.float32


def test_cpu_engine_logits_unchanged_through_lazy_weights(gguf):
    model = api.load_model(gguf)
    cfg, eager, _ = load_model_gguf(gguf)  # every tensor dequantized up front (the old load)
    ids = np.random.default_rng(0).integers(0, cfg.vocab, 11)
    lazy_eng, eager_eng = CPUEngine(model.cfg, model.weights), CPUEngine(cfg, eager)
    np.testing.assert_array_equal(lazy_eng.prefill(ids), eager_eng.prefill(ids))
    np.testing.assert_array_equal(lazy_eng.step(int(ids[0])), eager_eng.step(int(ids[0])))


def test_weight_sizes_come_from_tensor_infos(gguf, dequant_calls):
    m = GGUFModel(gguf)
    params, nbytes = weight_sizes(LazyWeights(m))
    assert dequant_calls == []
    infos = [m.tensor_info(n) for n in m.tensor_names]
    assert params == sum(int(np.prod(i.shape)) for i in infos)
    assert nbytes == sum(i.nbytes for i in infos) < 4 * params  # block bytes, not float32


def test_bench_speed_rows_on_a_gguf(gguf):
    res = CliRunner().invoke(make_app(), ["bench", "speed", str(gguf), "--engine", "cpu", "-p", "5", "-n", "3",
                                          "-r", "1", "--warmup", "0", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    m = GGUFModel(gguf)
    infos = [m.tensor_info(n) for n in m.tensor_names]
    assert {r["test"] for r in rows} == {"pp5", "tg3"}
    for row in rows:
        assert row["params_m"] == pytest.approx(sum(int(np.prod(i.shape)) for i in infos) / 1e6)
        assert row["size_gib"] == pytest.approx(sum(i.nbytes for i in infos) / 2**30)
