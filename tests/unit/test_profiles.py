"""Profiles: schema validation, GPU matching, unknown names, RunConfig precedence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from lucebox_cli import config
from lucebox_cli.config import RunConfig, get_profile, load_profiles, match_profile, resolve_profile, resolve_run_config
from lucebox_cli.errors import ProfileError, ProfileMismatch, UsageError

REPO = Path(__file__).resolve().parents[2]
RTX3090 = {"name": "NVIDIA GeForce RTX 3090", "cc_major": 8, "cc_minor": 6, "sm_count": 82}
H200 = {"name": "NVIDIA H200", "cc_major": 9, "cc_minor": 0, "sm_count": 132}


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    """A copy of the repo's profiles to break."""
    for f in (REPO / "profiles").glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _edit(path: Path, dotted: str, value, delete: bool = False) -> None:
    doc = yaml.safe_load(path.read_text())
    node = doc
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    if delete:
        del node[last]
    else:
        node[last] = value
    path.write_text(yaml.safe_dump(doc))


def test_repo_profiles_load():
    profiles = load_profiles()
    assert {"rtx3090-sm86", "h200-sm90"} <= set(profiles)
    rtx = profiles["rtx3090-sm86"]
    assert (rtx.arch, rtx.hardware.sm_count, rtx.hardware.compute_capability) == ("sm_86", 82, (8, 6))
    assert rtx.hardware.bandwidth_gbps == 936 and rtx.hardware.memory_gb == 24
    h200 = profiles["h200-sm90"]
    assert (h200.arch, h200.hardware.sm_count, h200.arch_number) == ("sm_90", 132, 90)
    assert h200.hardware.smem_per_block_optin == 232448
    for p in profiles.values():
        assert p.get("build.megakernel.threads") > 0 and p.get("build.megakernel.blocks_per_sm") >= 1
        assert p.run.kv_cache_type == "f16"


def test_profile_is_frozen():
    p = get_profile("rtx3090-sm86")
    with pytest.raises(Exception):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.data["name"] = "x"  # type: ignore[index]


def test_env_profiles_dir(profile_dir: Path, monkeypatch):
    (profile_dir / "h200-sm90.yaml").unlink()
    monkeypatch.setenv(config.PROFILES_ENV, str(profile_dir))
    assert list(load_profiles()) == ["rtx3090-sm86"]


@pytest.mark.parametrize(
    "key,value,delete,expect",
    [
        ("hardware.sm_count", None, True, "hardware.sm_count: missing"),
        ("hardware.sm_count", "82", False, "hardware.sm_count: must be an integer"),
        ("hardware.sm_count", 0, False, "hardware.sm_count: must be between"),
        ("hardware.compute_capability", [8], False, "compute_capability: must be [major, minor]"),
        ("hardware.bandwidth_gbps", True, False, "bandwidth_gbps: must be a number"),
        ("hardware.gpu_names", [], False, "gpu_names: must be a non-empty list"),
        ("hardware.gpu_names", ["RTX ("], False, "gpu_names: bad regex"),
        ("hardware.sm_cuont", 82, False, "hardware.sm_cuont: unknown key"),
        ("build.arch", "sm_90", False, "build.arch: sm_90 does not match compute_capability 8.6"),
        ("build.arch", "ampere", False, "build.arch: must look like"),
        ("build.megakernel.threads", 4096, False, "build.megakernel.threads: must be between"),
        ("build.megakernel.ring_slots", 1, False, "build.megakernel.ring_slots: must be between"),
        ("build.megakernel.ring_slot_bytes", 512, False, "build.megakernel.ring_slot_bytes: must be between"),
        ("build.megakernel.ring_hold", 2, False, "build.megakernel.ring_hold: must be between"),
        ("run.kv_cache_type", "f8", False, "run.kv_cache_type: must be one of"),
        ("run.budget", None, True, "run.budget: missing"),
        ("run.prefill_rows", 100, False, "run.prefill_rows: 100 is not a multiple of 64"),
        ("run.prefill_rows", 32, False, "run.prefill_rows: must be between"),
        ("name", "other", False, "differs from the file name"),
    ],
    ids=lambda v: str(v) if not isinstance(v, (list, bool)) and v is not None else None,
)
def test_schema_errors_name_file_and_key(profile_dir: Path, key, value, delete, expect):
    path = profile_dir / "rtx3090-sm86.yaml"
    _edit(path, key, value, delete)
    with pytest.raises(ProfileError) as info:
        load_profiles(profile_dir)
    assert str(path) in info.value.message
    assert expect in info.value.message
    assert info.value.hint


def test_prefill_rows_is_optional(profile_dir: Path):
    path = profile_dir / "rtx3090-sm86.yaml"
    _edit(path, "run.prefill_rows", None, True)
    assert load_profiles(profile_dir)["rtx3090-sm86"].run.prefill_rows == 64
    _edit(path, "run.prefill_rows", 192, False)
    assert load_profiles(profile_dir)["rtx3090-sm86"].run.prefill_rows == 192


def test_megakernel_ring_is_optional_tuning(profile_dir: Path):
    path = profile_dir / "rtx3090-sm86.yaml"
    _edit(path, "build.megakernel.ring_slots", 2, False)
    _edit(path, "build.megakernel.ring_slot_bytes", 2048, False)
    mk = load_profiles(profile_dir)["rtx3090-sm86"].get("build.megakernel")
    assert (mk["ring_slots"], mk["ring_slot_bytes"]) == (2, 2048)
    _edit(path, "build.megakernel.ring_hold", 1, False)
    assert load_profiles(profile_dir)["rtx3090-sm86"].get("build.megakernel")["ring_hold"] == 1


