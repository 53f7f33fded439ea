"""GGUF reading (memory-mapped) and writing: with gguf_read.py, the only modules that import `gguf`.

Reading lives in gguf_read.py and is re-exported here, so callers import everything from this module:
`GGUFModel(path)` (metadata, tensor infos, `raw`, `dequant`, `dequant_rows`) and `LazyWeights(model)`,
the read-only name -> float32 Mapping that dequantizes on lookup.

Writing: `write_gguf(path, arch, metadata, tensors, ...)` streams tensor by tensor into
`<path>.tmp-<pid>` and renames it into place only when complete, so an interrupted write never
leaves a file that looks finished. Large models pass a `TensorStream` (the plan of names, types
and shapes first, then a generator of data in the same order) so that only one tensor is in
memory at a time.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import LuceboxError
from lucebox_cli.gguf_read import (  # noqa: F401  (re-exported: gguf_io is the public face)
    _NP_OF,
    _SCALAR_FMT,
    _STRING,
    _ARRAY,
    ALIGNMENT,
    DEQUANT_TYPES,
    GGUFModel,
    LazyWeights,
    TensorInfo,
    _gguf,
    block_geometry,
    tensor_nbytes,
)

FLOAT_TYPES = ("F32", "F16", "BF16")
# Bytes written per chunk when converting a float tensor, so a 5 GB embedding never needs a
# second full-size copy in memory.
_CHUNK_BYTES = 64 << 20


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatTensor:
    """A float array to be stored as F32, F16 or BF16."""

    array: np.ndarray
    ggml_type: str = "F32"

    def __post_init__(self):
        if self.ggml_type not in FLOAT_TYPES:
            raise ValueError(f"FloatTensor type must be one of {FLOAT_TYPES}, got {self.ggml_type}")


@dataclass(frozen=True)
class QuantTensor:
    """Already-packed blocks (Q8_0, Q4_K, …) of a tensor with numpy element `shape`."""

    ggml_type: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self):
        want = tensor_nbytes(self.ggml_type, self.shape)
        if self.data.dtype != np.uint8 or self.data.nbytes != want:
            raise ValueError(
                f"QuantTensor {self.ggml_type}{list(self.shape)} needs {want} uint8 bytes, got "
                f"{self.data.nbytes} of {self.data.dtype}"
            )


@dataclass(frozen=True)
class TensorPlan:
    name: str
    ggml_type: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.ggml_type, self.shape)


@dataclass
class TensorStream:
    """Two-phase tensors for streaming writes: the full plan, then data in the same order."""

    plan: list[TensorPlan]
    data: Iterable[tuple[str, Any]]


@dataclass(frozen=True)
class Typed:
    """A metadata value with an explicit GGUF type ("uint64", "int32", "float64", …)."""

    value: Any
    gguf_type: str


def _as_tensor(value: Any) -> FloatTensor | QuantTensor:
    if isinstance(value, (FloatTensor, QuantTensor)):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray):
        return FloatTensor(value[0], value[1])
    if isinstance(value, np.ndarray):
        return FloatTensor(value, "F16" if value.dtype == np.float16 else "F32")
    raise TypeError(f"cannot write a tensor from {type(value).__name__}")


def _plan_of(name: str, t: FloatTensor | QuantTensor) -> TensorPlan:
    if isinstance(t, QuantTensor):
        return TensorPlan(name, t.ggml_type, tuple(int(d) for d in t.shape))
    return TensorPlan(name, t.ggml_type, tuple(int(d) for d in t.array.shape))


def _encode_chunks(t: FloatTensor | QuantTensor) -> Iterator[np.ndarray]:
    """The tensor's on-disk bytes, in chunks small enough not to double peak memory."""
    if isinstance(t, QuantTensor):
        yield np.ascontiguousarray(t.data).reshape(-1)
        return
    flat = t.array.reshape(-1)
    step = max(1, _CHUNK_BYTES // 4)
    for i in range(0, flat.size, step):
        chunk = np.asarray(flat[i : i + step], dtype=np.float32)
        if t.ggml_type == "F32":
            yield chunk
        elif t.ggml_type == "F16":
            yield chunk.astype(np.float16)
        else:
            yield _gguf().quants.quantize(chunk, _gguf().GGMLQuantizationType.BF16)


# GGUF value type ids by name (gguf.GGUFValueType), for `Typed` and our serializer.
_VTYPE = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6,
          "bool": 7, "string": 8, "uint64": 10, "int64": 11, "float64": 12}


def _infer_vtype(value: Any) -> int:
    # llama.cpp checks value types strictly; these are the types its converter writes:
    # counts and ids UINT32, floats FLOAT32, arrays of ints INT32 (token_type, sections).
    if isinstance(value, (bool, np.bool_)):
        return _VTYPE["bool"]
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return _VTYPE["uint32"]
        if -(2**31) <= v < 0:
            return _VTYPE["int32"]
        return _VTYPE["int64"] if v < 0 else _VTYPE["uint64"]
    if isinstance(value, (float, np.floating)):
        return _VTYPE["float32"]
    if isinstance(value, str):
        return _STRING
    raise TypeError(f"unsupported metadata value {value!r}")


def _pack_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pack_array(key: str, items: list) -> bytes:
    if not items:
        raise ValueError(f"metadata {key!r}: GGUF cannot store an empty array")
    first = items[0]
    if isinstance(first, str):
        body = b"".join(_pack_string(x) for x in items)
        return struct.pack("<IQ", _STRING, len(items)) + body
    if isinstance(first, (bool, np.bool_)):
        etype = _VTYPE["bool"]
    elif isinstance(first, (int, np.integer)):
        etype = _VTYPE["int32"]
    elif isinstance(first, (float, np.floating)):
        etype = _VTYPE["float32"]
    else:
        raise TypeError(f"metadata {key!r}: unsupported array of {type(first).__name__}")
    body = np.asarray(items, dtype=_NP_OF[etype]).tobytes()
    return struct.pack("<IQ", etype, len(items)) + body


