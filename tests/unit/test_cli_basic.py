"""The CLI skeleton through Typer's runner: help, version, profiles, doctor, build errors; and make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lucebox_cli import __version__
from lucebox_cli.cli.app import make_app

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(make_app(), list(args), env=env)


def test_help_has_examples():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "Examples:" in result.output and "lucebox doctor" in result.output
    for command in ("profiles", "doctor", "build"):
        assert command in result.output


@pytest.mark.parametrize("command", ["profiles", "doctor", "build"])
def test_command_help_has_examples(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0 and "Examples:" in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"lucebox {__version__}"


def test_profiles_json():
    result = invoke("profiles", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["rtx3090-sm86"]["arch"] == "sm_86"
    assert rows["h200-sm90"]["arch"] == "sm_90"
    assert rows["rtx3090-sm86"]["hardware"]["sm_count"] == 82
    assert rows["h200-sm90"]["run"]["max_context"] == 131072


def test_profiles_table():
    result = invoke("profiles")
    assert result.exit_code == 0 and "rtx3090-sm86" in result.output and "sm_90" in result.output


def test_doctor_json_without_gpu():
    result = invoke("doctor", "--json", env={"LUCEBOX_FORCE_NO_GPU": "1"})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["gpu"]["count"] == 0 and report["gpu"]["reason"]
    assert report["profile"]["matched"] is None
    assert {"rtx3090-sm86", "h200-sm90"} <= set(report["profile"]["known"])
    assert report["packages"]["typer"] and report["python"]["version"]
    assert "cache_dir" in report["hf"] and isinstance(report["hf"]["offline"], bool)
    assert isinstance(report["engines"], list)


def test_doctor_human_without_gpu():
    result = invoke("doctor", env={"LUCEBOX_FORCE_NO_GPU": "1"})
    assert result.exit_code == 0 and "no GPU" in result.output


def test_doctor_hf_cache_from_env(tmp_path: Path):
    env = {"LUCEBOX_FORCE_NO_GPU": "1", "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env["HF_HUB_CACHE"] = ""
    report = json.loads(invoke("doctor", "--json", env=env).stdout)
    assert report["hf"]["cache_dir"] == str(tmp_path / "home" / "hub") and report["hf"]["offline"] is True


def test_unknown_profile_is_one_line_and_hint():
    result = invoke("build", "--profile", "nope")
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == "error: unknown profile 'nope'"
    assert lines[1].startswith("hint: known profiles:") and "rtx3090-sm86" in lines[1]
    assert len(lines) == 2 and "Traceback" not in result.output


def test_build_without_gpu_asks_for_profile():
    result = invoke("build", env={"LUCEBOX_FORCE_NO_GPU": "1", "LUCEBOX_PROFILE": ""})
    assert result.exit_code == 2
    assert "error: no GPU to match a profile" in result.stderr and "--profile" in result.stderr


def test_make_build_refuses_unknown_profile():
    env = dict(os.environ, PY=sys.executable)
    proc = subprocess.run(["make", "build", "PROFILE=nope"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown profile 'nope'" in proc.stderr
    assert "rtx3090-sm86" in proc.stderr and "h200-sm90" in proc.stderr
