"""llama.cpp's llama-bench as a baseline beside our speed rows (`lucebox bench speed --baseline-llama-bench`).

The one place that talks to llama-bench: builds its argv from our -p/-n/-r/-d/--warmup, runs it with a
timeout, parses its `-o json` output (fields as llama-bench prints them: n_prompt, n_gen, n_depth,
avg_ts, stddev_ts, samples_ts, model_size, model_n_params, gpu_info, backends, build_commit, ...) and
turns each record into one of our rows, engine="llama.cpp", named like the row of ours it measures.

Same test, same meaning. Our tg<N> generates N tokens after the P-token prompt; llama-bench's tg<N> starts
from an empty context. So tg runs as `-p 0 -n N -d P` (llama-bench fills P tokens untimed, then times N),
and our tg<N>@d<D> as `-d D`; pp<P> runs alone at depth 0. That takes two llama-bench runs (pp, then tg at
its depths): one run with `-d 0,P` would also time pp at depth P, which we do not measure.
GB/s and % bw use runner.bytes_per_token with llama.cpp's own model_size, so they say what llama.cpp
moves per token. Energy is not metered around llama-bench (tok/J stays empty).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence

from lucebox_cli.errors import LuceboxError, UsageError

ENGINE = "llama.cpp"
DEFAULT_TIMEOUT_S = 1800.0
# per-test keys of a llama-bench JSON record that we cannot do without
_REQUIRED = ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "samples_ts")


class BaselineError(LuceboxError):
    """llama-bench missing, failing, too slow, or printing something that is not its JSON rows.

    `rows` holds the llama.cpp rows of runs that did finish before the failure (llama-bench itself
    prints the tests it completed before exiting 1)."""

    def __init__(self, message: str, hint: Optional[str] = None, rows: Optional[list[dict[str, Any]]] = None):
        super().__init__(message, hint)
        self.rows = rows or []


def require_gguf(model: Any, model_arg: str) -> Path:
    """The GGUF file a loaded model came from; llama-bench reads nothing else."""
    if getattr(model, "format", None) != "gguf" or not Path(model.path).is_file():
        raise UsageError(
            f"--baseline-llama-bench needs a GGUF model; {model_arg!r} is {getattr(model, 'format', '?')} "
            f"({model.path})",
            hint="pass a .gguf file or a :QUANT alias, or make one: lucebox quantize FOLDER --type Q8_0 -o model.gguf",
        )
    return Path(model.path)


def build_argvs(binary: str | os.PathLike, gguf: str | os.PathLike, *, n_prompt: int, n_gen: int, reps: int,
                depth: int = 0, warmup: int = 1) -> list[list[str]]:
    """The llama-bench command lines that measure what our rows measure (module docstring): a pp run if
    n_prompt > 0, a tg run (at depth n_prompt, and at `depth` too when given) if n_gen > 0.

    llama-bench has one warm-up run per test (or none with --no-warmup); our --warmup N > 1 has no
    llama-bench equivalent and maps to its one."""
    common = ["-m", str(gguf), "-r", str(reps), "-o", "json"] + ([] if warmup > 0 else ["--no-warmup"])
    argvs = []
    if n_prompt > 0:
        argvs.append([str(binary), *common, "-p", str(n_prompt), "-n", "0"])
    if n_gen > 0:
        depths = sorted({n_prompt} | ({depth} if depth > 0 else set()))
        # -d only when needed: llama-bench builds older than its -d option still run plain pp/tg
        d_args = ["-d", ",".join(map(str, depths))] if depths != [0] else []
        argvs.append([str(binary), *common, "-p", "0", "-n", str(n_gen), *d_args])
    return argvs


def our_test_name(rec: dict[str, Any], n_prompt: int) -> str:
    """Our name for a llama-bench record: pp<P>, tg<N> (at depth = our prompt), tg<N>@d<D>."""
    p, n, d = int(rec["n_prompt"]), int(rec["n_gen"]), int(rec.get("n_depth") or 0)
    if p > 0 and n == 0:
        return f"pp{p}" + (f"@d{d}" if d else "")
    if n > 0 and p == 0:
        return f"tg{n}" if d == n_prompt else f"tg{n}@d{d}"
    return f"pp{p}+tg{n}" + (f"@d{d}" if d else "")


def llama_bench_name(rec: dict[str, Any]) -> str:
    """llama-bench's own label (its markdown `test` column), kept so either naming can be checked."""
    p, n, d = int(rec["n_prompt"]), int(rec["n_gen"]), int(rec.get("n_depth") or 0)
    name = f"pp{p}" if n == 0 else f"tg{n}" if p == 0 else f"pp{p}+tg{n}"
    return name + (f" @ d{d}" if d else "")


