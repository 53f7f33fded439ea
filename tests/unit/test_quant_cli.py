"""`lucebox quantize` through Typer's runner: outputs, --json report, and the one-line errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from lucebox_cli.cli.app import make_app
from lucebox_cli.gguf_io import GGUFModel
from test_quant_mix import _shrink_tokenizer
from tiny_models import make_tiny_checkpoint


def invoke(*args: str):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    folder = make_tiny_checkpoint(root / "tiny", hidden=256, n_layers=4, vocab=512)
    _shrink_tokenizer(folder)
    return folder


def test_hf_folder_to_default_output_with_json_report(checkpoint):
    result = invoke("quantize", checkpoint, "--type", "q4_k_m", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    out = checkpoint.parent / "tiny-Q4_K_M.gguf"
    assert report["out"] == str(out) and out.is_file()
    assert report["types"]["Q6_K"] >= 1 and report["types"]["F32"] >= 1
    first = report["tensors"][0]
    assert set(first) == {"name", "ggml_type", "shape", "nbytes", "bits_per_weight", "seconds"}
    with GGUFModel(out) as m:
        assert m.architecture == "qwen35"
        assert m.get("general.file_type") == 15
        assert m.tensor_info("token_embd.weight").ggml_type == "Q6_K"
        assert len(m.get("tokenizer.ggml.tokens")) == 1000 + 33  # shrunk vocabulary + special tokens


def test_gguf_input_requantize_needs_the_flag(checkpoint, tmp_path):
    q8 = tmp_path / "m-Q8_0.gguf"
    assert invoke("quantize", checkpoint, "-t", "Q8_0", "-o", q8).exit_code == 0
    refused = invoke("quantize", q8, "-t", "Q4_K_M")
    assert refused.exit_code == 1 and "already quantized" in refused.output and "--allow-requantize" in refused.output
    ok = invoke("quantize", q8, "-t", "Q4_K_M", "--allow-requantize")
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "m-Q4_K_M.gguf").is_file()
    assert "bits/weight" in ok.stdout


def test_errors_are_one_line_with_a_hint(checkpoint, tmp_path):
    unknown = invoke("quantize", checkpoint, "--type", "Q3_K_S")
    assert unknown.exit_code == 2 and "unknown --type" in unknown.output and "hint:" in unknown.output
    out = tmp_path / "o.gguf"
    assert invoke("quantize", checkpoint, "-t", "F16", "-o", out).exit_code == 0
    again = invoke("quantize", checkpoint, "-t", "F16", "-o", out)
    assert again.exit_code == 1 and "already exists" in again.output
    assert invoke("quantize", checkpoint, "-t", "F16", "-o", out, "--force").exit_code == 0
    same = invoke("quantize", out, "-t", "F16", "-o", out, "--force")
    assert same.exit_code == 1 and "refusing to overwrite the input" in same.output


def test_missing_tensor_and_foreign_architecture(checkpoint, tmp_path):
    from tiny_models import write_safetensors
    from safetensors.numpy import load_file

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    write_safetensors(broken / "model.safetensors", tensors)
    result = invoke("quantize", broken, "-t", "Q8_0")
    assert result.exit_code == 1 and "blk.1.ffn_down.weight is missing" in result.output

    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "llama"
    foreign = tmp_path / "foreign"
    shutil.copytree(checkpoint, foreign)
    (foreign / "config.json").write_text(json.dumps(cfg))
    result = invoke("quantize", foreign, "-t", "Q8_0")
    assert result.exit_code == 1 and "not a Qwen3.5" in result.output


def test_vlm_bf16_checkpoint_converts_like_the_text_one(tmp_path):
    from lucebox_cli.models.qwen35 import HFCheckpoint
    from lucebox_cli.quant.convert import quantize

    names = {}
    for vlm in (False, True):
        folder = make_tiny_checkpoint(tmp_path / f"vlm{vlm}", hidden=256, n_layers=4, vocab=512,
                                      dtype="bfloat16", vlm=vlm)
        _shrink_tokenizer(folder)
        report = quantize(folder, tmp_path / f"vlm{vlm}.gguf", "BF16")
        names[vlm] = [(t.name, t.ggml_type, t.shape) for t in report.tensors]
        with GGUFModel(report.out) as m:
            # BF16 in, BF16 out: the stored bits are the checkpoint's, unchanged
            assert m.tensor_info("blk.0.ffn_up.weight").ggml_type == "BF16"
            stored = m.raw("blk.0.ffn_up.weight").view(np.uint16)
        prefix = "model.language_model." if vlm else "model."
        source = HFCheckpoint(folder).load(prefix + "layers.0.mlp.up_proj.weight")
        assert np.array_equal(stored, (source.view(np.uint32) >> 16).astype(np.uint16).ravel())
    assert names[True] == names[False]
