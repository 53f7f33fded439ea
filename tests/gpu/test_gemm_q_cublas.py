"""fp16 dequantization (lb_dequant_f16) and the cuBLAS quantized GEMM (lb_gemm_q_cublas) on the GPU.

lb_dequant_f16 against the gguf package's dequantization (what the CPU engine uses) rounded to fp16: bit for bit,
every type, row ranges that start past row 0 and have odd lengths (the Q6_K / Q8_0 trailing d arrays are indexed
by the whole tensor's rows), K = 256 .. 5120, the output NaN-poisoned first (and its guard rows checked untouched).

lb_f32_to_f16 + lb_gemm_q_cublas_x16 (one conversion shared by several matrices) bit-identical to lb_gemm_q_cublas.

lb_gemm_q_cublas against the float64 reference of test_quant_gemv.py and against lb_gemm_q_smalln: odd sizes
(rows 301 and 4099, n = 1, 65, 300), accumulate 0 (NaN-poisoned y) and 1, a scratch that holds the whole matrix
and one that forces several row chunks. Skipped, with the reason, where the library has no cuBLAS loaded
(lb_blas_ready() == 0: no libcublas found, or LUCEBOX_CUBLAS=off).
"""

from __future__ import annotations

import ctypes

import numpy as np

from gpu_lib import pytest

from lucebox_cli.engines import _lib
from test_quant_gemv import ALL_QTYPES, QTYPES, Dev, case, fit_rows, gguf_type, lib, random_gguf_bytes, rel_rms

pytestmark = pytest.mark.gpu

# fp16 weights and activations into fp32 accumulation, as the small-N kernel (test_quant_gemv.py's TOL)
TOL = 1e-3
GUARD = 8  # poisoned fp16 values after the output, checked untouched


def dequant_ref(qt: str, rows: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes [rows, row_bytes], float16 [rows, k] reference: gguf's float32 rounded to nearest)."""
    import gguf

    raw = random_gguf_bytes(qt, rows, k, seed)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[gguf_type(qt)]).reshape(rows, k)
    return raw, np.asarray(ref, np.float32).astype(np.float16)


def device_weights(qt: str, raw: np.ndarray, rows: int, k: int) -> Dev:
    src, dst = Dev.of(raw), Dev(raw.nbytes)
    try:
        lib().call("lb_quant_repack", ALL_QTYPES[qt], src.ptr, dst.ptr, rows, k, None)
        lib().call("lb_dev_sync")
    finally:
        src.close()
    return dst


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
# The last two ranges are whole 16-row tiles: the tiled Q4_K's / Q6_K's dequantization then walks the stored order.
@pytest.mark.parametrize("rows,k,row0,n", [(37, 256, 0, 37), (37, 256, 5, 31), (41, 1280, 13, 27), (9, 5120, 3, 5),
                                           (300, 2304, 101, 199), (64, 1280, 16, 32), (304, 2304, 0, 304)],
                         ids=["all-K256", "r5+31-K256", "r13+27-K1280", "r3+5-K5120", "r101+199-K2304",
                              "r16+32-K1280", "all-K2304"])
def test_dequant_f16_bit_exact(qt, rows, k, row0, n):
    rows = fit_rows(qt, rows)  # the tiled Q4_K: whole 16-row tiles (37 -> 48, 300 -> 304), the same row ranges
    raw, ref = dequant_ref(qt, rows, k, seed=rows * 31 + k + row0)
    w = device_weights(qt, raw, rows, k)
    out = Dev(2 * (n * k + GUARD))
    try:
        lib().call("lb_dev_memset", out.ptr, 0xFF, out.nbytes)  # NaN everywhere
        lib().call("lb_dequant_f16", ALL_QTYPES[qt], w.ptr, rows, k, row0, n, out.ptr, None)
        got = out.get(np.uint16, n * k + GUARD)
    finally:
        w.close()
        out.close()
    assert (got[n * k:] == 0xFFFF).all(), "wrote past the rows asked for"
    got = got[: n * k].reshape(n, k)
    want = ref[row0 : row0 + n].view(np.uint16)
    bad = np.argwhere(got != want)
    assert not bad.size, f"{qt} rows {row0}..{row0 + n} of {rows}, K {k}: {len(bad)} values differ, first at {bad[0]}"


