"""lb_gemv_q_norm and lb_gemv_q_clear (cuda/ops/gemv_q_fold.cu), against the calls they replace in a decode step.

lb_gemv_q_norm(x) against lb_df_rmsnorm(x) then lb_gemv_q on its output, on the same device weights (random GGUF
blocks through lb_quant_repack, as test_quant_gemv.py makes them) and an x past fp16's range (the fold must normalize
before rounding to fp16). Both round the same normed values to fp16 for the mma;
they differ only in fp32 summation order: the stream-K atomics (two calls of either differ by ~1e-7) and the sum of
squares (each block of the fold sums x in its own order, so r can differ from the norm kernel's in its last bit, which
moves an fp16 rounding of h now and then: ~3 of 5120 elements by one fp16 ulp, 2^-11 of that element, about
sqrt(3)·2^-11 / sqrt(5120) ≈ 1.2e-5 of the output's RMS). TOL_SAME = 1e-4 holds that with room and is ten times
below the 1e-3 both are held to against the float64 product (checked too).
lb_gemv_q_clear: the product of lb_gemv_q (rel 1e-6: atomics order only) for every qtype lb_gemv_q takes, and its
zero range: zero inside, the poison pattern untouched on both sides (ranges with 0..3-float tails, a 16-byte one, a
logits row of the 27B's vocabulary), at K multiples of 256 including 5120 and 17408 (the 27B's ffn_down). Outputs
start NaN-poisoned (accumulate = 0) or at a finite vector that is subtracted again (accumulate = 1).
An engine check: a tiny model whose every group folds (Hv = 16: the DeltaNet's 16-row alpha / beta tile, as the
27B's 48 do) against the CPU engine, and its decode steps with LUCEBOX_NORM_FOLD=0 against those with the fold.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_gemv_norm.py [--bench]` (--bench: µs per
norm-fed group of the 27B step, norm + GEMV against the fold, in CUDA graphs).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit"), str(Path(__file__).resolve().parent)]

from gpu_lib import pytest  # noqa: E402
from test_quant_gemv import ALL_QTYPES, TOL, Dev, case, fit_rows, lib, rel_rms  # noqa: E402

pytestmark = pytest.mark.gpu

TOL_SAME = 1e-4
EPS = 1e-6
POISON = np.float32(7.25)  # the pattern around a zero range (a NaN would not compare)
FOLD_TYPES = ("Q4_K_T", "Q6_K_T")
# rows (whole 16-row tiles) x k: the 27B's beta / alpha (48 rows: fewer items than blocks), an odd tile count and
# 256-block count, one 256-block, the largest k the norm form takes, the 27B's attention k / v (1024 rows), q (12288)
# and an FFN matrix (17408: blocks' windows of 256-blocks start mid-row and wrap), and 65536 x 512 (more items per
# block than 256-blocks per row: every block stages all of x)
NORM_SHAPES = [(48, 5120), (304, 256 * 7), (272, 256), (2064, 8192), (1024, 5120), (12288, 5120), (17408, 5120),
               (65536, 512)]
# the clear form's products, at the k of every decode GEMV that writes the residual (ssm_out 6144, attn_output
# 6144, ffn_down 17408) and of the input projections
CLEAR_SHAPES = [(304, 5120), (5120, 17408), (1040, 6144), (1024, 256 * 7)]


def residual_x(k: int, seed: int) -> np.ndarray:
    """A row half past fp16's range (std 1e5; fp16 ends at 65504), so that a fold rounding x to fp16 before
    normalizing it would overflow, with two outliers of ten sigma (the 27B's residual has a few such channels)."""
    rng = np.random.default_rng(seed)
    x = (1.0e5 * rng.standard_normal(k)).astype(np.float32)
    x[[k // 3, k - 5]] = [1.0e6, -1.0e6]
    return x


def norm_w(k: int, seed: int) -> np.ndarray:
    """RMSNorm1p weights with the +1 in (as the engine uploads them)."""
    return (1.0 + 0.2 * np.random.default_rng(seed).standard_normal(k)).astype(np.float32)


def gemv(name: str, *args) -> None:
    lib().call(name, *args)


def test_fold_forms_are_there():
    assert hasattr(lib().fn, "lb_gemv_q_norm") and hasattr(lib().fn, "lb_gemv_q_clear")


# (the top decorator varies fastest: a shape's weights are made once, test_quant_gemv.case keeps six)
@pytest.mark.parametrize("accumulate", [0, 1], ids=["store", "accumulate"])
@pytest.mark.parametrize("qt", FOLD_TYPES)
@pytest.mark.parametrize("rows,k", NORM_SHAPES, ids=[f"N{r}-K{k}" for r, k in NORM_SHAPES])
def test_gemv_norm_equals_norm_then_gemv(qt, rows, k, accumulate):
    w, ref = case(qt, rows, k)
    x, nw = residual_x(k, rows + k), norm_w(k, k)
    y0 = np.random.default_rng(rows).standard_normal(rows).astype(np.float32)
    xd, wd, hd = Dev.of(x), Dev.of(nw), Dev(4 * k)
    yd, yr = (Dev.of(y0), Dev.of(y0)) if accumulate else (Dev(4 * rows), Dev(4 * rows))
    try:
        for d in ((yd, yr) if not accumulate else ()) + (hd,):
            lib().call("lb_dev_memset", d.ptr, 0xFF, d.nbytes)  # NaN: an unwritten output shows
        gemv("lb_gemv_q_norm", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, wd.ptr, EPS, yd.ptr, accumulate, None, 0, None)
        lib().call("lb_df_rmsnorm", xd.ptr, wd.ptr, hd.ptr, 1, k, EPS, None, 0, None, 0, None)
        gemv("lb_gemv_q", ALL_QTYPES[qt], w.ptr, rows, k, hd.ptr, yr.ptr, accumulate, None)
        got, want = yd.get(np.float32, rows), yr.get(np.float32, rows)
    finally:
        for d in (xd, wd, hd, yd, yr):
            d.close()
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} unwritten / NaN outputs"
    base = y0.astype(np.float64) if accumulate else 0.0
    got, want = got.astype(np.float64) - base, want.astype(np.float64) - base
    err = rel_rms(got, want)
    assert err < TOL_SAME, f"{qt} N{rows} K{k}: vs norm + gemv, relative RMS {err:.2e}"
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt(np.mean(x64**2) + EPS) * nw
    err64 = rel_rms(got, ref @ h)
    assert err64 < TOL, f"{qt} N{rows} K{k}: vs the float64 product, relative RMS {err64:.2e}"


def clear_target(nbytes: int, off: int) -> tuple[Dev, int]:
    """A poisoned buffer with 64 bytes of margin around a range of nbytes starting `off` bytes in (16-aligned)."""
    buf = Dev.of(np.full((off + nbytes + 64) // 4, POISON, np.float32))
    return buf, buf.ptr.value + off


def check_clear(buf: Dev, off: int, nbytes: int, what: str) -> None:
    got = buf.get(np.float32, buf.nbytes // 4)
    lo, hi = off // 4, (off + nbytes) // 4
    assert not got[lo:hi].any(), f"{what}: {int(np.count_nonzero(got[lo:hi]))} floats of the range not zeroed"
    assert (got[:lo] == POISON).all() and (got[hi:] == POISON).all(), f"{what}: a float outside the range changed"


# the range: 16-byte units plus a 0..3-float tail, one unit alone, and a logits row of the 27B (248320 floats)
CLEAR_BYTES = [4096, 4100, 4104, 4108, 16, 248320 * 4]


@pytest.mark.parametrize("accumulate", [0, 1], ids=["store", "accumulate"])
@pytest.mark.parametrize("qt", list(ALL_QTYPES))
@pytest.mark.parametrize("rows,k", CLEAR_SHAPES, ids=[f"N{r}-K{k}" for r, k in CLEAR_SHAPES])
def test_gemv_clear(qt, rows, k, accumulate):
    """lb_gemv_q_clear = lb_gemv_q plus the zero range, for every qtype (the tiled ones in the kernel, the others by
    a memset), with the range's tail varied by shape."""
    rows = fit_rows(qt, rows)
    w, _ = case(qt, rows, k)
    nbytes = CLEAR_BYTES[(rows + k + accumulate) % len(CLEAR_BYTES)]
    x = np.random.default_rng(k).standard_normal(k).astype(np.float32)
    y0 = np.random.default_rng(rows).standard_normal(rows).astype(np.float32)
    xd = Dev.of(x)
    yd, yr = (Dev.of(y0), Dev.of(y0)) if accumulate else (Dev(4 * rows), Dev(4 * rows))
    buf, at = clear_target(nbytes, 48)
    try:
        if not accumulate:
            for d in (yd, yr):
                lib().call("lb_dev_memset", d.ptr, 0xFF, d.nbytes)
        gemv("lb_gemv_q_clear", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, yd.ptr, accumulate, at, nbytes, None)
        gemv("lb_gemv_q", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, yr.ptr, accumulate, None)
        got, want = yd.get(np.float32, rows), yr.get(np.float32, rows)
        check_clear(buf, 48, nbytes, f"{qt} N{rows} K{k}")
    finally:
        for d in (xd, yd, yr, buf):
            d.close()
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} unwritten / NaN outputs"
    base = y0.astype(np.float64) if accumulate else 0.0
    err = rel_rms(got.astype(np.float64) - base, want.astype(np.float64) - base)
    assert err < 1e-6, f"{qt} N{rows} K{k}: vs lb_gemv_q, relative RMS {err:.2e}"


@pytest.mark.parametrize("qt", FOLD_TYPES)
@pytest.mark.parametrize("nbytes", CLEAR_BYTES, ids=[f"B{b}" for b in CLEAR_BYTES])
def test_gemv_norm_clears_its_range(qt, nbytes):
    """The norm form's zero range (the engine does not use it; the ABI offers it): zero inside, untouched around,
    and the product as without a range."""
    rows, k = 1040, 5120
    w, _ = case(qt, rows, k)
    x, nw = residual_x(k, 3), norm_w(k, 4)
    xd, wd, yd, yr = Dev.of(x), Dev.of(nw), Dev(4 * rows), Dev(4 * rows)
    buf, at = clear_target(nbytes, 16)
    try:
        gemv("lb_gemv_q_norm", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, wd.ptr, EPS, yd.ptr, 0, at, nbytes, None)
        gemv("lb_gemv_q_norm", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, wd.ptr, EPS, yr.ptr, 0, None, 0, None)
        err = rel_rms(yd.get(np.float32, rows).astype(np.float64), yr.get(np.float32, rows).astype(np.float64))
        check_clear(buf, 16, nbytes, f"{qt} {nbytes} B")
    finally:
        for d in (xd, wd, yd, yr, buf):
            d.close()
    assert err < 1e-6


def test_refusals():
    """The norm form takes the tiled types and k <= 8192 only; clear ranges must be aligned and apart from x, y, w."""
    from lucebox_cli.engines import _lib

    fn = lib().fn
    w, _ = case("Q4_K_T", 304, 256 * 7)
    xd, wd, yd = Dev(4 * 256 * 7), Dev(4 * 256 * 7), Dev(4 * 304)
    try:
        args = lambda qt: (qt, w.ptr, 304, 256 * 7, xd.ptr, wd.ptr, EPS, yd.ptr, 1)  # noqa: E731
        assert fn.lb_gemv_q_norm(*args(12), None, 0, None) == _lib.LB_ERR_UNSUPPORTED
        assert fn.lb_gemv_q_norm(*args(268), yd.ptr, 16, None) == _lib.LB_ERR_INVALID_ARG  # clears its own y
        assert fn.lb_gemv_q_norm(*args(268), xd.ptr.value + 4, 16, None) == _lib.LB_ERR_INVALID_ARG
        assert fn.lb_gemv_q_clear(268, w.ptr, 304, 256 * 7, xd.ptr, yd.ptr, 1, xd.ptr, 64, None) == \
            _lib.LB_ERR_INVALID_ARG
    finally:
        for d in (xd, wd, yd):
            d.close()


def all_fold_gguf() -> Path:
    """A tiny Q4_K_M model (tests/unit/dflash_tiny.py) whose every group folds: Hv = 16 (hv_ratio 8)."""
    import os

    from dflash_tiny import make_tiny_q4km

    folder = Path(os.environ.get("LUCEBOX_DFLASH_GGUF_DIR", ROOT / ".gl" / "dflash"))
    folder.mkdir(parents=True, exist_ok=True)
    return make_tiny_q4km(folder / "tiny4-hv16", n_layers=4, hv_ratio=8, vocab=4096)


def engine_steps(monkeypatch, fold: str, ids, toks: list[int]):
    """Prefill ids, then one decode step per token of toks (scratch NaN-poisoned before each): the logits, and the
    engine's fold plan for a decode step."""
    from lucebox_cli.engines.dflash import DFlashTargetEngine
    from lucebox_cli.engines.dflash_layers import Pass

    monkeypatch.setenv("LUCEBOX_NORM_FOLD", fold)
    eng = DFlashTargetEngine(all_fold_gguf(), max_context=512, budget=22, lib=lib())
    try:
        assert eng.info["norm_fold"] == (fold == "1")
        out = [eng.prefill(ids)]
        for tok in toks:
            eng.poison()
            out.append(eng.step(tok))
        return out, eng._layers.fold_plan(Pass("step", 1, 0))
    finally:
        eng.close()


def test_engine_fold_on_off_and_cpu(monkeypatch):
    """Every group but layer 0's mixer folded (the 27B's plan): decode-step logits within the engine tests' 1e-2 of
    the CPU engine, and within 2e-3 of the same steps with LUCEBOX_NORM_FOLD=0 (two identical sessions already
    differ by ~5e-4 here: test_dflash_engine.assert_same_or_near_tie). The steps feed the CPU engine's greedy tokens
    to all three, so a near tie cannot send them down different paths."""
    from lucebox_cli.engines.cpu import CPUEngine
    from lucebox_cli.gguf_io import GGUFModel
    from lucebox_cli.models.qwen35 import expected_tensors
    from lucebox_cli.models.qwen35_gguf import read_model_config

    ids = np.random.default_rng(9).integers(0, 4096, 33)
    model = GGUFModel(all_fold_gguf())
    cfg = read_model_config(model)
    cpu = CPUEngine(cfg, {n: np.array(model.dequant(n)) for n in expected_tensors(cfg)}, max_context=512)
    ref = [cpu.prefill(ids)]
    toks = []
    for _ in range(12):
        toks.append(int(np.argmax(ref[-1])))
        ref.append(cpu.step(toks[-1]))
    on, plan = engine_steps(monkeypatch, "1", ids, toks)
    assert plan is not None and not plan.mixer[0] and all(plan.mixer[1:]) and all(plan.mlp) and plan.head
    off, plan_off = engine_steps(monkeypatch, "0", ids, toks)
    assert plan_off is None
    for j, (a, b, c) in enumerate(zip(on, off, ref)):
        assert np.isfinite(a).all(), f"call {j}: NaN / Inf logits"
        assert rel_rms(a.astype(np.float64), c.astype(np.float64)) < 1e-2, f"call {j}: fold vs CPU"
        assert rel_rms(a.astype(np.float64), b.astype(np.float64)) < 2e-3, f"call {j}: fold on vs off"


# The 27B decode step's norm-fed groups (rows of the merged GEMVs, k = 5120) for --bench.
BENCH_GROUPS = [("FFN gate+up", "Q4_K_T", 2 * 17408), ("DeltaNet qkv+z+beta+alpha", "Q4_K_T", 10240 + 6144 + 96),
                ("attn q+k", "Q4_K_T", 12288 + 1024), ("attn v", "Q6_K_T", 1024), ("LM head", "Q6_K_T", 248320)]


def bench(iters: int = 100, k: int = 5120) -> list[tuple[str, float, float]]:
    """µs per group, in a CUDA graph of `iters` groups over weight copies rotated past 2x L2 (random weights): the
    step's form before the fold (lb_df_rmsnorm clearing the outputs, then lb_gemv_q on h) against lb_gemv_q_norm
    (its clear done by the GEMV before it: nothing here). Host wall time of a graph launch and sync, over 3 launches
    after one warm-up; the graph gaps are in both."""
    import time

    fn, out = lib().fn, []
    stream = ctypes.c_void_p()
    lib().call("lb_stream_create", ctypes.byref(stream))
    x, nw = Dev.of(residual_x(k, 1)), Dev.of(norm_w(k, 2))
    h = Dev(4 * k)
    try:
        for name, qt, rows in BENCH_GROUPS:
            qtype = ALL_QTYPES[qt]
            nbytes = fn.lb_quant_bytes(qtype, rows, k)
            copies = max(2, min(32, (2 * 60 << 20) // nbytes + 1))
            ws = [Dev(nbytes) for _ in range(copies)]
            y = Dev(4 * rows)
            lib().call("lb_dev_memset", y.ptr, 0, y.nbytes)
            for i, w in enumerate(ws):
                lib().call("lb_quant_fill_random", qtype, w.ptr, rows, k, 1234 + i, None)
            times = []
            for fold in (False, True):
                lib().call("lb_graph_begin", stream)
                for i in range(iters):
                    w = ws[i % copies].ptr
                    if fold:
                        lib().call("lb_gemv_q_norm", qtype, w, rows, k, x.ptr, nw.ptr, EPS, y.ptr, 1, None, 0, stream)
                    else:
                        lib().call("lb_df_rmsnorm", x.ptr, nw.ptr, h.ptr, 1, k, EPS, y.ptr, y.nbytes, None, 0, stream)
                        lib().call("lb_gemv_q", qtype, w, rows, k, h.ptr, y.ptr, 1, stream)
                exe = ctypes.c_void_p()
                lib().call("lb_graph_end", stream, ctypes.byref(exe))
                lib().call("lb_graph_launch", exe, stream)
                lib().call("lb_dev_sync")
                t0 = time.perf_counter()
                for _ in range(3):
                    lib().call("lb_graph_launch", exe, stream)
                lib().call("lb_dev_sync")
                times.append((time.perf_counter() - t0) / (3 * iters) * 1e6)
                lib().call("lb_graph_destroy", exe)
            out.append((f"{name} ({qt} {rows}x{k})", times[0], times[1]))
            for d in ws + [y]:
                d.close()
    finally:
        for d in (x, nw, h):
            d.close()
        lib().call("lb_stream_destroy", stream)
    return out


if __name__ == "__main__":
    if "--bench" in sys.argv:  # python tests/gpu/test_gemv_norm.py --bench: µs per group, both forms
        print("| group | norm + gemv µs | gemv_q_norm µs | saved µs |\n|---|---|---|---|")
        for name, a, b in bench():
            print(f"| {name} | {a:.2f} | {b:.2f} | {a - b:.2f} |", flush=True)
        sys.exit(0)
    sys.exit(pytest.main([__file__, "-q"]) if hasattr(pytest, "main") else 0)
