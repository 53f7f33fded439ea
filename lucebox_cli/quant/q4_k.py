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
def _lanes_step_sums(xt, wt, lt, isc, mnv, nmax, sums):
    """One scale-search step for 8 lanes (generated, one lane per sub-block): quants into lt,
    and per lane the sequential float32 sums sum_l, sum_l2, sum_xl into sums[0..2, lane]; local
    accumulators keep the 24 independent chains in registers."""
    i0 = isc[0]; m0 = mnv[0]; a0 = F0; b0 = F0; c0 = F0
    i1 = isc[1]; m1 = mnv[1]; a1 = F0; b1 = F0; c1 = F0
    i2 = isc[2]; m2 = mnv[2]; a2 = F0; b2 = F0; c2 = F0
    i3 = isc[3]; m3 = mnv[3]; a3 = F0; b3 = F0; c3 = F0
    i4 = isc[4]; m4 = mnv[4]; a4 = F0; b4 = F0; c4 = F0
    i5 = isc[5]; m5 = mnv[5]; a5 = F0; b5 = F0; c5 = F0
    i6 = isc[6]; m6 = mnv[6]; a6 = F0; b6 = F0; c6 = F0
    i7 = isc[7]; m7 = mnv[7]; a7 = F0; b7 = F0; c7 = F0
    for i in range(32):
        x0 = xt[i, 0]
        l0 = max(0, min(nmax, nearest_int(np.float32(i0 * np.float32(x0 - m0)))))
        lt[i, 0] = l0
        fl0 = np.float32(l0)
        w0 = np.float32(wt[i, 0] * fl0)
        a0 = np.float32(a0 + w0)
        b0 = np.float32(b0 + np.float32(w0 * fl0))
        c0 = np.float32(c0 + np.float32(w0 * x0))
        x1 = xt[i, 1]
        l1 = max(0, min(nmax, nearest_int(np.float32(i1 * np.float32(x1 - m1)))))
        lt[i, 1] = l1
        fl1 = np.float32(l1)
        w1 = np.float32(wt[i, 1] * fl1)
        a1 = np.float32(a1 + w1)
        b1 = np.float32(b1 + np.float32(w1 * fl1))
        c1 = np.float32(c1 + np.float32(w1 * x1))
        x2 = xt[i, 2]
        l2 = max(0, min(nmax, nearest_int(np.float32(i2 * np.float32(x2 - m2)))))
        lt[i, 2] = l2
        fl2 = np.float32(l2)
        w2 = np.float32(wt[i, 2] * fl2)
        a2 = np.float32(a2 + w2)
        b2 = np.float32(b2 + np.float32(w2 * fl2))
        c2 = np.float32(c2 + np.float32(w2 * x2))
        x3 = xt[i, 3]
        l3 = max(0, min(nmax, nearest_int(np.float32(i3 * np.float32(x3 - m3)))))
        lt[i, 3] = l3
        fl3 = np.float32(l3)
        w3 = np.float32(wt[i, 3] * fl3)
        a3 = np.float32(a3 + w3)
        b3 = np.float32(b3 + np.float32(w3 * fl3))
        c3 = np.float32(c3 + np.float32(w3 * x3))
        x4 = xt[i, 4]
        l4 = max(0, min(nmax, nearest_int(np.float32(i4 * np.float32(x4 - m4)))))
        lt[i, 4] = l4
        fl4 = np.float32(l4)
        w4 = np.float32(wt[i, 4] * fl4)
        a4 = np.float32(a4 + w4)
        b4 = np.float32(b4 + np.float32(w4 * fl4))
        c4 = np.float32(c4 + np.float32(w4 * x4))
        x5 = xt[i, 5]
        l5 = max(0, min(nmax, nearest_int(np.float32(i5 * np.float32(x5 - m5)))))
        lt[i, 5] = l5
        fl5 = np.float32(l5)
        w5 = np.float32(wt[i, 5] * fl5)
        a5 = np.float32(a5 + w5)
        b5 = np.float32(b5 + np.float32(w5 * fl5))
        c5 = np.float32(c5 + np.float32(w5 * x5))
        x6 = xt[i, 6]
        l6 = max(0, min(nmax, nearest_int(np.float32(i6 * np.float32(x6 - m6)))))
        lt[i, 6] = l6
        fl6 = np.float32(l6)
        w6 = np.float32(wt[i, 6] * fl6)
        a6 = np.float32(a6 + w6)
        b6 = np.float32(b6 + np.float32(w6 * fl6))
        c6 = np.float32(c6 + np.float32(w6 * x6))
        x7 = xt[i, 7]
        l7 = max(0, min(nmax, nearest_int(np.float32(i7 * np.float32(x7 - m7)))))
        lt[i, 7] = l7
        fl7 = np.float32(l7)
        w7 = np.float32(wt[i, 7] * fl7)
        a7 = np.float32(a7 + w7)
        b7 = np.float32(b7 + np.float32(w7 * fl7))
        c7 = np.float32(c7 + np.float32(w7 * x7))
    sums[0, 0] = a0; sums[1, 0] = b0; sums[2, 0] = c0
    sums[0, 1] = a1; sums[1, 1] = b1; sums[2, 1] = c1
    sums[0, 2] = a2; sums[1, 2] = b2; sums[2, 2] = c2
    sums[0, 3] = a3; sums[1, 3] = b3; sums[2, 3] = c3
    sums[0, 4] = a4; sums[1, 4] = b4; sums[2, 4] = c4
    sums[0, 5] = a5; sums[1, 5] = b5; sums[2, 5] = c5
    sums[0, 6] = a6; sums[1, 6] = b6; sums[2, 6] = c6
    sums[0, 7] = a7; sums[1, 7] = b7; sums[2, 7] = c7


