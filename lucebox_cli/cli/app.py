"""The `lucebox` command: Typer app, global flags, and the one place errors become exit codes."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated, Optional

import click
import typer
from typer.core import TyperGroup

from lucebox_cli import __version__
from lucebox_cli.errors import LuceboxError

EPILOG = """\
Examples:

\b
  lucebox doctor                          # what this machine has: GPU, profile, engines, cache
  lucebox pull qwen3.5-27b                # GGUF target + DFlash draft into the HF cache
  lucebox pull qwen3.5-0.8b --dry-run     # list files and sizes, download nothing
  lucebox run qwen3.5-0.8b --prompt "Hi"  # generate (GPU megakernel if built, else CPU engine)
  lucebox run M --draft replay:0.1 --spec ddtree --budget 22 --json
  lucebox quantize ./Qwen3.5-0.8B --type Q4_K_M -o q4.gguf
  lucebox bench speed qwen3.5-0.8b -p 520 -n 128 -r 5
  lucebox bench humaneval --model M --draft D --n-prompts 10 --md
  lucebox profiles --json                 # hardware profiles as JSON
  lucebox build --profile rtx3090-sm86    # compile the CUDA engines for a card

\b
Set LUCEBOX_DEBUG=1 to see tracebacks.
"""

# Each module registers its command(s) with `register(app)`. A command is listed here only once it works.
COMMAND_MODULES: list[str] = [
    "profiles",
    "doctor",
    "build",
    "pull",
    "quantize",
    "run",
    "bench",
]


class _LuceboxGroup(TyperGroup):
    """Turns LuceboxError into one error line + hint and an exit code, for the CLI and CliRunner alike."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except LuceboxError as err:
            if os.environ.get("LUCEBOX_DEBUG") == "1":
                raise
            ctx.exit(report_error(err))


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"lucebox {__version__}")
        raise typer.Exit()


def make_app() -> typer.Typer:
    app = typer.Typer(
        name="lucebox",
        cls=_LuceboxGroup,
        help="Fast single-GPU inference for Qwen3.5/3.6: pull, quantize, run and bench.",
        epilog=EPILOG,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        version: Annotated[
            Optional[bool],
            typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
        ] = None,
        verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More logging (-vv for debug).")] = 0,
    ) -> None:
        level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    for name in COMMAND_MODULES:
        importlib.import_module(f"lucebox_cli.cli.{name}").register(app)
    return app


def report_error(err: LuceboxError) -> int:
    """One line of error, one line of hint, on stderr; returns the exit code."""
    from lucebox_cli.cli.output import stderr_console

    console = stderr_console()
    console.print(f"[bold red]error:[/] {err.message}", markup=True, soft_wrap=True)
    if err.hint:
        console.print(f"[yellow]hint:[/] {err.hint}", markup=True, soft_wrap=True)
    return err.exit_code


def main(argv: list[str] | None = None) -> None:
    app = make_app()
    try:
        app(args=argv, standalone_mode=True)
    except KeyboardInterrupt:
        if os.environ.get("LUCEBOX_DEBUG") == "1":
            raise
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
