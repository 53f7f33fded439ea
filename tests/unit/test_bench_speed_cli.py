"""`lucebox bench speed` on the CPU engine: llama-bench-style rows, JSON with raw samples, and the
pp rows report compute (TFLOP/s) rather than a bandwidth that would exceed the card's."""

from __future__ import annotations

import json

from tiny_models import make_tiny_checkpoint
from typer.testing import CliRunner

from lucebox_cli.cli.app import make_app


def test_bench_speed_json_rows(tmp_path):
    model = make_tiny_checkpoint(tmp_path / "m", n_layers=4, hidden=64)
    res = CliRunner().invoke(make_app(), ["bench", "speed", str(model), "--engine", "cpu", "-p", "9", "-n", "5",
                                          "-r", "3", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    by_test = {r["test"]: r for r in rows}
    assert set(by_test) == {"pp9", "tg5"}
    for row in rows:
        assert row["engine"] == "cpu" and row["reps"] == 3 and len(row["samples"]) == 3
        assert row["tok_s"] > 0 and min(row["samples"]) <= row["tok_s"] <= max(row["samples"])
    assert by_test["pp9"]["gbps"] is None and by_test["pp9"]["tflops"] > 0
    assert by_test["tg5"]["gbps"] > 0 and by_test["tg5"]["tflops"] is None
