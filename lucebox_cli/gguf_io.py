"""GGUF reading (memory-mapped) and writing: the only module that imports the `gguf` package.

Reading: `GGUFModel(path)` parses the header once, keeps the file memory-mapped and hands out
tensors on demand, either as raw block bytes (`raw`, zero-copy) or dequantized to float32
(`dequant`). Every way a file can be broken (bad magic, truncated header, tensor data past the
end of the file, unknown types, missing tensors, wrong shapes) raises `BadModelFile` naming the
tensor or byte offset.

Writing: `write_gguf(path, arch, metadata, tensors, ...)` streams tensor by tensor into
`<path>.tmp-<pid>` and renames it into place only when complete, so an interrupted write never
leaves a file that looks finished. Large models pass a `TensorStream` (the plan of names, types
and shapes first, then a generator of data in the same order) so that only one tensor is in
memory at a time.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import BadModelFile, LuceboxError, UnsupportedModel

ALIGNMENT = 32
FLOAT_TYPES = ("F32", "F16", "BF16")
# The types `dequant` is tested on; others the gguf package knows may also work.
DEQUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Bytes written per chunk when converting a float tensor, so a 5 GB embedding never needs a
# second full-size copy in memory.
_CHUNK_BYTES = 64 << 20


def _gguf():
    # Imported lazily: `import lucebox_cli.gguf_io` must stay cheap and side-effect free.
    import gguf

    return gguf


def _qtype(name: str):
    gguf = _gguf()
    try:
        return gguf.GGMLQuantizationType[name]
    except KeyError:
        raise UnsupportedModel(f"unknown ggml tensor type {name!r}") from None


def block_geometry(ggml_type: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type, e.g. Q4_K -> (256, 144)."""
    return _gguf().GGML_QUANT_SIZES[_qtype(ggml_type)]


