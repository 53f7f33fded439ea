"""Q6_K: 256-weight super-blocks of 16 × 16, 6-bit signed quants (−32..31), an int8 scale per
sub-block and one fp16 super-block factor d (value = d·scale·q).

Matches quantize_row_q6_K_ref byte for byte (the no-imatrix path): per sub-block ggml's
make_qx_quants with rmse_type 1 (weights x², a ±0.9 search around nmax; subblock_fits runs the 16
sub-blocks as SIMD lanes), then the int8 scales against the largest-magnitude scale, then quants
recomputed against the rounded d·scale.
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
    """ggml's make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): symmetric scale, x²-weighted.

    One sub-block at a time, written as the reference is; the quantizer uses subblock_fits, and
    tests/unit/test_quant_kernels.py checks the two against each other sub-block by sub-block."""
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
def _lanes_qx_sums(xt, wt, wxt, isc, sums):
    """One candidate scale per lane (isc[j] for sub-block j): the quants' sums sumlx, suml2 into
    sums[0, j], sums[1, j], each accumulated over i = 0..15 in order as the reference does. The
    lanes are the inner loop and independent, so LLVM turns it into SIMD over the 16 lanes
    without reordering any lane's additions."""
    for j in range(16):
        sums[0, j] = F0
        sums[1, j] = F0
    for i in range(16):
        for j in range(16):
            l = np.float32(max(-32, min(31, nearest_int(np.float32(isc[j] * xt[i, j])))))
            sums[0, j] = np.float32(sums[0, j] + np.float32(wxt[i, j] * l))
            sums[1, j] = np.float32(sums[1, j] + np.float32(np.float32(wt[i, j] * l) * l))


@njit(cache=True, inline="always", error_model="numpy")
def subblock_fits(x, o, L, scales, work):
    """make_qx_quants_rmse1(nmax 32) for the 16 sub-blocks of the super-block at x[o:], all at once:
    quants into L[0:256], scales into scales[0:16].

    The scalar search is bound by the latency of its two float add chains (sumlx, suml2: 16
    dependent adds per candidate scale, 19 candidates). Here lane j of the [16, 16] scratch arrays
    is sub-block j and every loop runs across the lanes, so the 32 chains are independent and
    vectorize. Each lane does exactly the scalar reference's float32 operations in the same order,
    so the result is bit for bit the reference's (tests/unit/test_quant_kernels.py checks both
    against llama.cpp and each other). The max search uses per-lane selects. Instead of
    re-storing the quants each time a candidate wins, a lane keeps the winning iscale and the
    quants are stored once at the end from it: the same iscale gives the same quants. Lanes whose
    sub-block is all (near) zero compute values that are discarded, as the reference returns
    early for them."""
    xt, wt, wxt, v = work
    fn = np.float32(32.0)
    for j in range(16):
        for i in range(16):
            xt[i, j] = x[o + 16 * j + i]
    # rows of v: 0 amax, 1 max (signed), 2 iscale, 3 sumlx, 4 suml2, 5 scale, 6 best, 7 winning iscale
    for j in range(16):
        v[0, j] = F0
        v[1, j] = F0
    for i in range(16):
        for j in range(16):
            xi = xt[i, j]
            ax = abs(xi)
            take = ax > v[0, j]  # strict: the first of equal magnitudes wins, as in the reference
            v[0, j] = ax if take else v[0, j]
            v[1, j] = xi if take else v[1, j]
            w = np.float32(xi * xi)  # rmse_type 1: weight x²; the reference's w*x[i]*l is (w*x)*l
            wt[i, j] = w
            wxt[i, j] = np.float32(w * xi)
    for j in range(16):
        v[2, j] = np.float32(-fn / v[1, j])
    _lanes_qx_sums(xt, wt, wxt, v[2], v[3:5])
    for j in range(16):
        sumlx = v[3, j]
        suml2 = v[4, j]
        scale = np.float32(sumlx / suml2)
        scale = scale if suml2 != F0 else F0
        v[5, j] = scale
        v[6, j] = np.float32(scale * sumlx)
        v[7, j] = v[2, j]
    for step in range(-9, 10):
        if step == 0:
            continue
        num = np.float32(-np.float32(fn + np.float32(F01 * np.float32(step))))
        for j in range(16):
            v[2, j] = np.float32(num / v[1, j])
        _lanes_qx_sums(xt, wt, wxt, v[2], v[3:5])
        for j in range(16):
            sumlx = v[3, j]
            suml2 = v[4, j]
            # a per-lane branch: a select form (every lane's update computed) measured slower, 291 vs 343 MB/s
            if suml2 > F0 and np.float32(sumlx * sumlx) > np.float32(v[6, j] * suml2):
                scale = np.float32(sumlx / suml2)
                v[5, j] = scale
                v[6, j] = np.float32(scale * sumlx)
                v[7, j] = v[2, j]
    for j in range(16):
        if v[0, j] < GROUP_MAX_EPS:
            scales[j] = F0
            for i in range(16):
                L[16 * j + i] = 0
        else:
            scales[j] = v[5, j]
            _qx_store(x, o + 16 * j, 16, 32, v[7, j], L, 16 * j)


@njit(cache=True, inline="always")
def q6_scratch():
    """A row's work buffers: (L, scales, (xt, wt, wxt, lane vectors)) for subblock_fits."""
    return (np.zeros(QK_K, dtype=np.int64), np.zeros(16, dtype=np.float32),
            (np.zeros((16, 16), dtype=np.float32), np.zeros((16, 16), dtype=np.float32),
             np.zeros((16, 16), dtype=np.float32), np.zeros((8, 16), dtype=np.float32)))


@njit(cache=True, inline="always", error_model="numpy")
def _block(x, o, out, p, work):
    L, scales, lanes = work
    subblock_fits(x, o, L, scales, lanes)
    max_scale = F0
    max_abs_scale = F0
    for ib in range(16):
        sc = scales[ib]
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
        work = q6_scratch()
        xr = x[r]
        orow = out[r]
        for i in range(nb):
            _block(xr, i * QK_K, orow, i * BLOCK_BYTES, work)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*210]."""
    return quantize_rows(_q6_k_rows, x, QK_K, BLOCK_BYTES)
