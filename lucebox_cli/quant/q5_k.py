"""Q5_K: Q4_K's super-block with 5-bit quants (0..31); the 5th bits live in qh[32].

Matches quantize_row_q5_K_ref byte for byte (the no-imatrix path). Sub-block fit, scale packing and
requantization are Q4_K's (see q4_k.py) with nmax 31 and a shorter, finer scale search.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import as_rows, store_fp16
from lucebox_cli.quant.floats import fp16_round
from lucebox_cli.quant.q4_k import F63, pack_scales, requantize, subblock_fits

QK_K = 256
BLOCK_BYTES = 176


@njit(cache=True, inline="always", error_model="numpy")
def _block(x, o, out, p, L, scales, mins, weights, laux):
    max_scale, max_min = subblock_fits(x, o, 31, np.float32(-0.5), np.float32(0.1), 15, L, scales, mins, weights, laux)
    pack_scales(scales, mins, max_scale, max_min, out, p + 4)
    store_fp16(out, p, np.float32(max_scale / F63))
    store_fp16(out, p + 2, np.float32(max_min / F63))
    d = fp16_round(np.float32(max_scale / F63))
    dmin = fp16_round(np.float32(max_min / F63))
    requantize(x, o, 31, d, dmin, out, p + 4, L)
    qh = p + 16
    ql = p + 48
    for j in range(32):
        out[qh + j] = 0
    m1 = 1
    m2 = 2
    for n in range(0, QK_K, 64):
        for j in range(32):
            l1 = L[n + j]
            if l1 > 15:
                l1 -= 16
                out[qh + j] |= m1
            l2 = L[n + j + 32]
            if l2 > 15:
                l2 -= 16
                out[qh + j] |= m2
            out[ql + j] = l1 | (l2 << 4)
        m1 <<= 2
        m2 <<= 2
        ql += 32


@njit(cache=True, parallel=True, error_model="numpy")
def _q5_k_rows(x, out):
    nb = x.shape[1] // QK_K
    for r in prange(x.shape[0]):
        L = np.zeros(QK_K, dtype=np.int64)
        laux = np.zeros(32, dtype=np.int64)
        weights = np.zeros(32, dtype=np.float32)
        scales = np.zeros(8, dtype=np.float32)
        mins = np.zeros(8, dtype=np.float32)
        xr = x[r]
        orow = out[r]
        for i in range(nb):
            _block(xr, i * QK_K, orow, i * BLOCK_BYTES, L, scales, mins, weights, laux)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*176]."""
    x = as_rows(x, QK_K)
    out = np.empty((x.shape[0], x.shape[1] // QK_K * BLOCK_BYTES), dtype=np.uint8)
    _q5_k_rows(x, out)
    return out
