"""`lucebox bench speed --depth D --verify-n N`: the tg-at-depth row and the one-verify row (its time and
the same run's AR step, so the verify is stated in decode-step units), on the CPU engine."""

from __future__ import annotations

import json

from tiny_models import make_tiny_checkpoint
from typer.testing import CliRunner

from lucebox_cli.bench.runner import verify_tree
from lucebox_cli.cli.app import make_app


def test_depth_and_verify_rows(tmp_path):
    model = make_tiny_checkpoint(tmp_path / "m", n_layers=4, hidden=64)
    res = CliRunner().invoke(make_app(), ["bench", "speed", str(model), "--engine", "cpu", "-p", "9", "-n", "4",
                                          "-d", "20", "--verify-n", "23", "-r", "2", "--json"])
    assert res.exit_code == 0, res.output
    by_test = {r["test"]: r for r in json.loads(res.stdout)}
    assert set(by_test) == {"pp9", "tg4", "tg4@d20", "verify23"}
    v = by_test["verify23"]
    assert v["verify_ms"] > 0 and v["ar_step_ms"] > 0
    assert abs(v["verify_in_steps"] - v["verify_ms"] / v["ar_step_ms"]) < 1e-9
    assert v["gbps"] is None and v["tok_s"] > 0
    assert by_test["tg4@d20"]["gbps"] > 0


def test_verify_tree_shape():
    t = verify_tree(23, 1000)
    assert t.size == 23 and int(t.depth.max()) == 15  # a 16-slot spine, then siblings