def tensor_nbytes(ggml_type: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of `ggml_type` with numpy `shape`; its rows must be whole blocks."""
    block, size = block_geometry(ggml_type)
    shape = tuple(int(d) for d in shape)
    row = shape[-1] if shape else 1
    if row % block:
        raise ValueError(f"row length {row} is not a multiple of the {ggml_type} block ({block})")
    return int(np.prod(shape, dtype=np.int64)) // block * size


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives: ggml type name, numpy shape (= GGUF ne reversed), absolute offset."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@functools.lru_cache(maxsize=1)
def _checked_reader_class():
    gguf = _gguf()

    class _CheckedReader(gguf.GGUFReader):
        # The stock reader turns a tensor past EOF into a numpy reshape error; check each
        # tensor's extent against the file size first so the error can name it.
        def _build_tensors(self, start_offs, fields):
            size = len(self.data)
            for field in fields:
                _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    qtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                except ValueError:
                    raise UnsupportedModel(
                        f"tensor {name!r} has unknown ggml type id {int(raw_dtype[0])}"
                    ) from None
                block, tsize = gguf.GGML_QUANT_SIZES[qtype]
                n_elems = int(np.prod(dims.astype(np.int64))) if len(dims) else 1
                begin = int(start_offs) + int(offset_tensor[0])
                end = begin + n_elems * tsize // block
                if end > size:
                    raise BadModelFile(
                        f"tensor {name!r} spans bytes {begin}..{end} but the file has only "
                        f"{size} bytes (truncated download?)",
                        hint="delete the file and download or convert it again",
                    )
            return super()._build_tensors(start_offs, fields)

    return _CheckedReader


def _field_value(field) -> Any:
    gguf = _gguf()
    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY and len(types) > 1 and types[-1] != gguf.GGUFValueType.STRING:
        # Numeric arrays: one concatenate instead of a Python loop per element.
        if not field.data:
            return []
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    return field.contents()


class GGUFModel:
    """A memory-mapped GGUF file: metadata as plain Python values, tensors on demand."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._reader = self._open(self.path)
        self.metadata: dict[str, Any] = {}
        try:
            for key, field in self._reader.fields.items():
                if not key.startswith("GGUF."):
                    self.metadata[key] = _field_value(field)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise BadModelFile(f"{self.path}: unreadable metadata value ({exc})") from None
        self._infos: dict[str, TensorInfo] = {}
        self._tensors: dict[str, Any] = {}
        for t in self._reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self._infos[t.name] = TensorInfo(
                t.name, t.tensor_type.name, shape, int(t.data_offset), int(t.n_bytes)
            )
            self._tensors[t.name] = t

    @staticmethod
    def _open(path: Path):
        if not path.is_file():
            raise BadModelFile(f"{path}: no such file", hint="check the path")
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise BadModelFile(
                f"{path}: not a GGUF file (magic {magic!r} at offset 0, expected b'GGUF')",
                hint="pass a .gguf file, or an HF checkpoint folder",
            )
        try:
            return _checked_reader_class()(path, "r")
        except LuceboxError:
            raise
        except Exception as exc:  # the reader fails in many numpy/struct ways on garbage
            raise BadModelFile(
                f"{path}: corrupt or truncated GGUF header ({type(exc).__name__}: {exc}; "
                f"file size {size} bytes)",
                hint="delete the file and download or convert it again",
            ) from None

    # -- metadata ---------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise BadModelFile(f"{self.path}: no general.architecture key")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require_key(self, key: str) -> Any:
        if key not in self.metadata:
            raise BadModelFile(f"{self.path}: missing metadata key {key!r}")
        return self.metadata[key]

    # -- tensors ----------------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise BadModelFile(
                f"{self.path}: missing tensor {name!r}",
                hint="the file is incomplete or was made for another architecture",
            ) from None

    def require(self, name: str, shape: Sequence[int] | None = None) -> TensorInfo:
        """The info of `name`, checking that it exists and (if given) has numpy `shape`."""
        info = self.tensor_info(name)
        if shape is not None and tuple(int(d) for d in shape) != info.shape:
            raise BadModelFile(
                f"{self.path}: tensor {name!r} has shape {list(info.shape)}, "
                f"expected {[int(d) for d in shape]}",
                hint="the file's metadata and tensors disagree; convert it again",
            )
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a flat read-only uint8 view of the memory map (no copy)."""
        info = self.tensor_info(name)
        t = self._tensors[name]
        return np.asarray(t.data).reshape(-1).view(np.uint8)[: info.nbytes]

    def dequant(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy shape. F32 tensors come back as a read-only view."""
        info = self.tensor_info(name)
        data = self.raw(name)
        if info.ggml_type == "F32":
            return data.view(np.float32).reshape(info.shape)
        gguf = _gguf()
        qtype = _qtype(info.ggml_type)
        block, size = block_geometry(info.ggml_type)
        rows = data.reshape(-1, info.shape[-1] // block * size) if info.shape else data
        try:
            out = gguf.quants.dequantize(rows, qtype)
        except NotImplementedError:
            raise UnsupportedModel(
                f"{self.path}: tensor {name!r} has type {info.ggml_type}, which lucebox cannot "
                "dequantize", hint=f"supported: {', '.join(DEQUANT_TYPES)}"
            ) from None
        return np.asarray(out, dtype=np.float32).reshape(info.shape)

    def close(self) -> None:
        # Dropping the reader drops the memory map once no returned view is alive.
        self._tensors.clear()
        self._reader = None

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFModel({str(self.path)!r}, {len(self._infos)} tensors)"


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


_SCALAR_TYPES = {
    "uint8": "UINT8", "int8": "INT8", "uint16": "UINT16", "int16": "INT16",
    "uint32": "UINT32", "int32": "INT32", "uint64": "UINT64", "int64": "INT64",
    "float32": "FLOAT32", "float64": "FLOAT64", "bool": "BOOL", "string": "STRING",
}


def _infer_vtype(value: Any) -> str:
    # llama.cpp checks value types strictly; these are the types its converter writes:
    # counts and ids UINT32, floats FLOAT32, arrays of ints INT32 (token_type, sections).
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return "UINT32"
        return "INT32" if -(2**31) <= v < 0 else ("INT64" if v < 0 else "UINT64")
    if isinstance(value, (float, np.floating)):
        return "FLOAT32"
    if isinstance(value, str):
        return "STRING"
    raise TypeError(f"unsupported metadata value {value!r}")


def _add_kv(writer, key: str, value: Any) -> None:
    gguf = _gguf()
    vt = gguf.GGUFValueType
    if isinstance(value, Typed):
        writer.add_key_value(key, value.value, vt[_SCALAR_TYPES[value.gguf_type]])
        return
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not items:
            raise ValueError(f"metadata {key!r}: GGUF cannot store an empty array")
        first = items[0]
        if isinstance(first, bool):
            sub = vt.BOOL
        elif isinstance(first, (int, np.integer)):
            sub = vt.INT32
        elif isinstance(first, (float, np.floating)):
            sub = vt.FLOAT32
        elif isinstance(first, str):
            sub = vt.STRING
        else:
            raise TypeError(f"metadata {key!r}: unsupported array of {type(first).__name__}")
        writer.add_key_value(key, items, vt.ARRAY, sub_type=sub)
        return
    writer.add_key_value(key, value, vt[_infer_vtype(value)])


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
    gguf = _gguf()
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        for key, value in kv.items():
            _add_kv(writer, key, value)
        for p in plan:
            # Element shape + raw_dtype: the writer stores ne = reversed(shape) as given.
            writer.add_tensor_info(p.name, p.shape, np.dtype(np.float32), p.nbytes, raw_dtype=_qtype(p.ggml_type))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        _write_tensor_data(fout, plan, data, progress)
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        writer.close()


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
