"""Weights of the 27B target engine: which GGUF tensors go to the device, in what layout, and the host
side of the embedding.

`upload_plan(model, cfg)` lists every device tensor with its byte offset inside one weight arena
(256-byte aligned, the order of the file) and refuses, naming the tensor, any type or shape the ops do
not take: matrices must be Q4_K, Q5_K, Q6_K or Q8_0 with rows a multiple of 256; vectors and the conv
weight F32. `device_bytes(entry, raw)` turns a tensor's GGUF bytes into the device layout of
cuda/common/quant_blocks.cuh: Q4_K / Q5_K unchanged, Q6_K and Q8_0 with every block's fp16 d moved to
one trailing array, and (unless LUCEBOX_Q4K_TILE=0) Q4_K tensors whose rows are a multiple of 16 in the tiled
layout (qtype LB_QT_Q4_K_TILED: blocks ordered [rows/16][K/256][16 rows], so that the n = 1 GEMV reads
each warp item as one contiguous 2304-byte run), and (unless LUCEBOX_Q6K_TILE=0) Q6_K tensors whose rows are a
multiple of 16 in the tiled Q6_K layout (qtype LB_QT_Q6_K_TILED: 16-row tiles of 3360 bytes with the fp16 d inside,
the 16-byte pieces in the order the n = 1 GEMV's lanes read them; quant_blocks.cuh Q6_K_T). That repack is done here
on the host (a byte shuffle
of one tensor at a time), so loading needs no device staging buffer; the gpu test compares it with
lb_quant_repack bit for bit.

The embedding of an untied model never goes to the device: `EmbeddingRows` dequantizes only the rows of
the tokens being fed, from the memory-mapped file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from lucebox_cli.engines.memory_plan import ALIGN, on_device
from lucebox_cli.errors import EngineUnavailable
from lucebox_cli.models.qwen35 import Qwen35Config, expected_tensors

# ggml type name -> the C API's qtype id (LB_QT_*)
QTYPE_IDS = {"Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# LB_QT_Q4_K_TILED: Q4_K blocks in 16-row tiles (cuda/common/quant_blocks.cuh Q4_K_T)
Q4K_TILED = 12 | 0x100
TILE_ROWS = 16
Q4K_BLOCK = 144
TILE_ENV = "LUCEBOX_Q4K_TILE"
# LB_QT_Q6_K_TILED: Q6_K in 16-row tiles of 3360 bytes (cuda/common/quant_blocks.cuh Q6_K_T, q6t_offset)
Q6K_TILED = 14 | 0x100
Q6K_BLOCK = 210
Q6K_TILE_BYTES = TILE_ROWS * Q6K_BLOCK
TILE6_ENV = "LUCEBOX_Q6K_TILE"
TILED_QTYPES = {Q4K_TILED: "Q4_K", Q6K_TILED: "Q6_K"}


def q4k_tile_default(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the engine uploads Q4_K tensors tiled (read at engine creation): on unless LUCEBOX_Q4K_TILE=0. On the
    H200 the tiled layout took the 27B's tg128 from 122.2 to 138.4 tok/s (docs/perf.md "Q4_K tiled layout")."""
    env = os.environ if env is None else env
    return env.get(TILE_ENV, "1") != "0"


