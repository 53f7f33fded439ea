"""The 27B prefill's gate + up as one fp16-output GEMM (LUCEBOX_PREFILL_GU=merged16) on the GPU.

lb_gemm_q_cublas_x16_h over two matrices back to back (one tensor of 2·ffn rows: Q4_K, Q5_K, tiled Q4_K) against
what it replaces, lb_gemm_q_cublas_x16 (fp32 Y) on each half alone, rounded to fp16: equal up to one fp16 ulp
(cuBLAS's fp16 epilogue rounds its own fp32 accumulator; the fp32-output GEMM may pick another kernel and sum in
another order), odd sizes (t = 257, ffn = 1008 rows a half: not a multiple of 128), a scratch holding the whole
tensor and one forcing 128-row chunks (the last partial), the output NaN-poisoned with guard values after it
checked untouched. accumulate = 1 and a misaligned y16 are refused.

lb_df_swiglu_f16_rows against lb_df_swiglu_f16 on the same values (the fp16 gate / up taken to fp32): bit-exact,
t = 257, ffn = 1000 (the vector path), 1001 and a misaligned input (the scalar path), 17408 (the 27B's), NaN-poisoned
output plus guards.

The engine: a tiny GGUF's prefill logits with merged16 against split (rel RMS < 1e-3) and against the CPU engine
(as test_dflash_engine.py's cuBLAS case), both Q4_K layouts, scratch NaN-poisoned.
Skipped where the library has no cuBLAS loaded (the SwiGLU tests run anyway).
"""

from __future__ import annotations

import numpy as np

from gpu_lib import pytest

from lucebox_cli.engines import _lib
from test_quant_gemv import ALL_QTYPES, Dev, case, lib

pytestmark = pytest.mark.gpu

GUARD = 8  # poisoned fp16 values after each output, checked untouched
NAN16 = 0xFFFF


def needs_cublas():
    if not _lib.cublas_ready(lib()):
        pytest.skip("cuBLAS not loaded (lb_blas_ready() == 0: no libcublas found, or LUCEBOX_CUBLAS=off)")


def al(n: int) -> int:
    return (n + 255) // 256 * 256


