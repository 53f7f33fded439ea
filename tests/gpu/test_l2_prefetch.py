"""The L2 prefetch of the next GEMV's weights inside the decode DeltaNet and attention kernels
(cuda/common/lb_l2_prefetch.cuh; lb_gdn_decode_step_pf, lb_attn_decode_fused_at_pf). A prefetch is only a hint,
so each _pf entry point must give exactly what its plain twin gives, bit for bit, whatever range it is handed:
a 27B out-projection's size (17.7 MB), a range of an odd number of 16-byte units, one with a tail of fewer than
16 bytes, a single byte, and pf = NULL. A misaligned range is refused with an argument error, and the range's
own bytes are never written.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_l2_prefetch.py`.
"""

from __future__ import annotations

import ctypes

import numpy as np
from gdn_attn_dev import Pool, call, lib
from gpu_lib import pytest

pytestmark = pytest.mark.gpu

f32 = np.float32
D = 128
EPS = 1e-6
STEPS = 4
OUT_PROJ_27B = 5120 * (6144 // 256) * 144  # Q4_K ssm_out / attn_output of the 27B: 17,694,720 bytes
RANGES = [OUT_PROJ_27B, 16 * 100_003, 16 * 4_099 + 7, 1, 0]  # 0: pf = NULL
RANGE_IDS = ["27b-out-proj", "odd-16B-units", "sub-16B-tail", "one-byte", "null"]


def _pf_buffer(p, nbytes: int):
    """A device range to prefetch, filled with a pattern so that a write into it would show."""
    n = max(nbytes, 16)
    return p.of((np.arange(n, dtype=np.int64) % 251).astype(np.uint8))


def _gdn_steps(hk: int, hv: int, pf_bytes: int | None) -> dict:
    """STEPS decode steps of one layer: lb_gdn_decode_step (pf_bytes None) or lb_gdn_decode_step_pf."""
    import test_gdn_ops as G

    w, x, state0 = G._fused_case(hk, hv, STEPS, 300 + hk + hv)
    c = (2 * hk + hv) * D
    with Pool() as p:
        wd = G._wdev(p, w)
        pre, a, b, z = p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["z"])
        conv, st = p.of(x["conv"]), p.of(state0)
        pf = _pf_buffer(p, pf_bytes or 0) if pf_bytes is not None else None
        ys = []
        for i in range(STEPS):
            y, scratch = p.nan(hv * D * 4), p.nan(lib().fn.lb_gdn_step_scratch_bytes(1, hk, hv))
            args = (pre.at(i * c * 4), a.at(i * hv * 4), b.at(i * hv * 4), z.at(i * hv * D * 4), wd["conv_w"].ptr,
                    wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr, scratch.ptr, 1, hk,
                    hv, ctypes.c_float(EPS))
            if pf_bytes is None:
                call("lb_gdn_decode_step", *args, None)
            else:
                call("lb_gdn_decode_step_pf", *args, pf.ptr if pf_bytes else None, pf_bytes, None)
            ys.append(y.get(f32, (hv * D,)))
        out = {"y": np.stack(ys), "state": st.get(f32, state0.shape), "conv": conv.get(f32, (3, c))}
        if pf is not None:
            n = max(pf_bytes, 16)
            out["pf"] = pf.get(np.uint8, (n,))
            assert np.array_equal(out["pf"], (np.arange(n, dtype=np.int64) % 251).astype(np.uint8)), "pf written"
        return out


@pytest.mark.parametrize("hk,hv", [(16, 48), (3, 24)], ids=["Hk16-Hv48", "Hk3-Hv24"])
@pytest.mark.parametrize("pf_bytes", RANGES, ids=RANGE_IDS)
def test_gdn_decode_step_pf_same_bits(hk, hv, pf_bytes):
    want = _gdn_steps(hk, hv, None)
    got = _gdn_steps(hk, hv, pf_bytes)
    for key in ("y", "state", "conv"):
        assert np.isfinite(got[key]).all(), key
        assert np.array_equal(got[key].view(np.uint32), want[key].view(np.uint32)), key


