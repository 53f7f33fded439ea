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
import os
import shutil
import struct
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


# GGUF value types (gguf.GGUFValueType): id -> struct format for the fixed-size ones.
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP_OF = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class _HeaderParser:
    """A bounds-checked GGUF v2/v3 header parser over a memory map.

    Our own rather than gguf.GGUFReader: that one builds numpy views for every element of every
    array, which takes ~40 s on a 248k-token vocabulary, and reports truncation as numpy errors.
    """

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)
        self.what = "the header"

    def fail(self, why: str) -> BadModelFile:
        return BadModelFile(
            f"{self.path}: corrupt or truncated GGUF header: {why} at byte offset {self.pos} "
            f"while reading {self.what} (file size {self.size} bytes)",
            hint="delete the file and download or convert it again",
        )

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{n} bytes needed, the file ends")

    def scalar(self, vtype: int):
        fmt = _SCALAR_FMT[vtype]
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.scalar(10)
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid UTF-8 string") from None

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FMT:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise self.fail(f"unknown value type {vtype}")

    def array(self) -> list:
        etype, count = self.scalar(4), self.scalar(10)
        if etype in _NP_OF:
            dtype = np.dtype(_NP_OF[etype])
            self.need(count * dtype.itemsize)
            out = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
            self.pos += count * dtype.itemsize
            return out
        # Each element takes at least 8 bytes: reject absurd counts before looping over them.
        self.need(min(count, self.size) * 8)
        return [self.value(etype) for _ in range(count)]

    def parse(self) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
        """(metadata, [(name, ne, type id, relative offset)], data start offset)."""
        self.pos = 4
        version = self.scalar(4)
        if version not in (2, 3):
            raise BadModelFile(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = self.scalar(10), self.scalar(10)
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            self.what = "a metadata key"
            key = self.string()
            self.what = f"metadata {key!r}"
            meta[key] = self.value(self.scalar(4))
        infos = []
        for _ in range(n_tensors):
            self.what = "a tensor name"
            name = self.string()
            self.what = f"tensor info {name!r}"
            n_dims = self.scalar(4)
            if n_dims > 8:
                raise self.fail(f"{n_dims} dimensions")
            ne = tuple(self.scalar(10) for _ in range(n_dims))
            infos.append((name, ne, self.scalar(4), self.scalar(10)))
        align = meta.get("general.alignment", ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise BadModelFile(f"{self.path}: invalid general.alignment {align!r}")
        return meta, infos, -(-self.pos // align) * align


class GGUFModel:
    """A memory-mapped GGUF file: metadata as plain Python values, tensors on demand."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_file():
            raise BadModelFile(f"{self.path}: no such file", hint="check the path")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise BadModelFile(
                f"{self.path}: not a GGUF file (magic {magic!r} at offset 0, expected b'GGUF')",
                hint="pass a .gguf file, or an HF checkpoint folder",
            )
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        meta, infos, data_start = _HeaderParser(memoryview(self._mm), self.path).parse()
        self.metadata: dict[str, Any] = meta
        self.data_offset = data_start
        self._infos: dict[str, TensorInfo] = {}
        for name, ne, type_id, rel in infos:
            if name in self._infos:
                raise BadModelFile(f"{self.path}: tensor {name!r} appears twice")
            self._infos[name] = self._tensor_info(name, ne, type_id, data_start + rel)

    def _tensor_info(self, name: str, ne: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
        gguf = _gguf()
        try:
            ggml_type = gguf.GGMLQuantizationType(type_id).name
        except ValueError:
            raise UnsupportedModel(f"{self.path}: tensor {name!r} has unknown ggml type id {type_id}") from None
        shape = tuple(int(d) for d in reversed(ne))
        try:
            nbytes = tensor_nbytes(ggml_type, shape)
        except ValueError as exc:
            raise BadModelFile(f"{self.path}: tensor {name!r}: {exc}") from None
        size = len(self._mm)
        if offset + nbytes > size:
            raise BadModelFile(
                f"{self.path}: tensor {name!r} spans bytes {offset}..{offset + nbytes} but the file "
                f"has only {size} bytes (truncated download?)",
                hint="delete the file and download or convert it again",
            )
        return TensorInfo(name, ggml_type, shape, offset, nbytes)

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
        if self._mm is None:
            raise LuceboxError(f"{self.path} was closed")
        return np.asarray(self._mm[info.offset : info.offset + info.nbytes])

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
        # Dropping our reference unmaps the file once no returned view is alive.
        self._mm = None

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
