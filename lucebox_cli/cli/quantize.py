"""`lucebox quantize SRC --type T`: HF Qwen3.5 checkpoint or GGUF → GGUF with llama.cpp's mixes;
a z-lab DFlash draft folder → `dflash-qwen3` GGUF (the library picks the path from SRC)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from lucebox_cli.cli.options import JsonOpt
from lucebox_cli.cli.output import print_json, stderr_console, stdout_console
from lucebox_cli.errors import UsageError

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M", "Q5_K_M")

EPILOG = """\
Examples:

\b
  lucebox quantize ./Qwen3.5-0.8B --type Q4_K_M          # HF folder → ./Qwen3.5-0.8B-Q4_K_M.gguf
  lucebox quantize qwen3.5-0.8b --type BF16 -o m.gguf      # a pulled alias, from the HF cache
  lucebox quantize m-F32.gguf --type Q8_0 --json           # GGUF → GGUF, per-tensor report
  lucebox quantize m-Q8_0.gguf --type Q4_K_M --allow-requantize
  lucebox quantize ./Qwen3.5-27B-DFlash --type Q8_0        # a DFlash draft folder → dflash-qwen3 GGUF

\b
Types: F32 F16 BF16 Q8_0 Q6_K Q4_K Q5_K (one type for every matrix, llama.cpp --pure)
       Q4_K_M Q5_K_M (llama.cpp's mixes: Q6_K for the LM head and some attn_v/attn_qkv/ffn_down).
Norms, ssm_conv1d, ssm_a and dt stay F32. Every tensor's bytes equal llama.cpp's quantizer output.
DFlash drafts (config.json with dflash_config): F32 F16 BF16 Q8_0 Q4_K_M (docs/dflash-gguf.md).
"""

TypeOpt = Annotated[str, typer.Option("--type", "-t", metavar="TYPE", help=f"Output type: {', '.join(TYPES)}.")]
OutOpt = Annotated[
    Optional[Path], typer.Option("-o", "--output", metavar="OUT", help="Output .gguf (default: <name>-<TYPE>.gguf).")
]
RequantOpt = Annotated[
    bool, typer.Option("--allow-requantize", help="Allow re-quantizing tensors that are already quantized (lossy).")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")]


def quantize(
    src: Annotated[
        str,
        typer.Argument(metavar="SRC", help="HF folder (Qwen3.5 or DFlash draft), .gguf file, or a pulled alias."),
    ],
    qtype: TypeOpt = "Q4_K_M",
    output: OutOpt = None,
    allow_requantize: RequantOpt = False,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a GGUF of SRC in TYPE, tensor by tensor (llama.cpp-identical quantization)."""
    from lucebox_cli.quant import convert

    name = qtype.upper()
    if name not in TYPES:
        raise UsageError(f"unknown --type {qtype!r}", hint=f"choose one of {', '.join(TYPES)}")
    path, from_cache = _resolve_source(src)
    out = output if output is not None else _default_output(path, src, name, from_cache)
    with _progress_bar(out) as progress:
        report = convert.quantize(path, out, name, allow_requantize=allow_requantize,
                                  progress=progress, overwrite=force)
    if json_out:
        print_json(report.to_dict())
    else:
        _print_report(report)


def register(app: typer.Typer) -> None:
    app.command("quantize", epilog=EPILOG)(quantize)


def _resolve_source(src: str) -> tuple[Path, bool]:
    """(file or folder to read, whether it came from the HF cache)."""
    from lucebox_cli import hub, registry
    from lucebox_cli.errors import ModelNotFound

    spec = registry.resolve(src)
    if spec.is_local:
        return spec.local_path, False  # type: ignore[return-value]
    # Only the target (and its tokenizer) is needed; a missing draft must not block quantization.
    spec = dataclasses.replace(spec, repos=tuple(r for r in spec.repos if r.role in ("target", "tokenizer")))
    found = hub.find_local(spec)
    targets = found.paths("target")
    if spec.format == "gguf":
        ggufs = [p for p in targets if p.suffix == ".gguf"]
        if len(ggufs) != 1:
            raise ModelNotFound(f"{src}: expected one cached .gguf, found {len(ggufs)}",
                                hint="split GGUFs are not supported as input; quantize from the HF checkpoint")
        return ggufs[0], True
    folder = found.dir("target")
    if folder is None:
        raise ModelNotFound(f"{src} is not in the cache", hint=f"run `lucebox pull {src}` first")
    return folder, True


def _default_output(path: Path, src: str, qtype: str, from_cache: bool) -> Path:
    from lucebox_cli.quant.convert import default_output

    if from_cache:
        # Never write into the HF cache: the current folder, named after the alias.
        return Path.cwd() / f"{src.split(':')[0].replace('/', '_')}-{qtype}.gguf"
    return default_output(path, qtype)


@contextmanager
def _progress_bar(out: Path) -> Iterator:
    columns = (
        TextColumn("{task.description}", style="cyan"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr_console(), transient=True) as bars:
        task = bars.add_task(escape(out.name), total=None)

        def update(done: int, total: int, name: str) -> None:
            bars.update(task, completed=done, total=total, description=escape(f"{out.name}: {name}"))

        yield update


def _print_report(report) -> None:
    console = stdout_console()
    table = Table(title=escape(report.out), title_justify="left", show_edge=False)
    for col in ("type", "tensors", "MB", "bits/weight"):
        table.add_column(col, justify="left" if col == "type" else "right")
    by_type: dict[str, list] = {}
    for t in report.tensors:
        by_type.setdefault(t.ggml_type, []).append(t)
    for ggml_type, ts in sorted(by_type.items(), key=lambda kv: -sum(t.nbytes for t in kv[1])):
        nbytes = sum(t.nbytes for t in ts)
        weights = sum(t.nbytes * 8 / t.bits_per_weight for t in ts if t.bits_per_weight)
        table.add_row(ggml_type, str(len(ts)), f"{nbytes / 1e6:.1f}", f"{8 * nbytes / max(weights, 1):.3f}")
    console.print(table)
    console.print(
        f"{report.qtype}: {report.total_bytes / 1e6:.1f} MB, {report.bits_per_weight:.3f} bits/weight, "
        f"{len(report.tensors)} tensors in {report.seconds:.1f} s"
    )
