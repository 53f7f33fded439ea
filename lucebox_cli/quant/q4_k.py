"""Q4_K: 256-weight super-blocks of 8 × 32, 4-bit quants with a 6-bit scale and a 6-bit min per
sub-block, and fp16 super-block factors d and dmin (value = d·sc·q − dmin·m).

Matches quantize_row_q4_K_ref byte for byte: that is the path llama.cpp takes without an importance
matrix. Every float operation is float32 and in the reference's order, because the search below
compares errors, and one changed rounding can flip a choice.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from lucebox_cli.quant._common import quantize_rows, stack_f32, store_fp16
from lucebox_cli.quant.floats import f32_bits, fp16_round, nearest_int

QK_K = 256
BLOCK_BYTES = 144

F0 = np.float32(0.0)
F1 = np.float32(1.0)
F32_ = np.float32(32.0)
F63 = np.float32(63.0)


@njit(cache=True, inline="always", error_model="numpy")
def make_qkx2_quants(x, o, n, nmax, w, L, lo, laux, rmin, rdelta, nstep):
    """ggml's make_qkx2_quants (use_mad = false), one sub-block at a time, written as the reference
    is: asymmetric (scale, min) fit of x[o:o+n] to 0..nmax, weighted squared error; quants into
    L[lo:lo+n]; returns (scale, -min). The quantizer uses subblock_fits;
    tests/unit/test_quant_kernels.py checks the two against each other sub-block by sub-block."""
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
def subblock_fits_scalar(x, o, nmax, rmin, rdelta, nstep, L, scales, mins):
    """quantize_row_q4_K_ref's sub-block loop as written there (weights av_x + |x|, then
    make_qkx2_quants per sub-block): the reference subblock_fits is tested against."""
    weights = np.zeros(32, dtype=np.float32)
    laux = np.zeros(32, dtype=np.int64)
    for j in range(8):
        b = o + 32 * j
        sum_x2 = F0
        for i in range(32):
            sum_x2 = np.float32(sum_x2 + np.float32(x[b + i] * x[b + i]))
        av_x = np.float32(np.sqrt(np.float32(sum_x2 / F32_)))
        for i in range(32):
            weights[i] = np.float32(av_x + abs(x[b + i]))
        sc, mi = make_qkx2_quants(x, b, 32, nmax, weights, L, 32 * j, laux, rmin, rdelta, nstep)
        scales[j] = sc
        mins[j] = mi


LANES = 16  # sub-blocks fitted together: the 8 of each of two super-blocks
F2_22 = np.float32(4194304.0)  # 2^22, the offset in nearest_int's mantissa
F_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


@njit(cache=True, inline="always", error_model="numpy")
def _quant(fval, nmax):
    """max(0, min(nmax, nearest_int(fval))) as a float32, exactly. nearest_int is
    (mantissa bits of fval + 1.5·2^23) − 2^22; clamping the mantissa to [2^22, 2^22 + nmax] first
    is the same clamp, and the result then fits a 32-bit int convert. Out-of-range, inf and NaN
    fvals get the reference's (garbage, then clamped) value too. From nearest_int's int64
    result LLVM widened every lane to 64 bits for the convert: 8 more instructions per 16 values."""
    m = np.int64(f32_bits(np.float32(fval + F_MAGIC))) & 0x007FFFFF
    m = max(0x00400000, min(0x00400000 + nmax, m))
    return np.float32(np.float32(m) - F2_22)


@njit(cache=True, inline="always", error_model="numpy")
def _lanes_step_sums(xt, wt, lt, isc, mn, nmax, sums):
    """One candidate iscale per lane (isc[j], quantizing against mn[j]): the quants into lt (as
    float32) and sum_l, sum_l2, sum_xl into sums[0..2, j], each accumulated over i = 0..31 in
    the reference's order. The lanes are the inner loop and independent, so LLVM vectorizes
    across them without reordering any lane's additions."""
    for j in range(LANES):
        sums[0, j] = F0
        sums[1, j] = F0
        sums[2, j] = F0
    for i in range(32):
        for j in range(LANES):
            xi = xt[i, j]
            l = _quant(np.float32(isc[j] * np.float32(xi - mn[j])), nmax)
            lt[i, j] = l
            wl = np.float32(wt[i, j] * l)
            sums[0, j] = np.float32(sums[0, j] + wl)
            sums[1, j] = np.float32(sums[1, j] + np.float32(wl * l))
            sums[2, j] = np.float32(sums[2, j] + np.float32(wl * xi))


