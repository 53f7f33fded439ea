"""The 32-weight legacy types llama.cpp falls back to when a row is not a multiple of 256:
Q4_K → Q5_0, Q5_K → Q5_1 (and Q2_K/Q3_K → Q4_0, kept for completeness). Q6_K falls back to Q8_0.

Each matches its quantize_row_*_ref byte for byte (the no-imatrix path). The casts mirror the C:
`(int8_t)(v + 16.5f)` truncates toward zero, then MIN, then the uint8 store.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import cvtt, quantize_rows, store_fp16, to_int8

QK = 32
F0 = np.float32(0.0)
F1 = np.float32(1.0)
FLT_MAX = np.float32(3.4028234663852886e38)


@njit(cache=True, inline="always", error_model="numpy")
def _absmax_signed(x, o):
    amax = F0
    mx = F0
    for j in range(QK):
        v = x[o + j]
        if amax < abs(v):
            amax = abs(v)
            mx = v
    return mx


@njit(cache=True, inline="always", error_model="numpy")
def _minmax(x, o):
    mn = FLT_MAX
    mx = -FLT_MAX
    for j in range(QK):
        v = x[o + j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(cache=True, inline="always", error_model="numpy")
def _put_qh(out, p, qh):
    for k in range(4):
        out[p + k] = (qh >> (8 * k)) & 0xFF


@njit(cache=True, inline="always", error_model="numpy")
def _q4_0_block(x, o, out, p):
    d = np.float32(_absmax_signed(x, o) / np.float32(-8.0))
    inv = np.float32(F1 / d) if d != F0 else F0
    store_fp16(out, p, d)
    for j in range(QK // 2):
        x0 = np.float32(x[o + j] * inv)
        x1 = np.float32(x[o + 16 + j] * inv)
        q0 = min(15, to_int8(cvtt(np.float32(x0 + np.float32(8.5))))) & 0xFF
        q1 = min(15, to_int8(cvtt(np.float32(x1 + np.float32(8.5))))) & 0xFF
        out[p + 2 + j] = (q0 | (q1 << 4)) & 0xFF


@njit(cache=True, inline="always", error_model="numpy")
def _q5_0_block(x, o, out, p):
    d = np.float32(_absmax_signed(x, o) / np.float32(-16.0))
    inv = np.float32(F1 / d) if d != F0 else F0
    store_fp16(out, p, d)
    qh = 0
    for j in range(QK // 2):
        x0 = np.float32(x[o + j] * inv)
        x1 = np.float32(x[o + 16 + j] * inv)
        q0 = min(31, to_int8(cvtt(np.float32(x0 + np.float32(16.5))))) & 0xFF
        q1 = min(31, to_int8(cvtt(np.float32(x1 + np.float32(16.5))))) & 0xFF
        out[p + 6 + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
        qh |= ((q0 & 0x10) >> 4) << j
        qh |= ((q1 & 0x10) >> 4) << (j + 16)
    _put_qh(out, p + 2, qh)


@njit(cache=True, inline="always", error_model="numpy")
def _q5_1_block(x, o, out, p):
    mn, mx = _minmax(x, o)
    d = np.float32(np.float32(mx - mn) / np.float32(31.0))
    inv = np.float32(F1 / d) if d != F0 else F0
    store_fp16(out, p, d)
    store_fp16(out, p + 2, mn)
    qh = 0
    for j in range(QK // 2):
        x0 = np.float32(np.float32(x[o + j] - mn) * inv)
        x1 = np.float32(np.float32(x[o + 16 + j] - mn) * inv)
        q0 = cvtt(np.float32(x0 + np.float32(0.5))) & 0xFF
        q1 = cvtt(np.float32(x1 + np.float32(0.5))) & 0xFF
        out[p + 8 + j] = ((q0 & 0x0F) | ((q1 & 0x0F) << 4)) & 0xFF
        qh |= ((q0 & 0x10) >> 4) << j
        qh |= ((q1 & 0x10) >> 4) << (j + 16)
    _put_qh(out, p + 4, qh)


@njit(cache=True, parallel=True, error_model="numpy")
def _rows(x, out, kind, nbytes):
    nb = x.shape[1] // QK
    for r in prange(x.shape[0]):
        xr = x[r]
        orow = out[r]
        for i in range(nb):
            if kind == 0:
                _q4_0_block(xr, i * QK, orow, i * nbytes)
            elif kind == 1:
                _q5_0_block(xr, i * QK, orow, i * nbytes)
            else:
                _q5_1_block(xr, i * QK, orow, i * nbytes)


def _quantize(x: np.ndarray, kind: int, nbytes: int) -> np.ndarray:
    return quantize_rows(_rows, x, QK, nbytes, kind, nbytes)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/32*18]."""
    return _quantize(x, 0, 18)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/32*22]."""
    return _quantize(x, 1, 22)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/32*24]."""
    return _quantize(x, 2, 24)
