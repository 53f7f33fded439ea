"""HF Qwen3.5 checkpoint → qwen35 GGUF, and GGUF → GGUF requantization, tensor by tensor.

`quantize(src, out, qtype)` plans every tensor (name, type, shape) from headers alone, then streams:
read one tensor, apply the checkpoint fix-ups (models/qwen35.py), quantize, write, drop it. Peak
memory is about one tensor in float32 plus its packed bytes. The file is written to a temporary name
and renamed at the end (gguf_io.write_gguf). Tensors are stored in llama.cpp's order (layer, then
name), the order `llama_model_quantize` writes, so both tools lay out the same model the same way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lucebox_cli.errors import BadModelFile, LuceboxError, ModelNotFound, UnsupportedModel
from lucebox_cli.quant.blocks import block_type, is_quantized
from lucebox_cli.quant.mixes import FTYPES, check_ftype, choose_types, llama_order_key

SUPPORTED_ARCHS = ("qwen35",)
GGML_QUANT_VERSION = 2
ProgressFn = Callable[[int, int, str], None]


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


class _HFCheckpoint:
    """Random access to the tensors of an HF safetensors folder (headers parsed once, shards memmapped)."""

    _DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

    def __init__(self, folder: Path):
        self.folder = folder
        self.files = self._shards(folder)
        if not self.files:
            raise ModelNotFound(f"{folder} has no .safetensors weights")
        self.where: dict[str, tuple[Path, dict, int]] = {}
        for path in self.files:
            header, start = self._header(path)
            for name, info in header.items():
                self.where[name] = (path, info, start)
        self._maps: dict[Path, np.memmap] = {}

    @staticmethod
    def _shards(folder: Path) -> list[Path]:
        index = folder / "model.safetensors.index.json"
        if not index.is_file():
            return sorted(folder.glob("*.safetensors"))
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as err:
            raise BadModelFile(f"{index} is not a safetensors index: {err}") from None
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BadModelFile(f"{folder} lacks shard(s) {', '.join(missing)} named by its index",
                               hint="finish the download (lucebox pull …) and try again")
        return files

    @staticmethod
    def _header(path: Path) -> tuple[dict, int]:
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

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32 (BF16 widened by a bit shift, exactly)."""
        path, info, start = self.where[name]
        dtype = self._DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise UnsupportedModel(f"{path.name}: tensor {name} has dtype {info.get('dtype')}; lucebox reads F32/F16/BF16")
        mm = self._maps.get(path)
        if mm is None:
            mm = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = (start + int(o) for o in info["data_offsets"])
        shape = tuple(int(s) for s in info["shape"])
        if end > mm.size or end - begin != math.prod(shape) * np.dtype(dtype).itemsize:
            raise BadModelFile(f"{path.name}: tensor {name} is truncated or its offsets disagree with its shape")
        raw = mm[begin:end].view(dtype).reshape(shape)
        if dtype is np.uint16:
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return np.array(raw, dtype=np.float32)


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


def _hf_source(folder: Path) -> _Source:
    from lucebox_cli.models import qwen35
    from lucebox_cli.tokenizer import Tokenizer

    cfg = qwen35.Qwen35Config.from_hf_config(qwen35.read_hf_config(folder))
    ckpt = _HFCheckpoint(folder)
    # Names do not depend on the value-head reorder, so a config without it maps names on a dummy.
    name_cfg = dataclasses.replace(cfg, hv=cfg.hk, dv=cfg.dv)
    dummy = np.zeros((1, 1, 1), np.float32)
    hf_of: dict[str, str] = {}
    for hf_name in ckpt.where:
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
    return _Source(qwen35.ARCH, meta, cfg.n_layers, shapes, {n: "F32" for n in shapes}, load, list(ckpt.files))


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
    return _Source(arch, meta, n_layers, shapes, in_types, model.dequant, [path], model.raw)


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
    """Convert an HF Qwen3.5 folder or a qwen35 GGUF into a GGUF of file type `qtype`.

    `out` None means `default_output(src, qtype)`. An existing `out` is replaced only with
    `overwrite`; the input itself never is. `progress(done_bytes, total_bytes, tensor_name)` is
    called after each tensor is written.
    """
    from lucebox_cli.gguf_io import QuantTensor, TensorPlan, TensorStream, write_gguf

    qtype = check_ftype(qtype)
    src = Path(src)
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
