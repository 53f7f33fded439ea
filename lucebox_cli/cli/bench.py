"""`lucebox bench …`: the benchmark command group (speed rows, and the HumanEval / GSM8K / MATH-500 suites)."""

from __future__ import annotations

import importlib

import typer

# each module adds its subcommands with register(bench_app); one missing from a build is skipped
SUBCOMMAND_MODULES = ("bench_speed", "bench_suites")


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(
        help="Measure speed (llama-bench style rows) and speculative acceptance on prompt suites.",
        no_args_is_help=True,
        rich_markup_mode=None,
    )
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"lucebox_cli.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"lucebox_cli.cli.{name}":
                raise
            continue
        module.register(bench_app)
    app.add_typer(bench_app, name="bench")
