"""Q4_K: 256-weight super-blocks of 8 × 32, 4-bit quants with a 6-bit scale and a 6-bit min per
sub-block, and fp16 super-block factors d and dmin (value = d·sc·q − dmin·m).

Matches quantize_row_q4_K_ref byte for byte: that is the path llama.cpp takes without an importance
matrix. Every float operation is float32 and in the reference's order, because the search below
compares errors, and one changed rounding can flip a choice.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from lucebox_cli.quant._common import quantize_rows, store_fp16
from lucebox_cli.quant.floats import fp16_round, nearest_int

QK_K = 256
BLOCK_BYTES = 144

F0 = np.float32(0.0)
F1 = np.float32(1.0)
F32_ = np.float32(32.0)
F63 = np.float32(63.0)


@njit(cache=True, inline="always", error_model="numpy")
def make_qkx2_quants(x, o, n, nmax, w, L, lo, laux, rmin, rdelta, nstep):
    """Asymmetric (scale, min) fit of x[o:o+n] to 0..nmax, weighted squared error; quants into
    L[lo:lo+n]. Returns (scale, -min) like ggml's make_qkx2_quants with use_mad = false."""
    fn = np.float32(nmax)
    mn = x[o]
    mx = x[o]
    sum_w = w[0]
    sum_x = np.float32(sum_w * x[o])
    for i in range(1, n):
        xi = x[o + i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        sum_w = np.float32(sum_w + w[i])
        sum_x = np.float32(sum_x + np.float32(w[i] * xi))
    if mn > F0:
        mn = F0
    if mx == mn:
        for i in range(n):
            L[lo + i] = 0
        return F0, np.float32(-mn)
    iscale = np.float32(fn / np.float32(mx - mn))
    scale = np.float32(F1 / iscale)
    best_error = F0
    for i in range(n):
        xi = x[o + i]
        l = nearest_int(np.float32(iscale * np.float32(xi - mn)))
        l = max(0, min(nmax, l))
        L[lo + i] = l
        diff = np.float32(np.float32(np.float32(scale * np.float32(l)) + mn) - xi)
        best_error = np.float32(best_error + np.float32(w[i] * np.float32(diff * diff)))
    if nstep < 1:
        return scale, np.float32(-mn)
    for step in range(nstep + 1):
        # min moves whenever a better fit is found, and later steps use the moved value (as ggml does)
        rng = np.float32(mx - mn)
        iscale = np.float32(np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step))) + fn) / rng)
        sum_l = F0
        sum_l2 = F0
        sum_xl = F0
        for i in range(n):
            xi = x[o + i]
            l = nearest_int(np.float32(iscale * np.float32(xi - mn)))
            l = max(0, min(nmax, l))
            laux[i] = l
            wl = np.float32(w[i] * np.float32(l))
            sum_l = np.float32(sum_l + wl)
            sum_l2 = np.float32(sum_l2 + np.float32(wl * np.float32(l)))
            sum_xl = np.float32(sum_xl + np.float32(wl * xi))
        D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
        if D > F0:
            this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl) - np.float32(sum_x * sum_l)) / D)
            this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x) - np.float32(sum_l * sum_xl)) / D)
            if this_min > F0:
                this_min = F0
                this_scale = np.float32(sum_xl / sum_l2)
            cur_error = F0
            for i in range(n):
                diff = np.float32(np.float32(np.float32(this_scale * np.float32(laux[i])) + this_min) - x[o + i])
                cur_error = np.float32(cur_error + np.float32(w[i] * np.float32(diff * diff)))
            if cur_error < best_error:
                for i in range(n):
                    L[lo + i] = laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, np.float32(-mn)


@njit(cache=True, inline="always", error_model="numpy")
def subblock_fits(x, o, nmax, rmin, rdelta, nstep, L, scales, mins, weights, laux):
    """Fit the 8 sub-blocks of the super-block at x[o:]; returns (max_scale, max_min)."""
    max_scale = F0
    max_min = F0
    for j in range(8):
        b = o + 32 * j
        sum_x2 = F0
        for l in range(32):
            sum_x2 = np.float32(sum_x2 + np.float32(x[b + l] * x[b + l]))
        av_x = np.float32(np.sqrt(np.float32(sum_x2 / F32_)))
        for l in range(32):
            weights[l] = np.float32(av_x + abs(x[b + l]))
        sc, mi = make_qkx2_quants(x, b, 32, nmax, weights, L, 32 * j, laux, rmin, rdelta, nstep)
        scales[j] = sc
        mins[j] = mi
        if sc > max_scale:
            max_scale = sc
        if mi > max_min:
            max_min = mi
    return max_scale, max_min


