"""lb_gemv_q_pair: a Q6_K_T and a Q4_K_T n = 1 product of the same x in one launch (gemv_q6q4_tile_kernel; the 27B
DeltaNet decode's attn_qkv and attn_gate + ssm_beta + ssm_alpha), against the two lb_gemv_q launches it replaces and
the float64 reference of test_quant_gemv (random GGUF blocks through lb_quant_repack).

Both outputs sit in one buffer, b's right after a's (the engine's [qkv | z | beta | alpha] row). At K = 256 every
output row gets one item, hence one atomicAdd onto zero, and the same arithmetic: bit-identical to the two launches;
at larger K equal up to the fp32 order of the stream-K atomics. The merged launch's Q6 part follows lb_gemv_q's
Q6_K_T kernel: gemv_q6_cols_kernel's arithmetic by default, the x-staged one under LUCEBOX_Q6_GEMV=xs and =old (=old's
plain launch is bit-identical to xs); both switch values run in children here. LUCEBOX_QKV_ZBA=0 (read once per
process: a child) keeps two launches. Run: pytest -m gpu tests/gpu/test_gemv_pair.py, or as a script (--bench: µs of the merged launch
against the two at the 27B shapes).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_lib import pytest  # noqa: E402
from test_quant_gemv import ALL_QTYPES, TOL, Dev, case, lib, rel_rms  # noqa: E402

pytestmark = pytest.mark.gpu

Q6T, Q4T = ALL_QTYPES["Q6_K_T"], ALL_QTYPES["Q4_K_T"]
# (rows of the Q6_K_T part, rows of the Q4_K_T part, k): the 27B's attn_qkv + z/beta/alpha and its attention layers'
# attn_v (Q6_K_T) + attn_q/attn_k (one Q4_K_T tensor), then odd small shapes
# (rows multiples of 16, k of 256; a part of one tile, parts that end mid row group, a Q4 part larger than the Q6)
SHAPES = [(10240, 6240, 5120), (1024, 13312, 5120), (16, 16, 256), (48, 80, 256), (1008, 272, 256 * 7), (64, 4096, 1024), (4112, 48, 768)]


def outputs(ra: int, rb: int, k: int, merged: bool, accumulate: int, qa: str = "Q6_K_T", qb: str = "Q4_K_T"):
    """(ya, yb) of the pair call (merged) or of two lb_gemv_q calls, one output buffer [ya | yb]; accumulate = 1 adds
    onto a preset vector (0.25 · row index)."""
    wa, _ = case(qa, ra, k)
    wb, _ = case(qb, rb, k)
    x = np.random.default_rng(ra + 3 * rb + k).standard_normal(k).astype(np.float32)
    xd = Dev.of(x)
    y0 = (0.25 * np.arange(ra + rb)).astype(np.float32)
    yd = Dev.of(y0) if accumulate else Dev(4 * (ra + rb))
    try:
        if not accumulate:
            lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)  # NaN: an unwritten row shows
        ya = yd.ptr.value
        yb = ya + 4 * ra
        if merged:
            lib().call("lb_gemv_q_pair", ALL_QTYPES[qa], wa.ptr, ra, ya, ALL_QTYPES[qb], wb.ptr, rb, yb, k, xd.ptr,
                       accumulate, None)
        else:
            lib().call("lb_gemv_q", ALL_QTYPES[qa], wa.ptr, ra, k, xd.ptr, ya, accumulate, None)
            lib().call("lb_gemv_q", ALL_QTYPES[qb], wb.ptr, rb, k, xd.ptr, yb, accumulate, None)
        y = yd.get(np.float32, ra + rb)
    finally:
        xd.close()
        yd.close()
    base = y0.astype(np.float64) if accumulate else 0.0
    return y[:ra], y[ra:], x, base


def check_shape(ra: int, rb: int, k: int, accumulate: int, qa: str = "Q6_K_T", qb: str = "Q4_K_T") -> None:
    pa, pb, x, base = outputs(ra, rb, k, True, accumulate, qa, qb)
    sa, sb, _, _ = outputs(ra, rb, k, False, accumulate, qa, qb)
    want = np.concatenate([case(qa, ra, k)[1] @ x.astype(np.float64), case(qb, rb, k)[1] @ x.astype(np.float64)])
    got, two = np.concatenate([pa, pb]), np.concatenate([sa, sb])
    key = f"{qa} {ra} + {qb} {rb}, k {k}, acc {accumulate}"
    assert np.isfinite(got).all(), f"{key}: unwritten / NaN outputs"
    want = want + base
    assert rel_rms(got.astype(np.float64), want) < TOL, key
    assert rel_rms(two.astype(np.float64), want) < TOL, key
    if k == 256 and not accumulate:
        assert np.array_equal(got.view(np.uint32), two.view(np.uint32)), f"{key}: not bit-identical to two launches"
    else:
        assert rel_rms(got.astype(np.float64), two.astype(np.float64)) < 4 * np.sqrt(k) * 2.0**-24, key


def test_merged_by_default():
    if os.environ.get("LUCEBOX_QKV_ZBA") == "0":
        pytest.skip("LUCEBOX_QKV_ZBA=0 is set here")
    assert lib().fn.lb_gemv_q_pair_merged(Q6T, Q4T) == 1
    assert lib().fn.lb_gemv_q_pair_merged(Q4T, Q6T) == 0 and lib().fn.lb_gemv_q_pair_merged(Q6T, Q6T) == 0


@pytest.mark.parametrize("ra,rb,k", SHAPES)
@pytest.mark.parametrize("accumulate", [0, 1])
def test_pair_matches_two_launches(ra, rb, k, accumulate):
    check_shape(ra, rb, k, accumulate)


@pytest.mark.parametrize("qa,qb", [("Q4_K_T", "Q6_K_T"), ("Q4_K", "Q6_K"), ("Q6_K_T", "Q6_K_T")])
def test_other_types_are_two_launches(qa, qb):
    """Any other pair of types is lb_gemv_q(a) then lb_gemv_q(b): same results."""
    check_shape(48, 80, 512, 0, qa, qb)


def test_pdl_chain_reads_the_previous_output():
    """Under PDL (lb_set_pdl(1)) the merged launch reads x written by the launch before it: GEMV 1 writes x2, the pair
    reads it at once; the result is the two-step product."""
    ra, rb, k = 1008, 272, 1024
    w1, r1 = case("Q4_K_T", k, k)
    wa, ra_ref = case("Q6_K_T", ra, k)
    wb, rb_ref = case("Q4_K_T", rb, k)
    x = np.random.default_rng(5).standard_normal(k).astype(np.float32)
    xd, x2, y = Dev.of(x), Dev(4 * k), Dev(4 * (ra + rb))
    prev = lib().fn.lb_set_pdl(1)  # returns the previous mode, not a status
    try:
        for _ in range(3):
            lib().call("lb_dev_memset", x2.ptr, 0, x2.nbytes)
            lib().call("lb_dev_memset", y.ptr, 0, y.nbytes)
            lib().call("lb_gemv_q", Q4T, w1.ptr, k, k, xd.ptr, x2.ptr, 1, None)
            lib().call("lb_gemv_q_pair", Q6T, wa.ptr, ra, y.ptr, Q4T, wb.ptr, rb, y.ptr.value + 4 * ra, k, x2.ptr, 1,
                       None)
            got = y.get(np.float32, ra + rb).astype(np.float64)
            h = r1 @ x.astype(np.float64)
            want = np.concatenate([ra_ref @ h, rb_ref @ h])
            assert rel_rms(got, want) < 2 * TOL
    finally:
        lib().fn.lb_set_pdl(prev)
        for d in (xd, x2, y):
            d.close()


def test_switch_off_keeps_two_launches():
    """LUCEBOX_QKV_ZBA=0 (a child process): lb_gemv_q_pair_merged says 0 and the results are still right."""
    if os.environ.get("LUCEBOX_QKV_ZBA") == "0":
        pytest.skip("this process is the child")
    env = dict(os.environ, LUCEBOX_QKV_ZBA="0")
    r = subprocess.run([sys.executable, __file__, "--check-off"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "off ok" in r.stdout


# K = 256 shapes first (the bit-for-bit check), then larger K (the order of the atomics only)
Q6_MODE_SHAPES = [(16, 16, 256), (48, 80, 256), (1008, 272, 256), (1008, 272, 256 * 7), (4112, 48, 768)]


@pytest.mark.parametrize("mode", ["xs", "old"])
def test_pair_matches_two_launches_q6_mode(mode):
    """LUCEBOX_Q6_GEMV=xs / old (a child process): the merged launch (x-staged Q6 part) against the two launches
    (the xs, resp. old, plain kernel), bit for bit at K = 256."""
    if os.environ.get("LUCEBOX_Q6_GEMV"):
        pytest.skip("LUCEBOX_Q6_GEMV is set here: the child sets its own")
    env = dict(os.environ, LUCEBOX_Q6_GEMV=mode)
    env.pop("LUCEBOX_QKV_ZBA", None)
    r = subprocess.run([sys.executable, __file__, "--check-q6-mode"], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "q6 mode ok" in r.stdout


def bench(iters: int = 200) -> None:
    """µs per call at the 27B shapes (DeltaNet qkv + z/beta/alpha; attention v + q/k): the pair (merged) against the
    two lb_gemv_q, weights L2-resident (a floor on the launch cost, not the HBM timeline: docs/perf.md has the
    in-graph numbers)."""
    import time

    for ra, rb, k in ((10240, 6240, 5120), (1024, 13312, 5120)):
        wa = Dev(lib().fn.lb_quant_bytes(Q6T, ra, k))
        wb = Dev(lib().fn.lb_quant_bytes(Q4T, rb, k))
        lib().call("lb_quant_fill_random", Q6T, wa.ptr, ra, k, 1, None)
        lib().call("lb_quant_fill_random", Q4T, wb.ptr, rb, k, 2, None)
        xd, y = Dev.of(np.ones(k, np.float32)), Dev(4 * (ra + rb))
        for merged in (False, True):
            def one():
                if merged:
                    lib().call("lb_gemv_q_pair", Q6T, wa.ptr, ra, y.ptr, Q4T, wb.ptr, rb, y.ptr.value + 4 * ra, k,
                               xd.ptr, 1, None)
                else:
                    lib().call("lb_gemv_q", Q6T, wa.ptr, ra, k, xd.ptr, y.ptr, 1, None)
                    lib().call("lb_gemv_q", Q4T, wb.ptr, rb, k, xd.ptr, y.ptr.value + 4 * ra, 1, None)
            for _ in range(10):
                one()
            lib().call("lb_dev_sync")
            t0 = time.perf_counter()
            for _ in range(iters):
                one()
            lib().call("lb_dev_sync")
            us = (time.perf_counter() - t0) / iters * 1e6
            print(f"Q6 {ra} + Q4 {rb}, k {k}: {'pair' if merged else 'two launches'}: {us:.1f} µs a call")
        for d in (wa, wb, xd, y):
            d.close()


if __name__ == "__main__":
    if "--check-off" in sys.argv:
        assert lib().fn.lb_gemv_q_pair_merged(Q6T, Q4T) == 0
        check_shape(1008, 272, 256 * 7, 0)
        check_shape(48, 80, 256, 0)
        print("off ok")
    elif "--check-q6-mode" in sys.argv:  # under LUCEBOX_Q6_GEMV=xs or old
        assert lib().fn.lb_gemv_q_pair_merged(Q6T, Q4T) == 1
        for ra, rb, k in Q6_MODE_SHAPES:
            for acc in (0, 1):
                check_shape(ra, rb, k, acc)
        print("q6 mode ok")
    elif "--bench" in sys.argv:
        bench()
    else:
        sys.exit(pytest.main([__file__, "-v"]))
