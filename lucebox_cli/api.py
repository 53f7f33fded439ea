"""The library surface the CLI, bench and tests use. Never prints.

    model = load_model("qwen3.5-0.8b")              # alias (HF cache), HF folder, or .gguf file
    opened = open_engine(cfg, model)                 # -> OpenedEngine(engine, model, note)
    result = generate(cfg, prompt_ids, on_token=cb)  # -> GenerationResult(prompt_tokens, tokens, text, stats)

Engine choice: "cpu" is the numpy reference engine; "cuda" the built GPU engine for the model (the
0.8B decode megakernel, or the quantized 27B target engine for qwen35 GGUFs with its head sizes);
"auto" tries cuda and falls back to cpu, saying why in `note`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from lucebox_cli.config import RunConfig
from lucebox_cli.errors import (
    BadModelFile,
    EngineUnavailable,
    ModelNotFound,
    ProfileError,
    ProfileMismatch,
    UnsupportedModel,
    UsageError,
)
from lucebox_cli.models.qwen35 import Qwen35Config, check_weights, load_hf_checkpoint, read_hf_config

ENGINES = ("auto", "cpu", "cuda")
# (token id, decoded text piece: '' while a multi-byte character is incomplete or without a tokenizer)
TokenCallback = Callable[[int, str], None]


@dataclass
class LoadedModel:
    """A target model in the internal layout, with what generation needs around it."""

    name: str  # what the user asked for
    path: Path  # HF checkpoint folder or .gguf file
    format: str  # "safetensors" | "gguf"
    cfg: Qwen35Config
    # GGUF name -> float32. For a .gguf file a read-only gguf_io.LazyWeights: a lookup dequantizes that
    # tensor (nothing is dequantized at load); shapes and sizes come from its tensor infos.
    weights: Mapping[str, np.ndarray]
    tokenizer: Any = None  # lucebox_cli.tokenizer.Tokenizer, or None when the model ships none
    eos_ids: tuple[int, ...] = ()
    draft_path: Optional[Path] = None  # the registry's draft for this alias, when cached
    gguf: Any = None  # the open gguf_io.GGUFModel of a .gguf target: the 27B engine reads its blocks directly


@dataclass
class OpenedEngine:
    engine: Any  # an Engine (engines/base.py)
    model: LoadedModel
    note: Optional[str] = None  # why "auto" chose what it chose, for the stats line


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    stats: dict[str, Any] = field(default_factory=dict)


# ---- models ----


def load_model(path_or_alias: str | Path) -> LoadedModel:
    """Resolve an alias (from the local HF cache, never the network), an HF folder or a .gguf file."""
    from lucebox_cli import hub, registry

    name = str(path_or_alias)
    spec = registry.resolve(name)
    if spec.is_local:
        path, tok_dir, draft = Path(spec.local_path), None, None
    else:
        pulled = hub.find_local(spec)
        target = pulled.paths("target")
        path = _gguf_in(target) if spec.format == "gguf" else pulled.dir("target")
        tok_dir, draft = pulled.dir("tokenizer"), pulled.dir("draft")
    if path.is_dir() and not (path / "config.json").is_file():
        path = _gguf_in(sorted(path.glob("*.gguf")))
    model = _load_gguf(name, path) if path.is_file() else _load_hf(name, path)
    if tok_dir is not None and model.tokenizer is None:
        model.tokenizer = _hf_tokenizer(tok_dir)
        model.eos_ids = _eos_ids(model.eos_ids, model.tokenizer)
    model.draft_path = draft
    return model


def _gguf_in(paths: Sequence[Path]) -> Path:
    ggufs = [Path(p) for p in paths if str(p).lower().endswith(".gguf")]
    if not ggufs:
        raise ModelNotFound("no config.json or .gguf file found", hint="point at an HF checkpoint folder or a .gguf file")
    if len(ggufs) > 1:
        raise UnsupportedModel(
            f"expected one .gguf file, found {len(ggufs)}: {', '.join(p.name for p in ggufs) or 'none'}",
            hint="split GGUFs are not supported yet: merge them with llama-gguf-split --merge",
        )
    return ggufs[0]


def _load_hf(name: str, folder: Path) -> LoadedModel:
    cfg, weights = load_hf_checkpoint(folder)
    tokenizer = _hf_tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
    declared: list[int] = []
    config = read_hf_config(folder)
    for source in (config, config.get("text_config") or {}, _json_or_empty(folder / "generation_config.json")):
        declared += _as_ids(source.get("eos_token_id"))
    return LoadedModel(name, folder, "safetensors", cfg, weights, tokenizer, _eos_ids(declared, tokenizer))


def _load_gguf(name: str, path: Path) -> LoadedModel:
    """Header, config and tokenizer only: tensors stay in the memory map until an engine reads them."""
    from lucebox_cli.gguf_io import GGUFModel, LazyWeights

    gguf = GGUFModel(path)
    embd = gguf.tensor_info("token_embd.weight")
    cfg = Qwen35Config.from_gguf_metadata(gguf.metadata, vocab=embd.shape[0], tied="output.weight" not in gguf)
    weights = LazyWeights(gguf)
    check_weights(cfg, weights, source=str(path))  # from the tensor infos
    tokenizer = None
    if "tokenizer.ggml.tokens" in gguf.metadata:
        from lucebox_cli.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
    declared = _as_ids(gguf.get("tokenizer.ggml.eos_token_id")) + _as_ids(gguf.get("tokenizer.ggml.eot_token_id"))
    return LoadedModel(name, path, "gguf", cfg, weights, tokenizer, _eos_ids(declared, tokenizer), gguf=gguf)


def _hf_tokenizer(folder: Path):
    from lucebox_cli.tokenizer import Tokenizer

    return Tokenizer.from_hf_folder(folder)


def _json_or_empty(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        raise BadModelFile(f"{path} is not valid JSON: {err}") from None


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _eos_ids(declared: Sequence[int], tokenizer: Any) -> tuple[int, ...]:
    """Declared EOS ids, else the tokenizer's end tokens (<|im_end|>, <|endoftext|>)."""
    ids = list(declared)
    if not ids and tokenizer is not None:
        ids = [tokenizer.eos_id, tokenizer.im_end_id, tokenizer.endoftext_id]
    return tuple(dict.fromkeys(int(i) for i in ids))