def _pack_kv(key: str, value: Any) -> bytes:
    head = _pack_string(key)
    if isinstance(value, Typed):
        vtype = _VTYPE[value.gguf_type]
        value = value.value
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = value.tolist() if isinstance(value, np.ndarray) else list(value)
        return head + struct.pack("<I", _ARRAY) + _pack_array(key, items)
    else:
        vtype = _infer_vtype(value)
    if vtype == _STRING:
        return head + struct.pack("<I", vtype) + _pack_string(value)
    return head + struct.pack("<I", vtype) + struct.pack(_SCALAR_FMT[vtype], value)


def _header_bytes(arch: str, kv: dict[str, Any], plan: list[TensorPlan]) -> bytes:
    """Magic, version 3, counts, key/values (architecture first) and tensor infos."""
    gguf = _gguf()
    items = {"general.architecture": arch, **kv}
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(plan), len(items))]
    parts += [_pack_kv(k, v) for k, v in items.items()]
    offset = 0
    for p in plan:
        ne = tuple(reversed(p.shape)) or (1,)
        type_id = int(gguf.GGMLQuantizationType[p.ggml_type])
        parts.append(_pack_string(p.name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset))
        offset += -(-p.nbytes // ALIGNMENT) * ALIGNMENT
    return b"".join(parts)


def _tmp_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def _check_destination(path: Path, inputs: Sequence[str | os.PathLike[str]], overwrite: bool):
    for src in inputs:
        src = Path(src)
        if src.exists() and path.exists() and os.path.samefile(src, path):
            raise LuceboxError(
                f"refusing to overwrite the input file {src}", hint="choose another output path"
            )
    if path.exists() and not overwrite:
        raise LuceboxError(f"{path} already exists", hint="pass --force to replace it")
    if not path.parent.is_dir():
        raise LuceboxError(f"output folder {path.parent} does not exist", hint="create it first")


def _disk_full(path: Path, needed: int) -> LuceboxError:
    free = shutil.disk_usage(path.parent).free
    return LuceboxError(
        f"disk full: writing {path.name} needs {needed / 1e9:.2f} GB, "
        f"{free / 1e9:.2f} GB free in {path.parent}",
        hint="free some space or write the file to another disk",
    )


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: dict[str, Any],
    tensors: Iterable[tuple[str, Any]] | TensorStream,
    tokenizer: Any = None,
    progress: Callable[[int, int, str], None] | None = None,
    *,
    inputs: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = True,
) -> Path:
    """Write a GGUF file atomically (tmp file + rename); returns the final path.

    `tensors`: (name, value) pairs, value a float array (F32), `FloatTensor`, `(array, type)`,
    or `QuantTensor`; or a `TensorStream` to stream without holding all tensors. `tokenizer`:
    a dict of `tokenizer.*` metadata or an object with `to_gguf_metadata()`. `progress(done,
    total, name)` is called after each tensor, in bytes. `inputs` are files that must never be
    overwritten (the sources of a conversion).
    """
    path = Path(path)
    _check_destination(path, inputs, overwrite)
    if isinstance(tensors, TensorStream):
        plan, data = list(tensors.plan), tensors.data
    else:
        pairs = [(n, _as_tensor(v)) for n, v in tensors]
        plan, data = [_plan_of(n, t) for n, t in pairs], pairs
    kv = dict(metadata)
    if tokenizer is not None:
        kv.update(tokenizer.to_gguf_metadata() if hasattr(tokenizer, "to_gguf_metadata") else tokenizer)
    kv.pop("general.architecture", None)
    # Data is always aligned to 32 bytes; a copied alignment key would misdescribe the file.
    kv.pop("general.alignment", None)
    if len({p.name for p in plan}) != len(plan):
        raise ValueError("duplicate tensor names in the plan")
    total = sum(p.nbytes for p in plan)
    if shutil.disk_usage(path.parent).free < total:
        raise _disk_full(path, total)
    tmp = _tmp_path(path)
    try:
        _write_file(tmp, arch, kv, plan, data, progress)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(path, total) from None
        raise LuceboxError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_file(tmp: Path, arch: str, kv: dict, plan: list[TensorPlan], data, progress) -> None:
    header = _header_bytes(arch, kv, plan)
    with open(tmp, "wb") as fout:
        fout.write(header)
        _write_tensor_data(fout, plan, data, progress)
        fout.flush()
        os.fsync(fout.fileno())


def _pad(fout, align: int = ALIGNMENT) -> None:
    pos = fout.tell()
    if pos % align:
        fout.write(b"\0" * (align - pos % align))


def _write_tensor_data(fout, plan: list[TensorPlan], data, progress) -> None:
    total = sum(p.nbytes for p in plan)
    done = 0
    it = iter(data)
    for p in plan:
        try:
            name, value = next(it)
        except StopIteration:
            raise ValueError(f"tensor data ended before {p.name!r}") from None
        t = _as_tensor(value)
        got = _plan_of(name, t)
        if got != p:
            raise ValueError(f"tensor data out of plan: expected {p}, got {got}")
        _pad(fout)
        written = 0
        for chunk in _encode_chunks(t):
            buf = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
            fout.write(buf.data)
            written += buf.nbytes
        if written != p.nbytes:
            raise ValueError(f"tensor {p.name!r}: wrote {written} bytes, planned {p.nbytes}")
        done += written
        if progress is not None:
            progress(done, total, p.name)
    if next(it, None) is not None:
        raise ValueError("more tensor data than planned")
    _pad(fout)