def parse_json(text: str) -> list[dict[str, Any]]:
    """llama-bench `-o json` stdout -> its records; ValueError naming what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        snippet = text.strip().splitlines()[0][:60] if text.strip() else "nothing"
        raise ValueError(f"not JSON ({err.msg} at line {err.lineno}; starts with {snippet!r})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"expected a JSON list of objects, got {type(data).__name__}")
    for rec in data:
        missing = [k for k in _REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"a record lacks {', '.join(missing)}")
        samples = rec["samples_ts"]
        if (not isinstance(samples, list) or not samples
                or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in samples)):
            raise ValueError("samples_ts is not a list of positive numbers")
        if not all(isinstance(rec[k], (int, float)) for k in ("n_prompt", "n_gen", "avg_ts", "stddev_ts")):
            raise ValueError("n_prompt / n_gen / avg_ts / stddev_ts are not numbers")
    return data


def to_rows(records: Sequence[dict[str, Any]], *, n_prompt: int, warmup: int, cfg: Any = None, hardware: Any = None,
            base: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """One row per record, in our row format (bench/runner.speed_rows); `base` (model name, random-weights
    flag) is merged in; the whole record stays under "llama_bench"."""
    from lucebox_cli.bench.runner import bytes_per_token

    rows = []
    for rec in records:
        test = our_test_name(rec, n_prompt)
        samples = [float(x) for x in rec["samples_ts"]]
        tok_s = float(rec["avg_ts"])
        params = rec.get("model_n_params")
        size = rec.get("model_size")
        p, n, d = int(rec["n_prompt"]), int(rec["n_gen"]), int(rec.get("n_depth") or 0)
        is_pp = p > 0 and n == 0
        # the same context runner.speed_rows states bytes at: mid-generation
        gbps = (tok_s * bytes_per_token(cfg, int(size), d + n / 2) / 1e9
                if cfg is not None and size is not None and not is_pp else None)
        row = dict(base or {})
        row.update({
            "engine": ENGINE, "test": test, "tok_s": tok_s, "sd": float(rec["stddev_ts"]),
            "median": statistics.median(samples), "samples": samples, "reps": len(samples),
            "warmup": 1 if warmup > 0 else 0,
            "params_m": params / 1e6 if params is not None else None,
            "size_gib": size / 2**30 if size is not None else None,
            "gbps": gbps,
            "tflops": 2.0 * params * tok_s / 1e12 if is_pp and params is not None else None,
            "pct_bw": 100.0 * gbps / hardware.bandwidth_gbps if hardware and gbps is not None else None,
            "pct_bw_measured": (100.0 * gbps / hardware.bandwidth_measured_gbps
                                if hardware and gbps is not None and getattr(hardware, "bandwidth_measured_gbps", None)
                                else None),
            "tok_per_j": None, "profile": None,
            "gpu": rec.get("gpu_info") or None, "commit": rec.get("build_commit"), "backends": rec.get("backends"),
            "llama_bench_test": llama_bench_name(rec), "llama_bench": dict(rec),
        })
        rows.append(row)
    return rows


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output on stderr"


def run_json(argv: list[str], timeout_s: float) -> list[dict[str, Any]]:
    """Run one llama-bench command line; its records, or BaselineError with a one-line reason."""
    binary = argv[0]
    if not Path(binary).exists():
        raise BaselineError(f"llama-bench not found: {binary}",
                            hint="pass the path of llama.cpp's llama-bench (e.g. llama.cpp/build/bin/llama-bench)")
    if Path(binary).is_dir() or not os.access(binary, os.X_OK):
        raise BaselineError(f"llama-bench is not an executable file: {binary}",
                            hint=f"chmod +x {binary}, or pass the llama-bench binary itself")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BaselineError(f"llama-bench did not finish within {timeout_s:g} s (killed)",
                            hint="raise --baseline-timeout, or lower -r / -p / -n") from None
    except OSError as err:
        raise BaselineError(f"llama-bench could not start: {err.strerror or err}",
                            hint="check that PATH is a llama-bench binary built for this machine") from None
    if done.returncode != 0:
        raise BaselineError(f"llama-bench exited with status {done.returncode}: {_tail(done.stderr)}",
                            hint="run it by hand to see its log: " + " ".join(argv))
    try:
        return parse_json(done.stdout)
    except ValueError as err:
        raise BaselineError(f"llama-bench output is not its -o json rows: {err}",
                            hint="check that PATH is llama.cpp's llama-bench (one with -o json)") from None


def hardware_of(profile_name: Optional[str]) -> Any:
    """The profile's hardware (for % bw), or None: no profile (CPU engine) or one that no longer loads."""
    if not profile_name:
        return None
    from lucebox_cli.config import get_profile

    try:
        return get_profile(profile_name).hardware
    except LuceboxError:
        return None


def baseline_rows(binary: str | os.PathLike, gguf: str | os.PathLike, *, n_prompt: int, n_gen: int, reps: int,
                  depth: int = 0, warmup: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S, cfg: Any = None,
                  hardware: Any = None, base: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """llama.cpp rows for the same tests as ours. On a failure raises BaselineError whose `rows` are those
    of the llama-bench runs that completed."""
    rows: list[dict[str, Any]] = []
    for argv in build_argvs(binary, gguf, n_prompt=n_prompt, n_gen=n_gen, reps=reps, depth=depth, warmup=warmup):
        try:
            records = run_json(argv, timeout_s)
        except BaselineError as err:
            err.rows = rows
            raise
        rows += to_rows(records, n_prompt=n_prompt, warmup=warmup, cfg=cfg, hardware=hardware, base=base)
    return rows
