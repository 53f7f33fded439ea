"""HF safetensors checkpoints without torch or the safetensors package: the one reader every model
uses. Headers are parsed once, shards memory-mapped, and a tensor (or a slab of its rows) is read only
when asked for; BF16 is widened to float32 by a bit shift (exact: bf16 is the top half of an fp32).

    HFCheckpoint(folder)     tensors by HF name, unread: names, shape(), path(), load(), rows(start, stop)
    iter_hf_tensors(folder)  (hf_name, array) one at a time, converted to a dtype (float32 by default)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import BadModelFile, ModelNotFound, UnsupportedModel

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as err:
            raise BadModelFile(f"{index} is not a safetensors index: {err}") from None
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder} has no .safetensors weights")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise BadModelFile(f"{folder} lacks shard(s) {', '.join(missing)} named by its index")
    return files


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the byte offset where tensor data starts."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= 100_000_000:
                raise ValueError("implausible header length")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as err:
        raise BadModelFile(f"{path} is not a safetensors file: {err}") from None
    header.pop("__metadata__", None)
    return header, 8 + n


class HFCheckpoint:
    """The tensors of an HF safetensors folder by HF name, unread: headers are parsed once, shards
    memory-mapped on first use, and only the tensor (or the slab of rows) asked for is materialised,
    so a 54 GB checkpoint is read in the memory of one tensor, or of one slab of the embedding."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.files = _safetensors_files(self.folder)
        self._where: dict[str, tuple[Path, dict[str, Any], int]] = {}
        for path in self.files:
            header, start = _safetensors_header(path)
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                self._where[name] = (path, info, start)
        self._maps: dict[Path, np.ndarray] = {}

    @property
    def names(self) -> list[str]:
        """Every tensor name, shard by shard, in storage order within a shard."""
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(s) for s in self._where[name][1]["shape"])

    def path(self, name: str) -> Path:
        """The shard file that holds the tensor."""
        return self._where[name][0]

    def load(self, name: str) -> np.ndarray:
        """The whole tensor: F32/F16/F64 as stored, BF16 widened to float32 by a bit shift (exact)."""
        return self.rows(name, 0, None)

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start:stop) of the leading axis, decoded like `load`; only their bytes are read."""
        path, info, data_start = self._where[name]
        mm = self._maps.get(path)
        if mm is None:
            mm = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        raw = _stored_view(path, name, info, mm, data_start)
        if raw.ndim:
            raw = raw[start:stop]
        if info.get("dtype") == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return np.array(raw)


def iter_hf_tensors(folder: str | Path, *, dtype: Any = np.float32) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (hf_name, array) for every tensor of an HF checkpoint, one at a time, converted to `dtype`.

    Files are memory-mapped; only the tensor being yielded is materialised, so a 54 GB checkpoint
    streams in the memory of its largest tensor. BF16 is widened to float32 by a bit shift.
    """
    ckpt = HFCheckpoint(folder)
    for name in ckpt.names:
        yield name, ckpt.load(name).astype(dtype, copy=False)


def _stored_view(path: Path, name: str, info: dict, mm: np.ndarray, start: int) -> np.ndarray:
    """The tensor's stored elements as a read-only view of the memory map (BF16 as uint16)."""
    st_dtype = info.get("dtype")
    if st_dtype not in _ST_DTYPES:
        raise UnsupportedModel(f"{path.name}: tensor {name} has dtype {st_dtype}; lucebox reads F32/F16/BF16")
    begin, end = (start + int(o) for o in info["data_offsets"])
    shape = tuple(int(s) for s in info["shape"])
    np_dtype = np.dtype(_ST_DTYPES[st_dtype])
    if end > mm.size or end - begin != math.prod(shape) * np_dtype.itemsize:
        raise BadModelFile(f"{path.name}: tensor {name} is truncated or its offsets disagree with its shape")
    return mm[begin:end].view(np_dtype).reshape(shape)
