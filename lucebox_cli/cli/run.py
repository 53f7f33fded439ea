"""`lucebox run MODEL`: generate text; tokens stream to stdout, a stats line goes to stderr."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from lucebox_cli.cli.options import PREFILL_WEIGHTS_CHOICES, PREFILL_WEIGHTS_HELP, JsonOpt, ProfileOpt, check_choice
from lucebox_cli.cli.output import print_json, stderr_console
from lucebox_cli.errors import UsageError

EPILOG = """\
Examples:

\b
  lucebox run qwen3.5-0.8b --prompt "Write a haiku about GPUs" --chat
  lucebox run ./my-checkpoint --engine cpu --prompt-ids 1,2,3 --max-tokens 16 --json
  lucebox run model.gguf --prompt "def fib(n):" --temperature 0.7 --top-p 0.9 --seed 1
  lucebox run qwen3.5-27b --spec ddtree --budget 22 --prompt "..." --chat

MODEL is an alias (from the local HF cache: `lucebox pull` it first), an HF checkpoint folder
(config.json + safetensors + tokenizer.json) or a .gguf file. Default sampling is greedy.
"""

SPEC_CHOICES = ("none", "chain", "ddtree")
ENGINE_CHOICES = ("auto", "cpu", "cuda")


def run(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Alias, HF checkpoint folder, or .gguf file.")],
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="Prompt text.")] = None,
    prompt_ids: Annotated[
        Optional[str], typer.Option("--prompt-ids", metavar="IDS", help="Prompt as comma-separated token ids.")
    ] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="auto | cpu | cuda (default auto).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap --prompt as a user turn of the chat template.")] = False,
    thinking: Annotated[
        Optional[bool], typer.Option("--thinking/--no-thinking", help="Let the chat model think first (default off).")
    ] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Tokens to generate (default 128).")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="0 = greedy (default).")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampling seed.")] = None,
    draft: Annotated[
        Optional[str], typer.Option("--draft", help="Draft for --spec: alias, folder, .gguf, or replay[:RATE].")
    ] = None,
    spec: Annotated[Optional[str], typer.Option("--spec", help="none | chain | ddtree (default none).")] = None,
    budget: Annotated[Optional[int], typer.Option("--budget", help="DDTree node budget (default 22).")] = None,
    max_context: Annotated[Optional[int], typer.Option("--max-context", help="KV cache length (default 4096).")] = None,
    prefill_weights: Annotated[Optional[str], typer.Option("--prefill-weights", help=PREFILL_WEIGHTS_HELP)] = None,
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Generate text with a Qwen3.5/3.6 model."""
    from lucebox_cli import api
    from lucebox_cli.config import get_profile, resolve_run_config

    check_choice("--engine", engine, ENGINE_CHOICES)
    check_choice("--spec", spec, SPEC_CHOICES)
    check_choice("--prefill-weights", prefill_weights, PREFILL_WEIGHTS_CHOICES)
    ids = _parse_ids(prompt_ids)
    if (prompt is None) == (ids is None):
        raise UsageError("give exactly one of --prompt TEXT and --prompt-ids 1,2,3")
    values = dict(model=model, engine=engine, chat=chat or None, thinking=thinking, max_tokens=max_tokens,
                  temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft=draft, spec=spec,
                  budget=budget, max_context=max_context, profile=profile, prefill_weights=prefill_weights)
    profile_name = profile or os.environ.get("LUCEBOX_PROFILE") or None
    cfg = resolve_run_config(values, get_profile(profile_name) if profile_name else None)
    loaded = api.load_model(cfg.model)
    # Without a tokenizer the stream shows token ids.
    has_tokenizer = loaded.tokenizer is not None

    def stream(token: int, piece: str) -> None:
        if json_out:
            return
        sys.stdout.write(piece if has_tokenizer else (f"{token} " if token >= 0 else ""))
        sys.stdout.flush()

    result = api.generate(cfg, ids, prompt=prompt, on_token=stream, model=loaded)
    if json_out:
        print_json({"prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": result.text,
                    "stats": result.stats})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    _print_stats(result.stats)


def _parse_ids(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError:
        raise UsageError(f"--prompt-ids {text!r} is not a comma-separated list of integers",
                         hint="e.g. --prompt-ids 9707,11,1879") from None
    if not ids:
        raise UsageError("--prompt-ids is empty")
    return ids


def _print_stats(stats: dict) -> None:
    console = stderr_console()
    if stats.get("note"):
        console.print(f"note: {stats['note']}", markup=False, soft_wrap=True)
    line = (f"prompt {stats['prompt_tokens']} tokens, generated {stats['generated_tokens']} tokens, "
            f"{stats['tok_per_s']:.2f} tok/s ({stats['engine']} engine")
    if stats.get("mode") not in (None, "none"):
        line += (f", {stats['mode']} with {stats['draft']}, {stats['steps']} steps, "
                 f"acceptance length {stats['al_mean']:.2f}")
    console.print(line + ")", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("run", epilog=EPILOG)(run)