def test_dequant_f16_refuses_bad_ranges():
    w = Dev(lib().fn.lb_quant_bytes(QTYPES["Q4_K"], 8, 256))
    out = Dev(2 * 8 * 256)
    try:
        for row0, n in ((-1, 2), (0, 0), (7, 2)):
            st = lib().fn.lb_dequant_f16(QTYPES["Q4_K"], w.ptr, 8, 256, row0, n, out.ptr, None)
            assert st == 1, (row0, n)
        assert lib().fn.lb_dequant_f16(QTYPES["Q4_K"], w.ptr, 8, 300, 0, 1, out.ptr, None) == 1  # K % 256
        assert lib().fn.lb_dequant_f16(99, w.ptr, 8, 256, 0, 1, out.ptr, None) == 6
        assert lib().fn.lb_dequant_f16(268, w.ptr, 8, 256, 0, 1, out.ptr, None) == 1  # tiled: 16-row tiles
        assert lib().fn.lb_dequant_f16(270, w.ptr, 8, 256, 0, 1, out.ptr, None) == 1  # tiled Q6_K likewise
    finally:
        w.close()
        out.close()


def needs_cublas():
    if not _lib.cublas_ready(lib()):  # loads a libcublas first (engines/cublas.py)
        pytest.skip("cuBLAS not loaded (lb_blas_ready() == 0: no libcublas found, or LUCEBOX_CUBLAS=off)")


