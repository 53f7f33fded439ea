"""lb_gdn_decode_step_out: a decode DeltaNet layer's mixer and its out-projection (ssm_out, tiled Q4_K) in one kernel
(cuda/common/gdn_out_tail.cuh), against the two calls it replaces, lb_gdn_decode_step then lb_gemv_q, and against
the float64 product of the dequantized W_out with the y the library wrote.

Consecutive steps on one layer (state and conv state carried on the device), y NaN-poisoned before every call, the
residual `out` preset to random values (the call adds into it): y, state and conv state must equal the two-call
path's (the same kernel code computes them; conv bit for bit), out must match it to fp32 summation order (both round
y to fp16 and take the same products) and the float64 reference to the GEMV's tolerance. Shapes: the 27B's
(Hk 16, Hv 48, 5120 rows), odd ones (a key-head count whose value heads take both halves of a 256-block, r = 1 and
r = 4, row counts that leave some cluster blocks without a tile), a CUDA-graph capture replayed, and the refusals.
Run: pytest -m gpu tests/gpu/test_gdn_decode_out.py, or as a script.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gdn_attn_dev import Pool, assert_close, call  # noqa: E402
from gpu_lib import pytest  # noqa: E402
from test_gdn_ops import D, EPS, TOL, _fused_case, _fused_expected, _wdev  # noqa: E402
from test_quant_gemv import ALL_QTYPES, case, rel_rms  # noqa: E402

pytestmark = pytest.mark.gpu

Q4T = ALL_QTYPES["Q4_K_T"]
# (hk, hv, out rows): the 27B; value heads of both parities in one cluster (hk odd); r = 1; r = 4 with a row count
# that leaves the last cluster block short; fewer tiles than the 8 blocks of a cluster
SHAPES = [(16, 48, 5120), (3, 6, 80), (4, 4, 272), (1, 4, 4112), (2, 6, 48)]
IDS = [f"Hk{a}-Hv{b}-rows{c}" for a, b, c in SHAPES]
STEPS = 3


def _out_expected() -> int:
    return _fused_expected()  # the out form needs the fused push kernel: sm_90, LUCEBOX_GDN_DECODE unset / push


def _run(hk: int, hv: int, rows: int, fused_out: bool, seed: int) -> dict:
    """STEPS decode steps through lb_gdn_decode_step_out (fused_out) or lb_gdn_decode_step + lb_gemv_q."""
    from gdn_attn_dev import lib

    w, x, state0 = _fused_case(hk, hv, STEPS, seed)
    k = hv * D
    wout, _ = case("Q4_K_T", rows, k)
    res0 = np.random.default_rng(seed + 5).standard_normal((STEPS, rows)).astype(np.float32)
    c = (2 * hk + hv) * D
    got = {"y": [], "state": [], "conv": [], "out": []}
    # (wout belongs to case()'s cache: not closed here)
    with Pool() as p:
        wd = _wdev(p, w)
        pre, a, b, z = p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["z"])
        conv, st = p.of(x["conv"]), p.of(state0)
        scratch = p.nan(lib().fn.lb_gdn_step_scratch_bytes(1, hk, hv))
        for i in range(STEPS):
            y, out = p.nan(k * 4), p.of(res0[i])
            args = (pre.at(i * c * 4), a.at(i * hv * 4), b.at(i * hv * 4), z.at(i * k * 4), wd["conv_w"].ptr,
                    wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr)
            if fused_out:
                call("lb_gdn_decode_step_out", *args, wout.ptr, Q4T, rows, out.ptr, hk, hv, ctypes.c_float(EPS),
                     None)
            else:
                call("lb_gdn_decode_step", *args, scratch.ptr, 1, hk, hv, ctypes.c_float(EPS), None)
                call("lb_gemv_q", Q4T, wout.ptr, rows, k, y.ptr, out.ptr, 1, None)
            got["y"].append(y.get(np.float32, k))
            got["state"].append(st.get(np.float32, state0.shape))
            got["conv"].append(conv.get(np.float32, (3, c)))
            got["out"].append(out.get(np.float32, rows))
    return {"res0": res0, **{n: np.stack(v) for n, v in got.items()}}


def test_out_path():
    """Which shapes the library takes: the 27B's and the odd ones on sm_90; never another weight type, Hv / Hk > 4,
    rows that are not whole 16-row tiles, or 128·Hv that is not whole 256-blocks."""
    from gdn_attn_dev import lib

    fn, want = lib().fn, _out_expected()
    assert [fn.lb_gdn_decode_out_path(hk, hv, Q4T, rows) for hk, hv, rows in SHAPES] == [want] * len(SHAPES)
    assert fn.lb_gdn_decode_out_path(16, 48, ALL_QTYPES["Q4_K"], 5120) == 0
    assert fn.lb_gdn_decode_out_path(16, 48, ALL_QTYPES["Q6_K_T"], 5120) == 0
    assert fn.lb_gdn_decode_out_path(2, 10, Q4T, 5120) == 0  # r = 5
    assert fn.lb_gdn_decode_out_path(16, 48, Q4T, 5128) == 0
    assert fn.lb_gdn_decode_out_path(1, 1, Q4T, 256) == 0  # K = 128
    if not want:
        return
    # the call refuses what the path refuses, without touching its outputs
    with Pool() as p:
        y = p.nan(4 * 128 * 10)
        status = lib().fn.lb_gdn_decode_step_out(*([y.ptr] * 11), y.ptr, Q4T, 5120, y.ptr, 2, 10,
                                                 ctypes.c_float(EPS), None)
        assert status == 6  # LB_ERR_UNSUPPORTED
        assert np.isnan(y.get(np.float32, 128 * 10)).all()


@pytest.mark.parametrize("hk,hv,rows", SHAPES, ids=IDS)
def test_out_matches_two_calls(hk, hv, rows):
    if not _out_expected():
        pytest.skip("the out form needs the fused sm_90 decode kernel")
    seed = 300 + hk + hv + rows
    fused, split = _run(hk, hv, rows, True, seed), _run(hk, hv, rows, False, seed)
    _, ref_w = case("Q4_K_T", rows, hv * D)
    for i in range(STEPS):
        assert np.array_equal(fused["conv"][i], split["conv"][i]), f"conv state, step {i}"
        assert_close(fused["y"][i], split["y"][i], 1e-6, f"y, step {i}")
        assert_close(fused["state"][i], split["state"][i], 1e-6, f"state, step {i}")
        assert np.isfinite(fused["out"][i]).all(), f"out, step {i}: NaN"
        # the product alone (out minus the preset residual), against the two-call path's and float64's
        prod = fused["out"][i].astype(np.float64) - fused["res0"][i]
        prod2 = split["out"][i].astype(np.float64) - split["res0"][i]
        want = ref_w @ fused["y"][i].astype(np.float64)
        assert rel_rms(prod, want) < 1e-3, f"out vs float64, step {i}"
        assert rel_rms(prod, prod2) < 4 * np.sqrt(hv * D) * 2.0**-24 + 1e-6, f"out vs two calls, step {i}"


def test_out_graph_replays():
    """The call captured in a CUDA graph (as the engine's step graph does) and replayed: each replay advances the
    state once more and adds the product into the residual again, as the same calls issued eagerly do."""
    if not _out_expected():
        pytest.skip("the out form needs the fused sm_90 decode kernel")
    from gdn_attn_dev import lib

    L, hk, hv, rows, steps = lib(), 2, 6, 48, 4
    w, x, state0 = _fused_case(hk, hv, steps, 501, repeat=True)
    k, c = hv * D, (2 * hk + hv) * D
    wout, _ = case("Q4_K_T", rows, k)
    res0 = np.random.default_rng(502).standard_normal(rows).astype(np.float32)
    results = {}
    s, exe = ctypes.c_void_p(), ctypes.c_void_p()
    L.call("lb_stream_create", ctypes.byref(s))
    try:
        for graph in (False, True):
            with Pool() as p:
                wd = _wdev(p, w)
                conv, st, y, out = p.of(x["conv"]), p.of(state0), p.nan(k * 4), p.of(res0)
                args = (p.of(x["pre"][:1]).ptr, p.of(x["a"][:1]).ptr, p.of(x["b"][:1]).ptr, p.of(x["z"][:1]).ptr,
                        wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr,
                        y.ptr, wout.ptr, Q4T, rows, out.ptr, hk, hv, ctypes.c_float(EPS))
                seq = []
                if graph:
                    L.call("lb_graph_begin", s)
                    L.call("lb_gdn_decode_step_out", *args, s)
                    L.call("lb_graph_end", s, ctypes.byref(exe))
                try:
                    for _ in range(steps):
                        if graph:
                            L.call("lb_graph_launch", exe, s)
                        else:
                            L.call("lb_gdn_decode_step_out", *args, s)
                        L.call("lb_dev_sync")
                        seq.append((out.get(np.float32, rows), st.get(np.float32, state0.shape),
                                    conv.get(np.float32, (3, c))))
                finally:
                    if graph:
                        L.call("lb_graph_destroy", exe)
                results[graph] = seq
    finally:
        L.call("lb_stream_destroy", s)
    for i, (eager, replay) in enumerate(zip(results[False], results[True])):
        assert_close(replay[0], eager[0], 1e-5, f"out, replay {i}")
        assert_close(replay[1], eager[1], TOL, f"state, replay {i}")
        assert np.array_equal(replay[2], eager[2]), f"conv state, replay {i}"
    assert rel_rms(results[True][-1][0].astype(np.float64), res0.astype(np.float64)) > 1e-3  # it did add


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