def test_gdn_decode_step_pf_refuses_misaligned():
    import test_gdn_ops as G

    hk, hv = 2, 6
    w, x, state0 = G._fused_case(hk, hv, 1, 7)
    with Pool() as p:
        wd = G._wdev(p, w)
        pf = _pf_buffer(p, 64)
        fn = lib().fn.lb_gdn_decode_step_pf
        st = fn(p.of(x["pre"]).ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr, wd["conv_w"].ptr,
                wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, p.of(x["conv"]).ptr, p.of(state0).ptr,
                p.nan(hv * D * 4).ptr, p.nan(lib().fn.lb_gdn_step_scratch_bytes(1, hk, hv)).ptr, 1, hk, hv,
                ctypes.c_float(EPS), pf.at(8), 32, None)
        assert st != 0 and "aligned" in lib().last_error()


def _attn_run(c, max_splits: int, pf_bytes: int | None):
    """lb_attn_decode_fused_at (pf_bytes None) or lb_attn_decode_fused_at_pf at row c.n_past."""
    from test_attn_decode_fused import EPS as AEPS, HD, ROPE, THETA

    with Pool() as p:
        kc, vc = p.of(c.kbits), p.of(c.vbits)
        qf = p.nan(c.nh * HD * 4)
        nbytes = lib().fn.lb_attn_partials_bytes(1, c.nh, max_splits)
        part = p.nan(nbytes) if nbytes else None
        tickets = p.of(np.zeros(c.nkv, np.uint32))
        pos = p.of(np.asarray([c.n_past, 0, 0, 0], np.int32))
        out = p.nan(c.nh * HD * 4)
        args = (p.of(c.qg).ptr, p.of(c.k).ptr, p.of(c.v).ptr, p.of(c.w_q).ptr, p.of(c.w_k).ptr, pos.ptr, qf.ptr,
                kc.ptr, vc.ptr, c.kv, out.ptr, part.ptr if part else None, max_splits, tickets.ptr, c.nh, c.nkv,
                c.max_ctx, ROPE, ctypes.c_float(AEPS), ctypes.c_float(THETA))
        if pf_bytes is None:
            call("lb_attn_decode_fused_at", *args, None)
        else:
            pf = _pf_buffer(p, pf_bytes)
            call("lb_attn_decode_fused_at_pf", *args, pf.ptr if pf_bytes else None, pf_bytes, None)
        return (out.get(f32, (c.nh * HD,)), kc.get(np.uint16, c.kbits.shape), vc.get(np.uint16, c.vbits.shape),
                tickets.get(np.uint32, (c.nkv,)))


@pytest.mark.parametrize("n_past,splits", [(1, 64), (600, 64), (4097, 8)], ids=["ctx1", "ctx600", "ctx4097"])
@pytest.mark.parametrize("pf_bytes", RANGES, ids=RANGE_IDS)
def test_attn_decode_fused_at_pf_same_bits(n_past, splits, pf_bytes):
    from test_attn_decode_fused import Step

    c = Step(24, 4, 0, n_past, 40 + n_past)  # the 27B's heads, f16 cache
    want = _attn_run(c, splits, None)
    got = _attn_run(c, splits, pf_bytes)
    assert np.isfinite(got[0]).all()
    assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
    assert not got[3].any()


if __name__ == "__main__":
    for hk, hv in [(16, 48), (3, 24)]:
        for r in RANGES:
            test_gdn_decode_step_pf_same_bits(hk, hv, r)
    test_gdn_decode_step_pf_refuses_misaligned()
    for n_past, splits in [(1, 64), (600, 64), (4097, 8)]:
        for r in RANGES:
            test_attn_decode_fused_at_pf_same_bits(n_past, splits, r)
    print("ok")
