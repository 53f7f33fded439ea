"""Resident fp16 prefill weights on the GPU: lb_gemm_q_cublas* with qtype LB_QT_F16, and the engine's f16 mode.

The C entry points given W as fp16 rows (lb_dequant_f16's output kept) against the same call given the quantized
bytes with a scratch that holds the whole matrix (one dequantization, one GEMM of the same shape): the same fp16
operands, so equal up to cuBLAS's choice of kernel (asserted within 1e-6 relative; in practice bit for bit), for the
fp32-x form, the fp16-x form with accumulate 0 (NaN-poisoned y) and 1, and the fp16-output form (one fp16 ulp); odd
sizes (rows 304 / 1008, t = 257 / 65); a misaligned or non-256-multiple K is refused before any work.

The engine: a tiny GGUF's 300-token prefill in 256-row cuBLAS passes with prefill_weights="f16" against "q" (rel
RMS < 1e-3, as merged16 against split: the same fp16 weights, kernels cuBLAS may pick differently), the greedy tokens
after it identical, against the CPU engine (test_dflash_engine.py's TOL), scratch NaN-poisoned.
Skipped where the library has no cuBLAS loaded.
"""

from __future__ import annotations

import numpy as np

from gpu_lib import pytest

from test_gate_up_f16 import al, needs_cublas
from test_quant_gemv import ALL_QTYPES, Dev, case, fit_rows, lib

pytestmark = pytest.mark.gpu

F16 = 1  # LB_QT_F16
NAN16 = 0xFFFF


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b**2)), 1e-30))


@pytest.mark.parametrize("qt", ["Q4_K", "Q4_K_T", "Q6_K_T", "Q8_0"])
@pytest.mark.parametrize("rows,k,t", [(304, 1280, 257), (1008, 5120, 65)], ids=["r304-K1280-t257", "r1008-K5120-t65"])
def test_f16_weights_equal_the_dequantizing_call(qt, rows, k, t):
    needs_cublas()
    rows = fit_rows(qt, rows)
    w, _ = case(qt, rows, k)
    q = ALL_QTYPES[qt]
    rng = np.random.default_rng(rows + k + t)
    x = rng.standard_normal((t, k)).astype(np.float32)
    x16 = x.astype(np.float16)
    xd, x16d = Dev.of(x), Dev.of(x16)
    w16 = Dev(2 * rows * k)
    scratch_bytes = al(2 * t * k) + al(2 * rows * k)  # x16 + the whole matrix: one dequantization, one GEMM
    sd = Dev(scratch_bytes)
    y = Dev(4 * t * rows)
    yh = Dev(2 * t * rows)
    y0 = (rng.standard_normal((t, rows)) * 0.1).astype(np.float32)
    try:
        lib().call("lb_dev_memset", w16.ptr, 0xFF, w16.nbytes)
        lib().call("lb_dequant_f16", q, w.ptr, rows, k, 0, rows, w16.ptr, None)

        def run(form: str, qtype: int, wp, acc: int) -> np.ndarray:
            if form == "x16_h":
                lib().call("lb_dev_memset", yh.ptr, 0xFF, yh.nbytes)
                lib().call("lb_gemm_q_cublas_x16_h", qtype, wp, rows, k, x16d.ptr, t, yh.ptr, 0, sd.ptr,
                           scratch_bytes, None)
                return yh.get(np.float16, t * rows).astype(np.float32)
            if acc:
                lib().call("lb_dev_h2d", y.ptr, y0.ctypes.data, y0.nbytes)
            else:
                lib().call("lb_dev_memset", y.ptr, 0xFF, y.nbytes)
            if form == "f32":
                lib().call("lb_gemm_q_cublas", qtype, wp, rows, k, xd.ptr, t, y.ptr, acc, sd.ptr, scratch_bytes, None)
            else:
                lib().call("lb_gemm_q_cublas_x16", qtype, wp, rows, k, x16d.ptr, t, y.ptr, acc, sd.ptr,
                           scratch_bytes - al(2 * t * k), None)
            return y.get(np.float32, t * rows)

        for form, acc in (("f32", 0), ("f32", 1), ("x16", 0), ("x16", 1), ("x16_h", 0)):
            want = run(form, q, w.ptr, acc)
            got = run(form, F16, w16.ptr, acc)
            assert np.isfinite(got).all(), f"{form} acc={acc}: NaN / inf outputs"
            if form == "x16_h":  # fp16 outputs: at most one ulp apart
                ulp = np.spacing(np.abs(want.astype(np.float16))).astype(np.float32)
                assert (np.abs(got - want) <= ulp * 1.0001).all(), f"{qt} {form}: more than one fp16 ulp apart"
            else:
                err = rel(got, want)
                assert err < 1e-6, f"{qt} {form} acc={acc}: rel RMS {err:.3g} against the dequantizing call"
    finally:
        for d in (w, xd, x16d, w16, sd, y, yh):
            d.close()


