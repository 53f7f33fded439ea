"""HF Qwen3.5 checkpoint → qwen35 GGUF, and GGUF → GGUF requantization, tensor by tensor.

`quantize(src, out, qtype)` plans every tensor (name, type, shape) from headers alone, then streams:
read one tensor, apply the checkpoint fix-ups (models/qwen35.py), quantize, write, drop it. Tensors
that the fix-ups leave as they are (the embedding and LM head, the FFN, most attention matrices) are
read and packed SLAB_ROWS rows at a time, so the 27B embedding (5 GB in float32) never exists in
float32: peak memory is one slab in float32 plus the tensor's packed bytes, or one fixed-up layer
tensor. The file is written to a temporary name and renamed at the end (gguf_io.write_gguf).
Tensors are stored in llama.cpp's order (layer, then name), the order `llama_model_quantize`
writes, so both tools lay out the same model the same way.

A z-lab DFlash draft folder (config.json with `dflash_config`) goes to convert_draft.py instead,
and is reported the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import BadModelFile, LuceboxError, ModelNotFound, UnsupportedModel, UsageError
from lucebox_cli.quant.blocks import block_type, is_quantized
from lucebox_cli.quant.mixes import FTYPES, check_ftype, choose_types, llama_order_key

SUPPORTED_ARCHS = ("qwen35",)
GGML_QUANT_VERSION = 2
# Rows packed at a time: 4096 rows of the 27B embedding (hidden 5120) are 84 MB in float32.
SLAB_ROWS = 4096
ProgressFn = Callable[[int, int, str], None]
RowsFn = Callable[[int, int], np.ndarray]


def encode(x: np.ndarray, ggml_type: str) -> np.ndarray:
    """float32 [..., cols] → the tensor's bytes in `ggml_type` as uint8 [rows, row_bytes]."""
    from lucebox_cli.quant import floats, legacy, q4_k, q5_k, q6_k, q8_0

    kernels: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "Q8_0": q8_0.quantize_q8_0, "Q4_K": q4_k.quantize_q4_k, "Q5_K": q5_k.quantize_q5_k,
        "Q6_K": q6_k.quantize_q6_k, "Q4_0": legacy.quantize_q4_0, "Q5_0": legacy.quantize_q5_0,
        "Q5_1": legacy.quantize_q5_1,
        "F32": lambda a: floats.to_f32(a).view(np.uint8),
        "F16": lambda a: floats.to_f16(a).view(np.uint8),
        "BF16": lambda a: floats.to_bf16(a).view(np.uint8),
    }
    if ggml_type not in kernels:
        raise UnsupportedModel(f"lucebox cannot write tensors of type {ggml_type}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    return kernels[ggml_type](rows).reshape(rows.shape[0], -1)


def encode_rows(rows: RowsFn, shape: tuple[int, int], ggml_type: str, slab_rows: int | None = None) -> np.ndarray:
    """A [n_rows, cols] tensor packed `slab_rows` (default SLAB_ROWS) rows at a time; `rows(start,
    stop)` reads float rows.

    Returns uint8 [n_rows, row_bytes], the same bytes as `encode` of the whole tensor: every block
    format packs each row on its own, so only the float32 slab, not the tensor, is ever held.
    """
    from lucebox_cli.gguf_io import tensor_nbytes

    n_rows, cols = shape
    slab_rows = slab_rows or SLAB_ROWS
    out = np.empty((n_rows, tensor_nbytes(ggml_type, (cols,))), dtype=np.uint8)
    for start in range(0, n_rows, slab_rows):
        stop = min(n_rows, start + slab_rows)
        out[start:stop] = encode(rows(start, stop), ggml_type)
    return out


@dataclass(frozen=True)
class TensorReport:
    name: str
    ggml_type: str
    shape: tuple[int, ...]
    nbytes: int
    bits_per_weight: float
    seconds: float


@dataclass
class QuantReport:
    src: str
    out: str
    qtype: str
    tensors: list[TensorReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_weights(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.total_bytes / max(1, self.n_weights)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src, "out": self.out, "type": self.qtype, "seconds": round(self.seconds, 3),
            "bytes": self.total_bytes, "weights": self.n_weights,
            "bits_per_weight": round(self.bits_per_weight, 4), "types": self.type_counts(),
            "tensors": [dataclasses.asdict(t) | {"shape": list(t.shape)} for t in self.tensors],
        }


# ---- sources ----------------------------------------------------------------------------------


@dataclass
class _Source:
    """What a conversion needs from its input, whatever its format."""

    arch: str
    metadata: dict[str, Any]
    n_layers: int
    shapes: dict[str, tuple[int, ...]]  # internal name → numpy shape
    in_types: dict[str, str]  # internal name → type in the input (F32 for an HF checkpoint)
    load: Callable[[str], np.ndarray]  # internal name → float32 array (fix-ups applied)
    inputs: list[Path]  # files that must never be overwritten
    raw: Callable[[str], np.ndarray] | None = None  # stored bytes of a tensor (GGUF inputs)
    rows: dict[str, RowsFn] = field(default_factory=dict)  # matrices that can be read in row slabs


def _hf_source(folder: Path) -> _Source:
    from lucebox_cli.models import qwen35
    from lucebox_cli.tokenizer import Tokenizer

    cfg = qwen35.Qwen35Config.from_hf_config(qwen35.read_hf_config(folder))
    ckpt = qwen35.HFCheckpoint(folder)
    # Names do not depend on the value-head reorder, so a config without it maps names on a dummy.
    name_cfg = dataclasses.replace(cfg, hv=cfg.hk, dv=cfg.dv)
    dummy = np.zeros((1, 1, 1), np.float32)
    hf_of: dict[str, str] = {}
    for hf_name in ckpt.names:
        for internal, _ in qwen35.hf_to_internal(hf_name, dummy, name_cfg) or ():
            hf_of[internal] = hf_name
    if not cfg.tied and "output.weight" not in hf_of:
        # Exports that drop lm_head with tie_word_embeddings false: the head is the embedding.
        cfg = dataclasses.replace(cfg, tied=True)
    shapes = qwen35.expected_tensors(cfg)
    for name in shapes:
        if name not in hf_of:
            raise BadModelFile(f"{folder}: tensor {name} is missing (no HF tensor maps to it)",
                               hint="the checkpoint is incomplete or not a Qwen3.5 text model")

    def load(name: str) -> np.ndarray:
        hf_name = hf_of[name]
        converted = dict(qwen35.hf_to_internal(hf_name, ckpt.load(hf_name), cfg) or ())
        x = converted[name]
        if tuple(x.shape) != shapes[name]:
            raise BadModelFile(f"{folder}: tensor {hf_name} has shape {list(x.shape)} after conversion, "
                               f"expected {list(shapes[name])}")
        return x

    meta = cfg.to_gguf_metadata()
    meta["general.name"] = folder.name
    meta.update(Tokenizer.from_hf_folder(folder).to_gguf_metadata(vocab_size=cfg.vocab))
    return _Source(qwen35.ARCH, meta, cfg.n_layers, shapes, {n: "F32" for n in shapes}, load, list(ckpt.files),
                   rows=_hf_row_readers(ckpt, cfg, hf_of, shapes))


def _hf_row_readers(ckpt, cfg, hf_of: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> dict[str, RowsFn]:
    """Row-slab readers for the matrices the fix-ups pass through unchanged (models/qwen35.py says which)."""
    from lucebox_cli.models import qwen35

    readers: dict[str, RowsFn] = {}
    for name, hf_name in hf_of.items():
        if name not in shapes or len(shapes[name]) != 2 or not qwen35.hf_passthrough(hf_name, cfg):
            continue
        if ckpt.shape(hf_name) != shapes[name]:
            raise BadModelFile(f"{ckpt.folder}: tensor {hf_name} has shape {list(ckpt.shape(hf_name))}, "
                               f"expected {list(shapes[name])}")
        readers[name] = functools.partial(ckpt.rows, hf_name)
    return readers


def _gguf_source(path: Path) -> _Source:
    from lucebox_cli.gguf_io import GGUFModel

    model = GGUFModel(path)
    arch = model.architecture
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"{path}: architecture {arch!r} is not supported by lucebox quantize",
                               hint=f"supported: {', '.join(SUPPORTED_ARCHS)}")
    n_layers = int(model.require_key(f"{arch}.block_count"))
    shapes = {n: model.tensor_info(n).shape for n in model.tensor_names}
    in_types = {n: model.tensor_info(n).ggml_type for n in model.tensor_names}
    meta = {k: v for k, v in model.metadata.items() if not k.startswith("GGUF.")}
    # F32 tensors dequantize to a view of the memory map: slicing rows of it reads only those rows.
    rows = {n: _rows_of_view(model.dequant, n) for n, t in in_types.items() if t == "F32" and len(shapes[n]) == 2}
    return _Source(arch, meta, n_layers, shapes, in_types, model.dequant, [path], model.raw, rows)


def _rows_of_view(view: Callable[[str], np.ndarray], name: str) -> RowsFn:
    return lambda start, stop: view(name)[start:stop]


def _open_source(src: Path) -> _Source:
    if src.is_dir():
        if not (src / "config.json").is_file():
            raise ModelNotFound(f"{src} has no config.json", hint="point at an HF checkpoint folder or a .gguf file")
        return _hf_source(src)
    if src.is_file():
        return _gguf_source(src)
    raise ModelNotFound(f"{src}: no such file or folder", hint="pass an HF checkpoint folder, a .gguf file or an alias")


# ---- output ---------------------------------------------------------------------------------------

_TYPE_SUFFIX = re.compile(r"[-_.](F32|F16|BF16|Q8_0|Q[456]_K(_[SM])?|Q[45]_[01])$", re.IGNORECASE)


def default_output(src: str | Path, qtype: str) -> Path:
    """`<name>-<TYPE>.gguf` next to the input (an existing type suffix in the name is replaced)."""
    src = Path(src)
    stem = src.name if src.is_dir() else src.stem
    stem = _TYPE_SUFFIX.sub("", stem) or stem
    return src.parent / f"{stem}-{check_ftype(qtype)}.gguf"


def _check_requantize(source: _Source, types: dict[str, str], allow: bool) -> None:
    """llama.cpp refuses to requantize an already-quantized tensor unless asked to."""
    if allow:
        return
    for name, new in types.items():
        old = source.in_types[name]
        if old != new and (not _known(old) or is_quantized(old)):
            raise LuceboxError(
                f"tensor {name} is already quantized ({old}); requantizing to {new} loses accuracy",
                hint="start from the BF16/F32 model, or pass --allow-requantize",
            )


def _known(type_name: str) -> bool:
    try:
        block_type(type_name)
    except LuceboxError:
        return False
    return True


def _packed(source: _Source, name: str, ggml_type: str) -> np.ndarray:
    """The tensor's bytes in `ggml_type`; a tensor already of that type is copied as is (as llama.cpp does)."""
    if source.raw is not None and source.in_types[name] == ggml_type:
        return np.array(source.raw(name), dtype=np.uint8)
    if name in source.rows:
        return encode_rows(source.rows[name], source.shapes[name], ggml_type)
    return encode(source.load(name), ggml_type)


def quantize(
    src: str | Path,
    out: str | Path | None,
    qtype: str,
    allow_requantize: bool = False,
    progress: ProgressFn | None = None,
    *,
    overwrite: bool = False,
) -> QuantReport:
    """Convert an HF Qwen3.5 folder or a qwen35 GGUF into a GGUF of file type `qtype`; a z-lab
    DFlash draft folder into a `dflash-qwen3` GGUF (types convert_draft.QTYPES).

    `out` None means `default_output(src, qtype)`. An existing `out` is replaced only with
    `overwrite`; the input itself never is. `progress(done_bytes, total_bytes, tensor_name)` is
    called after each tensor is written.
    """
    from lucebox_cli.gguf_io import QuantTensor, TensorPlan, TensorStream, write_gguf
    from lucebox_cli.models.dflash_draft import is_dflash_folder

    src = Path(src)
    if is_dflash_folder(src):
        return _quantize_draft(src, out, qtype, progress, overwrite)
    qtype = check_ftype(qtype)
    out = Path(out) if out is not None else default_output(src, qtype)
    t0 = time.perf_counter()
    source = _open_source(src)
    types = choose_types(((n, s, source.in_types[n]) for n, s in source.shapes.items()), qtype, source.n_layers)
    _check_requantize(source, types, allow_requantize)
    order = sorted(source.shapes, key=llama_order_key)
    plan = [TensorPlan(n, types[n], tuple(source.shapes[n])) for n in order]
    report = QuantReport(str(src), str(out), qtype)

    def data() -> Iterator[tuple[str, Any]]:
        for p in plan:
            t = time.perf_counter()
            packed = _packed(source, p.name, p.ggml_type)
            tensor = QuantTensor(p.ggml_type, p.shape, packed.reshape(-1))
            report.tensors.append(TensorReport(
                p.name, p.ggml_type, p.shape, packed.nbytes,
                8.0 * packed.nbytes / max(1, math.prod(p.shape)), time.perf_counter() - t,
            ))
            yield p.name, tensor

    meta = dict(source.metadata)
    meta["general.file_type"] = FTYPES[qtype][2]
    meta["general.quantization_version"] = GGML_QUANT_VERSION
    write_gguf(out, source.arch, meta, TensorStream(plan, data()), progress=progress,
               inputs=source.inputs, overwrite=overwrite)
    report.seconds = time.perf_counter() - t0
    return report


def _quantize_draft(src: Path, out: str | Path | None, qtype: str, progress: ProgressFn | None,
                    overwrite: bool) -> QuantReport:
    """convert_draft, reported like a target conversion. A tensor's seconds run from the previous
    tensor's write to its own (read, encode and write; convert_draft times nothing itself)."""
    from lucebox_cli.quant.convert_draft import QTYPES, convert_draft

    name = qtype.upper()
    if name not in QTYPES:
        raise UsageError(f"{src} is a DFlash draft: it converts to {', '.join(QTYPES)}, not {qtype}",
                         hint="pick one of those with --type")
    out = Path(out) if out is not None else default_output(src, name)
    seconds: dict[str, float] = {}
    last = [time.perf_counter()]

    def timed(done: int, total: int, tensor: str) -> None:
        now = time.perf_counter()
        seconds[tensor], last[0] = now - last[0], now
        if progress is not None:
            progress(done, total, tensor)

    t0 = time.perf_counter()
    result = convert_draft(src, out, name, timed, overwrite=overwrite)
    report = QuantReport(str(src), str(result.path), name, seconds=time.perf_counter() - t0)
    report.tensors = [
        TensorReport(p.name, p.ggml_type, p.shape, p.nbytes, 8.0 * p.nbytes / max(1, math.prod(p.shape)),
                     seconds.get(p.name, 0.0))
        for p in result.tensors
    ]
    return report
