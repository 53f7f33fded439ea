"""`lucebox quantize DRAFT_FOLDER`: a z-lab DFlash draft goes through convert_draft, with the same
progress callback and --json report as a target model, and draft-specific type errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lucebox_cli.cli.app import make_app
from lucebox_cli.gguf_io import GGUFModel
from lucebox_cli.models.dflash_draft import ARCH, load_draft
from lucebox_cli.quant.convert import quantize
from test_dflash_draft import hf_config, write_draft

REPORT_KEYS = {"src", "out", "type", "seconds", "bytes", "weights", "bits_per_weight", "types", "tensors"}
TENSOR_KEYS = {"name", "ggml_type", "shape", "nbytes", "bits_per_weight", "seconds"}


def invoke(*args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    # hidden and ffn 256 so that Q4_K_M really uses Q4_K / Q6_K blocks
    cfg = hf_config(hidden_size=256, intermediate_size=256, head_dim=64)
    return write_draft(tmp_path_factory.mktemp("draft") / "tiny-dflash", cfg, seed=3)


def test_json_report_has_the_target_shape(draft):
    result = invoke("quantize", draft, "--type", "q8_0", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    out = draft.parent / "tiny-dflash-Q8_0.gguf"
    assert set(report) == REPORT_KEYS
    assert report["out"] == str(out) and report["type"] == "Q8_0"
    assert all(set(t) == TENSOR_KEYS for t in report["tensors"])
    with GGUFModel(out) as m:
        assert m.architecture == ARCH
        stored = {n: (m.tensor_info(n).ggml_type, list(m.tensor_info(n).shape), m.tensor_info(n).nbytes)
                  for n in m.tensor_names}
    assert {t["name"]: (t["ggml_type"], t["shape"], t["nbytes"]) for t in report["tensors"]} == stored
    assert report["types"] == {"Q8_0": 1 + 7 * 2, "F32": 2 + 4 * 2}  # fc + 7 matrices a layer; norms
    assert report["bytes"] == sum(v[2] for v in stored.values())
    # the converted draft loads back to the checkpoint's weights, up to Q8_0 rounding
    _, want = load_draft(draft)
    _, got = load_draft(out)
    for name, w in want.items():
        err = np.sqrt(np.mean((got[name] - w) ** 2) / np.mean(w**2))
        assert err < (1e-7 if w.ndim == 1 else 1e-2), name


def test_q4_k_m_human_report(draft, tmp_path):
    out = tmp_path / "d.gguf"
    result = invoke("quantize", draft, "-t", "Q4_K_M", "-o", out)
    assert result.exit_code == 0, result.output
    assert "bits/weight" in result.stdout and "Q4_K_M" in result.stdout
    with GGUFModel(out) as m:
        assert m.tensor_info("blk.0.ffn_up.weight").ggml_type == "Q4_K"
        assert m.tensor_info("fc.weight").ggml_type == "Q6_K"
        assert m.tensor_info("blk.1.ffn_down.weight").ggml_type == "Q6_K"


def test_target_only_types_are_refused_with_the_draft_types(draft, tmp_path):
    for qtype in ("Q4_K", "Q6_K", "Q5_K_M"):
        result = invoke("quantize", draft, "-t", qtype, "-o", tmp_path / "x.gguf")
        assert result.exit_code == 2, result.output
        assert "DFlash draft" in result.output and "F32, F16, BF16, Q8_0, Q4_K_M" in result.output
        assert "hint:" in result.output
    assert not (tmp_path / "x.gguf").exists()


def test_library_dispatch_reports_progress_and_refuses_to_overwrite(draft, tmp_path):
    calls = []
    out = tmp_path / "d-F16.gguf"
    report = quantize(draft, out, "F16", progress=lambda done, total, name: calls.append((done, total, name)))
    assert [c[2] for c in calls] == [t.name for t in report.tensors]
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and calls[-1][0] == calls[-1][1] == report.total_bytes
    assert report.type_counts() == {"F16": 15, "F32": 10}
    assert abs(report.bits_per_weight - 8.0 * report.total_bytes / report.n_weights) < 1e-9
    again = invoke("quantize", draft, "-t", "F16", "-o", out)
    assert again.exit_code == 1 and "already exists" in again.output
    assert invoke("quantize", draft, "-t", "F16", "-o", out, "--force").exit_code == 0