# ---- engines ----


def open_engine(
    cfg: RunConfig, model: Optional[LoadedModel] = None, *, tap_layers: Sequence[int] = ()
) -> OpenedEngine:
    """Open cfg.engine for the model (loading cfg.model when not given)."""
    if cfg.engine not in ENGINES:
        raise UsageError(f"unknown engine {cfg.engine!r}", hint="use one of: " + ", ".join(ENGINES))
    model = model if model is not None else load_model(cfg.model)
    if cfg.engine == "cpu":
        return OpenedEngine(_open_cpu(cfg, model, tap_layers), model)
    try:
        return OpenedEngine(_open_cuda(cfg, model, tap_layers), model)
    except (EngineUnavailable, UnsupportedModel, ProfileMismatch, ProfileError) as err:
        if cfg.engine == "cuda":
            raise
        note = f"using the CPU reference engine (slow): {err.message}"
        return OpenedEngine(_open_cpu(cfg, model, tap_layers), model, note)


def _open_cpu(cfg: RunConfig, model: LoadedModel, tap_layers: Sequence[int]):
    from lucebox_cli.engines.cpu import CPUEngine

    return CPUEngine(model.cfg, model.weights, tap_layers=tap_layers, max_context=cfg.max_context)


def _open_cuda(cfg: RunConfig, model: LoadedModel, tap_layers: Sequence[int]):
    """The built GPU engine for this model and run; EngineUnavailable / UnsupportedModel say why not."""
    from lucebox_cli.engines import _lib

    # No GPU is the first thing to say: shape limits of a CUDA engine are moot on a machine without one.
    probe = _lib.probe_gpus()
    if not probe.gpus:
        raise EngineUnavailable(f"no NVIDIA GPU ({probe.reason})", hint="use --engine cpu, or run on a machine with a GPU")
    if model.format == "gguf" and model.cfg.head_dim == 256 and model.cfg.dk == 128:
        # qwen35 GGUFs at the 27B head sizes: the quantized target engine (engines/dflash.py). With --spec
        # chain/ddtree it verifies and commits on the GPU while the draft (replay, or the DFlash draft in
        # numpy) runs on the CPU: correct and lossless, but the draft is not fast yet (no GPU draft).
        from lucebox_cli.engines.dflash import DFlashTargetEngine

        return DFlashTargetEngine(model.gguf or model.path, profile=cfg.profile, max_context=cfg.max_context, budget=cfg.budget,
                                  tap_layers=tap_layers, prefill_weights=cfg.prefill_weights)
    if cfg.spec != "none" or tap_layers:
        raise EngineUnavailable(
            "no CUDA engine with speculative verify is available in this build (the megakernel only decodes)",
            hint="use --spec none for the megakernel, or --engine cpu",
        )
    from lucebox_cli.engines.megakernel import MegakernelEngine

    return MegakernelEngine(model.cfg, model.weights, profile=cfg.profile, max_context=cfg.max_context)


# ---- generation ----


def encode_prompt(cfg: RunConfig, model: LoadedModel, prompt: str) -> list[int]:
    """Token ids of a text prompt; with cfg.chat, wrapped as one user turn of the chat template."""
    if model.tokenizer is None:
        raise UsageError(f"{model.name} has no tokenizer, so a text prompt cannot be encoded",
                         hint="pass token ids (--prompt-ids 1,2,3) or add tokenizer.json to the folder")
    if cfg.chat:
        return model.tokenizer.encode_chat([{"role": "user", "content": prompt}], thinking=cfg.thinking)
    return model.tokenizer.encode(prompt)


