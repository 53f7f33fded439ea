"""Whole Qwen3.5 models to and from GGUF: config + internal-layout weights + tokenizer.

`write_model_gguf` writes what llama.cpp's converter would for a `qwen35` model (all metadata, the
tokenizer, tensors in float types or already-packed `QuantTensor`s), streaming one tensor at a
time. `load_model_gguf` reads any such file back (ours or llama.cpp's, quantized or not) into
(config, float32 weights, tokenizer) for the CPU engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from lucebox_cli.errors import UnsupportedModel
from lucebox_cli.gguf_io import (
    FLOAT_TYPES,
    FloatTensor,
    GGUFModel,
    QuantTensor,
    TensorPlan,
    TensorStream,
    write_gguf,
)
from lucebox_cli.models.qwen35 import ARCH, Qwen35Config, check_weights, expected_tensors
from lucebox_cli.tokenizer import Tokenizer

# llama_ftype values for general.file_type of uniformly typed files.
FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}

TypeChoice = Union[str, Mapping[str, str], Callable[[str, tuple], str], None]


def keeps_f32(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors llama.cpp's converter always keeps in F32: vectors (norms, ssm_a, dt) and the conv."""
    return len(shape) == 1 or name.endswith("ssm_conv1d.weight")


def _type_for(name: str, shape: tuple[int, ...], types: TypeChoice) -> str:
    if keeps_f32(name, shape):
        return "F32"
    if types is None:
        return "F32"
    if isinstance(types, str):
        chosen = types
    elif callable(types):
        chosen = types(name, shape)
    else:
        chosen = types.get(name, "F32")
    if chosen not in FLOAT_TYPES:
        raise UnsupportedModel(
            f"{name}: {chosen} needs packed blocks; pass a QuantTensor for it",
            hint=f"write_model_gguf converts only to {', '.join(FLOAT_TYPES)}",
        )
    return chosen


def _plan(cfg: Qwen35Config, weights: Mapping[str, Any], types: TypeChoice) -> list[TensorPlan]:
    plan = []
    for name, shape in expected_tensors(cfg).items():
        value = weights[name]
        if isinstance(value, QuantTensor):
            plan.append(TensorPlan(name, value.ggml_type, tuple(value.shape)))
        else:
            plan.append(TensorPlan(name, _type_for(name, shape, types), shape))
    return plan


def _tensor_data(plan: list[TensorPlan], weights: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    # Looked up lazily so a weights mapping that loads on access holds one tensor at a time.
    for p in plan:
        value = weights[p.name]
        if isinstance(value, QuantTensor):
            yield p.name, value
        else:
            yield p.name, FloatTensor(np.asarray(value), p.ggml_type)


def write_model_gguf(
    path: str | os.PathLike[str],
    cfg: Qwen35Config,
    weights: Mapping[str, Any],
    tokenizer: Tokenizer,
    types: TypeChoice = None,
    *,
    name: str | None = None,
    extra_metadata: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    inputs: tuple = (),
    overwrite: bool = True,
) -> Path:
    """Write a complete qwen35 GGUF.

    `weights`: internal layout (GGUF names, numpy float arrays or `QuantTensor`s). `types`: the
    float type of the matrices: one of F32/F16/BF16, a {name: type} map, or a function (name,
    shape) -> type; vectors and the conv weight stay F32 as in llama.cpp's files.
    """
    # QuantTensor carries its element shape, so one check covers both kinds of value.
    check_weights(cfg, weights)
    plan = _plan(cfg, weights, types)
    meta = cfg.to_gguf_metadata()
    meta.pop("general.architecture", None)
    meta["general.name"] = name or "qwen35"
    matrix_types = {p.ggml_type for p in plan if not keeps_f32(p.name, p.shape)}
    if len(matrix_types) == 1 and next(iter(matrix_types)) in FILE_TYPES:
        meta["general.file_type"] = FILE_TYPES[next(iter(matrix_types))]
    if extra_metadata:
        meta.update(extra_metadata)
    return write_gguf(
        path, ARCH, meta, TensorStream(plan, _tensor_data(plan, weights)),
        tokenizer=tokenizer.to_gguf_metadata(vocab_size=cfg.vocab),
        progress=progress, inputs=inputs, overwrite=overwrite,
    )


def read_model_config(model: GGUFModel) -> Qwen35Config:
    """The config of an open qwen35 GGUF (vocab from the embedding, tied when `output` is absent)."""
    if model.architecture != ARCH:
        raise UnsupportedModel(
            f"{model.path}: architecture {model.architecture!r} is not {ARCH!r}",
            hint="lucebox runs Qwen3.5/3.6 GGUFs",
        )
    vocab = model.require("token_embd.weight").shape[0]
    return Qwen35Config.from_gguf_metadata(model.metadata, vocab=vocab, tied="output.weight" not in model)


def load_model_gguf(path: str | os.PathLike[str]) -> tuple[Qwen35Config, dict[str, np.ndarray], Tokenizer]:
    """(config, {gguf name: float32 array}, tokenizer) of a qwen35 GGUF, dequantizing every tensor."""
    model = GGUFModel(path)
    cfg = read_model_config(model)
    weights = {}
    for name, shape in expected_tensors(cfg).items():
        model.require(name, shape)
        weights[name] = model.dequant(name)
    return cfg, weights, Tokenizer.from_gguf_metadata(model.metadata)
