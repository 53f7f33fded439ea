"""`lucebox bench speed MODEL -p 520 -n 128 -r 5`: llama-bench style pp/tg rows for one engine.

Registered into the `bench` group by cli/bench.py (`register(bench_app)`); parses, calls the library
(api.load_model / api.open_engine, bench.runner), prints rows. No math here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lucebox_cli.cli.options import PREFILL_WEIGHTS_CHOICES, PREFILL_WEIGHTS_HELP, ProfileOpt, check_choice
from lucebox_cli.errors import UsageError

EPILOG = """\
Examples:

\b
  lucebox bench speed qwen3.5-0.8b                      # pp520 + tg128, 5 repetitions, markdown
  lucebox bench speed ./random-0.8b -p 520 -n 128 -r 5 --json
  lucebox bench speed model.gguf --engine cpu -p 16 -n 8 -r 1
  lucebox bench speed random-27b.gguf -p 520 -n 128 -d 4096 --verify-n 23   # + tg at depth, a 23-slot verify
  lucebox bench speed model.gguf --baseline-llama-bench ~/llama.cpp/build/bin/llama-bench   # + llama.cpp rows
"""

BASELINE_HELP = (
    "Also run this llama-bench binary on the same model, which must be a GGUF (same -p/-n/-r/-d; its tg runs "
    "after the -p prompt, as ours do) and print its rows, engine llama.cpp, beside ours. If it fails "
    "(missing, exit status, timeout, output that is not -o json), our rows and any llama.cpp rows that "
    "finished are still printed, then one error line on stderr and exit status 1, as llama-bench itself "
    "exits 1 after printing the tests it completed."
)


def _git_commit() -> Optional[str]:
    # the device machine gets a copy of the tree without .git: the caller may pass the commit in
    if os.environ.get("LUCEBOX_GIT_COMMIT"):
        return os.environ["LUCEBOX_GIT_COMMIT"]
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _random_flag(model: Any) -> bool:
    from lucebox_cli.models.qwen35 import read_hf_config

    path = Path(model.path)
    if path.is_dir():
        return bool(read_hf_config(path).get("lucebox_random_weights", False))
    try:
        from lucebox_cli.gguf_io import GGUFModel

        return bool(GGUFModel(path).metadata.get("lucebox.random_weights", False))
    except Exception:
        return False


def run_speed(model_arg: str, *, n_prompt: int, n_gen: int, reps: int, engine: str, profile: Optional[str],
              max_context: int, warmup: int, depth: int = 0, verify_n: int = 0,
              loaded: Any = None, prefill_weights: Optional[str] = None) -> list[dict[str, Any]]:
    """Load (unless `loaded` is the already loaded model_arg), open, measure; rows carry GPU, commit and
    the resolved config."""
    from lucebox_cli import api
    from lucebox_cli.bench.runner import speed_rows
    from lucebox_cli.config import RunConfig

    if n_prompt < 0 or n_gen < 0 or reps < 1 or (n_prompt == 0 and n_gen == 0):
        raise UsageError("need -p >= 0, -n >= 0 (not both 0) and -r >= 1")
    if depth < 0 or not 0 <= verify_n <= 64:
        raise UsageError("need --depth >= 0 and --verify-n in 0..64")
    # a verify row needs a tree budget of verify_n - 1 (RunConfig's default otherwise)
    extra = {"budget": max(verify_n - 1, 1)} if verify_n else {}
    cfg = RunConfig(model=model_arg, engine=engine, profile=profile,
                    max_context=max(max_context, n_prompt + n_gen + 1, depth + n_gen + 1, n_prompt + 9 + verify_n),
                    prefill_weights=prefill_weights, **extra)
    model = loaded if loaded is not None else api.load_model(model_arg)
    opened = api.open_engine(cfg, model)
    try:
        eng = opened.engine
        prof = getattr(eng, "profile", None)
        gpu = None
        if eng.name != "cpu":
            from lucebox_cli.engines import _lib

            gpus = _lib.gpu_info()
            gpu = gpus[0]["name"] if gpus else None
        base = {"model": Path(model_arg).name, "random_weights": _random_flag(model),
                "profile": getattr(prof, "name", None), "gpu": gpu, "commit": _git_commit(),
                "note": opened.note, "config": cfg.to_dict(),
                "engine_info": getattr(eng, "info", None)}
        return speed_rows(model, eng, profile=prof, n_prompt=n_prompt, n_gen=n_gen, reps=reps, warmup=warmup,
                          base=base, depth=depth, verify_n=verify_n)
    finally:
        opened.engine.close()


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("speed", epilog=EPILOG)
    def speed(
        model: Annotated[str, typer.Argument(help="Alias, HF folder or .gguf file.")],
        n_prompt: Annotated[int, typer.Option("-p", "--n-prompt", help="Prompt tokens (pp test); 0 skips it.")] = 520,
        n_gen: Annotated[int, typer.Option("-n", "--n-gen", help="Generated tokens (tg test); 0 skips it.")] = 128,
        reps: Annotated[int, typer.Option("-r", "--repetitions", help="Timed repetitions per test.")] = 5,
        warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs before each test.")] = 1,
        engine: Annotated[str, typer.Option("--engine", help="auto | cuda | cpu")] = "auto",
        profile: ProfileOpt = None,
        max_context: Annotated[int, typer.Option("--max-context", help="KV cache rows.")] = 4096,
        depth: Annotated[int, typer.Option("-d", "--depth", help="Also tg<n> after this many context tokens.")] = 0,
        verify_n: Annotated[int, typer.Option("--verify-n", help="Also one tree verify of this many slots "
                                                                 "(time and AR-step units).")] = 0,
        prefill_weights: Annotated[Optional[str], typer.Option("--prefill-weights", help=PREFILL_WEIGHTS_HELP)] = None,
        as_json: Annotated[bool, typer.Option("--json", help="JSON rows with raw samples.")] = False,
        as_md: Annotated[bool, typer.Option("--md", help="Markdown table (default).")] = False,
        as_csv: Annotated[bool, typer.Option("--csv", help="CSV.")] = False,
        baseline: Annotated[Optional[str], typer.Option("--baseline-llama-bench", metavar="PATH",
                                                        help=BASELINE_HELP)] = None,
        baseline_timeout: Annotated[float, typer.Option("--baseline-timeout",
                                                        help="Seconds each llama-bench run may take.")] = 1800.0,
    ) -> None:
        """Prompt processing and generation speed, llama-bench style (warm-up excluded)."""
        from lucebox_cli.bench.report import render

        if as_json + as_md + as_csv > 1:
            raise UsageError("choose one of --json, --md, --csv")
        check_choice("--prefill-weights", prefill_weights, PREFILL_WEIGHTS_CHOICES)
        loaded, gguf, failed = None, None, None
        if baseline is not None:
            from lucebox_cli import api
            from lucebox_cli.bench import llama_bench

            if baseline_timeout <= 0:
                raise UsageError("need --baseline-timeout > 0")
            # checked before measuring: a non-GGUF model cannot have a baseline, so fail before the long part
            loaded = api.load_model(model)
            gguf = llama_bench.require_gguf(loaded, model)
        rows = run_speed(model, n_prompt=n_prompt, n_gen=n_gen, reps=reps, engine=engine, profile=profile,
                         max_context=max_context, warmup=warmup, depth=depth, verify_n=verify_n, loaded=loaded,
                         prefill_weights=prefill_weights)
        if baseline is not None:
            # run_speed has closed our engine: llama.cpp gets the GPU (and its memory) to itself
            kw = dict(n_prompt=n_prompt, n_gen=n_gen, reps=reps, depth=depth, warmup=warmup,
                      timeout_s=baseline_timeout, cfg=loaded.cfg, hardware=llama_bench.hardware_of(rows[0]["profile"]),
                      base={"model": rows[0]["model"], "random_weights": rows[0]["random_weights"]})
            try:
                rows = rows + llama_bench.baseline_rows(baseline, gguf, **kw)
            except llama_bench.BaselineError as err:
                rows, failed = rows + err.rows, err
        typer.echo(render(rows, "json" if as_json else "csv" if as_csv else "md"), nl=False)
        if failed is not None:
            raise failed
