"""Q6_K: 256-weight super-blocks of 16 × 16, 6-bit signed quants (−32..31), an int8 scale per
sub-block and one fp16 super-block factor d (value = d·scale·q).

Matches quantize_row_q6_K_ref byte for byte (the no-imatrix path): per sub-block ggml's
make_qx_quants with rmse_type 1 (weights x², a ±0.9 search around nmax), then the int8 scales
against the largest-magnitude scale, then quants recomputed against the rounded d·scale.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import quantize_rows, store_fp16, to_int8
from lucebox_cli.quant.floats import fp16_round, nearest_int

QK_K = 256
BLOCK_BYTES = 210
GROUP_MAX_EPS = np.float32(1e-15)

F0 = np.float32(0.0)
F01 = np.float32(0.1)


@njit(cache=True, inline="always", error_model="numpy")
def _qx_sums(x, o, n, nmax, iscale):
    sumlx = F0
    suml2 = F0
    for i in range(n):
        xi = x[o + i]
        l = max(-nmax, min(nmax - 1, nearest_int(np.float32(iscale * xi))))
        w = np.float32(xi * xi)
        sumlx = np.float32(sumlx + np.float32(np.float32(w * xi) * np.float32(l)))
        suml2 = np.float32(suml2 + np.float32(np.float32(w * np.float32(l)) * np.float32(l)))
    return sumlx, suml2


@njit(cache=True, inline="always", error_model="numpy")
def _qx_store(x, o, n, nmax, iscale, L, lo):
    for i in range(n):
        l = nearest_int(np.float32(iscale * x[o + i]))
        L[lo + i] = nmax + max(-nmax, min(nmax - 1, l))


@njit(cache=True, inline="always", error_model="numpy")
def make_qx_quants_rmse1(x, o, n, nmax, L, lo):
    """ggml's make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): symmetric scale, x²-weighted."""
    mx = F0
    amax = F0
    for i in range(n):
        ax = abs(x[o + i])
        if ax > amax:
            amax = ax
            mx = x[o + i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[lo + i] = 0
        return F0
    fn = np.float32(nmax)
    iscale = np.float32(-fn / mx)
    _qx_store(x, o, n, nmax, iscale, L, lo)
    sumlx, suml2 = _qx_sums(x, o, n, nmax, iscale)
    scale = np.float32(sumlx / suml2) if suml2 != F0 else F0
    best = np.float32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = np.float32(np.float32(-np.float32(fn + np.float32(F01 * np.float32(step)))) / mx)
        sumlx, suml2 = _qx_sums(x, o, n, nmax, iscale)
        if suml2 > F0 and np.float32(sumlx * sumlx) > np.float32(best * suml2):
            _qx_store(x, o, n, nmax, iscale, L, lo)
            scale = np.float32(sumlx / suml2)
            best = np.float32(scale * sumlx)
    return scale


@njit(cache=True, inline="always", error_model="numpy")
def _block(x, o, out, p, L, scales):
    max_scale = F0
    max_abs_scale = F0
    for ib in range(16):
        sc = make_qx_quants_rmse1(x, o + 16 * ib, 16, 32, L, 16 * ib)
        scales[ib] = sc
        if abs(sc) > max_abs_scale:
            max_abs_scale = abs(sc)
            max_scale = sc
    if max_abs_scale < GROUP_MAX_EPS:
        for k in range(BLOCK_BYTES):
            out[p + k] = 0
        return
    iscale = np.float32(np.float32(-128.0) / max_scale)
    store_fp16(out, p + 208, np.float32(np.float32(1.0) / iscale))
    d = fp16_round(np.float32(np.float32(1.0) / iscale))
    ps = p + 192
    for ib in range(16):
        out[ps + ib] = to_int8(min(127, nearest_int(np.float32(iscale * scales[ib])))) & 0xFF
    for j in range(16):
        dj = np.float32(d * np.float32(to_int8(out[ps + j])))
        if dj == F0:
            continue
        for ii in range(16):
            l = nearest_int(np.float32(x[o + 16 * j + ii] / dj))
            L[16 * j + ii] = max(-32, min(31, l)) + 32
    ql = p
    qh = p + 128
    for j in range(0, QK_K, 128):
        for l in range(32):
            q1 = L[j + l] & 0xF
            q2 = L[j + l + 32] & 0xF
            q3 = L[j + l + 64] & 0xF
            q4 = L[j + l + 96] & 0xF
            out[ql + l] = q1 | (q3 << 4)
            out[ql + l + 32] = q2 | (q4 << 4)
            out[qh + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                           | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6)) & 0xFF
        ql += 64
        qh += 32


@njit(cache=True, parallel=True, error_model="numpy")
def _q6_k_rows(x, out):
    nb = x.shape[1] // QK_K
    for r in prange(x.shape[0]):
        L = np.zeros(QK_K, dtype=np.int64)
        scales = np.zeros(16, dtype=np.float32)
        xr = x[r]
        orow = out[r]
        for i in range(nb):
            _block(xr, i * QK_K, orow, i * BLOCK_BYTES, L, scales)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*210]."""
    return quantize_rows(_q6_k_rows, x, QK_K, BLOCK_BYTES)