@njit(cache=True, inline="always", error_model="numpy")
def _lanes_step_err(xt, wt, lt, tsc, tmn, err):
    """Per lane the weighted squared error of (tsc·lt + tmn) against xt, summed over i in order.
    Four rows per pass: with one, the lane loop's body is small enough that LLVM unrolls it
    fully before vectorizing, and the 16 unrolled chains stayed scalar (2x slower overall)."""
    for j in range(LANES):
        err[j] = F0
    for i in range(0, 32, 4):
        for j in range(LANES):
            e = err[j]
            d = np.float32(np.float32(np.float32(tsc[j] * lt[i, j]) + tmn[j]) - xt[i, j])
            e = np.float32(e + np.float32(wt[i, j] * np.float32(d * d)))
            d = np.float32(np.float32(np.float32(tsc[j] * lt[i + 1, j]) + tmn[j]) - xt[i + 1, j])
            e = np.float32(e + np.float32(wt[i + 1, j] * np.float32(d * d)))
            d = np.float32(np.float32(np.float32(tsc[j] * lt[i + 2, j]) + tmn[j]) - xt[i + 2, j])
            e = np.float32(e + np.float32(wt[i + 2, j] * np.float32(d * d)))
            d = np.float32(np.float32(np.float32(tsc[j] * lt[i + 3, j]) + tmn[j]) - xt[i + 3, j])
            err[j] = np.float32(e + np.float32(wt[i + 3, j] * np.float32(d * d)))


@njit(cache=True, inline="always", error_model="numpy")
def _minmax_row(xt, wt, i, j, sum_x, sum_w, mn, mx):
    xi = xt[i, j]
    mn[j] = xi if xi < mn[j] else mn[j]
    mx[j] = xi if xi > mx[j] else mx[j]
    sum_w[j] = np.float32(sum_w[j] + wt[i, j])
    sum_x[j] = np.float32(sum_x[j] + np.float32(wt[i, j] * xi))


