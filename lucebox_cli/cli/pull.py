"""`lucebox pull NAME` (alias `fetch`): weights from the Hugging Face hub into the shared HF cache."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.markup import escape
from rich.table import Table

from lucebox_cli import hub, registry
from lucebox_cli.cli.options import JsonOpt, OfflineOpt
from lucebox_cli.cli.output import print_json, stderr_console, stdout_console

EPILOG = """\
Examples:

\b
  lucebox pull qwen3.5-27b                      # Q4_K_M GGUF target + DFlash draft
  lucebox pull qwen3.5-27b:Q8_0 --dry-run       # files and sizes, download nothing
  lucebox pull qwen3.5-0.8b --include '*.json'  # only the matching files
  lucebox pull unsloth/Qwen3.5-27B-GGUF:Q6_K    # any hub repo, with a quant tag
  HF_HUB_OFFLINE=1 lucebox pull qwen3.5-27b --json   # where the cached files are

Known aliases: {aliases}. Files go to the HF cache ($HF_HUB_CACHE, else $HF_HOME/hub);
an interrupted pull resumes where it stopped; every LFS file is checked against the hub's SHA-256.
"""

IncludeOpt = Annotated[
    Optional[list[str]],
    typer.Option("--include", metavar="PATTERN", help="Only files matching this glob (repeatable), e.g. '*.json'."),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="List the files and sizes; download nothing.")]
RevisionOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--revision",
        metavar="REV",
        help="Branch, tag or commit of the target repo; ROLE=REV (e.g. draft=abc123) pins another repo.",
    ),
]


def pull(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Alias (qwen3.5-27b[:QUANT]), hub repo org/repo[:QUANT], or local path.")
    ],
    include: IncludeOpt = None,
    dry_run: DryRunOpt = False,
    offline: OfflineOpt = False,
    json_out: JsonOpt = False,
    revision: RevisionOpt = None,
) -> None:
    """Download a model's files (target, draft, tokenizer) into the Hugging Face cache."""
    spec = registry.resolve(name)
    for rev in revision or []:
        spec = spec.with_revision(rev)
    # None lets the library follow HF_HUB_OFFLINE; --offline forces it.
    offline_arg = True if offline else None
    if dry_run:
        files = hub.plan(spec, include=include, offline=offline_arg)
        if json_out:
            print_json(_plan_json(spec, files))
        else:
            _print_plan(spec, files)
        return
    with _progress_bars() as progress:
        result = hub.download(spec, include=include, offline=offline_arg, progress=progress)
    if json_out:
        print_json(result.to_json())
    else:
        _print_result(result)


def register(app: typer.Typer) -> None:
    epilog = EPILOG.format(aliases=", ".join(registry.known_aliases()))
    app.command("pull", epilog=epilog)(pull)
    app.command("fetch", epilog=epilog, help="Same as `pull`: download a model into the Hugging Face cache.")(pull)


@contextmanager
def _progress_bars() -> Iterator[hub.ProgressFn]:
    """One Rich bar per file on stderr (bytes, speed, ETA); yields the callback hub.download calls."""
    columns = (
        TextColumn("{task.description}", style="cyan"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    tasks: dict[tuple[str, str], TaskID] = {}
    with Progress(*columns, console=stderr_console(), transient=False) as bars:

        def update(file: hub.PlannedFile, done: int) -> None:
            key = (file.repo_id, file.path)
            if key not in tasks:
                label = f"{file.path} (cached)" if file.cached else file.path
                tasks[key] = bars.add_task(_short(label), total=file.size or None)
            bars.update(tasks[key], completed=done)

        yield update


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def _plan_json(spec: registry.ModelSpec, files: list[hub.PlannedFile]) -> dict:
    return {
        "name": spec.name,
        "dry_run": True,
        "repos": [
            {"repo_id": r.repo_id, "role": r.role, "revision": r.revision, "patterns": list(r.allow_patterns)}
            for r in spec.repos
        ],
        "files": [
            {
                "repo_id": f.repo_id,
                "role": f.role,
                "path": f.path,
                "size": f.size,
                "sha256": f.sha256,
                "revision": f.revision,
                "cached": f.cached,
            }
            for f in files
        ],
        "total_size": sum(f.size for f in files),
        "download_size": sum(f.size for f in files if not f.cached),
    }


def _print_plan(spec: registry.ModelSpec, files: list[hub.PlannedFile]) -> None:
    table = Table(title=f"{spec.name}: files to pull", title_justify="left", box=None, pad_edge=False)
    for col in ("role", "repo", "file", "size", "status"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for f in files:
        table.add_row(f.role, escape(f.repo_id), escape(f.path), decimal(f.size), "cached" if f.cached else "to download")
    console = stdout_console()
    console.print(table)
    total = sum(f.size for f in files)
    todo = sum(f.size for f in files if not f.cached)
    summary = f"{_files(len(files))}, {decimal(total)} total, {decimal(todo)} to download (dry run)"
    console.print(summary, markup=False)


def _print_result(result: hub.PullResult) -> None:
    console = stdout_console()
    where = f" in {result.cache_dir}" if result.cache_dir else ""
    total = decimal(sum(f.size for f in result.files))
    console.print(f"{result.name}: {_files(len(result.files))}, {total}{where}", markup=False, soft_wrap=True)
    for repo in result.repos:
        files = [f for f in result.files if f.repo_id == repo.repo_id]
        commit = (repo.commit or repo.revision)[:12]
        label = "/".join(repo.roles)
        console.print(
            f"  {label:<16} {repo.repo_id or '(local)'} @ {commit}  {_files(len(files))}  "
            f"{decimal(sum(f.size for f in files))}  {repo.snapshot or ''}",
            soft_wrap=True,
            markup=False,
        )