def test_f16_weights_refusals():
    needs_cublas()
    k, t, rows = 512, 4, 32
    w16, x16, y, sd = Dev(2 * rows * k + 64), Dev(2 * t * k), Dev(4 * t * rows), Dev(al(2 * t * k) + 2 * k)
    try:
        base = w16.ptr.value
        for wp, kk, what in ((base + 8, k, "16-byte aligned"), (base, 384, "multiple of 256")):
            st = lib().fn.lb_gemm_q_cublas_x16(F16, wp, rows, kk, x16.ptr, t, y.ptr, 0, sd.ptr, sd.nbytes, None)
            assert st != 0 and what in lib().last_error(), (what, lib().last_error())
        # lb_dequant_f16 itself does not take F16 (nothing to dequantize)
        assert lib().fn.lb_dequant_f16(F16, base, rows, k, 0, rows, base, None) != 0
    finally:
        for d in (w16, x16, y, sd):
            d.close()


def test_engine_prefill_f16_weights_vs_q(monkeypatch):
    """A 300-token prompt in 256-row cuBLAS passes: f16 against q (twice, fresh engines), then 8 greedy steps each.
    The same fp16 weights, but cuBLAS need not pick the same kernels for a GEMM whose A sits elsewhere (H100, session
    15: f16 vs q 4.3e-4 relative RMS of the logits, the scale of merged16 vs split), so the bound is test_gate_up_f16's
    engine bound (1e-3); the two q runs' difference is reported as a warning beside it."""
    import warnings

    from test_dflash_engine import TOL, VOCAB, cpu_weights, gguf

    from lucebox_cli.engines.cpu import CPUEngine
    from lucebox_cli.engines.dflash import DFlashTargetEngine

    needs_cublas()
    monkeypatch.setenv("LUCEBOX_PREFILL_GEMM", "cublas")
    monkeypatch.delenv("LUCEBOX_PREFILL_WEIGHTS", raising=False)
    ids = np.random.default_rng(17).integers(0, VOCAB, 300)
    logits, tokens = [], []
    for mode in ("q", "q", "f16"):
        gpu = DFlashTargetEngine(gguf(4), max_context=512, budget=22, lib=lib(), prefill_rows=256,
                                 prefill_weights=mode)
        try:
            assert gpu.info["prefill_weights"] == mode and gpu.info["prefill_gemm"] == "cublas"
            assert (gpu.plan.bytes_of("prefill f16 weights") > 0) == (mode == "f16")
            gpu.poison()
            logits.append(gpu.prefill(ids))
            tokens.append(list(gpu.greedy_tokens(int(np.argmax(logits[-1])), 8)))
        finally:
            gpu.close()
    qq, fq = rel(logits[1], logits[0]), rel(logits[2], logits[0])
    warnings.warn(f"prefill logits: q vs q rel RMS {qq:.3g}, f16 vs q {fq:.3g}")
    assert fq < 1e-3, f"f16 vs q: rel RMS {fq:.3g} (q vs q {qq:.3g})"
    assert tokens[2] == tokens[0] == tokens[1]
    cfg, weights = cpu_weights(4)
    assert rel(logits[2], CPUEngine(cfg, weights, max_context=512).prefill(ids)) < TOL


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]) if hasattr(pytest, "main") else 0)