@njit(cache=True, inline="always", error_model="numpy")
def subblock_fits(x, o0, o1, nmax, rmin, rdelta, nstep, L, scales, mins):
    """Fit the 8 sub-blocks of the super-block at x[o0:] and the 8 of the one at x[o1:] (o1 may
    equal o0): quants into L[0:256] and L[256:512], scales and -mins into scales/mins[0:8], [8:16].

    ggml's make_qkx2_quants (use_mad = false) for all 16 sub-blocks at once: lane j of the
    [32, 16] scratch arrays is sub-block j and every loop runs across the lanes (inner loop), so
    the 16 sub-blocks' float add chains are independent and LLVM vectorizes them, one AVX-512
    vector per row (with 8 lanes, one super-block, LLVM fully unrolled the lane loops and left
    them scalar). Each lane performs exactly the scalar reference's float32 operations in the
    same order, so the result is bit for bit the reference's (make_qkx2_quants above;
    tests/unit/test_quant_kernels.py checks the two against each other and llama.cpp). The
    scratch is on the stack (_common.stack_f32) so that LLVM can keep the sums in registers.
    Instead of copying the quants each time a candidate wins, a lane keeps the winning iscale
    and the min it was quantized against, and the quants are computed once at the end from
    those: the same float32 operations give the same quants. Lanes whose sub-block is constant
    (the reference returns early) and candidates with D <= 0 (the reference skips them) compute
    values that are then discarded."""
    # stack_f32 takes a literal size: 512 = 32 * LANES, 48 = 3 * LANES, 16 = LANES
    xt = carray(stack_f32(512), (32, LANES))  # x, lane j = sub-block j
    wt = carray(stack_f32(512), (32, LANES))  # weights av_x + |x|
    lt = carray(stack_f32(512), (32, LANES))  # a candidate's quants
    sums = carray(stack_f32(48), (3, LANES))  # sum_l, sum_l2, sum_xl
    sum_x = carray(stack_f32(16), (LANES,))  # first sum_x2, then the weighted sum_x
    sum_w = carray(stack_f32(16), (LANES,))
    mn = carray(stack_f32(16), (LANES,))  # the reference's min: moves when a candidate wins
    mx = carray(stack_f32(16), (LANES,))
    iscale = carray(stack_f32(16), (LANES,))  # first av_x, then the candidate's iscale
    scale = carray(stack_f32(16), (LANES,))
    best = carray(stack_f32(16), (LANES,))  # best_error
    cur = carray(stack_f32(16), (LANES,))  # cur_error
    tscale = carray(stack_f32(16), (LANES,))  # this_scale
    tmin = carray(stack_f32(16), (LANES,))  # this_min
    dpos = carray(stack_f32(16), (LANES,))  # D > 0
    live = carray(stack_f32(16), (LANES,))  # max != min: the reference does not return early
    win_isc = carray(stack_f32(16), (LANES,))  # the winner's iscale
    win_mn = carray(stack_f32(16), (LANES,))  # and the min it quantized against
    fn = np.float32(nmax)
    for j in range(LANES):
        sum_x[j] = F0
    d1 = o1 - o0 - QK_K
    for i in range(32):
        for j in range(LANES):
            xv = x[o0 + 32 * j + i + (d1 if j >= 8 else 0)]
            xt[i, j] = xv
            sum_x[j] = np.float32(sum_x[j] + np.float32(xv * xv))
    for j in range(LANES):
        iscale[j] = np.float32(np.sqrt(np.float32(sum_x[j] / F32_)))  # av_x
    for i in range(32):
        for j in range(LANES):
            wt[i, j] = np.float32(iscale[j] + abs(xt[i, j]))
    # min, max, sum_w, sum_x over rows 0..31 in order, in passes of 4 rows (as in _lanes_step_err)
    for j in range(LANES):
        mn[j] = xt[0, j]
        mx[j] = xt[0, j]
        sum_w[j] = wt[0, j]
        sum_x[j] = np.float32(wt[0, j] * xt[0, j])
        _minmax_row(xt, wt, 1, j, sum_x, sum_w, mn, mx)
        _minmax_row(xt, wt, 2, j, sum_x, sum_w, mn, mx)
        _minmax_row(xt, wt, 3, j, sum_x, sum_w, mn, mx)
    for i in range(4, 28, 4):
        for j in range(LANES):
            _minmax_row(xt, wt, i, j, sum_x, sum_w, mn, mx)
            _minmax_row(xt, wt, i + 1, j, sum_x, sum_w, mn, mx)
            _minmax_row(xt, wt, i + 2, j, sum_x, sum_w, mn, mx)
            _minmax_row(xt, wt, i + 3, j, sum_x, sum_w, mn, mx)
    for j in range(LANES):
        _minmax_row(xt, wt, 28, j, sum_x, sum_w, mn, mx)
        _minmax_row(xt, wt, 29, j, sum_x, sum_w, mn, mx)
        _minmax_row(xt, wt, 30, j, sum_x, sum_w, mn, mx)
        _minmax_row(xt, wt, 31, j, sum_x, sum_w, mn, mx)
        m = mn[j] if mn[j] < F0 else F0
        mn[j] = m
        live[j] = F1 if mx[j] != m else F0
        isc = np.float32(fn / np.float32(mx[j] - m))
        iscale[j] = isc
        scale[j] = np.float32(F1 / isc)
        best[j] = F0
        win_isc[j] = isc
        win_mn[j] = m
    for i in range(0, 32, 2):
        for j in range(LANES):
            # written out: the same code as a helper function ran 20% slower (not vectorized)
            xi = xt[i, j]
            l = _quant(np.float32(iscale[j] * np.float32(xi - mn[j])), nmax)
            diff = np.float32(np.float32(np.float32(scale[j] * l) + mn[j]) - xi)
            e = np.float32(best[j] + np.float32(wt[i, j] * np.float32(diff * diff)))
            xi = xt[i + 1, j]
            l = _quant(np.float32(iscale[j] * np.float32(xi - mn[j])), nmax)
            diff = np.float32(np.float32(np.float32(scale[j] * l) + mn[j]) - xi)
            best[j] = np.float32(e + np.float32(wt[i + 1, j] * np.float32(diff * diff)))
    if nstep >= 1:
        num = np.float32(np.float32(rmin + np.float32(rdelta * F0)) + fn)
        for j in range(LANES):
            iscale[j] = np.float32(num / np.float32(mx[j] - mn[j]))
        for step in range(nstep + 1):
            _lanes_step_sums(xt, wt, lt, iscale, mn, nmax, sums)
            for j in range(LANES):
                sw = sum_w[j]
                sx = sum_x[j]
                sl = sums[0, j]
                sl2 = sums[1, j]
                sxl = sums[2, j]
                D = np.float32(np.float32(sw * sl2) - np.float32(sl * sl))
                this_scale = np.float32(np.float32(np.float32(sw * sxl) - np.float32(sx * sl)) / D)
                this_min = np.float32(np.float32(np.float32(sl2 * sx) - np.float32(sl * sxl)) / D)
                clamp = this_min > F0
                tscale[j] = np.float32(sxl / sl2) if clamp else this_scale
                tmin[j] = F0 if clamp else this_min
                dpos[j] = F1 if D > F0 else F0
            _lanes_step_err(xt, wt, lt, tscale, tmin, cur)
            num = np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step + 1))) + fn)
            for j in range(LANES):
                if dpos[j] != F0 and live[j] != F0 and cur[j] < best[j]:
                    best[j] = cur[j]
                    scale[j] = tscale[j]
                    win_isc[j] = iscale[j]
                    win_mn[j] = mn[j]
                    mn[j] = tmin[j]
                # the next step's iscale, from the min as it now stands (the reference's order);
                # here rather than in a loop of its own, which LLVM unrolled into 16 scalar divisions
                iscale[j] = np.float32(num / np.float32(mx[j] - mn[j]))
    for j in range(LANES):
        b = o0 + 32 * j + (d1 if j >= 8 else 0)
        if live[j] != F0:
            isc = win_isc[j]
            qmn = win_mn[j]
            for i in range(32):
                L[32 * j + i] = max(0, min(nmax, nearest_int(np.float32(isc * np.float32(x[b + i] - qmn)))))
            scales[j] = scale[j]
        else:
            for i in range(32):
                L[32 * j + i] = 0
            scales[j] = F0
        mins[j] = np.float32(-mn[j])


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
    """A row's buffers for fit_blocks: (L, scales, mins) of two super-blocks."""
    return (np.zeros(2 * QK_K, dtype=np.int64), np.zeros(LANES, dtype=np.float32),
            np.zeros(LANES, dtype=np.float32))