def within_one_ulp(got: np.ndarray, want: np.ndarray, scale: float) -> np.ndarray:
    """Per value: got (fp16) is want (fp16) or one of its fp16 neighbours, or within 1e-5·scale of it. The floor is for
    results near zero, where two fp32 summation orders (~1e-7 of the terms' size, and the terms are ~scale) already
    differ by more than the fp16 ulp there; it is far below one ulp of a typical value."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    ulp = np.spacing(np.abs(want)).astype(np.float64)
    return (g == w) | (np.abs(g - w) <= np.maximum(ulp * 1.0001, 1e-5 * scale))


@pytest.mark.parametrize("qt", ["Q4_K", "Q5_K", "Q4_K_T"])
@pytest.mark.parametrize("t,k", [(257, 1280), (65, 5120)], ids=["t257-K1280", "t65-K5120"])
@pytest.mark.parametrize("chunk", ["whole", "128"])
def test_gemm_x16_h_is_the_split_fp32_gemms_rounded(qt, t, k, chunk):
    needs_cublas()
    ffn = 1008  # a multiple of 16 (the tiled layout's tiles) but not of 128: the chunks' last one is partial
    w, _ = case(qt, 2 * ffn, k)  # one tensor of 2·ffn rows = gate then up back to back, as in the arena
    half = lib().fn.lb_quant_bytes(ALL_QTYPES[qt], ffn, k)  # where "up" starts
    assert half * 2 == lib().fn.lb_quant_bytes(ALL_QTYPES[qt], 2 * ffn, k)
    rng = np.random.default_rng(t * 7 + k)
    x16 = rng.standard_normal((t, k)).astype(np.float16)
    wbytes = 2 * (2 * ffn) * k if chunk == "whole" else 2 * 128 * k + 100  # not a whole row more: 128-row chunks
    xd, sd = Dev.of(x16), Dev(al(wbytes))
    yh = Dev(2 * (t * 2 * ffn + GUARD))
    y32 = Dev(4 * t * ffn)
    try:
        lib().call("lb_dev_memset", yh.ptr, 0xFF, yh.nbytes)
        lib().call("lb_dev_memset", sd.ptr, 0xFF, sd.nbytes)
        lib().call("lb_gemm_q_cublas_x16_h", ALL_QTYPES[qt], w.ptr, 2 * ffn, k, xd.ptr, t, yh.ptr, 0, sd.ptr, wbytes,
                   None)
        got = yh.get(np.uint16, t * 2 * ffn + GUARD)
        assert (got[t * 2 * ffn:] == NAN16).all(), "wrote past y16"
        got = got[: t * 2 * ffn].view(np.float16).reshape(t, 2 * ffn)
        assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} NaN / inf outputs"
        halves = []
        for h in range(2):  # the split path: each matrix alone, fp32 Y
            lib().call("lb_dev_memset", y32.ptr, 0xFF, y32.nbytes)
            lib().call("lb_gemm_q_cublas_x16", ALL_QTYPES[qt], w.ptr.value + h * half, ffn, k, xd.ptr, t, y32.ptr, 0,
                       sd.ptr, wbytes, None)
            halves.append(y32.get(np.float32, t * ffn).reshape(t, ffn))
        want32 = np.concatenate(halves, axis=1)
        want = want32.astype(np.float16)
    finally:
        for d in (xd, sd, yh, y32):
            d.close()
    scale = float(np.sqrt(np.mean(want32.astype(np.float64) ** 2)))
    assert scale < 1e3, "test inputs should keep the outputs well inside fp16's range"
    # t >= 256 is every width the engine's cuBLAS passes run (CUBLAS_MIN_ROWS): one ulp (or 1e-5·scale near zero).
    # Narrower, the H100's cuBLAS 13 picks a split-K kernel for the fp16-output GEMM whose partial sums are rounded to
    # fp16 (t = 65, K = 5120: 2 of 131k outputs ~2.6e-5·scale off the fp32 GEMM rounded, session 15; the H200 picks
    # none there), so the floor is 1e-4·scale: still far below what a wrong row, column or offset gives (~scale).
    ok = within_one_ulp(got, want, scale if t >= 256 else 10 * scale)
    bad = np.argwhere(~ok)
    assert not bad.size, (f"{qt} t={t} K={k} chunk={chunk}: {len(bad)} values beyond one fp16 ulp, first at "
                          f"{bad[0]}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}")
    # almost all identical: the two GEMMs differ only in summation order
    assert np.mean(got.view(np.uint16) == want.view(np.uint16)) > 0.95


def test_gemm_x16_h_checks_its_arguments():
    k = 256 * 5
    w, _ = case("Q4_K", 256, k)
    d = Dev(4 * 65 * k)
    try:
        st = lib().fn.lb_gemm_q_cublas_x16_h(ALL_QTYPES["Q4_K"], w.ptr, 256, k, d.ptr, 65, d.ptr, 1, d.ptr, 4 * k, None)
        assert st == _lib.LB_ERR_INVALID_ARG and "accumulate" in lib().last_error()
        st = lib().fn.lb_gemm_q_cublas_x16_h(ALL_QTYPES["Q4_K"], w.ptr, 256, k, d.ptr, 65, d.ptr.value + 2, 0, d.ptr,
                                             4 * k, None)
        assert st == _lib.LB_ERR_INVALID_ARG
        st = lib().fn.lb_gemm_q_cublas_x16_h(ALL_QTYPES["Q4_K"], w.ptr, 256, k, d.ptr, 65, d.ptr, 0, d.ptr, 2 * k - 2,
                                             None)
        assert st == _lib.LB_ERR_INVALID_ARG and "scratch" in lib().last_error()
    finally:
        d.close()


@pytest.mark.parametrize("ffn,offset", [(1000, 0), (1001, 0), (1000, 2), (17408, 0)],
                         ids=["ffn1000-vec", "ffn1001", "ffn1000-unaligned", "ffn17408"])
def test_swiglu_rows_bit_exact(ffn, offset):
    t = 257
    rng = np.random.default_rng(ffn + offset)
    # gate / up at the scale of the 27B's FFN activations, plus some large and tiny values and exact zeros
    gu = (rng.standard_normal((t, 2 * ffn)) * 3).astype(np.float16)
    gu[0, :8] = [0, -0.0, 60000, -60000, 1e-7, -1e-7, 11.5, -11.5]
    g32 = np.ascontiguousarray(gu[:, :ffn].astype(np.float32))
    u32 = np.ascontiguousarray(gu[:, ffn:].astype(np.float32))
    gd = Dev(gu.nbytes + 16)
    gd_ptr = gd.ptr.value + offset
    lib().call("lb_dev_h2d", gd_ptr, gu.ctypes.data, gu.nbytes)
    g_d, u_d = Dev.of(g32), Dev.of(u32)
    outs = []
    try:
        for form in ("rows", "split"):
            y = Dev(2 * (t * ffn + GUARD) + 16)
            try:
                lib().call("lb_dev_memset", y.ptr, 0xFF, y.nbytes)
                if form == "rows":
                    yp = y.ptr.value + offset
                    lib().call("lb_df_swiglu_f16_rows", gd_ptr, yp, t, ffn, None)
                else:
                    yp = y.ptr.value
                    lib().call("lb_df_swiglu_f16", g_d.ptr, u_d.ptr, yp, t * ffn, None)
                lib().call("lb_dev_sync")
                out = np.empty(t * ffn + GUARD, np.uint16)
                lib().call("lb_dev_d2h", out.ctypes.data, yp, out.nbytes)
            finally:
                y.close()
            assert (out[t * ffn:] == NAN16).all(), f"{form}: wrote past y16"
            outs.append(out[: t * ffn])
    finally:
        for d in (gd, g_d, u_d):
            d.close()
    rows, split = outs
    bad = np.flatnonzero(rows != split)
    assert not bad.size, f"ffn={ffn} offset={offset}: {len(bad)} values differ, first at {bad[0]}"


@pytest.mark.parametrize("tile", ["0", "1"], ids=["gguf-q4k", "tiled-q4k"])
def test_engine_prefill_merged16_vs_split(tile, monkeypatch):
    """A 300-token prompt in 256-row passes on cuBLAS: merged16's logits against split's (rel RMS < 1e-3: gate and
    up rounded to fp16 before the SwiGLU) and against the CPU engine (test_dflash_engine.py's TOL)."""
    from test_dflash_engine import TOL, VOCAB, cpu_weights, gguf, rel

    from lucebox_cli.engines.cpu import CPUEngine
    from lucebox_cli.engines.dflash import DFlashTargetEngine

    needs_cublas()
    monkeypatch.setenv("LUCEBOX_PREFILL_GEMM", "cublas")
    monkeypatch.setenv("LUCEBOX_Q4K_TILE", tile)
    ids = np.random.default_rng(11).integers(0, VOCAB, 300)
    out = {}
    for mode in ("split", "merged16"):
        monkeypatch.setenv("LUCEBOX_PREFILL_GU", mode)
        gpu = DFlashTargetEngine(gguf(4), max_context=512, budget=22, lib=lib(), prefill_rows=256)
        try:
            assert gpu.info["prefill_gu"] == mode and gpu.info["prefill_gemm"] == "cublas"
            if mode == "merged16":
                L = gpu._layers
                assert all(L._gu_merged((f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"))
                           for i in range(L.cfg.n_layers)), "gate / up not one tensor: merged16 would not run"
            gpu.poison()
            out[mode] = gpu.prefill(ids)
        finally:
            gpu.close()
    cfg, weights = cpu_weights(4)
    lc = CPUEngine(cfg, weights, max_context=512).prefill(ids)
    err = rel(out["merged16"], out["split"])
    assert err < 1e-3, f"merged16 vs split: rel RMS {err:.3g}"
    assert rel(out["merged16"], lc) < TOL


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]) if hasattr(pytest, "main") else 0)
