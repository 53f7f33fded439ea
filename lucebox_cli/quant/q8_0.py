"""Q8_0: 32 weights per block, one fp16 scale d = amax/127, int8 quants = roundf(x/d).

Matches quantize_row_q8_0_ref byte for byte (llama.cpp uses it with or without an imatrix).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import quantize_rows, roundf, store_fp16, to_int8

QK8_0 = 32
BLOCK_BYTES = 34


@njit(cache=True, inline="always")
def _block(x, o, out, p):
    amax = np.float32(0.0)
    for j in range(QK8_0):
        v = abs(x[o + j])
        # MAX(amax, v) as ggml writes it, so a NaN input propagates the same way
        amax = amax if amax > v else v
    d = np.float32(amax / np.float32(127.0))
    inv = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
    store_fp16(out, p, d)
    for j in range(QK8_0):
        out[p + 2 + j] = to_int8(roundf(np.float32(x[o + j] * inv))) & 0xFF


@njit(cache=True, parallel=True)
def _q8_0_rows(x, out):
    nb = x.shape[1] // QK8_0
    for r in prange(x.shape[0]):
        xr = x[r]
        orow = out[r]
        for i in range(nb):
            _block(xr, i * QK8_0, orow, i * BLOCK_BYTES)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/32*34]."""
    return quantize_rows(_q8_0_rows, x, QK8_0, BLOCK_BYTES)
