"""`lucebox doctor [--json]`: what this machine has (Python, packages, nvcc, GPUs, profile, engines,
HF cache). Works, and exits 0, on a machine with no GPU."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from lucebox_cli import __version__, config
from lucebox_cli.cli.output import print_json, stdout_console
from lucebox_cli.cli.options import JsonOpt
from lucebox_cli.errors import LuceboxError

EPILOG = """\
Examples:

\b
  lucebox doctor           # a readable report
  lucebox doctor --json    # the same as one JSON object
"""

# Distribution names (as pip knows them); versions are read from metadata, nothing is imported.
PACKAGES = (
    "typer", "rich", "huggingface_hub", "gguf", "numba", "numba-cuda", "numpy", "tokenizers", "pyyaml",
    "torch", "transformers", "llama_cpp_python",
)
_TRUE = {"1", "true", "yes", "on"}


def _package_versions() -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _nvcc() -> dict[str, Any]:
    path = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)
    if path is None:
        return {"path": None, "version": None}
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {"path": path, "version": None}
    m = re.search(r"release [\d.]+, V([\d.]+)", text)
    return {"path": path, "version": m.group(1) if m else None}


def _hf_cache() -> dict[str, Any]:
    # Same resolution as huggingface_hub (HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > $HF_HOME/hub), from env only.
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or str(Path(home) / "hub")
    offline = (os.environ.get("HF_HUB_OFFLINE") or "").strip().lower() in _TRUE
    return {"cache_dir": str(Path(cache).expanduser()), "hf_home": home, "offline": offline,
            "token_set": bool(os.environ.get("HF_TOKEN"))}


def _engines() -> list[dict[str, Any]]:
    from lucebox_cli.engines import _lib

    rows = []
    for name, path in _lib.built_libs().items():
        row: dict[str, Any] = {"profile": name, "path": str(path)}
        try:
            lib = _lib.open_lib(path, name)
            info = lib.build_info()
            row.update(archs=info.get("archs"), abi=info.get("abi"), nvcc=info.get("nvcc"), commit=info.get("commit"),
                       abi_ok=info.get("abi") == _lib.ABI_VERSION)
        except LuceboxError as err:
            row["error"] = err.message
        rows.append(row)
    return rows


def _profile_report(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        names = list(config.load_profiles())
    except LuceboxError as err:
        return {"known": [], "matched": None, "error": err.message}
    report: dict[str, Any] = {"dir": str(config.profiles_dir()), "known": names, "matched": None}
    if gpus:
        try:
            matched = config.resolve_profile(None, gpus)
            report["matched"] = matched.name if matched else None
        except LuceboxError as err:
            report["error"] = err.message
    return report


def collect() -> dict[str, Any]:
    from lucebox_cli.engines import _lib

    probe = _lib.probe_gpus()
    return {
        "lucebox": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "packages": _package_versions(),
        "nvcc": _nvcc(),
        "gpu": {"count": len(probe.gpus), "gpus": probe.gpus, "reason": probe.reason, "source": probe.source,
                "driver": probe.driver},
        "profile": _profile_report(probe.gpus),
        "engines": _engines(),
        "hf": _hf_cache(),
    }


def _print_report(r: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("lucebox", f"{r['lucebox']} (Python {r['python']['version']}, {r['python']['executable']})")
    pkgs = ", ".join(f"{k} {v}" for k, v in r["packages"].items() if v)
    missing = [k for k, v in r["packages"].items() if not v]
    table.add_row("packages", pkgs + (f"; not installed: {', '.join(missing)}" if missing else ""))
    nv = r["nvcc"]
    table.add_row("nvcc", f"{nv['version']} ({nv['path']})" if nv["path"] else "not found")
    gpu = r["gpu"]
    if gpu["gpus"]:
        for g in gpu["gpus"]:
            table.add_row(f"GPU {g['index']}", f"{g['name']}, sm_{g['cc_major']}{g['cc_minor']}, {g['sm_count']} SMs, "
                          f"{g['total_mem_bytes'] / 2**30:.1f} GiB (driver {gpu['driver']})")
    else:
        table.add_row("GPU", f"no GPU ({gpu['reason']})")
    prof = r["profile"]
    matched = prof.get("matched") or (prof.get("error") or "none (no GPU; pass --profile)")
    table.add_row("profile", f"{matched}  [known: {', '.join(prof['known'])}]")
    if r["engines"]:
        for e in r["engines"]:
            detail = e.get("error") or f"{', '.join(e['archs'] or [])}, ABI {e['abi']}{'' if e['abi_ok'] else ' (stale: rebuild)'}, commit {e['commit']}"
            table.add_row(f"engine {e['profile']}", f"{e['path']} ({detail})")
    else:
        table.add_row("engines", "none built (make build PROFILE=…)")
    hf = r["hf"]
    table.add_row("HF cache", f"{hf['cache_dir']}{' (offline)' if hf['offline'] else ''}")
    stdout_console().print(table)


def doctor(json_out: JsonOpt = False) -> None:
    """Report Python, packages, nvcc, GPUs, the matched profile, built engines and the HF cache."""
    report = collect()
    if json_out:
        print_json(report)
    else:
        _print_report(report)


def register(app: typer.Typer) -> None:
    app.command("doctor", epilog=EPILOG)(doctor)
