"""`lucebox profiles [--json]`: the hardware profiles in profiles/*.yaml, validated."""

from __future__ import annotations

import typer
from rich.table import Table

from lucebox_cli import config
from lucebox_cli.cli.options import JsonOpt
from lucebox_cli.cli.output import print_json, stdout_console

EPILOG = """\
Examples:

\b
  lucebox profiles                 # table: arch, SMs, memory, bandwidth (measured), run defaults
  lucebox profiles --json          # [{"name": "rtx3090-sm86", "arch": "sm_86", ...}, ...]

Profiles live in profiles/*.yaml (or $LUCEBOX_PROFILES_DIR); `make build PROFILE=<name>` builds one.
"""


def profiles(json_out: JsonOpt = False) -> None:
    """List the hardware profiles: facts, build arch and run defaults."""
    loaded = config.load_profiles()
    if json_out:
        print_json([p.to_dict() for p in loaded.values()])
        return
    table = Table(title=f"profiles ({config.profiles_dir()})", title_justify="left")
    for col in ("name", "arch", "SMs", "memory", "GB/s", "budget", "KV", "max ctx"):
        table.add_column(col, justify="left" if col in ("name", "arch", "KV") else "right", no_wrap=True)
    for p in loaded.values():
        hw = p.hardware
        measured = f" ({hw.bandwidth_measured_gbps:g})" if hw.bandwidth_measured_gbps else ""
        table.add_row(
            p.name,
            p.arch,
            str(hw.sm_count),
            f"{hw.memory_gb:g} GB",
            f"{hw.bandwidth_gbps:g}{measured}",
            str(p.run.budget),
            p.run.kv_cache_type,
            str(p.run.max_context),
        )
    stdout_console().print(table)


def register(app: typer.Typer) -> None:
    app.command("profiles", epilog=EPILOG)(profiles)
