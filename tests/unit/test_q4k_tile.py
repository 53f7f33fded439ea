"""The tiled Q4_K device layout (LB_QT_Q4_K_TILED = 268, cuda/common/quant_blocks.cuh Q4_K_T) on the CPU.

The host side (engines/dflash_upload.py: tile_q4k / untile_q4k, Entry.tiled, upload_plan's LUCEBOX_Q4K_TILE switch)
against the layout's defining formula, and numpy transcriptions of the device index math that no GPU runs here:
lb_quant_repack's tile_q4k kernel (one thread per destination chunk), gemv_k45_tile_kernel's item addresses (lane L
loads bytes 16 L + 512 i of a contiguous 2304-byte item and stores chunk c = L + 32 i as piece c % 9 of row c // 9)
and its 32-bit stream-K cursors (every item of every live 16-row tile visited once, each tile's partial sums flushed
where its 256-blocks end or the block's share ends). The kernels themselves run in tests/gpu (test_quant_gemv.py,
test_qmm_smalln.py, test_gemm_q_cublas.py, test_dflash_graphs.py, test_dflash_engine.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.engines.dflash_upload import (Q4K_TILED, TILE_ENV, Entry, can_tile, device_bytes, gguf_bytes,
                                               q4k_tile_default, qtype_entry, tile_q4k, untile_q4k, upload_plan)

BLOCK = 144
KWARPS = 4  # warps per block of the n = 1 kernels (qmm.cuh kWarps)


def block_index(row: int, kb: int, nb: int) -> int:
    """quant_blocks.cuh block_index<true>, as written there."""
    return ((row >> 4) * nb + kb) * 16 + (row & 15)


def gguf_q4k(rows: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, rows * (k // 256) * BLOCK, dtype=np.uint8)


@pytest.mark.parametrize("rows,k", [(16, 256), (48, 1280), (64, 256 * 7), (272, 5120)])
def test_tile_is_the_index_formula(rows, k):
    nb = k // 256
    raw = gguf_q4k(rows, k, rows + k)
    tiled = tile_q4k(raw, rows, k)
    assert tiled.size == raw.size
    t, g = tiled.reshape(-1, BLOCK), raw.reshape(rows, nb, BLOCK)
    idx = [block_index(r, kb, nb) for r in range(rows) for kb in range(nb)]
    assert sorted(idx) == list(range(rows * nb)), "not a permutation of the blocks"
    for r in range(rows):
        for kb in range(nb):
            assert np.array_equal(t[block_index(r, kb, nb)], g[r, kb]), (r, kb)
    assert np.array_equal(untile_q4k(tiled, rows, k), raw)


@pytest.mark.parametrize("rows,k", [(16, 256), (48, 1280), (112, 256 * 7)])
def test_repack_kernel_index_math(rows, k):
    """quant_repack.cu tile_q4k: destination chunk d is piece d % 9 of destination block db = d / 9, which is source
    block (row, kb) with q = db / 16, row = (q / nb)·16 + db % 16, kb = q % nb."""
    nb = k // 256
    raw = gguf_q4k(rows, k, 7)
    src = raw.reshape(-1, 16)
    d = np.arange(src.shape[0], dtype=np.int64)
    db = d // 9
    q = db // 16
    row = (q // nb) * 16 + db % 16
    kb = q % nb
    dst = src[(row * nb + kb) * 9 + d % 9]
    assert np.array_equal(dst.reshape(-1), tile_q4k(raw, rows, k))


@pytest.mark.parametrize("rows,k", [(64, 256), (80, 1280), (272, 5120)])
def test_gemv_item_addresses(rows, k):
    """gemv_k45_tile_kernel: item (tile row tr, kb) starts at (tr·nb + kb)·2304; lane L's load i reads 16 bytes at
    +16 L + 512 i (chunk c = L + 32 i < 144), and the staging store puts it at piece c % 9 of row c // 9: that must be
    the GGUF bytes of row 16 tr + c // 9, block kb, bytes 16 (c % 9) .. +15."""
    nb = k // 256
    raw = gguf_q4k(rows, k, 3)
    dev = tile_q4k(raw, rows, k)
    g = raw.reshape(rows, nb, BLOCK)
    for tr in range(rows // 16):
        for kb in range(nb):
            base = (tr * nb + kb) * 16 * BLOCK
            for lane in range(32):
                for i in range(5):
                    c = lane + 32 * i
                    if c >= 144:
                        continue
                    at = base + 16 * lane + 512 * i
                    want = g[16 * tr + c // 9, kb, 16 * (c % 9) : 16 * (c % 9) + 16]
                    assert np.array_equal(dev[at : at + 16], want), (tr, kb, lane, i)


def emulate_tile_cursors(n_rows: int, nb: int, grid: int):
    """gemv_k45_tile_kernel's loop per block and warp (stream_k_share, then the 32-bit cursors): the live items it
    computes and the (tile row, items folded) of each flush."""
    items = -(-n_rows // (16 * KWARPS)) * nb
    n_tiles = n_rows // 16
    seen, flushes = [], []
    for b in range(grid):
        it0, end0 = items * b // grid, items * (b + 1) // grid
        if it0 >= end0:
            continue
        for warp in range(KWARPS):
            left, tr, kb = end0 - it0, (it0 // nb) * KWARPS + warp, it0 % nb
            acc = 0
            while True:
                live = tr < n_tiles
                if live:
                    seen.append((tr, kb))
                    acc += 1
                left -= 1
                if (kb + 1 == nb or left == 0) and live:
                    flushes.append((tr, acc))
                    acc = 0
                if left == 0:
                    break
                kb += 1
                if kb == nb:
                    kb, tr = 0, tr + KWARPS
    return seen, flushes


@pytest.mark.parametrize("n_rows,nb,grid", [(17408, 20, 132 * 7), (5120, 68, 132 * 6), (16480, 20, 924), (48, 20, 7),
                                            (272, 7, 5), (16, 1, 1), (96, 3, 100)])
def test_gemv_cursors_cover_every_item_once(n_rows, nb, grid):
    items = -(-n_rows // 64) * nb
    seen, flushes = emulate_tile_cursors(n_rows, nb, min(grid, items))  # the launch caps the grid by the items
    want = [(tr, kb) for tr in range(n_rows // 16) for kb in range(nb)]
    assert sorted(seen) == want, "an item was skipped or computed twice"
    folded = {}
    for tr, n in flushes:
        assert n > 0
        folded[tr] = folded.get(tr, 0) + n
    assert folded == {tr: nb for tr in range(n_rows // 16)}, "a tile's partial sums were not all flushed"


def test_concatenated_tiled_tensors_are_one_tiled_tensor():
    """Back-to-back tiled tensors (each of whole 16-row tiles, same K) are the tiled form of their concatenation:
    what lets dflash_layers.matmuls run them as one GEMV."""
    k = 512
    parts = [(64, gguf_q4k(64, k, 1)), (48, gguf_q4k(48, k, 2)), (16, gguf_q4k(16, k, 3))]
    cat = np.concatenate([tile_q4k(raw, r, k) for r, raw in parts])
    whole = np.concatenate([raw for _, raw in parts])
    assert np.array_equal(cat, tile_q4k(whole, sum(r for r, _ in parts), k))


def test_entries_and_switch():
    assert q4k_tile_default({}) and not q4k_tile_default({TILE_ENV: "0"}) and q4k_tile_default({TILE_ENV: "1"})
    assert can_tile("Q4_K", (48, 5120)) and not can_tile("Q4_K", (6, 256)) and not can_tile("Q8_0", (48, 5120))
    with pytest.raises(ValueError, match="tiled"):
        Entry("w", "Q4_K", (6, 256), 6 * 144, 0, tiled=True)
    e = qtype_entry("w", Q4K_TILED, 32, 512)
    assert e.tiled and e.qtype == Q4K_TILED and e.ggml_type == "Q4_K" and e.nbytes == 32 * 2 * 144
    raw = gguf_q4k(32, 512, 5)
    dev = device_bytes(e, raw)
    assert np.array_equal(dev, tile_q4k(raw, 32, 512)) and np.array_equal(gguf_bytes(e, dev), raw)
    plain = qtype_entry("w", 12, 32, 512)
    assert not plain.tiled and plain.qtype == 12 and np.array_equal(device_bytes(plain, raw), raw)
    for qt, size in ((8, 32 * 512 // 32 * 34), (13, 32 * 2 * 176), (14, 32 * 2 * 210)):
        assert qtype_entry("w", qt, 32, 512).nbytes == size


class _FakeModel:
    """What upload_plan reads of a GGUFModel: tensor infos (type, shape, bytes) of the 27B Q4_K_M mix."""

    def __init__(self, sizes):
        self.sizes = sizes

    def require(self, name, shape):
        s = self.sizes[name]
        assert tuple(s.shape) == tuple(shape)
        return type("Info", (), {"ggml_type": s.ggml_type, "shape": s.shape, "nbytes": s.nbytes})()


def test_27b_every_q4k_matrix_tiles():
    """Every Q4_K matrix of the 27B Q4_K_M has whole 16-row tiles (ssm_alpha/beta: 48 rows), so with the switch on
    all of them upload tiled, the arena offsets do not move (same bytes), and the DeltaNet input run (qkv, gate,
    beta, alpha) keeps one qtype where it did."""
    cfg = mp.qwen35_27b_config()
    sizes = mp.sizes_from_mix(cfg, "Q4_K_M")
    model = _FakeModel(sizes)
    off, on = upload_plan(model, cfg, tile=False, tile6=False), upload_plan(model, cfg, tile=True, tile6=False)
    q4k = [e for e in on if e.ggml_type == "Q4_K"]
    assert q4k and all(e.tiled and e.qtype == Q4K_TILED for e in q4k)
    assert not any(e.tiled for e in off) and not any(e.tiled for e in on if e.ggml_type != "Q4_K")
    assert [(e.name, e.offset, e.nbytes) for e in off] == [(e.name, e.offset, e.nbytes) for e in on]
    by = {e.name: e for e in on}
    names = [f"blk.0.{n}.weight" for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")]
    assert by[names[2]].shape[0] == 48 and by[names[2]].tiled
