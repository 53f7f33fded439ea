"""z-lab DFlash draft (HF folder) → GGUF, architecture `dflash-qwen3` (docs/dflash-gguf.md).

The draft is small (1.7 B parameters for the 27B target) but is still streamed tensor by tensor:
the plan (names, types, shapes) comes from the config and the safetensors headers, then each tensor
is read, encoded and written before the next is touched. The file is written to a temporary name
and renamed at the end by `gguf_io.write_gguf`.

Types: norms are always F32; matrices take the requested type. Q4_K_M has no llama.cpp recipe for
this architecture, so ours is a documented simple mix: Q6_K for `fc` (every context row of every
layer passes through it) and for every layer's `attn_v` and `ffn_down` (the tensors llama.cpp's
Q4_K_M protects in its own models), Q4_K for the rest. A matrix whose rows do not fit the chosen
block size falls back to Q8_0, or to BF16 when rows are not a multiple of 32 either.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lucebox_cli.errors import UsageError
from lucebox_cli.models.dflash_draft import ARCH, DFlashConfig, check_weights, hf_tensors, read_hf_config

QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_K_M")
# llama_ftype values (llama.h) for general.file_type
_FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_K_M": 15}
_BLOCK = {"Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
_Q4_K_M_HIGH = ("fc.weight", "attn_v.weight", "ffn_down.weight")


@dataclass(frozen=True)
class ConvertedDraft:
    path: Path
    config: DFlashConfig
    tensors: list  # gguf_io.TensorPlan, in file order
    seconds: float

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def tensor_type(name: str, shape: tuple[int, ...], qtype: str) -> str:
    """The ggml type one draft tensor gets in a `qtype` file."""
    if len(shape) == 1:
        return "F32"
    if qtype in ("F32", "F16", "BF16"):
        return qtype
    want = qtype
    if qtype == "Q4_K_M":
        want = "Q6_K" if name.endswith(_Q4_K_M_HIGH) else "Q4_K"
    cols = shape[-1]
    if cols % _BLOCK[want] == 0:
        return want
    return "Q8_0" if cols % _BLOCK["Q8_0"] == 0 else "BF16"


def _encode(array: np.ndarray, ggml_type: str):
    from lucebox_cli.gguf_io import FloatTensor, QuantTensor

    if ggml_type in ("F32", "F16", "BF16"):
        return FloatTensor(array, ggml_type)
    if ggml_type == "Q8_0":
        from lucebox_cli.quant.q8_0 import quantize_q8_0 as quantize
    elif ggml_type == "Q4_K":
        from lucebox_cli.quant.q4_k import quantize_q4_k as quantize
    else:
        from lucebox_cli.quant.q6_k import quantize_q6_k as quantize
    return QuantTensor(ggml_type, tuple(array.shape), quantize(array).reshape(-1))


def draft_metadata(cfg: DFlashConfig, qtype: str, name: str) -> dict:
    md = {"general.name": name, "general.file_type": _FILE_TYPES[qtype]}
    if qtype in ("Q8_0", "Q4_K_M"):
        md["general.quantization_version"] = 2
    md.update(cfg.to_gguf_metadata())
    return md


def convert_draft(
    src_folder: str | Path,
    out: str | Path,
    qtype: str,
    progress: Callable[[int, int, str], None] | None = None,
    *,
    overwrite: bool = True,
) -> ConvertedDraft:
    """Convert a z-lab DFlash folder (config.json with `dflash_config`) to a `dflash-qwen3` GGUF."""
    from lucebox_cli.gguf_io import TensorPlan, TensorStream, write_gguf

    qtype = qtype.upper()
    if qtype not in QTYPES:
        raise UsageError(f"DFlash drafts convert to {', '.join(QTYPES)}, not {qtype}",
                         hint="pick one of those with --type")
    t0 = time.perf_counter()
    src_folder = Path(src_folder)
    cfg = read_hf_config(src_folder)
    source = hf_tensors(src_folder)
    check_weights(cfg, {k: t.shape for k, t in source.items()}, str(src_folder))
    plan = [TensorPlan(name, tensor_type(name, shape, qtype), shape) for name, shape in cfg.tensor_shapes().items()]

    def data() -> Iterator[tuple[str, object]]:
        for p in plan:
            yield p.name, _encode(source[p.name].load(), p.ggml_type)

    path = write_gguf(
        out, ARCH, draft_metadata(cfg, qtype, src_folder.name), TensorStream(plan, data()),
        progress=progress, inputs=sorted({str(t.path) for t in source.values()}), overwrite=overwrite,
    )
    return ConvertedDraft(Path(path), cfg, plan, time.perf_counter() - t0)