@njit(cache=True, inline="always", error_model="numpy")
def fit_blocks(x, o0, o1, out, p0, p1, nmax, rmin, rdelta, nstep, work):
    """Fit the super-blocks at x[o0:] and x[o1:] (Q4_K and Q5_K alike; o1 == o0, p1 == p0 fits
    one): fp16 d, dmin and the 6-bit scales go to out[p:p+16]; returns L, the quants re-fitted to
    those rounded factors, the first block's in L[0:256], the second's in L[256:512]."""
    L, scales, mins = work
    subblock_fits(x, o0, o1, nmax, rmin, rdelta, nstep, L, scales, mins)
    for k in range(2):
        o = o0 if k == 0 else o1
        p = p0 if k == 0 else p1
        max_scale = F0
        max_min = F0
        for j in range(8 * k, 8 * k + 8):
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        pack_scales(scales[8 * k:], mins[8 * k:], max_scale, max_min, out, p + 4)
        store_fp16(out, p, np.float32(max_scale / F63))
        store_fp16(out, p + 2, np.float32(max_min / F63))
        d = fp16_round(np.float32(max_scale / F63))
        dmin = fp16_round(np.float32(max_min / F63))
        requantize(x, o, nmax, d, dmin, out, p + 4, L[QK_K * k:])
    return L


@njit(cache=True, inline="always", error_model="numpy")
def _block(L, out, q):
    """The 4-bit quants L[0:256] into out[q:q+128]."""
    for j in range(0, QK_K, 64):
        for l in range(32):
            out[q + l] = L[j + l] | (L[j + l + 32] << 4)
        q += 32


@njit(cache=True, parallel=True, error_model="numpy")
def _q4_k_rows(x, out):
    nb = x.shape[1] // QK_K
    for r in prange(x.shape[0]):
        work = k_scratch()
        xr = x[r]
        orow = out[r]
        for i in range(0, nb, 2):
            # two super-blocks per fit (the last one twice when nb is odd: same bytes, written twice)
            i1 = i + 1 if i + 1 < nb else i
            L = fit_blocks(xr, i * QK_K, i1 * QK_K, orow, i * BLOCK_BYTES, i1 * BLOCK_BYTES,
                           15, np.float32(-1.0), np.float32(0.1), 20, work)
            _block(L, orow, i * BLOCK_BYTES + 16)
            _block(L[QK_K:], orow, i1 * BLOCK_BYTES + 16)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/256*144]."""
    return quantize_rows(_q4_k_rows, x, QK_K, BLOCK_BYTES)