def q6k_tile_default(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the engine uploads Q6_K tensors tiled (read at engine creation): on unless LUCEBOX_Q6K_TILE is "0"
    or "". On the H200 it took the 27B's tg128 from 138.3 to 144.1 tok/s (docs/perf.md "Q6_K tiled layout")."""
    env = os.environ if env is None else env
    return env.get(TILE6_ENV, "1") not in ("", "0")


def can_tile(ggml_type: str, shape: tuple[int, ...]) -> bool:
    """The tiled layouts take Q4_K and Q6_K matrices of whole 16-row tiles; others keep their layout."""
    return ggml_type in ("Q4_K", "Q6_K") and len(shape) == 2 and shape[0] % TILE_ROWS == 0 and shape[1] % 256 == 0


def _tile_copy(src: np.ndarray, rows: int, k: int, to_tiles: bool) -> np.ndarray:
    # Whole 144-byte blocks as numpy void items: one transposed copy of [rows/16, 16, nb] <-> [rows/16, nb, 16]
    # blocks (3-5 GB/s warm on the dev box, about twice a per-column loop of 8-byte words).
    nb = k // 256
    blocks = np.ascontiguousarray(src, np.uint8).reshape(-1).view(f"V{Q4K_BLOCK}")
    if to_tiles:
        out = blocks.reshape(rows // TILE_ROWS, TILE_ROWS, nb).transpose(0, 2, 1)
    else:
        out = blocks.reshape(rows // TILE_ROWS, nb, TILE_ROWS).transpose(0, 2, 1)
    return np.ascontiguousarray(out).view(np.uint8).reshape(-1)


def tile_q4k(raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    """GGUF Q4_K bytes [rows, k] -> the tiled order: block (r, kb) at ((r // 16) * (k // 256) + kb) * 16 + r % 16
    (lb_quant_repack with LB_QT_Q4_K_TILED does the same on the GPU)."""
    return _tile_copy(raw, rows, k, True)


def untile_q4k(dev: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Inverse of tile_q4k."""
    return _tile_copy(dev, rows, k, False)


def _q6k_views(gguf: np.ndarray, tiled: np.ndarray, rows: int, k: int):
    # Pairs of views (GGUF side, tiled side) of the same shape, one per region of the Q6_K_T tile; the GGUF side is
    # [T, h, g, nb, ...] of block bytes, the tiled side the tile's [T, nb, ...] regions (quant_blocks.cuh Q6_K_T):
    #   ql [c][h][g][64 B] at 0, qh [c][h][g][32 B] at 2048, scales [h][g][16 B] at 3072, d [g][h][2 B] at 3328.
    nt, nb = rows // TILE_ROWS, k // 256
    g6 = gguf.reshape(nt, 2, 8, nb, Q6K_BLOCK)  # [T, h, g, kb, byte]
    t6 = tiled.reshape(nt, nb, Q6K_TILE_BYTES)  # [T, kb, tile byte]
    ql = g6[..., :128].reshape(nt, 2, 8, nb, 2, 64).transpose(0, 3, 4, 1, 2, 5)  # [T, kb, c, h, g, 64]
    qh = g6[..., 128:192].reshape(nt, 2, 8, nb, 2, 32).transpose(0, 3, 4, 1, 2, 5)
    sc = g6[..., 192:208].transpose(0, 3, 1, 2, 4)  # [T, kb, h, g, 16]
    d = g6[..., 208:].transpose(0, 3, 2, 1, 4)  # [T, kb, g, h, 2]
    return [(ql, t6[..., :2048].reshape(nt, nb, 2, 2, 8, 64)), (qh, t6[..., 2048:3072].reshape(nt, nb, 2, 2, 8, 32)),
            (sc, t6[..., 3072:3328].reshape(nt, nb, 2, 8, 16)), (d, t6[..., 3328:].reshape(nt, nb, 8, 2, 2))]


def tile_q6k(raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    """GGUF Q6_K bytes [rows, k] -> the tiled Q6_K layout: byte o of block (r, kb) at tile (r // 16) * (k // 256) + kb,
    offset q6t_offset(r % 16, o) (lb_quant_repack with LB_QT_Q6_K_TILED does the same on the GPU). Four strided
    region copies."""
    src = np.ascontiguousarray(raw, np.uint8).reshape(-1)
    out = np.empty_like(src)
    for g, t in _q6k_views(src, out, rows, k):
        t[...] = g
    return out


def untile_q6k(dev: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Inverse of tile_q6k."""
    src = np.ascontiguousarray(dev, np.uint8).reshape(-1)
    out = np.empty_like(src)
    for g, t in _q6k_views(out, src, rows, k):
        g[...] = t
    return out


def q6t_offset(r16: int, o: int) -> int:
    """quant_blocks.cuh q6t_offset, as written there: where byte o (0..209) of the GGUF block of tile row r16 sits
    in a Q6_K_T tile."""
    h, g = r16 >> 3, r16 & 7
    if o < 128:
        return 512 * (2 * (o >> 6) + h) + 64 * g + (o & 63)
    if o < 192:
        return 2048 + 256 * (2 * ((o - 128) >> 5) + h) + 32 * g + ((o - 128) & 31)
    if o < 208:
        return 3072 + 128 * h + 16 * g + (o - 192)
    return 3328 + 4 * g + 2 * h + (o - 208)


# (weights per block, GGUF bytes per block, byte offset of the fp16 d inside a block)
_D_MOVED = {"Q6_K": (256, 210, 208), "Q8_0": (32, 34, 0)}


@dataclass(frozen=True)
class Entry:
    """One device tensor: GGUF name, type, numpy shape, GGUF bytes, its offset in the arena, and whether it is
    uploaded in its type's tiled layout (qtype LB_QT_Q4_K_TILED or LB_QT_Q6_K_TILED)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    tiled: bool = False

    def __post_init__(self):
        if self.tiled and not can_tile(self.ggml_type, tuple(self.shape)):
            raise ValueError(f"{self.name}: {self.ggml_type} {list(self.shape)} cannot take a tiled layout")

    @property
    def qtype(self) -> int:
        return QTYPE_IDS[self.ggml_type] | 0x100 if self.tiled else QTYPE_IDS.get(self.ggml_type, 0)


def qtype_entry(name: str, qtype: int, rows: int, k: int) -> Entry:
    """The Entry of a [rows, k] matrix the C API knows as `qtype` (tests and the CPU emulation of the ops)."""
    tiled = qtype in TILED_QTYPES
    ggml_type = TILED_QTYPES[qtype] if tiled else {v: n for n, v in QTYPE_IDS.items()}[qtype]
    block, size = (32, 34) if ggml_type == "Q8_0" else (256, {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[ggml_type])
    return Entry(name, ggml_type, (rows, k), rows * k // block * size, 0, tiled)


def check_supported(cfg: Qwen35Config) -> None:
    """The shapes the ops take; EngineUnavailable names what does not fit."""
    why = []
    if cfg.head_dim != 256:
        why.append(f"attention head_dim {cfg.head_dim} (the ops take 256)")
    if cfg.dk != 128 or cfg.dv != 128:
        why.append(f"DeltaNet head dims {cfg.dk}/{cfg.dv} (the ops take 128)")
    if cfg.n_heads // cfg.n_kv_heads > 8:
        why.append(f"{cfg.n_heads // cfg.n_kv_heads} query heads per kv head (the ops take at most 8)")
    if cfg.conv_kernel != 4:
        why.append(f"conv kernel {cfg.conv_kernel} (the ops take 4)")
    for what, k in (("hidden", cfg.hidden), ("ffn", cfg.ffn), ("DeltaNet value width", cfg.hv * cfg.dv)):
        if k % 256:
            why.append(f"{what} {k} is not a multiple of 256 (the quantized matrix ops' K)")
    if why:
        raise EngineUnavailable("the CUDA 27B engine does not support this model: " + "; ".join(why),
                                hint="use --engine cpu")


def _check_tensor(name: str, ggml_type: str, shape: tuple[int, ...]) -> None:
    if len(shape) == 1 or name.endswith("ssm_conv1d.weight"):
        ok = ggml_type == "F32"
        need = "F32"
    else:
        ok = ggml_type in QTYPE_IDS and shape[-1] % 256 == 0
        need = "Q4_K, Q5_K, Q6_K or Q8_0 with rows a multiple of 256"
    if not ok:
        raise EngineUnavailable(
            f"the CUDA 27B engine cannot use {name} ({ggml_type} {list(shape)}): it needs {need}",
            hint="quantize with `lucebox quantize MODEL Q4_K_M` (or Q5_K_M / Q8_0), or use --engine cpu",
        )


def upload_plan(model: Any, cfg: Qwen35Config, tile: Optional[bool] = None,
                tile6: Optional[bool] = None) -> list[Entry]:
    """Device tensors of an open GGUFModel, in arena order; raises EngineUnavailable on what the ops lack. tile:
    Q4_K matrices of whole 16-row tiles in the tiled layout (None: q4k_tile_default()). Back-to-back tiled tensors
    stay one tiled tensor of their summed rows, so the fused projections (dflash_layers.matmuls) still fuse; a
    Q4_K tensor that cannot tile keeps qtype 12 and so never fuses with a tiled one. tile6: the same for Q6_K
    (None: q6k_tile_default(), on by default); tiled Q6_K (270) never fuses (dflash_layers._ROW_BYTES_PER_256)."""
    check_supported(cfg)
    tile = q4k_tile_default() if tile is None else bool(tile)
    tile6 = q6k_tile_default() if tile6 is None else bool(tile6)
    entries, offset = [], 0
    for name, shape in expected_tensors(cfg).items():
        if not on_device(name, cfg):
            continue
        info = model.require(name, shape)
        _check_tensor(name, info.ggml_type, tuple(info.shape))
        shape = tuple(info.shape)
        want = tile if info.ggml_type == "Q4_K" else tile6 if info.ggml_type == "Q6_K" else False
        entries.append(Entry(name, info.ggml_type, shape, int(info.nbytes), offset,
                             want and can_tile(info.ggml_type, shape)))
        offset += (int(info.nbytes) + ALIGN - 1) // ALIGN * ALIGN
    return entries


def arena_bytes(entries: list[Entry]) -> int:
    last = entries[-1]
    return last.offset + (last.nbytes + ALIGN - 1) // ALIGN * ALIGN


def device_bytes(entry: Entry, raw: np.ndarray) -> np.ndarray:
    """The device layout of one tensor from its GGUF bytes (flat uint8, same length)."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != entry.nbytes:
        raise EngineUnavailable(f"{entry.name}: {raw.size} bytes in the file, {entry.nbytes} expected")
    if entry.tiled:
        return tile_q6k(raw, *entry.shape) if entry.ggml_type == "Q6_K" else tile_q4k(raw, *entry.shape)
    if entry.ggml_type not in _D_MOVED:
        return raw
    _, size, d_at = _D_MOVED[entry.ggml_type]
    blocks = raw.reshape(-1, size)
    n = blocks.shape[0]
    # Two strided slice copies into one output (np.delete + concatenate ran at ~76 MB/s per core and
    # held up the 1 GB Q6_K LM head for ~14 s at load; these run at ~3 GB/s).
    out = np.empty(raw.size, np.uint8)
    body = out[: n * (size - 2)].reshape(n, size - 2)  # [n_blocks, size - 2], block order kept
    body[:, :d_at] = blocks[:, :d_at]
    body[:, d_at:] = blocks[:, d_at + 2 :]
    out[n * (size - 2) :].reshape(n, 2)[:] = blocks[:, d_at : d_at + 2]
    return out


def gguf_bytes(entry: Entry, dev: np.ndarray) -> np.ndarray:
    """Inverse of device_bytes (tests and the CPU emulation of the matrix ops read weights back with it)."""
    dev = np.asarray(dev, dtype=np.uint8).reshape(-1)
    if entry.tiled:
        return untile_q6k(dev, *entry.shape) if entry.ggml_type == "Q6_K" else untile_q4k(dev, *entry.shape)
    if entry.ggml_type not in _D_MOVED:
        return dev
    _, size, d_at = _D_MOVED[entry.ggml_type]
    n_blocks = dev.size // size
    body = dev[: n_blocks * (size - 2)].reshape(n_blocks, size - 2)
    d = dev[n_blocks * (size - 2) :].reshape(n_blocks, 2)
    return np.concatenate([body[:, :d_at], d, body[:, d_at:]], axis=1).reshape(-1)


def iter_device_tensors(model: Any, entries: list[Entry]) -> Iterator[tuple[Entry, np.ndarray]]:
    """(entry, device-layout bytes) one tensor at a time, read from the memory map."""
    for e in entries:
        yield e, np.ascontiguousarray(device_bytes(e, model.raw(e.name)))


class EmbeddingRows:
    """float32 rows of token_embd for given token ids, dequantized on the host from the memory map."""

    def __init__(self, model: Any, cfg: Qwen35Config):
        model.require("token_embd.weight", (cfg.vocab, cfg.hidden))
        self.model = model

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        # only the fed tokens' rows are decoded (gguf_io.GGUFModel.dequant_rows), never the whole table
        return np.ascontiguousarray(self.model.dequant_rows("token_embd.weight", tokens))