@njit(cache=True, inline="always", error_model="numpy")
def _lanes_step_err(xt, wt, lt, tsc, tmn, err):
    """Per lane the weighted squared error of (tsc·lt + tmn) against xt, summed in order (generated)."""
    s0 = tsc[0]; m0 = tmn[0]; e0 = F0
    s1 = tsc[1]; m1 = tmn[1]; e1 = F0
    s2 = tsc[2]; m2 = tmn[2]; e2 = F0
    s3 = tsc[3]; m3 = tmn[3]; e3 = F0
    s4 = tsc[4]; m4 = tmn[4]; e4 = F0
    s5 = tsc[5]; m5 = tmn[5]; e5 = F0
    s6 = tsc[6]; m6 = tmn[6]; e6 = F0
    s7 = tsc[7]; m7 = tmn[7]; e7 = F0
    for i in range(32):
        d0 = np.float32(np.float32(np.float32(s0 * np.float32(lt[i, 0])) + m0) - xt[i, 0])
        e0 = np.float32(e0 + np.float32(wt[i, 0] * np.float32(d0 * d0)))
        d1 = np.float32(np.float32(np.float32(s1 * np.float32(lt[i, 1])) + m1) - xt[i, 1])
        e1 = np.float32(e1 + np.float32(wt[i, 1] * np.float32(d1 * d1)))
        d2 = np.float32(np.float32(np.float32(s2 * np.float32(lt[i, 2])) + m2) - xt[i, 2])
        e2 = np.float32(e2 + np.float32(wt[i, 2] * np.float32(d2 * d2)))
        d3 = np.float32(np.float32(np.float32(s3 * np.float32(lt[i, 3])) + m3) - xt[i, 3])
        e3 = np.float32(e3 + np.float32(wt[i, 3] * np.float32(d3 * d3)))
        d4 = np.float32(np.float32(np.float32(s4 * np.float32(lt[i, 4])) + m4) - xt[i, 4])
        e4 = np.float32(e4 + np.float32(wt[i, 4] * np.float32(d4 * d4)))
        d5 = np.float32(np.float32(np.float32(s5 * np.float32(lt[i, 5])) + m5) - xt[i, 5])
        e5 = np.float32(e5 + np.float32(wt[i, 5] * np.float32(d5 * d5)))
        d6 = np.float32(np.float32(np.float32(s6 * np.float32(lt[i, 6])) + m6) - xt[i, 6])
        e6 = np.float32(e6 + np.float32(wt[i, 6] * np.float32(d6 * d6)))
        d7 = np.float32(np.float32(np.float32(s7 * np.float32(lt[i, 7])) + m7) - xt[i, 7])
        e7 = np.float32(e7 + np.float32(wt[i, 7] * np.float32(d7 * d7)))
    err[0] = e0
    err[1] = e1
    err[2] = e2
    err[3] = e3
    err[4] = e4
    err[5] = e5
    err[6] = e6
    err[7] = e7



