"""GGUF reading, memory-mapped: the header parser, `GGUFModel` and the lazy float32 view of its tensors.

Imported by gguf_io, which stays the public face (`from lucebox_cli.gguf_io import GGUFModel`); gguf_io
and this module are the only importers of the `gguf` package.

`GGUFModel(path)` parses the header once, keeps the file memory-mapped and hands out tensors on demand:
raw block bytes (`raw`, zero-copy), a whole tensor dequantized to float32 (`dequant`), or only some rows
of a matrix (`dequant_rows`: every block format packs each row in its own whole blocks, so a row
dequantizes from its own bytes). `LazyWeights(model)` is a read-only Mapping name -> float32 array that
dequantizes a tensor when it is looked up and keeps nothing, so opening a 27B file costs no memory.
Every way a file can be broken (bad magic, truncated header, tensor data past the end of the file,
unknown types, missing tensors, wrong shapes) raises `BadModelFile` naming the tensor or byte offset.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import BadModelFile, LuceboxError, UnsupportedModel

ALIGNMENT = 32
# The types `dequant` is tested on; others the gguf package knows may also work.
DEQUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


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
        block, size = block_geometry(info.ggml_type)
        rows = data.reshape(-1, info.shape[-1] // block * size) if info.shape else data
        return self._decode(info, rows).reshape(info.shape)

    def dequant_rows(self, name: str, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 [len(rows), C] of rows of the 2-D tensor `name` [R, C], decoding only their blocks.

        Equal to `dequant(name)[rows]` for every type (rows may repeat, in any order).
        """
        info = self.tensor_info(name)
        if len(info.shape) != 2:
            raise ValueError(f"{self.path}: dequant_rows needs a 2-D tensor, {name!r} has shape {list(info.shape)}")
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        n_rows, width = info.shape
        if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
            raise IndexError(f"{name!r}: rows must lie in 0..{n_rows - 1}, got {idx.min()}..{idx.max()}")
        if idx.size == 0:
            return np.zeros((0, width), np.float32)
        picked = self.raw(name).reshape(n_rows, -1)[idx]  # [len(rows), bytes per row], a copy
        if info.ggml_type == "F32":
            return picked.view(np.float32).reshape(idx.size, width)
        return self._decode(info, picked).reshape(idx.size, width)

    def _decode(self, info: TensorInfo, blocks: np.ndarray) -> np.ndarray:
        """float32 of whole rows of block bytes (uint8 [rows, bytes per row]) through the gguf package."""
        gguf = _gguf()
        try:
            out = gguf.quants.dequantize(blocks, _qtype(info.ggml_type))
        except NotImplementedError:
            raise UnsupportedModel(
                f"{self.path}: tensor {info.name!r} has type {info.ggml_type}, which lucebox cannot "
                "dequantize", hint=f"supported: {', '.join(DEQUANT_TYPES)}"
            ) from None
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        # Dropping our reference unmaps the file once no returned view is alive.
        self._mm = None

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFModel({str(self.path)!r}, {len(self._infos)} tensors)"


class LazyWeights(Mapping):
    """Read-only {tensor name: float32 array} over a GGUFModel; a lookup dequantizes, nothing is cached.

    Shapes, types and stored sizes come from the tensor infos (`shape_of`, `infos`) without reading data,
    so shape checks and parameter counts never dequantize. Holders that need a tensor more than once
    keep the array they got.
    """

    def __init__(self, model: GGUFModel):
        self.model = model

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.model:
            raise KeyError(name)
        return self.model.dequant(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.model.tensor_names)

    def __len__(self) -> int:
        return len(self.model.tensor_names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.model

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self.model:
            raise KeyError(name)
        return self.model.tensor_info(name).shape

    def infos(self) -> list[TensorInfo]:
        return [self.model.tensor_info(n) for n in self.model.tensor_names]

    def __repr__(self) -> str:
        return f"LazyWeights({self.model!r})"