@njit(cache=True, inline="always", error_model="numpy")
def pack_scales(scales, mins, max_scale, max_min, out, p):
    """6-bit scales/mins into the 12 bytes at out[p:]: j < 4 in the low 6 bits of bytes j and j+4;
    j ≥ 4 as nibbles in byte j+4 with the top 2 bits in the high bits of bytes j−4 and j."""
    inv_scale = np.float32(F63 / max_scale) if max_scale > F0 else F0
    inv_min = np.float32(F63 / max_min) if max_min > F0 else F0
    for j in range(8):
        # uint8_t conversion, then MIN(63, ·), as the reference does
        ls = min(63, nearest_int(np.float32(inv_scale * scales[j])) & 0xFF)
        lm = min(63, nearest_int(np.float32(inv_min * mins[j])) & 0xFF)
        if j < 4:
            out[p + j] = ls
            out[p + j + 4] = lm
        else:
            out[p + j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            out[p + j - 4] |= (ls >> 4) << 6
            out[p + j] |= (lm >> 4) << 6


@njit(cache=True, inline="always")
def scale_min_k4(j, q, p):
    """Unpack sub-block j's 6-bit (scale, min) from the 12 bytes at q[p:]."""
    if j < 4:
        return q[p + j] & 63, q[p + j + 4] & 63
    sc = (q[p + j + 4] & 0xF) | ((q[p + j - 4] >> 6) << 4)
    m = (q[p + j + 4] >> 4) | ((q[p + j] >> 6) << 4)
    return sc, m


@njit(cache=True, inline="always", error_model="numpy")
def requantize(x, o, nmax, d, dmin, out, p_scales, L):
    """Recompute the quants against the rounded fp16 factors and 6-bit scales (sub-blocks whose
    effective scale is zero keep the quants of the fit)."""
    for j in range(8):
        sc, m = scale_min_k4(j, out, p_scales)
        dj = np.float32(d * np.float32(sc))
        if dj == F0:
            continue
        dm = np.float32(dmin * np.float32(m))
        for ii in range(32):
            l = nearest_int(np.float32(np.float32(x[o + 32 * j + ii] + dm) / dj))
            L[32 * j + ii] = max(0, min(nmax, l))


@njit(cache=True, inline="always")
def k_scratch():
    """A row's work buffers for fit_block: (L, laux, weights, scales, mins)."""
    return (np.zeros(QK_K, dtype=np.int64), np.zeros(32, dtype=np.int64), np.zeros(32, dtype=np.float32),
            np.zeros(8, dtype=np.float32), np.zeros(8, dtype=np.float32))


@njit(cache=True, inline="always", error_model="numpy")
def fit_block(x, o, out, p, nmax, rmin, rdelta, nstep, work):
    """Fit the super-block at x[o:] (Q4_K and Q5_K alike): fp16 d, dmin and the 6-bit scales go to
    out[p:p+16]; returns L, the quants re-fitted to those rounded factors."""
    L, laux, weights, scales, mins = work
    max_scale, max_min = subblock_fits(x, o, nmax, rmin, rdelta, nstep, L, scales, mins, weights, laux)
    pack_scales(scales, mins, max_scale, max_min, out, p + 4)
    store_fp16(out, p, np.float32(max_scale / F63))
    store_fp16(out, p + 2, np.float32(max_min / F63))
    d = fp16_round(np.float32(max_scale / F63))
    dmin = fp16_round(np.float32(max_min / F63))
    requantize(x, o, nmax, d, dmin, out, p + 4, L)
    return L


@njit(cache=True, inline="always", error_model="numpy")
def _block(x, o, out, p, work):
    L = fit_block(x, o, out, p, 15, np.float32(-1.0), np.float32(0.1), 20, work)
    q = p + 16
    for j in range(0, QK_K, 64):
        for l in range(32):
            out[q + l] = L[j + l] | (L[j + l + 32] << 4)
        q += 32


@njit(cache=True, parallel=True, error_model="numpy")
def _q4_k_rows(x, out):
    for r in prange(x.shape[0]):
        work = k_scratch()
        for i in range(x.shape[1] // QK_K):
            _block(x[r], i * QK_K, out[r], i * BLOCK_BYTES, work)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*144]."""
    return quantize_rows(_q4_k_rows, x, QK_K, BLOCK_BYTES)