@njit(cache=True, inline="always", error_model="numpy")
def subblock_fits(x, o, nmax, rmin, rdelta, nstep, L, scales, mins, work):
    """Fit the 8 sub-blocks of the super-block at x[o:]; returns (max_scale, max_min).

    ggml's make_qkx2_quants (use_mad = false) for all 8 sub-blocks at once: lane j of the [32, 8]
    scratch arrays is sub-block j. Each lane performs exactly the scalar reference's float32
    operations in the same order (the sums stay sequential per lane), so the result is bit for bit
    the reference's; interleaving 8 independent chains only removes the add-latency bound and lets
    LLVM use SIMD across the lanes. Branches become per-lane selects; a lane whose branch the
    reference does not take computes values that are then discarded."""
    xt, wt, lt, v = work
    fn = np.float32(nmax)
    for j in range(8):
        for i in range(32):
            xt[i, j] = x[o + 32 * j + i]
    # per-lane vectors, rows of v: 0 sum_x2/sum_x, 1 sum_w, 2 mn, 3 mx, 4 iscale, 5 scale, 6 best_error,
    # 7 sum_l, 8 sum_l2, 9 sum_xl, 10 cur_error, 11 this_scale, 12 this_min, 13 accept, 14 live
    for j in range(8):
        v[0, j] = F0
    for i in range(32):
        for j in range(8):
            v[0, j] = np.float32(v[0, j] + np.float32(xt[i, j] * xt[i, j]))
    for j in range(8):
        v[4, j] = np.float32(np.sqrt(np.float32(v[0, j] / F32_)))  # av_x
    for i in range(32):
        for j in range(8):
            wt[i, j] = np.float32(v[4, j] + abs(xt[i, j]))
    for j in range(8):
        v[2, j] = xt[0, j]
        v[3, j] = xt[0, j]
        v[1, j] = wt[0, j]
        v[0, j] = np.float32(wt[0, j] * xt[0, j])
    for i in range(1, 32):
        for j in range(8):
            xi = xt[i, j]
            v[2, j] = xi if xi < v[2, j] else v[2, j]
            v[3, j] = xi if xi > v[3, j] else v[3, j]
            v[1, j] = np.float32(v[1, j] + wt[i, j])
            v[0, j] = np.float32(v[0, j] + np.float32(wt[i, j] * xi))
    for j in range(8):
        mn = v[2, j]
        if mn > F0:
            mn = F0
        v[2, j] = mn
        v[14, j] = F1 if v[3, j] != mn else F0
        iscale = np.float32(fn / np.float32(v[3, j] - mn))
        v[4, j] = iscale
        v[5, j] = np.float32(F1 / iscale)
        v[6, j] = F0
    for i in range(32):
        for j in range(8):
            xi = xt[i, j]
            l = nearest_int(np.float32(v[4, j] * np.float32(xi - v[2, j])))
            l = max(0, min(nmax, l))
            lt[i, j] = l
            diff = np.float32(np.float32(np.float32(v[5, j] * np.float32(l)) + v[2, j]) - xi)
            v[6, j] = np.float32(v[6, j] + np.float32(wt[i, j] * np.float32(diff * diff)))
    for j in range(8):
        for i in range(32):
            L[32 * j + i] = lt[i, j]
    if nstep >= 1:
        for step in range(nstep + 1):
            num = np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step))) + fn)
            for j in range(8):
                v[4, j] = np.float32(num / np.float32(v[3, j] - v[2, j]))
            _lanes_step_sums(xt, wt, lt, v[4], v[2], nmax, v[7:10])
            for j in range(8):
                sum_w = v[1, j]
                sum_x = v[0, j]
                sum_l = v[7, j]
                sum_l2 = v[8, j]
                sum_xl = v[9, j]
                D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
                this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl) - np.float32(sum_x * sum_l)) / D)
                this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x) - np.float32(sum_l * sum_xl)) / D)
                if this_min > F0:
                    this_min = F0
                    this_scale = np.float32(sum_xl / sum_l2)
                v[11, j] = this_scale
                v[12, j] = this_min
                v[13, j] = F1 if D > F0 else F0
            _lanes_step_err(xt, wt, lt, v[11], v[12], v[10])
            for j in range(8):
                if v[13, j] != F0 and v[14, j] != F0 and v[10, j] < v[6, j]:
                    for i in range(32):
                        L[32 * j + i] = lt[i, j]
                    v[6, j] = v[10, j]
                    v[5, j] = v[11, j]
                    v[2, j] = v[12, j]
    max_scale = F0
    max_min = F0
    for j in range(8):
        if v[14, j] != F0:
            sc = v[5, j]
        else:
            sc = F0
            for i in range(32):
                L[32 * j + i] = 0
        mi = np.float32(-v[2, j])
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
    """A row's work buffers for fit_block: (L, scales, mins, (xt, wt, lt, lane vectors))."""
    return (np.zeros(QK_K, dtype=np.int64), np.zeros(8, dtype=np.float32), np.zeros(8, dtype=np.float32),
            (np.zeros((32, 8), dtype=np.float32), np.zeros((32, 8), dtype=np.float32),
             np.zeros((32, 8), dtype=np.int32), np.zeros((16, 8), dtype=np.float32)))


@njit(cache=True, inline="always", error_model="numpy")
def fit_block(x, o, out, p, nmax, rmin, rdelta, nstep, work):
    """Fit the super-block at x[o:] (Q4_K and Q5_K alike): fp16 d, dmin and the 6-bit scales go to
    out[p:p+16]; returns L, the quants re-fitted to those rounded factors."""
    L, scales, mins, lanes = work
    max_scale, max_min = subblock_fits(x, o, nmax, rmin, rdelta, nstep, L, scales, mins, lanes)
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
