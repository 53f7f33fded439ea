"""Q5_K: Q4_K's super-block with 5-bit quants (0..31); the 5th bits live in qh[32].

Matches quantize_row_q5_K_ref byte for byte (the no-imatrix path). Sub-block fit, scale packing and
requantization are Q4_K's (q4_k.fit_blocks, two super-blocks per call) with nmax 31 and a shorter,
finer scale search.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import quantize_rows
from lucebox_cli.quant.q4_k import fit_blocks, k_scratch

QK_K = 256
BLOCK_BYTES = 176


@njit(cache=True, inline="always", error_model="numpy")
def _block(L, out, p):
    """The 5-bit quants L[0:256] into the block at out[p:]: low nibbles to ql, 5th bits to qh (bit
    2k of qh[j] from L[64k + j], bit 2k+1 from L[64k + 32 + j]). The reference's `if (l > 15)
    { l -= 16; qh |= m; }` as bit operations (0 <= l <= 31): the branch on random data was
    mispredicted about half the time."""
    qh = p + 16
    ql = p + 48
    for j in range(32):
        out[qh + j] = 0
    for k in range(4):
        n = 64 * k
        for j in range(32):
            l1 = L[n + j]
            l2 = L[n + j + 32]
            out[ql + j] = (l1 & 15) | ((l2 & 15) << 4)
            out[qh + j] |= ((l1 >> 4) << (2 * k)) | ((l2 >> 4) << (2 * k + 1))
        ql += 32


@njit(cache=True, parallel=True, error_model="numpy")
def _q5_k_rows(x, out):
    nb = x.shape[1] // QK_K
    for r in prange(x.shape[0]):
        work = k_scratch()
        xr = x[r]
        orow = out[r]
        for i in range(0, nb, 2):
            # two super-blocks per fit (the last one twice when nb is odd: same bytes, written twice)
            i1 = i + 1 if i + 1 < nb else i
            L = fit_blocks(xr, i * QK_K, i1 * QK_K, orow, i * BLOCK_BYTES, i1 * BLOCK_BYTES,
                           31, np.float32(-0.5), np.float32(0.1), 15, work)
            _block(L, orow, i * BLOCK_BYTES)
            _block(L[QK_K:], orow, i1 * BLOCK_BYTES)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*176]."""
    return quantize_rows(_q5_k_rows, x, QK_K, BLOCK_BYTES)