def run_cublas(qt: str, rows: int, k: int, n: int, accumulate: int, chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(y from lb_gemm_q_cublas, y from lb_gemm_q_smalln 64 columns at a time), both [n, rows] float64."""
    w, _ = case(qt, rows, k)
    rng = np.random.default_rng(3000 + n)
    x = rng.standard_normal((n, k)).astype(np.float32)
    y0 = rng.standard_normal((n, rows)).astype(np.float32)
    scratch_bytes = lib().fn.lb_gemm_q_cublas_scratch_bytes(n, k, chunk_rows)
    assert scratch_bytes == (2 * n * k + 255) // 256 * 256 + (2 * chunk_rows * k + 255) // 256 * 256
    xd, sd = Dev.of(x), Dev(scratch_bytes)
    outs = []
    try:
        for op in ("cublas", "smalln"):
            yd = Dev.of(y0) if accumulate else Dev(4 * n * rows)
            try:
                if not accumulate:
                    lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)
                lib().call("lb_dev_memset", sd.ptr, 0xFF, sd.nbytes)  # the scratch holds nothing between calls
                if op == "cublas":
                    lib().call("lb_gemm_q_cublas", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, accumulate, sd.ptr,
                               scratch_bytes, None)
                else:
                    for c0 in range(0, n, 64):
                        m = min(64, n - c0)
                        fn = "lb_gemv_q" if m == 1 else "lb_gemm_q_smalln"
                        args = (xd.ptr.value + 4 * c0 * k, yd.ptr.value + 4 * c0 * rows)
                        if m == 1:
                            lib().call(fn, ALL_QTYPES[qt], w.ptr, rows, k, *args, accumulate, None)
                        else:
                            lib().call(fn, ALL_QTYPES[qt], w.ptr, rows, k, args[0], m, args[1], accumulate, None)
                got = yd.get(np.float32, n * rows).reshape(n, rows).astype(np.float64)
            finally:
                yd.close()
            assert np.isfinite(got).all(), f"{op} {qt} {rows}x{k} n={n}: {int((~np.isfinite(got)).sum())} NaN outputs"
            outs.append(got - y0 if accumulate else got)
    finally:
        xd.close()
        sd.close()
    return outs[0], outs[1]


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("rows,k", [(301, 256 * 7), (4099, 256 * 16)], ids=["N301-K1792", "N4099-K4096"])
@pytest.mark.parametrize("n", [1, 65, 300])
@pytest.mark.parametrize("accumulate", [0, 1])
def test_gemm_q_cublas(qt, rows, k, n, accumulate):
    needs_cublas()
    rows = fit_rows(qt, rows)
    _, ref = case(qt, rows, k)
    rng = np.random.default_rng(3000 + n)
    want = rng.standard_normal((n, k)).astype(np.float32).astype(np.float64) @ ref.T
    # the whole matrix in one chunk, then chunks of 128 rows (the last one partial)
    for chunk in (rows, 128):
        got, smalln = run_cublas(qt, rows, k, n, accumulate, chunk)
        err = rel_rms(got, want)
        assert err < TOL, f"{qt} {rows}x{k} n={n} acc={accumulate} chunk={chunk}: rel RMS {err:.3g} vs float64"
        assert rel_rms(got, smalln) < 2 * TOL, f"{qt} {rows}x{k} n={n}: cuBLAS and small-N differ"


@pytest.mark.parametrize("qt", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("n", [1, 65, 300])
@pytest.mark.parametrize("accumulate", [0, 1])
def test_gemm_q_cublas_x16_equals_the_one_call_form(qt, n, accumulate):
    """lb_f32_to_f16 + lb_gemm_q_cublas_x16 (the engine's grouped projections: one conversion, several matrices) is
    the same computation as lb_gemm_q_cublas: bit-identical y, over several row chunks, accumulate 0 onto NaN / 1;
    the fp16 x equals numpy's round-to-nearest conversion bit for bit."""
    needs_cublas()
    rows, k = fit_rows(qt, 4099), 256 * 16
    w, _ = case(qt, rows, k)
    rng = np.random.default_rng(4000 + n)
    x = rng.standard_normal((n, k)).astype(np.float32)
    y0 = rng.standard_normal((n, rows)).astype(np.float32)
    full = lib().fn.lb_gemm_q_cublas_scratch_bytes(n, k, 128)
    xb = (2 * n * k + 255) // 256 * 256
    xd, sd, wd = Dev.of(x), Dev(full), Dev(full - xb)
    outs = []
    try:
        for form in ("one call", "x16"):
            yd = Dev.of(y0) if accumulate else Dev(4 * n * rows)
            try:
                if not accumulate:
                    lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)
                lib().call("lb_dev_memset", sd.ptr, 0xFF, sd.nbytes)
                if form == "one call":
                    lib().call("lb_gemm_q_cublas", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, accumulate,
                               sd.ptr, full, None)
                else:
                    lib().call("lb_f32_to_f16", xd.ptr, n * k, sd.ptr, None)
                    lib().call("lb_dev_sync")
                    x16 = sd.get(np.float16, n * k).reshape(n, k)
                    assert np.array_equal(x16.view(np.uint16), x.astype(np.float16).view(np.uint16))
                    lib().call("lb_dev_memset", wd.ptr, 0xFF, wd.nbytes)
                    lib().call("lb_gemm_q_cublas_x16", ALL_QTYPES[qt], w.ptr, rows, k, sd.ptr, n, yd.ptr, accumulate,
                               wd.ptr, full - xb, None)
                outs.append(yd.get(np.float32, n * rows))
            finally:
                yd.close()
    finally:
        for d in (xd, sd, wd):
            d.close()
    assert np.isfinite(outs[1]).all(), f"{qt} n={n}: NaN outputs from the x16 form"
    assert np.array_equal(outs[0], outs[1]), f"{qt} n={n} acc={accumulate}: the x16 form differs"


def test_gemm_q_cublas_x16_checks_its_arguments():
    k = 256 * 7
    d = Dev(4 * 65 * k)
    try:
        assert lib().fn.lb_f32_to_f16(d.ptr, 12, d.ptr, None) == _lib.LB_ERR_INVALID_ARG  # not a multiple of 8
        assert lib().fn.lb_f32_to_f16(d.ptr.value + 4, 16, d.ptr, None) == _lib.LB_ERR_INVALID_ARG  # misaligned
        w, _ = case("Q4_K", 301, k)
        st = lib().fn.lb_gemm_q_cublas_x16(QTYPES["Q4_K"], w.ptr, 301, k, d.ptr, 65, d.ptr, 0, d.ptr, 2 * k - 2, None)
        assert st == _lib.LB_ERR_INVALID_ARG and "scratch" in lib().last_error()
    finally:
        d.close()


def test_gemm_q_cublas_reports_a_small_scratch():
    needs_cublas()
    w, _ = case("Q4_K", 301, 256 * 7)
    n, k = 65, 256 * 7
    small = lib().fn.lb_gemm_q_cublas_scratch_bytes(n, k, 1) - 256
    xd, yd, sd = Dev(4 * n * k), Dev(4 * n * 301), Dev(small)
    try:
        st = lib().fn.lb_gemm_q_cublas(QTYPES["Q4_K"], w.ptr, 301, k, xd.ptr, n, yd.ptr, 0, sd.ptr, small, None)
        assert st == 1 and "scratch" in lib().last_error()
    finally:
        for d in (xd, yd, sd):
            d.close()


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]) if hasattr(pytest, "main") else 0)