def generate(
    cfg: RunConfig,
    prompt_ids: Optional[Sequence[int]] = None,
    *,
    prompt: Optional[str] = None,
    on_token: Optional[TokenCallback] = None,
    model: Optional[LoadedModel] = None,
    opened: Optional[OpenedEngine] = None,
) -> GenerationResult:
    """Generate after `prompt_ids` (or the encoded text `prompt`); on_token(id, text) streams each token.

    Pass `opened` (from open_engine, with the draft's tap layers if any) to reuse one engine across
    calls (bench); it is then left open. Otherwise an engine is opened for this call and closed.
    """
    model = opened.model if opened is not None else model if model is not None else load_model(cfg.model)
    if prompt_ids is None:
        if prompt is None:
            raise UsageError("no prompt given", hint="give --prompt TEXT or --prompt-ids 1,2,3")
        prompt_ids = encode_prompt(cfg, model, prompt)
    prompt_ids = [int(t) for t in prompt_ids]
    t0 = time.perf_counter()
    draft_setup = draft_setup_for(cfg, model)
    owned = opened is None
    if owned:
        opened = open_engine(cfg, model, tap_layers=draft_setup[0] if draft_setup else ())
    load_s = time.perf_counter() - t0
    try:
        draft = draft_setup[1](opened.engine) if draft_setup else None
        stream = model.tokenizer.stream_decoder() if model.tokenizer is not None else None

        def emit(token: int) -> None:
            if on_token is not None:
                on_token(token, stream.push(token) if stream is not None else "")

        result = _run_loop(opened.engine, draft, cfg, prompt_ids, emit, model.eos_ids)
        if on_token is not None and stream is not None and (tail := stream.flush()):
            on_token(-1, tail)  # id -1: text held back at the end, not a token
    finally:
        if owned:
            opened.engine.close()
    text = model.tokenizer.decode(result.tokens) if model.tokenizer is not None else ""
    stats = {**result.stats(), "engine": opened.engine.name, "note": opened.note, "load_s": round(load_s, 3)}
    return GenerationResult(prompt_ids, list(result.tokens), text, stats)


def _run_loop(engine, draft, cfg: RunConfig, prompt_ids: list[int], emit: Callable[[int], None], eos_ids):
    """The one dispatch point to the decode loop: spec/loop.py runs plain (--spec none) and speculative."""
    from lucebox_cli.spec.loop import speculative_generate

    return speculative_generate(engine, draft, cfg, prompt_ids, on_token=emit, eos_ids=eos_ids)


def draft_setup_for(cfg: RunConfig, model: LoadedModel):
    """(tap layers the engine must capture, engine -> Draft) for cfg.draft, or None without a draft."""
    if cfg.spec == "none":
        return None
    from lucebox_cli.spec.drafts import DFlashDraftAdapter, ReplayDraft, parse_draft_arg

    kind, rate = parse_draft_arg(cfg.draft)
    if kind == "none" and model.draft_path is None:
        raise UsageError(f"--spec {cfg.spec} needs a draft", hint="add --draft DRAFT (an alias, folder, .gguf or replay:RATE)")
    if kind == "replay":
        return (), lambda engine: ReplayDraft(rate=float(rate or 0.0), seed=cfg.seed)
    source = model.draft_path if kind == "none" else _draft_source(cfg.draft)
    from lucebox_cli.models.dflash_draft import DFlashDraft, load_draft

    dcfg, dweights = load_draft(source)
    # one lookup each: a GGUF's lazy weights dequantize on every lookup
    embd = model.weights["token_embd.weight"]
    head = embd if model.cfg.tied else model.weights["output.weight"]

    def make(engine):
        draft = DFlashDraft(dcfg, dweights, embd, head)
        return DFlashDraftAdapter(draft, label=f"dflash:{Path(source).name}")

    return tuple(int(i) for i in dcfg.target_layer_ids), make


def _draft_source(arg: str) -> Path:
    """A --draft alias / repo / path -> the local draft folder or .gguf."""
    from lucebox_cli import hub, registry

    spec = registry.resolve(arg)
    if spec.is_local:
        return Path(spec.local_path)
    pulled = hub.find_local(spec)
    found = pulled.dir("draft") or pulled.dir("target")
    if found is None:
        raise ModelNotFound(f"no draft files for {arg} in the cache", hint=f"run `lucebox pull {arg}`")
    return found


__all__ = [
    "ENGINES",
    "GenerationResult",
    "LoadedModel",
    "OpenedEngine",
    "encode_prompt",
    "generate",
    "load_model",
    "open_engine",
]
