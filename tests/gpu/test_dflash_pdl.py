"""Programmatic dependent launch (cuda/common/lb_pdl.cuh) in the 27B target engine's passes, and the zero
ranges of lb_df_rmsnorm that replaced the projections' memsets.

- The engine (tiny 4-layer Q4_K_M of test_dflash_engine.py, its own stream) gives the same prefill, step and
  23-slot verify results with lb_set_pdl(1) and lb_set_pdl(0): identical argmax (a flip allowed only at a
  float-order near-tie: the GEMMs add stream-K partials with atomics), logits as close as two PDL-off runs are.
  (The engine itself captures its decode-step graph with PDL by default: DFlashTargetEngine.step_pdl.)
- lb_df_rmsnorm clears exactly its zero ranges (tails of 1..3 floats included) and refuses malformed ones.

Script mode, `python tests/gpu/test_dflash_pdl.py --bench`: GPU time per launch of a chain of small
kernels (lb_df_rmsnorm + lb_df_swiglu at 27B widths) on the legacy default stream and on a stream of
lb_stream_create, PDL on and off, measured between torch CUDA events with the host queue filled ahead
(a torch sleep kernel holds the GPU while the chain is enqueued): does PDL act on the legacy stream?
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit"), str(Path(__file__).resolve().parent)]

from gpu_lib import lib, pytest  # noqa: E402  (tests/gpu is on sys.path: see above)
from test_dflash_engine import VOCAB, assert_same_or_near_tie, branched_tree, gguf, rel  # noqa: E402

pytestmark = pytest.mark.gpu


def _run_session(on: int) -> dict:
    from lucebox_cli.engines.dflash import DFlashTargetEngine

    prev = lib().fn.lb_set_pdl(on)
    eng = DFlashTargetEngine(gguf(4), max_context=512, budget=22, tap_layers=(1,), lib=lib())
    try:
        out = {}
        ids = np.random.default_rng(21).integers(0, VOCAB, 70)  # two prefill passes (64 + 6)
        eng.poison()
        out["prefill"] = eng.prefill(ids)
        tok = int(np.argmax(out["prefill"]))
        steps = []
        for _ in range(6):
            eng.poison()
            lg = eng.step(tok)
            steps.append(lg)
            tok = int(np.argmax(lg))
        out["steps"] = np.stack(steps)
        out["step_argmax"] = [eng.step_argmax(tok)]
        tree = branched_tree(22, 23)
        eng.poison()
        res = eng.verify(tree)
        out["verify"] = res.logits
        out["verify_argmax"] = eng.verify_argmax(tree).argmax
        eng.commit(tree.path_to(int(np.argmax(tree.depth))))
        out["after_commit"] = eng.step(7)
        out["features"] = eng.features
        return out
    finally:
        eng.close()
        lib().fn.lb_set_pdl(prev)


def test_pdl_on_and_off_agree():
    """Every launch with PDL (lb_set_pdl(1)) against none, held to the engine's own run-to-run noise: stream-K
    GEMVs add their partial sums with atomics in any order, so two PDL-off runs differ too (~5e-4 in the logits of
    this 4-layer random model, ~9e-4 at 8 layers: scripts/pdl_check.py). Until session 9 this compared against
    1e-4 and "failed" on that noise alone; a race (a kernel reading a half-written or poisoned buffer) shows as NaN
    or errors far above it."""
    off, off2, on = _run_session(0), _run_session(0), _run_session(1)
    for key in ("prefill", "steps", "verify", "after_commit", "features"):
        floor, r = rel(off2[key], off[key]), rel(on[key], off[key])
        assert r < max(5 * floor, 1e-4) and r < 5e-3, f"{key}: PDL on vs off rel RMS {r:.3g} (off vs off {floor:.3g})"
    for key in ("prefill", "after_commit"):
        assert_same_or_near_tie([np.argmax(on[key])], [np.argmax(off[key])], [off[key]], f"{key} argmax")
    assert_same_or_near_tie(np.argmax(on["steps"], -1), np.argmax(off["steps"], -1), off["steps"], "step argmax")
    assert_same_or_near_tie(np.argmax(on["verify"], -1), np.argmax(off["verify"], -1), off["verify"],
                            "verify argmax")
    assert_same_or_near_tie(on["verify_argmax"], off["verify_argmax"], off["verify"], "verify_argmax")


def _dev(nbytes: int) -> ctypes.c_void_p:
    p = ctypes.c_void_p()
    lib().call("lb_dev_alloc", nbytes, ctypes.byref(p))
    return p


# n: the vector path (n % 4 == 0 up to 8192: 1000, the 27B's 5120, 8192) and the scalar loop (odd n, and
# 8196 past the vector path's registers)
@pytest.mark.parametrize("t,n", [(3, 1000), (2, 5120), (1, 8192), (3, 257), (2, 8196)])
def test_rmsnorm_rows(t, n):
    eps = 1e-6
    rng = np.random.default_rng(n)
    x = (3.0 * rng.standard_normal((t, n))).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    bufs = [_dev(a) for a in (x.nbytes, w.nbytes, x.nbytes)]
    try:
        lib().call("lb_dev_h2d", bufs[0], x.ctypes.data, x.nbytes)
        lib().call("lb_dev_h2d", bufs[1], w.ctypes.data, w.nbytes)
        lib().call("lb_dev_memset", bufs[2], 0xFF, x.nbytes)  # NaN: an unwritten element shows
        lib().call("lb_df_rmsnorm", bufs[0], bufs[1], bufs[2], t, n, eps, None, 0, None, 0, None)
        y = np.empty_like(x)
        lib().call("lb_dev_d2h", y.ctypes.data, bufs[2], y.nbytes)
        ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps) * w
        assert np.isfinite(y).all(), "unwritten or NaN outputs"
        assert rel(y, ref) < 1e-6
    finally:
        for p in bufs:
            lib().call("lb_dev_free", p)


# the fp16 outputs of a cuBLAS pass's inputs: the vector path (n % 4 == 0, 8-byte stores of 4 halves) and the scalar
# loop, rows at an 8-byte but not 16-byte aligned output
@pytest.mark.parametrize("t,n,off", [(3, 1000, 0), (2, 5120, 8), (3, 257, 0), (2, 8196, 0)])
def test_rmsnorm_and_swiglu_f16_are_the_fp32_ops_rounded(t, n, off):
    """lb_df_rmsnorm_f16 / lb_df_swiglu_f16 give the bits of the fp32 op followed by round-to-nearest fp16 (what
    lb_f32_to_f16 would make of it); every output written (NaN-poisoned first), nothing past the end."""
    eps = 1e-6
    rng = np.random.default_rng(n + off)
    x = (3.0 * rng.standard_normal((t, n))).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    g = (2.0 * rng.standard_normal(t * n)).astype(np.float32)
    guard = 8
    bufs = [_dev(a) for a in (x.nbytes, w.nbytes, x.nbytes, 2 * x.size + off + 2 * guard, g.nbytes, g.nbytes)]
    try:
        for d, a in ((bufs[0], x), (bufs[1], w), (bufs[4], g), (bufs[5], x)):
            lib().call("lb_dev_h2d", d, a.ctypes.data, a.nbytes)
        y16 = bufs[3].value + off
        for op in ("norm", "swiglu"):
            lib().call("lb_dev_memset", bufs[2], 0xFF, x.nbytes)
            lib().call("lb_dev_memset", bufs[3], 0xFF, 2 * x.size + off + 2 * guard)
            if op == "norm":
                lib().call("lb_df_rmsnorm", bufs[0], bufs[1], bufs[2], t, n, eps, None, 0, None, 0, None)
                lib().call("lb_df_rmsnorm_f16", bufs[0], bufs[1], y16, t, n, eps, None)
            else:
                lib().call("lb_df_swiglu", bufs[4], bufs[5], bufs[2], t * n, None)
                lib().call("lb_df_swiglu_f16", bufs[4], bufs[5], y16, t * n, None)
            y = np.empty_like(x)
            lib().call("lb_dev_d2h", y.ctypes.data, bufs[2], y.nbytes)
            h = np.empty(x.size + guard, np.float16)
            lib().call("lb_dev_d2h", h.ctypes.data, y16, h.nbytes)
            assert np.isfinite(y).all() and np.isfinite(h[: x.size]).all(), f"{op}: unwritten outputs"
            want = y.reshape(-1).astype(np.float16)
            assert np.array_equal(h[: x.size].view(np.uint16), want.view(np.uint16)), f"{op}: not the rounded fp32 op"
            assert (h[x.size:].view(np.uint16) == 0xFFFF).all(), f"{op}: wrote past the end"
    finally:
        for p in bufs:
            lib().call("lb_dev_free", p)


def test_rmsnorm_zero_ranges():
    from lucebox_cli.engines._lib import LB_ERR_INVALID_ARG

    t, n, eps = 3, 1000, 1e-6
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, n)).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    bufs = [_dev(a) for a in (x.nbytes, w.nbytes, x.nbytes, 4096, 1 << 22)]
    try:
        lib().call("lb_dev_h2d", bufs[0], x.ctypes.data, x.nbytes)
        lib().call("lb_dev_h2d", bufs[1], w.ctypes.data, w.nbytes)
        # (offset, bytes) in the two scratch buffers: tails of 3, 1 and 0 floats, one range absent, and a
        # 4 MB range that takes 256 zeroing blocks
        for (o0, n0), (o1, n1) in (((16, 4 * 15), (0, 4 * 17)), ((0, 16 * 40 + 4), (256, (1 << 22) - 512)),
                                   ((32, 0), (0, 16))):
            nan = np.full(4096 // 4, np.nan, np.float32), np.full((1 << 22) // 4, np.nan, np.float32)
            lib().call("lb_dev_h2d", bufs[3], nan[0].ctypes.data, 4096)
            lib().call("lb_dev_h2d", bufs[4], nan[1].ctypes.data, 1 << 22)
            z0 = bufs[3].value + o0 if n0 else None
            lib().call("lb_df_rmsnorm", bufs[0], bufs[1], bufs[2], t, n, eps, z0, n0, bufs[4].value + o1, n1,
                       None)
            y = np.empty_like(x)
            got = np.empty(4096 // 4, np.float32), np.empty((1 << 22) // 4, np.float32)
            lib().call("lb_dev_d2h", y.ctypes.data, bufs[2], y.nbytes)
            lib().call("lb_dev_d2h", got[0].ctypes.data, bufs[3], 4096)
            lib().call("lb_dev_d2h", got[1].ctypes.data, bufs[4], 1 << 22)
            ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps) * w
            assert rel(y, ref) < 1e-6
            for g, off, nb in ((got[0], o0, n0), (got[1], o1, n1)):
                inside = np.zeros(g.size, bool)
                inside[off // 4 : (off + nb) // 4] = True
                assert (g[inside] == 0).all(), "a float of a zero range was not cleared"
                assert np.isnan(g[~inside]).all(), "a float outside the zero ranges was written"
        for bad in ((bufs[3].value + 4, 16), (bufs[3].value, 6), (None, 16)):
            st = lib().fn.lb_df_rmsnorm(bufs[0], bufs[1], bufs[2], t, n, eps, *bad, None, 0, None)
            assert st == LB_ERR_INVALID_ARG, f"zero range {bad} accepted"
    finally:
        for p in bufs:
            lib().call("lb_dev_free", p)


def test_stream_create_destroy():
    s = ctypes.c_void_p()
    lib().call("lb_stream_create", ctypes.byref(s))
    assert s.value
    lib().call("lb_stream_destroy", s)
    lib().call("lb_stream_destroy", None)


# ---- script mode --bench: does PDL act on the legacy stream? ---------------------------------------


def bench_chain(pairs: int = 300, hidden: int = 5120, ffn: int = 17408) -> list[dict]:
    import torch

    bufs = [_dev(a) for a in (hidden * 4, hidden * 4, hidden * 4, ffn * 4, ffn * 4, ffn * 4)]
    for p, nbytes in zip(bufs, (hidden * 4,) * 3 + (ffn * 4,) * 3):
        lib().call("lb_dev_memset", p, 0, nbytes)
    own = ctypes.c_void_p()
    lib().call("lb_stream_create", ctypes.byref(own))
    rows = []
    try:
        for name, stream in (("legacy", None), ("own", own.value)):
            for on in (0, 1, 0, 1):  # twice each, interleaved
                prev = lib().fn.lb_set_pdl(on)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(40_000_000)  # ~20 ms of GPU: the chain below is queued before it runs
                e0.record()
                for _ in range(pairs):
                    lib().fn.lb_df_rmsnorm(bufs[0], bufs[1], bufs[2], 1, hidden, 1e-6, None, 0, None, 0, stream)
                    lib().fn.lb_df_swiglu(bufs[3], bufs[4], bufs[5], ffn, stream)
                e1.record()
                e1.synchronize()
                lib().fn.lb_set_pdl(prev)
                rows.append({"stream": name, "pdl": on, "us_per_kernel": round(e0.elapsed_time(e1) * 1e3 / (2 * pairs), 3)})
    finally:
        lib().call("lb_stream_destroy", own)
        for p in bufs:
            lib().call("lb_dev_free", p)
    return rows


def _main(argv: list[str]) -> int:
    if "--bench" in argv:
        for r in bench_chain():
            print(json.dumps(r))
        return 0
    for fn in (test_stream_create_destroy, test_rmsnorm_zero_ranges, test_pdl_on_and_off_agree):
        fn()
        print("ok", fn.__name__)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