def test_build_takes_extra_tuning_sections(profile_dir: Path):
    path = profile_dir / "rtx3090-sm86.yaml"
    _edit(path, "build.dflash", {"verify_tile": 64, "splits": [1, 2]})
    p = load_profiles(profile_dir)["rtx3090-sm86"]
    assert p.get("build.dflash.verify_tile") == 64
    assert p.get("build.dflash.nope", None) is None
    with pytest.raises(ProfileError):
        p.get("build.dflash.nope")


def test_broken_yaml(profile_dir: Path):
    (profile_dir / "bad.yaml").write_text("name: bad\nhardware: [unclosed\n")
    with pytest.raises(ProfileError, match="bad.yaml: cannot read profile"):
        load_profiles(profile_dir)


def test_empty_dir(tmp_path: Path):
    with pytest.raises(ProfileError, match="no profiles found"):
        load_profiles(tmp_path)


def test_unknown_profile_lists_known():
    with pytest.raises(ProfileError) as info:
        get_profile("nope")
    assert "nope" in info.value.message
    assert "rtx3090-sm86" in info.value.hint and "h200-sm90" in info.value.hint


@pytest.mark.parametrize(
    "gpu,expected",
    [
        (RTX3090, "rtx3090-sm86"),
        (H200, "h200-sm90"),
        ({"name": "NVIDIA H200 NVL", "compute_capability": "9.0", "sm_count": 132}, "h200-sm90"),
        # Same arch, same SM count (H100 SXM): best match by SM count.
        ({"name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0), "sm_count": 132}, "h200-sm90"),
        # Same arch but neither name nor SM count: no match.
        ({"name": "NVIDIA GeForce RTX 3090 Ti", "cc_major": 8, "cc_minor": 6, "sm_count": 84}, None),
        ({"name": "NVIDIA RTX A6000", "cc_major": 8, "cc_minor": 6, "sm_count": 84}, None),
        # Name matches but the arch does not: never matched.
        ({"name": "RTX 3090 lookalike", "cc_major": 8, "cc_minor": 9, "sm_count": 82}, None),
    ],
    ids=["rtx3090", "h200", "h200-nvl", "h100-sxm", "3090ti", "a6000", "wrong-cc"],
)
def test_match_profile(gpu, expected):
    matched = match_profile(gpu)
    assert (matched.name if matched else None) == expected


def test_resolve_profile(monkeypatch):
    monkeypatch.delenv(config.PROFILE_ENV, raising=False)
    assert resolve_profile(None, []) is None
    assert resolve_profile(None, [H200]).name == "h200-sm90"
    assert resolve_profile("rtx3090-sm86", []).name == "rtx3090-sm86"
    assert resolve_profile("rtx3090-sm86", [RTX3090]).name == "rtx3090-sm86"
    with pytest.raises(ProfileMismatch, match="sm_86") as info:
        resolve_profile("rtx3090-sm86", [H200])
    assert "h200-sm90" in info.value.hint
    with pytest.raises(ProfileError, match="no profile matches"):
        resolve_profile(None, [{"name": "Tesla T4", "cc_major": 7, "cc_minor": 5, "sm_count": 40}])
    monkeypatch.setenv(config.PROFILE_ENV, "h200-sm90")
    assert resolve_profile(None, []).name == "h200-sm90"


def test_arch_runs_on():
    assert config.arch_runs_on("sm_86", (8, 6)) and config.arch_runs_on("sm_86", (8, 9))
    assert not config.arch_runs_on("sm_86", (9, 0)) and not config.arch_runs_on("sm_90", (8, 6))
    assert config.arch_number("sm_90a") == 90


def test_run_config_precedence():
    rtx = get_profile("rtx3090-sm86")
    defaults = RunConfig(model="m")
    # defaults only
    rc = resolve_run_config({"model": "m"}, None, env={})
    assert rc == defaults
    # profile over defaults
    rc = resolve_run_config({"model": "m"}, rtx, env={})
    assert (rc.budget, rc.max_context, rc.profile) == (22, rtx.run.max_context, "rtx3090-sm86")
    # env over profile
    env = {"LUCEBOX_BUDGET": "7", "LUCEBOX_MAX_CONTEXT": "2048", "LUCEBOX_CHAT": "yes", "LUCEBOX_TOP_P": "0.5"}
    rc = resolve_run_config({"model": "m"}, rtx, env=env)
    assert (rc.budget, rc.max_context, rc.chat, rc.top_p) == (7, 2048, True, 0.5)
    # CLI over env; None means "not given"
    rc = resolve_run_config({"model": "m", "budget": 3, "max_context": None}, rtx, env=env)
    assert (rc.budget, rc.max_context) == (3, 2048)
    # model from env
    assert resolve_run_config({}, None, env={"LUCEBOX_MODEL": "qwen3.5-0.8b"}).model == "qwen3.5-0.8b"


def test_run_config_errors():
    with pytest.raises(UsageError, match="LUCEBOX_BUDGET"):
        resolve_run_config({"model": "m"}, None, env={"LUCEBOX_BUDGET": "many"})
    with pytest.raises(UsageError, match="no model"):
        resolve_run_config({}, None, env={})
    with pytest.raises(ValueError):
        resolve_run_config({"model": "m", "nope": 1}, None, env={})


def test_config_main(capsys):
    assert config.main(["arch", "h200-sm90"]) == 0
    assert capsys.readouterr().out.strip() == "sm_90"
    assert config.main(["arch", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown profile 'nope'" in err and "rtx3090-sm86" in err
    assert config.main(["get", "rtx3090-sm86", "build.megakernel.blocks_per_sm"]) == 0
    assert capsys.readouterr().out.strip() == "1"
    assert config.main([]) == 2
