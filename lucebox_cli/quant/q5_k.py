"""Q5_K: Q4_K's super-block with 5-bit quants (0..31); the 5th bits live in qh[32].

Matches quantize_row_q5_K_ref byte for byte (the no-imatrix path). Sub-block fit, scale packing and
requantization are Q4_K's (q4_k.fit_block) with nmax 31 and a shorter, finer scale search.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import quantize_rows
from lucebox_cli.quant.q4_k import fit_block, k_scratch

QK_K = 256
BLOCK_BYTES = 176


@njit(cache=True, inline="always", error_model="numpy")
def _block(x, o, out, p, work):
    L = fit_block(x, o, out, p, 31, np.float32(-0.5), np.float32(0.1), 15, work)
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
    for r in prange(x.shape[0]):
        work = k_scratch()
        for i in range(x.shape[1] // QK_K):
            _block(x[r], i * QK_K, out[r], i * BLOCK_BYTES, work)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*176]."""
    return quantize_rows(_q5_k_rows, x, QK_K, BLOCK_BYTES)
