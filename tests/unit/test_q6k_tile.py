"""The tiled Q6_K device layout (LB_QT_Q6_K_TILED = 270, cuda/common/quant_blocks.cuh Q6_K_T) on the CPU.

The host side (engines/dflash_upload.py: tile_q6k / untile_q6k, q6t_offset, Entry.tiled, upload_plan's
LUCEBOX_Q6K_TILE switch) against the layout's defining formula, and numpy transcriptions of the device index math
that no GPU runs here: lb_quant_repack's tile_q6k kernel (one thread per destination 16-bit unit, q6t_source),
gemv_q6_tile_kernel's lane loads (each one contiguous run over the warp, straight into Traits<Q6_K>'s pieces),
Traits<Q6_K_T>::piece / d_ptr (the small-N kernels), the dequant_f16 and df_embed byte addresses, and the stream-K
cursors (the same loop as gemv_k45_tile_kernel's). The kernels themselves run in tests/gpu (test_quant_gemv.py,
test_qmm_smalln.py, test_gemm_q_cublas.py, test_dflash_engine.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.engines.dflash_upload import (Q6K_TILED, TILE6_ENV, Entry, can_tile, device_bytes, gguf_bytes,
                                               q6k_tile_default, q6t_offset, qtype_entry, tile_q6k, untile_q6k,
                                               upload_plan)
from test_q4k_tile import _FakeModel, emulate_tile_cursors

BLOCK = 210
TILE = 16 * BLOCK  # 3360


def gguf_q6k(rows: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, rows * (k // 256) * BLOCK, dtype=np.uint8)


def q6t_source(off: int) -> tuple[int, int]:
    """quant_blocks.cuh q6t_source, as written there: (tile row, GGUF block byte) of tile byte off."""
    if off < 2048:
        reg, inn = off >> 9, off & 511
        return 8 * (reg & 1) + (inn >> 6), 64 * (reg >> 1) + (inn & 63)
    if off < 3072:
        reg, inn = (off - 2048) >> 8, (off - 2048) & 255
        return 8 * (reg & 1) + (inn >> 5), 128 + 32 * (reg >> 1) + (inn & 31)
    if off < 3328:
        return (off - 3072) >> 4, 192 + ((off - 3072) & 15)
    inn = off - 3328
    return 8 * ((inn >> 1) & 1) + (inn >> 2), 208 + (inn & 1)


def test_offset_is_a_bijection_and_source_its_inverse():
    offs = {q6t_offset(r, o) for r in range(16) for o in range(BLOCK)}
    assert offs == set(range(TILE))
    for off in range(TILE):
        r, o = q6t_source(off)
        assert 0 <= r < 16 and 0 <= o < BLOCK and q6t_offset(r, o) == off


@pytest.mark.parametrize("rows,k", [(16, 256), (48, 1280), (64, 256 * 7), (272, 5120)])
def test_tile_is_the_offset_formula(rows, k):
    nb = k // 256
    raw = gguf_q6k(rows, k, rows + k)
    tiled = tile_q6k(raw, rows, k)
    assert tiled.size == raw.size
    g = raw.reshape(rows, nb, BLOCK)
    r16, o = np.divmod(np.arange(16 * BLOCK), BLOCK)
    at = np.array([q6t_offset(int(a), int(b)) for a, b in zip(r16, o)])
    t = tiled.reshape(rows // 16, nb, TILE)
    for tr in range(rows // 16):
        for kb in range(nb):
            assert np.array_equal(t[tr, kb, at], g[16 * tr : 16 * tr + 16, kb].reshape(-1)), (tr, kb)
    assert np.array_equal(untile_q6k(tiled, rows, k), raw)


@pytest.mark.parametrize("rows,k", [(16, 256), (48, 1280), (112, 256 * 7)])
def test_repack_kernel_index_math(rows, k):
    """quant_repack.cu tile_q6k: destination unit u (16 bits) is byte 2 (u % 1680) of tile item = u / 1680; with
    (r16, o) = q6t_source of that byte, the source unit is ((row·nb + kb)·210 + o) / 2, row = (item / nb)·16 + r16,
    kb = item % nb."""
    nb = k // 256
    raw = gguf_q6k(rows, k, 7)
    src = raw.view(np.uint16)
    src_of = np.array([q6t_source(2 * j) for j in range(TILE // 2)])  # [1680, 2]
    assert (src_of[:, 1] % 2 == 0).all()  # every unit starts on an even block byte: whole 16-bit units
    u = np.arange(src.size, dtype=np.int64)
    item, j = np.divmod(u, TILE // 2)
    row = (item // nb) * 16 + src_of[j, 0]
    kb = item % nb
    dst = src[((row * nb + kb) * BLOCK + src_of[j, 1]) // 2]
    assert np.array_equal(dst.view(np.uint8), tile_q6k(raw, rows, k))


@pytest.mark.parametrize("rows,k", [(64, 256), (80, 1280)])
def test_gemv_lane_loads_are_the_q6k_pieces(rows, k):
    """gemv_q6_tile_kernel: item (tile row tr, kb) at (tr·nb + kb)·3360; lane L = 4g + t loads, for h = 0, 1 and
    c = 0, 1, ql at 16 L + 512 (2c + h), qh at 2048 + 32 g + 16 (t & 1) + 256 (2c + h), scales at 3072 + 16 g + 128 h,
    and 4 bytes of d at 3328 + 4 g: they must be Traits<Q6_K>'s pieces of row 16 tr + g + 8h (ql bytes 64c + 16t,
    qh bytes 32c + 16 (t & 1), the 16 scales; d of rows g and g + 8), and each warp instruction one contiguous run."""
    nb = k // 256
    raw = gguf_q6k(rows, k, 3)
    dev = tile_q6k(raw, rows, k)
    g6 = raw.reshape(rows, nb, BLOCK)
    for tr in range(rows // 16):
        for kb in range(nb):
            base = (tr * nb + kb) * TILE
            runs = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for h in range(2):
                    blk = g6[16 * tr + g + 8 * h, kb]
                    loads = []
                    for c in range(2):
                        loads.append((("ql", c, h), 16 * lane + 512 * (2 * c + h), blk[64 * c + 16 * t :][:16]))
                        loads.append((("qh", c, h), 2048 + 32 * g + 16 * (t & 1) + 256 * (2 * c + h),
                                      blk[128 + 32 * c + 16 * (t & 1) :][:16]))
                    loads.append((("sc", h), 3072 + 16 * g + 128 * h, blk[192:208]))
                    for key, at, want in loads:
                        assert np.array_equal(dev[base + at : base + at + 16], want), (tr, kb, lane, key)
                        runs.setdefault(key, set()).add(at)
                d = dev[base + 3328 + 4 * g : base + 3332 + 4 * g]
                assert np.array_equal(d[:2], g6[16 * tr + g, kb, 208:]) and np.array_equal(d[2:], g6[16 * tr + g + 8, kb, 208:])
            for key, ats in runs.items():  # the warp's lanes cover one contiguous run of 16-byte pieces
                ats = sorted(ats)
                assert ats == list(range(ats[0], ats[0] + 16 * len(ats), 16)), key
                assert len(ats) == {"ql": 32, "qh": 16, "sc": 8}[key[0]]


def traits_piece(row: int, kb: int, nb: int, t: int, p: int) -> int:
    """quant_blocks.cuh Traits<Q6_K_T>::piece, as written there (byte offset from w)."""
    b = ((row >> 4) * nb + kb) * TILE
    h, g = (row >> 3) & 1, row & 7
    if p < 2:
        return b + 512 * (2 * p + h) + 64 * g + 16 * t
    if p < 4:
        return b + 2048 + 256 * (2 * (p - 2) + h) + 32 * g + 16 * (t & 1)
    return b + 3072 + 128 * h + 16 * g


def q6k_piece(t: int, p: int) -> int:
    """Traits<Q6_K>::piece's offset inside a 208-byte body (as GGUF block bytes: the body is the block's first 208)."""
    return 64 * p + 16 * t if p < 2 else 128 + 32 * (p - 2) + 16 * (t & 1) if p < 4 else 192


@pytest.mark.parametrize("rows,k", [(48, 768), (96, 256)])
def test_traits_pieces_and_d_for_small_n(rows, k):
    """Traits<Q6_K_T>::piece and d_ptr (qmm_kernel at n = 2..8, qmm_smalln) read the bytes Traits<Q6_K> reads."""
    nb = k // 256
    raw = gguf_q6k(rows, k, 11)
    dev = tile_q6k(raw, rows, k)
    g6 = raw.reshape(rows, nb, BLOCK)
    for row in range(rows):
        for kb in range(nb):
            for t in range(4):
                for p in range(5):
                    at = traits_piece(row, kb, nb, t, p)
                    assert np.array_equal(dev[at : at + 16], g6[row, kb, q6k_piece(t, p) :][:16]), (row, kb, t, p)
            d_at = ((row >> 4) * nb + kb) * TILE + 3328 + 4 * (row & 7) + 2 * ((row >> 3) & 1)
            assert np.array_equal(dev[d_at : d_at + 2], g6[row, kb, 208:])


def test_dequant_and_embed_runs_stay_in_one_piece():
    """dequant_f16 (8-byte ql / qh runs at 8-aligned block bytes, the 16 scales, d) and df_embed (single bytes) map
    block bytes through q6t_offset; an 8-byte run at an 8-aligned ql / qh byte stays contiguous in the tile, and the
    16 scales are one 16-byte aligned piece."""
    for r16 in range(16):
        for o in list(range(0, 128, 8)) + list(range(128, 192, 8)):
            base = q6t_offset(r16, o)
            assert base % 8 == 0 and [q6t_offset(r16, o + i) for i in range(8)] == list(range(base, base + 8))
        s = q6t_offset(r16, 192)
        assert s % 16 == 0 and [q6t_offset(r16, 192 + i) for i in range(16)] == list(range(s, s + 16))
        assert q6t_offset(r16, 208) % 2 == 0 and q6t_offset(r16, 209) == q6t_offset(r16, 208) + 1


@pytest.mark.parametrize("n_rows,nb,grid", [(5120, 68, 132 * 7), (248320, 20, 132 * 7), (10240, 20, 924),
                                            (48, 20, 7), (16, 1, 1), (96, 3, 100)])
def test_gemv_cursors_cover_every_item_once(n_rows, nb, grid):
    """gemv_q6_tile_kernel runs gemv_k45_tile_kernel's cursor loop (test_q4k_tile.emulate_tile_cursors) over the same
    items (64-row groups × 256-blocks)."""
    items = -(-n_rows // 64) * nb
    seen, flushes = emulate_tile_cursors(n_rows, nb, min(grid, items))
    assert sorted(seen) == [(tr, kb) for tr in range(n_rows // 16) for kb in range(nb)]
    folded = {}
    for tr, n in flushes:
        folded[tr] = folded.get(tr, 0) + n
    assert folded == {tr: nb for tr in range(n_rows // 16)}


def test_concatenated_tiled_tensors_are_one_tiled_tensor():
    """The d lives inside each tile, so back-to-back tiled Q6_K tensors are the tiled form of their concatenation
    (unlike the untiled Q6_K, whose d array trails each tensor). Not used for fusion (dflash_layers)."""
    k = 512
    parts = [(64, gguf_q6k(64, k, 1)), (48, gguf_q6k(48, k, 2)), (16, gguf_q6k(16, k, 3))]
    cat = np.concatenate([tile_q6k(raw, r, k) for r, raw in parts])
    whole = np.concatenate([raw for _, raw in parts])
    assert np.array_equal(cat, tile_q6k(whole, sum(r for r, _ in parts), k))


def test_entries_and_switch():
    assert q6k_tile_default({}) and not q6k_tile_default({TILE6_ENV: "0"}) and q6k_tile_default({TILE6_ENV: "1"})
    assert not q6k_tile_default({TILE6_ENV: ""})
    assert can_tile("Q6_K", (48, 5120)) and not can_tile("Q6_K", (8, 256)) and not can_tile("Q8_0", (48, 5120))
    with pytest.raises(ValueError, match="tiled"):
        Entry("w", "Q6_K", (8, 256), 8 * 210, 0, tiled=True)
    e = qtype_entry("w", Q6K_TILED, 32, 512)
    assert e.tiled and e.qtype == Q6K_TILED and e.ggml_type == "Q6_K" and e.nbytes == 32 * 2 * 210
    raw = gguf_q6k(32, 512, 5)
    dev = device_bytes(e, raw)
    assert np.array_equal(dev, tile_q6k(raw, 32, 512)) and np.array_equal(gguf_bytes(e, dev), raw)
    plain = qtype_entry("w", 14, 32, 512)
    assert not plain.tiled and plain.qtype == 14 and np.array_equal(gguf_bytes(plain, device_bytes(plain, raw)), raw)


def test_27b_q6k_matrices_tile_under_the_switch():
    """With tile6 every Q6_K matrix of the 27B Q4_K_M (the LM head and the Q6_K FFN / attention matrices: all whole
    16-row tiles) uploads as qtype 270, the arena offsets do not move (same bytes), and the Q4_K choice is untouched."""
    cfg = mp.qwen35_27b_config()
    sizes = mp.sizes_from_mix(cfg, "Q4_K_M")
    model = _FakeModel(sizes)
    off = upload_plan(model, cfg, tile=True, tile6=False)
    on = upload_plan(model, cfg, tile=True, tile6=True)
    q6k = [e for e in on if e.ggml_type == "Q6_K"]
    assert q6k and all(e.tiled and e.qtype == Q6K_TILED for e in q6k)
    assert "output.weight" in {e.name for e in q6k}
    assert not any(e.tiled for e in off if e.ggml_type == "Q6_K")
    assert [(e.name, e.offset, e.nbytes, e.tiled if e.ggml_type != "Q6_K" else None) for e in off] == \
           [(e.name, e.offset, e.nbytes, e.tiled if e.ggml_type != "Q6_K" else None) for e in on]
