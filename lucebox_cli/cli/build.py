"""`lucebox build [--profile P] [--all]`: compile the CUDA library through the Makefile."""

from __future__ import annotations

import shutil
import subprocess
from typing import Annotated, Any

import typer

from lucebox_cli import config
from lucebox_cli.cli.options import JsonOpt, ProfileOpt
from lucebox_cli.cli.output import print_json, stderr_console
from lucebox_cli.errors import BuildError, UsageError

EPILOG = """\
Examples:

\b
  lucebox build                          # for the profile matched from this GPU
  lucebox build --profile rtx3090-sm86   # for a named card (no GPU needed)
  lucebox build --all                    # every profile

Runs `make build PROFILE=<name>` in the source checkout: build/<name>/liblucebox.so.
"""

# Lines of compiler output carried in the error hint.
TAIL_LINES = 15


def _targets(profile: str | None, all_profiles: bool) -> list[str]:
    if all_profiles:
        if profile:
            raise UsageError("--profile and --all exclude each other", hint="pass one of them")
        return list(config.load_profiles())
    if profile:
        return [config.get_profile(profile).name]
    from lucebox_cli.engines import _lib

    probe = _lib.probe_gpus()
    matched = config.resolve_profile(None, probe.gpus)
    if matched is None:
        raise UsageError(
            f"no GPU to match a profile ({probe.reason})",
            hint=f"pass --profile NAME (known: {', '.join(config.load_profiles())}) or --all",
        )
    return [matched.name]


def _make(profile: str) -> dict[str, Any]:
    root = config.repo_root()
    if root is None or not (root / "Makefile").is_file():
        raise BuildError("no source checkout with a Makefile found", hint="run from a clone: make build PROFILE=…")
    make = shutil.which("make")
    if make is None:
        raise BuildError("`make` is not installed", hint="install make (apt-get install make)")
    with stderr_console().status(f"building {profile} (nvcc)…"):
        proc = subprocess.run(
            [make, "--no-print-directory", "build", f"PROFILE={profile}"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        raise BuildError(f"make build PROFILE={profile} failed (exit {proc.returncode})", hint="\n".join(lines[-TAIL_LINES:]))
    from lucebox_cli.engines import _lib

    lib = _lib.load(profile)
    return {"profile": profile, "path": str(lib.path), **lib.build_info()}


def build(
    profile: ProfileOpt = None,
    all_profiles: Annotated[bool, typer.Option("--all", help="Build every profile in profiles/.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Compile cuda/ into build/<profile>/liblucebox.so for a profile's arch."""
    results = [_make(name) for name in _targets(profile, all_profiles)]
    if json_out:
        print_json(results)
        return
    console = stderr_console()
    for r in results:
        console.print(f"built {r['path']} ({', '.join(r['archs'])}, nvcc {r['nvcc']}, commit {r['commit']})")


def register(app: typer.Typer) -> None:
    app.command("build", epilog=EPILOG)(build)
