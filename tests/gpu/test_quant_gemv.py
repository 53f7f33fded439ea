"""Quantized GEMV / small-N GEMM (lb_gemv_q, lb_gemm_q_smalln) against a float64 numpy reference.

Weights are random GGUF block bytes (random quants, small positive fp16 scales like a real
checkpoint's), dequantized by the `gguf` package, so the reference shares no code with the kernels.
The GGUF bytes go to the GPU and through lb_quant_repack, exactly as an engine loads them. Outputs are
NaN-poisoned before `accumulate=1` calls (y preset to a known vector: an unwritten row keeps it), and
compared by relative RMS error (fp16 weights and activations into fp32 accumulation: ~3e-4 expected).

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_quant_gemv.py [--bench]`, which
also prints the bandwidth table at the 27B shapes (--gemv-bench: only its n = 1 K-quant rows; --tile-bench: Q4_K
against the tiled Q4_K at n = 1, 23, 64; --bench-one QT ROWS K ITERS [N]: one shape, for a profiler, QT Q4_K_T
included; --tile6-bench: Q6_K against the tiled Q6_K at n = 1, 8, 23, 64; the tiled Q6_K's n = 1 runs
gemv_q6_cols_kernel by default, LUCEBOX_Q6_GEMV=xs the x-staged kernel before it, =old the kernel before x staging,
for A/B runs; --q6-ab [ITERS]: the tiled Q6_K's n = 1 at the 27B shapes under the default, =xs and =old, each in a
child process). Every Q4_K case also runs on the tiled
layout (qtype 268) as "Q4_K_T", every Q6_K case on the tiled Q6_K (qtype 270) as "Q6_K_T".
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

from gpu_lib import lib as full_lib
from gpu_lib import pytest

pytestmark = pytest.mark.gpu

QTYPES = {"Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# The tiled Q4_K device layout (lb_quant_repack with qtype 268 from the same GGUF bytes; rows a multiple of 16): every
# Q4_K case runs again on it as "Q4_K_T" at the shape's rows rounded up to 16 (fit_rows), same reference and TOL.
TILED = {"Q4_K_T": 268, "Q6_K_T": 270}  # (Q6_K_T: the same for Q6_K, lb_quant_repack with qtype 270)
ALL_QTYPES = {**QTYPES, **TILED}
# (weights per block, bytes per block, byte offsets of fp16 scales within a block)
GEOMETRY = {"Q8_0": (32, 34, (0,)), "Q4_K": (256, 144, (0, 2)), "Q5_K": (256, 176, (0, 2)), "Q6_K": (256, 210, (208,))}
SCALE = {"Q8_0": 4e-3, "Q4_K": 1e-3, "Q5_K": 1e-3, "Q6_K": 5e-4}
TOL = 1e-3


API = ("lb_quant_bytes", "lb_quant_repack", "lb_quant_fill_random", "lb_gemv_q", "lb_gemm_q_smalln", "lb_bench_qmm",
       "lb_dev_alloc", "lb_dev_free", "lb_dev_h2d", "lb_dev_d2h", "lb_dev_memset", "lb_dev_sync", "lb_last_error",
       "lb_set_pdl")


@functools.lru_cache(maxsize=1)
def lib():
    import os
    from pathlib import Path

    from lucebox_cli.engines import _lib

    alone = os.environ.get("LUCEBOX_QMM_LIB")
    if alone:
        # a library of just these ops (scripts/device_quant.sh builds one when the full build fails):
        # only this op's rows of the declaration table apply
        cdll = ctypes.CDLL(alone)
        for name in API:
            fn = getattr(cdll, name)
            fn.restype, fn.argtypes = _lib.DECLS[name]
        return _lib.Lib(path=Path(alone), cdll=cdll)
    return full_lib()


class Dev:
    """A device buffer through lb_dev_* (freed on close)."""

    def __init__(self, nbytes: int):
        self.ptr = ctypes.c_void_p()
        self.nbytes = nbytes
        lib().call("lb_dev_alloc", nbytes, ctypes.byref(self.ptr))

    @classmethod
    def of(cls, a: np.ndarray) -> "Dev":
        a = np.ascontiguousarray(a)
        d = cls(a.nbytes)
        lib().call("lb_dev_h2d", d.ptr, a.ctypes.data, a.nbytes)
        return d

    def get(self, dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        lib().call("lb_dev_sync")
        lib().call("lb_dev_d2h", out.ctypes.data, self.ptr, out.nbytes)
        return out

    def close(self) -> None:
        if self.ptr:
            lib().call("lb_dev_free", self.ptr)
            self.ptr = ctypes.c_void_p()


def gguf_type(qt: str) -> str:
    """The GGUF type of a test qtype name (Q4_K_T / Q6_K_T: Q4_K / Q6_K bytes, tiled on the device)."""
    return qt[:-2] if qt in TILED else qt


def fit_rows(qt: str, rows: int) -> int:
    """rows for qtype qt: the tiled layout takes whole 16-row tiles (rounded up: 257 -> 272, 301 -> 304)."""
    return -(-rows // 16) * 16 if qt in TILED else rows


def random_gguf_bytes(qt: str, rows: int, k: int, seed: int) -> np.ndarray:
    """[rows, row_bytes] uint8 of valid blocks: random quants, fp16 scales in [s, 2s)."""
    qt = gguf_type(qt)
    block, size, scale_offsets = GEOMETRY[qt]
    rng = np.random.default_rng(seed)
    nblk = rows * (k // block)
    raw = rng.integers(0, 256, size=(nblk, size), dtype=np.uint8)
    for off in scale_offsets:
        d = (SCALE[qt] * (1.0 + rng.random(nblk))).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(rows, -1)


@functools.lru_cache(maxsize=6)
def case(qt: str, rows: int, k: int):
    """(device-layout weights, float64 dequantized reference [rows, k])."""
    import gguf

    raw = random_gguf_bytes(qt, rows, k, seed=rows * 7 + k + QTYPES[gguf_type(qt)])
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[gguf_type(qt)]).astype(np.float64).reshape(rows, k)
    src = Dev.of(raw)
    dst = Dev(raw.nbytes)
    assert lib().fn.lb_quant_bytes(ALL_QTYPES[qt], rows, k) == raw.nbytes
    lib().call("lb_quant_repack", ALL_QTYPES[qt], src.ptr, dst.ptr, rows, k, None)
    lib().call("lb_dev_sync")
    src.close()
    return dst, ref


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def run_case(qt: str, rows: int, k: int, n: int, accumulate: int) -> float:
    """Relative RMS error of one call; n == 1 goes through lb_gemv_q."""
    w, ref = case(qt, rows, k)
    rng = np.random.default_rng(1000 + n)
    x = rng.standard_normal((n, k)).astype(np.float32)  # column-major X[k, n]: vector j contiguous
    y0 = rng.standard_normal((n, rows)).astype(np.float32) if accumulate else None
    want = x.astype(np.float64) @ ref.T + (y0 if accumulate else 0.0)
    xd = Dev.of(x)
    yd = Dev.of(y0) if accumulate else Dev(4 * n * rows)
    if not accumulate:
        lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)  # NaN everywhere
    try:
        if n == 1:
            lib().call("lb_gemv_q", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, yd.ptr, accumulate, None)
        else:
            lib().call("lb_gemm_q_smalln", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, accumulate, None)
        got = yd.get(np.float32, n * rows).reshape(n, rows)
    finally:
        xd.close()
        yd.close()
    assert np.isfinite(got).all(), f"{qt} {rows}x{k} n={n}: {int((~np.isfinite(got)).sum())} unwritten/NaN outputs"
    if accumulate:
        # compare the product, not the preset vector it was added to
        return rel_rms(got.astype(np.float64) - y0, want - y0)
    return rel_rms(got.astype(np.float64), want)


# (301, 256·7) and (1001, 256·7): odd row counts and an odd number of 256-blocks per row (the last fp16 d
# of Q6_K and Q8_0's trailing arrays sits at an even index, with no partner).
GEMV_SHAPES = [(257, 5120), (5120, 17408), (17408, 5120), (301, 256 * 7)]
SMALLN_SHAPES = [(257, 5120), (1001, 256 * 7)]
# every column-tile width the dispatch picks: n = 2, 7 (NT 1), 13 (2), 23 (3), 29 (4), 41 (6), 64 (8)
NS = [2, 7, 13, 23, 29, 41, 64]
# Enough items that every block takes several and flushes mid-range (the shapes above give most blocks a
# single item at n > 1); at n = 5, Q8_0 takes the cp.async ring kernel (>= 48 MiB) and its ring wraps.
MANY_ITEMS_SHAPE = (17408, 5120)
MANY_ITEMS_NS = [5, 23, 64]


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("rows,k", GEMV_SHAPES, ids=[f"N{r}-K{k}" for r, k in GEMV_SHAPES])
@pytest.mark.parametrize("accumulate", [0, 1], ids=["store", "accumulate"])
def test_gemv_q(qt, rows, k, accumulate):
    rows = fit_rows(qt, rows)
    err = run_case(qt, rows, k, 1, accumulate)
    assert err < TOL, f"{qt} N{rows} K{k}: relative RMS {err:.2e}"


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("rows,k", SMALLN_SHAPES, ids=[f"N{r}-K{k}" for r, k in SMALLN_SHAPES])
@pytest.mark.parametrize("n", NS, ids=[f"n{n}" for n in NS])
def test_gemm_q_smalln(qt, rows, k, n):
    rows = fit_rows(qt, rows)
    err = run_case(qt, rows, k, n, accumulate=int(n % 2))
    assert err < TOL, f"{qt} N{rows} K{k} n={n}: relative RMS {err:.2e}"


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("n", MANY_ITEMS_NS, ids=[f"n{n}" for n in MANY_ITEMS_NS])
def test_gemm_q_smalln_many_items(qt, n):
    rows, k = MANY_ITEMS_SHAPE
    err = run_case(qt, rows, k, n, accumulate=int(n % 2))
    assert err < TOL, f"{qt} N{rows} K{k} n={n}: relative RMS {err:.2e}"


def run_pair(qt: str, rows: int, k: int, n: int, pdl: int) -> np.ndarray:
    """One call (accumulate = 0 onto NaN) with programmatic dependent launch on or off; returns y."""
    w, _ = case(qt, rows, k)
    x = np.random.default_rng(77).standard_normal((n, k)).astype(np.float32)
    xd, yd = Dev.of(x), Dev(4 * n * rows)
    prev = lib().fn.lb_set_pdl(pdl)
    try:
        lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)
        if n == 1:
            lib().call("lb_gemv_q", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, yd.ptr, 0, None)
        else:
            lib().call("lb_gemm_q_smalln", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, 0, None)
        return yd.get(np.float32, n * rows)
    finally:
        lib().fn.lb_set_pdl(prev)
        xd.close()
        yd.close()


@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("n", [1, 41])
def test_pdl_on_off_same(qt, n):
    """lb_set_pdl(0) and (1) give the same y (to fp32 atomics order: stream-K partial sums)."""
    rows, k = 5120, 17408
    on, off = run_pair(qt, rows, k, n, 1), run_pair(qt, rows, k, n, 0)
    assert np.isfinite(on).all() and np.isfinite(off).all()
    assert rel_rms(on.astype(np.float64), off.astype(np.float64)) < 1e-6


@pytest.mark.parametrize("qt", ["Q4_K", "Q6_K", "Q4_K_T", "Q6_K_T"])
def test_pdl_dependent_chain(qt):
    """y1 = Wa·x then y2 = Wb·y1 back to back on one stream, accumulating onto pre-zeroed outputs (no memset
    between the kernels, as the engine runs them): under PDL the second GEMV's blocks start while the first
    runs, and may read y1 only after pdl_wait. A read of a partial y1 would show as a large error of y2
    against Wb·(the final y1)."""
    wa, ref_a = case(qt, 5120, 17408)
    wb, ref_b = case(qt, 17408, 5120)
    x = np.random.default_rng(5).standard_normal(17408).astype(np.float32)
    xd, y1, y2 = Dev.of(x), Dev(4 * 5120), Dev(4 * 17408)
    prev = lib().fn.lb_set_pdl(1)
    try:
        for _ in range(3):
            lib().call("lb_dev_memset", y1.ptr, 0, y1.nbytes)
            lib().call("lb_dev_memset", y2.ptr, 0, y2.nbytes)
            lib().call("lb_gemv_q", ALL_QTYPES[qt], wa.ptr, 5120, 17408, xd.ptr, y1.ptr, 1, None)
            lib().call("lb_gemv_q", ALL_QTYPES[qt], wb.ptr, 17408, 5120, y1.ptr, y2.ptr, 1, None)
            got1 = y1.get(np.float32, 5120).astype(np.float64)
            got2 = y2.get(np.float32, 17408).astype(np.float64)
            assert rel_rms(got1, ref_a @ x.astype(np.float64)) < TOL
            assert rel_rms(got2, ref_b @ got1) < TOL
    finally:
        lib().fn.lb_set_pdl(prev)
        for d in (xd, y1, y2):
            d.close()


def test_rejects_bad_shapes():
    from lucebox_cli.errors import LuceboxError

    w, _ = case("Q4_K", 257, 5120)
    with pytest.raises(LuceboxError, match="multiple of 256"):
        lib().call("lb_gemv_q", 12, w.ptr, 257, 5000, w.ptr, w.ptr, 0, None)
    with pytest.raises(LuceboxError, match="qtype"):
        lib().call("lb_gemv_q", 2, w.ptr, 257, 5120, w.ptr, w.ptr, 0, None)
    with pytest.raises(LuceboxError, match="1..64"):
        lib().call("lb_gemm_q_smalln", 12, w.ptr, 257, 5120, w.ptr, 65, w.ptr, 0, None)
    # the tiled layout: whole 16-row tiles only
    assert lib().fn.lb_quant_bytes(268, 257, 5120) == 0 and lib().fn.lb_quant_bytes(268, 272, 5120) == 272 * 20 * 144
    for fn, extra in (("lb_gemv_q", ()), ("lb_gemm_q_smalln", (7,))):
        with pytest.raises(LuceboxError, match="multiple of 16"):
            lib().call(fn, 268, w.ptr, 257, 5120, w.ptr, *extra, w.ptr, 0, None)
    with pytest.raises(LuceboxError, match="multiple of 16"):
        lib().call("lb_quant_repack", 268, w.ptr, w.ptr, 257, 5120, None)
    # the tiled Q6_K likewise (same bytes as Q6_K)
    assert lib().fn.lb_quant_bytes(270, 257, 5120) == 0 and lib().fn.lb_quant_bytes(270, 272, 5120) == 272 * 20 * 210
    for fn, extra in (("lb_gemv_q", ()), ("lb_gemm_q_smalln", (7,))):
        with pytest.raises(LuceboxError, match="multiple of 16"):
            lib().call(fn, 270, w.ptr, 257, 5120, w.ptr, *extra, w.ptr, 0, None)
    with pytest.raises(LuceboxError, match="multiple of 16"):
        lib().call("lb_quant_repack", 270, w.ptr, w.ptr, 257, 5120, None)


def test_tiled_repack_is_the_host_tiling():
    """lb_quant_repack(268) equals engines/dflash_upload.tile_q4k (the engine's host repack) bit for bit, and its
    GGUF layout is the identity repack of the same bytes."""
    from lucebox_cli.engines.dflash_upload import tile_q4k

    for rows, k in ((16, 256), (304, 256 * 7), (1024, 5120)):
        raw = random_gguf_bytes("Q4_K", rows, k, seed=rows + k).reshape(-1)
        src, dst = Dev.of(raw), Dev(raw.nbytes)
        try:
            lib().call("lb_quant_repack", 268, src.ptr, dst.ptr, rows, k, None)
            got = dst.get(np.uint8, raw.size)
        finally:
            src.close()
            dst.close()
        assert np.array_equal(got, tile_q4k(raw, rows, k)), f"{rows}x{k}"


def test_tiled_q6k_repack_is_the_host_tiling():
    """lb_quant_repack(270) equals engines/dflash_upload.tile_q6k (the engine's host repack) bit for bit, and
    untile_q6k gives the GGUF bytes back."""
    from lucebox_cli.engines.dflash_upload import tile_q6k, untile_q6k

    for rows, k in ((16, 256), (304, 256 * 7), (1024, 5120)):
        raw = random_gguf_bytes("Q6_K", rows, k, seed=rows + k).reshape(-1)
        src, dst = Dev.of(raw), Dev(raw.nbytes)
        try:
            lib().call("lb_quant_repack", 270, src.ptr, dst.ptr, rows, k, None)
            got = dst.get(np.uint8, raw.size)
        finally:
            src.close()
            dst.close()
        assert np.array_equal(got, tile_q6k(raw, rows, k)), f"{rows}x{k}"
        assert np.array_equal(untile_q6k(got, rows, k), raw)


def test_tiled_q6k_matches_q6k():
    """The tiled Q6_K runs Q6_K's arithmetic: n = 1 (gemv_q6_tile_kernel against qmm_kernel<Q6_K>) and n = 7 (the
    register kernel through Traits<Q6_K_T>::piece) agree with the untiled Q6_K up to fp32 summation order."""
    for rows, k, n in ((5120, 17408, 1), (1008, 256 * 7, 1), (1008, 256 * 7, 7), (1008, 256 * 7, 23)):
        wt, _ = case("Q6_K_T", rows, k)
        w, _ = case("Q6_K", rows, k)
        x = np.random.default_rng(9).standard_normal((n, k)).astype(np.float32)
        xd, ya, yb = Dev.of(x), Dev(4 * n * rows), Dev(4 * n * rows)
        try:
            for qid, wd, yd in ((14, w, ya), (270, wt, yb)):
                if n == 1:
                    lib().call("lb_gemv_q", qid, wd.ptr, rows, k, xd.ptr, yd.ptr, 0, None)
                else:
                    lib().call("lb_gemm_q_smalln", qid, wd.ptr, rows, k, xd.ptr, n, yd.ptr, 0, None)
            a, b = ya.get(np.float32, n * rows), yb.get(np.float32, n * rows)
        finally:
            for d in (xd, ya, yb):
                d.close()
        assert np.isfinite(b).all()
        # Same products, different fp32 summation order (the two kernels split K across blocks differently: 6 blocks
        # per SM against 5, stream-K atomics): a random-walk bound of 2·sqrt(K)·2^-24 relative (1.6e-5 at K = 17408,
        # which measured 1.56e-6 on the H200; a 1e-6 bound failed there). A wrong block or scale is O(1).
        # (The tiled n = 1's default, gemv_q6_cols_kernel, keeps q − 32 exact and scales in fp32 instead: not the same
        # products, so only the fp16 rounding of (q − 32)·d·sc bounds the difference; LUCEBOX_Q6_GEMV=xs / old run
        # qmm_item's products.)
        import os

        cols = os.environ.get("LUCEBOX_Q6_GEMV") not in ("xs", "old")
        bound = 5e-4 if n == 1 and cols else 2 * np.sqrt(k) * 2.0**-24
        assert rel_rms(b.astype(np.float64), a.astype(np.float64)) < bound, (rows, k, n)


# n = 1 Q6_K_T runs gemv_q6_cols_kernel by default, gemv_q6_tile_kernel<6, true> (x staged per warp) under
# LUCEBOX_Q6_GEMV=xs and <6, false> under =old (read once per process: each in a child). xs and old feed the same fp16
# products to the mmas in the same order, so at K = 256 (one item, hence one atomicAdd, per output row) they agree
# bit for bit; at larger K up to the fp32 order of the stream-K atomics. The attn_qkv and ffn_down shapes of the 27B
# are included (the LM head's reference is too big).
Q6_XS_SHAPES = [(1008, 256), (1008, 256 * 7), (10240, 5120), (5120, 17408)]


def q6_gemv_outputs() -> dict[str, np.ndarray]:
    out = {}
    for rows, k in Q6_XS_SHAPES:
        w, _ = case("Q6_K_T", rows, k)
        x = np.random.default_rng(rows + k).standard_normal(k).astype(np.float32)
        xd, yd = Dev.of(x), Dev(4 * rows)
        try:
            lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)
            lib().call("lb_gemv_q", ALL_QTYPES["Q6_K_T"], w.ptr, rows, k, xd.ptr, yd.ptr, 0, None)
            out[f"{rows}x{k}"] = yd.get(np.float32, rows)
        finally:
            xd.close()
            yd.close()
    return out


def q6_child(mode: str, flag: str, dump) -> dict[str, np.ndarray]:
    """This file under LUCEBOX_Q6_GEMV=mode with `flag` (a --dump-q6-* option): the arrays it saved."""
    import os
    import subprocess

    env = dict(os.environ, LUCEBOX_Q6_GEMV=mode)
    r = subprocess.run([sys.executable, __file__, flag, str(dump)], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return dict(np.load(dump))


def test_q6_gemv_old_env_same(tmp_path):
    """LUCEBOX_Q6_GEMV=old (gemv_q6_tile_kernel<6, false>) against =xs (x staged per warp), each in a child: both
    right against the float64 reference, bit-identical at K = 256."""
    old = q6_child("old", "--dump-q6-gemv", tmp_path / "q6_old.npz")
    new = q6_child("xs", "--dump-q6-gemv", tmp_path / "q6_xs.npz")
    for rows, k in Q6_XS_SHAPES:
        key = f"{rows}x{k}"
        _, ref = case("Q6_K_T", rows, k)
        want = ref @ np.random.default_rng(rows + k).standard_normal(k).astype(np.float32).astype(np.float64)
        for name, y in (("old", old[key]), ("staged", new[key])):
            assert np.isfinite(y).all(), f"{name} {key}: unwritten/NaN outputs"
            assert rel_rms(y.astype(np.float64), want) < TOL, f"{name} {key}"
        if k == 256:
            assert np.array_equal(old[key].view(np.uint32), new[key].view(np.uint32)), f"{key}: not bit-identical"
        else:
            assert rel_rms(new[key].astype(np.float64), old[key].astype(np.float64)) < 2 * np.sqrt(k) * 2.0**-24, key


# The default n = 1 Q6_K_T kernel, gemv_q6_cols_kernel (one mma column per sub-block and lane), against
# LUCEBOX_Q6_GEMV=xs (the x-staged kernel it replaced, in a child). Odd tile counts and K, one item (K = 256), and the
# 27B's attn_qkv / ffn_down shapes, stored into NaN-poisoned y and accumulated onto a preset y; against the float64
# reference, and against xs: not bit-identical (xs rounds (q − 32)·d·sc to fp16 per weight, cols keeps q − 32 exact
# and scales in fp32), so cols must be at least as close to the reference as xs (same fp16 x in both).
Q6_COLS_SHAPES = [(16, 256), (272, 256 * 3), (304, 256 * 7), (1008, 256), (10240, 5120), (5120, 17408)]


def q6_cols_errors() -> dict[str, float]:
    return {f"{rows}x{k}-{acc}": run_case("Q6_K_T", rows, k, 1, acc) for rows, k in Q6_COLS_SHAPES for acc in (0, 1)}


def test_q6_gemv_cols_default_vs_xs(tmp_path):
    """The default (cols, this process) and LUCEBOX_Q6_GEMV=xs (a child) against the float64 reference and each
    other; the default is not the xs kernel (their K = 256 outputs differ in rounding)."""
    import os

    if os.environ.get("LUCEBOX_Q6_GEMV"):
        pytest.skip("LUCEBOX_Q6_GEMV is set here: the comparison needs the default kernel in this process")
    got = q6_child("xs", "--dump-q6-cols", tmp_path / "q6_xs.npz")
    for rows, k in Q6_COLS_SHAPES:
        for acc in (0, 1):
            key = f"{rows}x{k}-{acc}"
            xs_err = float(got["err-" + key])
            assert xs_err < TOL, f"xs {key}: relative RMS {xs_err:.2e}"
            err = run_case("Q6_K_T", rows, k, 1, acc)  # the default, this process (same x, same weights)
            assert err < TOL, f"cols {key}: relative RMS {err:.2e}"
            if acc == 0 and rows * k >= 16 * 256 * 3:
                assert err <= 1.1 * xs_err + 1e-7, f"cols {key}: {err:.3e} against xs's {xs_err:.3e}"
    xs = {k[len("y-"):]: v for k, v in got.items() if k.startswith("y-")}
    cols = q6_gemv_outputs()
    for key, y in cols.items():
        assert np.isfinite(y).all(), key
        assert rel_rms(y.astype(np.float64), xs[key].astype(np.float64)) < 5e-4, key
    assert not np.array_equal(cols["1008x256"].view(np.uint32), xs["1008x256"].view(np.uint32)), "default is not cols"


def q6_ab_bench(iters: int = 200, rounds: int = 3) -> str:
    """n = 1 Q6_K_T at the 27B's attn_qkv and ffn_down shapes (and the LM head), each LUCEBOX_Q6_GEMV value in its own
    child (the switch is read once per process) through lb_bench_qmm (weight copies rotated past 2× L2, accumulate = 1,
    back-to-back calls), the variants interleaved over `rounds` rounds; the median µs per call."""
    import os
    import subprocess

    shapes = [("attn_qkv", 10240, 5120), ("ffn_down", 5120, 17408), ("lm_head", 248320, 5120)]
    variants = [("cols", ""), ("xs", "xs"), ("old", "old")]
    us: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for vname, val in variants:
            env = dict(os.environ)
            env.pop("LUCEBOX_Q6_GEMV", None)
            if val:
                env["LUCEBOX_Q6_GEMV"] = val
            for name, rows, k in shapes:
                it = max(10, iters // 10) if name == "lm_head" else iters
                r = subprocess.run([sys.executable, __file__, "--bench-one", "Q6_K_T", str(rows), str(k), str(it)],
                                   env=env, capture_output=True, text=True, timeout=600)
                if r.returncode != 0:
                    raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
                line = [ln for ln in r.stdout.splitlines() if ln.startswith("Q6_K_T ")][-1]
                us.setdefault((name, vname), []).append(float(line.split(":")[1].split()[0]))
    out = ["| Q6_K_T n = 1 | MB | " + " | ".join(f"{v} µs (TB/s)" for v, _ in variants) + " | cols / xs |",
           "|---|---|" + "---|" * len(variants) + "---|"]
    for name, rows, k in shapes:
        mb = lib().fn.lb_quant_bytes(270, rows, k) / 1e6
        med = {v: float(np.median(us[(name, v)])) for v, _ in variants}
        cells = " | ".join(f"{med[v]:.2f} ({mb / med[v]:.2f})" for v, _ in variants)
        out.append(f"| {name} {rows}×{k} | {mb:.1f} | {cells} | {med['cols'] / med['xs']:.3f} |")
    out.append("all runs (µs): " + "; ".join(f"{n}/{v}: " + ", ".join(f"{x:.2f}" for x in xs) for (n, v), xs in us.items()))
    return "\n".join(out)


# ---- bandwidth table at the 27B shapes (script mode, or pytest -k bandwidth -s) ------------------

BENCH_SHAPES = [("ffn_gate/up", 17408, 5120), ("ffn_down", 5120, 17408), ("attn_qkv", 10240, 5120),
                ("attn_gate/q", 6144, 5120), ("ssm_out/o", 5120, 6144), ("lm_head", 248320, 5120)]


def bandwidth_rows(peak_gbs: float = 4000.0, ns=(1,), iters: int = 50, types=tuple(QTYPES), tensors=None) -> list[dict]:
    rows = []
    for qt in types:
        qid = ALL_QTYPES[qt]
        for name, n_rows, k in BENCH_SHAPES:
            if (name == "lm_head" and qt not in ("Q6_K", "Q6_K_T", "Q8_0")) or (tensors and name not in tensors):
                continue
            for n in ns:
                ms = ctypes.c_float()
                lib().call("lb_bench_qmm", qid, n_rows, k, n, iters, ctypes.byref(ms))
                nbytes = lib().fn.lb_quant_bytes(qid, n_rows, k)
                gbs = nbytes / (ms.value * 1e-3) / 1e9
                rows.append(dict(qtype=qt, tensor=name, n_rows=n_rows, k=k, n=n, us=ms.value * 1e3, gbs=gbs,
                                 frac=gbs / peak_gbs))
    return rows


def format_table(rows: list[dict]) -> str:
    out = ["| type | tensor | N×K | n | µs | GB/s | % of 4.0 TB/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['qtype']} | {r['tensor']} | {r['n_rows']}×{r['k']} | {r['n']} | {r['us']:.1f} | "
                   f"{r['gbs']:.0f} | {100 * r['frac']:.0f}% |")
    return "\n".join(out)


def test_bandwidth_table():
    rows = bandwidth_rows(iters=20)
    print("\n" + format_table(rows))
    assert all(r["gbs"] > 0 for r in rows)


def _main(argv: list[str]) -> int:
    """Script mode: every case with a one-line verdict, then (with --bench) the bandwidth table;
    --bench-only skips the cases."""
    if "--dump-q6-gemv" in argv:  # test_q6_gemv_old_env_same's children (under LUCEBOX_Q6_GEMV=old, xs)
        np.savez(argv[argv.index("--dump-q6-gemv") + 1], **q6_gemv_outputs())
        return 0
    if "--dump-q6-cols" in argv:  # test_q6_gemv_cols_default_vs_xs's child (under LUCEBOX_Q6_GEMV=xs)
        errs = {f"err-{k}": np.float64(v) for k, v in q6_cols_errors().items()}
        ys = {f"y-{k}": v for k, v in q6_gemv_outputs().items()}
        np.savez(argv[argv.index("--dump-q6-cols") + 1], **errs, **ys)
        return 0
    if "--q6-ab" in argv:  # the default (cols) vs LUCEBOX_Q6_GEMV=xs, old: Q6_K_T n = 1 at the 27B shapes (children)
        rest = argv[argv.index("--q6-ab") + 1 :]
        print(q6_ab_bench(iters=int(rest[0]) if rest and rest[0].isdigit() else 200), flush=True)
        return 0
    failed = 0
    cases = []
    for qt in QTYPES:  # grouped by type so the big references are dequantized once (case() keeps six)
        cases += [(qt, r, k, 1, a) for r, k in GEMV_SHAPES for a in (0, 1)]
        cases += [(qt, *MANY_ITEMS_SHAPE, n, n % 2) for n in MANY_ITEMS_NS]
        cases += [(qt, r, k, n, n % 2) for r, k in SMALLN_SHAPES for n in NS]
    for qt in TILED:
        cases += [(qt, fit_rows(qt, r), k, 1, a) for r, k in GEMV_SHAPES for a in (0, 1)]
        cases += [(qt, *MANY_ITEMS_SHAPE, n, n % 2) for n in MANY_ITEMS_NS]
        cases += [(qt, fit_rows(qt, r), k, n, n % 2) for r, k in SMALLN_SHAPES for n in NS]
    if any(f in argv for f in ("--bench-only", "--bench-one", "--gemv-bench", "--tile-bench", "--tile6-bench")):
        cases = []
    for qt, r, k, n, acc in cases:
        try:
            err = run_case(qt, r, k, n, acc)
            ok = err < TOL
            msg = f"rel RMS {err:.2e}"
        except Exception as exc:  # a script run reports every case, then fails at the end
            ok, msg = False, f"{type(exc).__name__}: {exc}"
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {qt} N{r} K{k} n{n} {'acc' if acc else 'store'}: {msg}", flush=True)
    if "--bench-one" in argv:  # one shape, for a profiler: --bench-one QT ROWS K ITERS [N]
        args = argv[argv.index("--bench-one") + 1 :]
        qt, rows, k, iters = args[:4]
        n = int(args[4]) if len(args) > 4 and args[4].isdigit() else 1
        ms = ctypes.c_float()
        lib().call("lb_bench_qmm", ALL_QTYPES[qt], int(rows), int(k), n, int(iters), ctypes.byref(ms))
        print(f"{qt} {rows}x{k} n = {n}: {1e3 * ms.value:.1f} us", flush=True)
    if "--gemv-bench" in argv:  # the n = 1 rows of the K-quants (and of the tiled Q4_K)
        print(format_table(bandwidth_rows(ns=(1,), types=("Q4_K", "Q4_K_T", "Q5_K", "Q6_K"))), flush=True)
    if "--tile-bench" in argv:  # Q4_K against the tiled Q4_K, n = 1 and the verify's / prefill's widths
        print(format_table(bandwidth_rows(ns=(1, 23, 64), types=("Q4_K", "Q4_K_T"))), flush=True)
    if "--tile6-bench" in argv:  # Q6_K against the tiled Q6_K (n = 1: gemv_q6_tile_kernel against qmm_kernel)
        print(format_table(bandwidth_rows(ns=(1, 8, 23, 64), types=("Q6_K", "Q6_K_T"))), flush=True)
    if "--bench" in argv or "--bench-only" in argv:
        rows = bandwidth_rows(ns=(1,))
        rows += bandwidth_rows(ns=(2, 8, 23, 64), types=("Q4_K",))
        rows += bandwidth_rows(ns=(2, 8, 23, 64), types=("Q5_K", "Q6_K", "Q8_0"), tensors=("ffn_down",))
        print(format_table(rows), flush=True)
    print(f"{failed} failed of {len(cases)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
