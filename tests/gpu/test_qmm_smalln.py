"""The x-staged small-N kernel (cuda/common/qmm_smalln.cuh, lb_gemm_q_smalln at n = 2..64; n = 33..64 is
"small-N v2", shipped as select 8's shape G since its first H200 run) against the float64
reference of test_quant_gemv.py, in every launch shape lb_qmm_smalln_select offers (and the register kernel it
replaces, as a control).

Every type, odd row counts, K a multiple of 256 with an odd block count, each column-tile width at its edges
(n = 2, 7, 9, 16, 23, 24, 31, 32), accumulate 0 (output NaN-poisoned first: an unwritten element stays NaN) and
1 (output preset to a random vector), plus shapes with several items per block (flushes mid-range, both x
buffers, row-group wrap). Results of the stream-K atomics are compared by relative RMS error, like the others.
Q4_K and Q4_K_T at n = 2..32 ship small-N v5 (select 0) since session 9; select 13 keeps the pre-v5 kernel, and the
sweep covers both; selects 14..16 are small-N v6 for Q6_K_T (opt-in), in three launch shapes.

Script mode: `python tests/gpu/test_qmm_smalln.py [--bench | --bench-tiled | --bench-v5 | --bench-v6]`; --bench-v5
prints the shipped kernel (v5) against the pre-v5 one (select 13) on Q4_K_T / Q4_K; --bench-v6 the Q6_K_T selects 14..16
against the shipped kernel; --bench-tiled every select that applies to the tiled layouts at the verify's n = 23; --bench
prints n = 64 (register kernel vs each v2 shape) on the 27B shapes and n = 33..57 at ffn_down, then n = 1 vs n = 23
(every kernel) on the 27B shapes, and the other widths at ffn_down.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np

from gpu_lib import pytest
from test_quant_gemv import ALL_QTYPES, QTYPES, TOL, Dev, case, fit_rows, lib, rel_rms

pytestmark = pytest.mark.gpu

# lb_qmm_smalln_select: 0 shipped, 1 register kernel (qmm.cuh), 2..7 staged shapes A..F at n <= 32 (the pre-v5 map
# for Q4_K); 8..11 the staged kernel at n = 33..64 ("small-N v2", shapes G, H; NT 6 up to n = 48 under 8/9, NT 8 always
# under 10/11); 12 the shipped choice (small-N v5 while it was opt-in, session 8); 13 the pre-v5 kernel for Q4_K and
# Q4_K_T at n = 2..32 and the pre-v6 kernel for Q6_K_T (what shipped before session 9); 14, 15, 16 "small-N v6" for
# Q6_K_T at n = 2..32 in launch shape D 1x8, B 2x4 and D with three blocks an SM (the shipped choice takes the fastest
# of them per width); the shipped choice for every other type and width under 12..16
SELECT = {0: "shipped", 1: "register", 2: "staged A 2x8", 3: "staged B 2x4", 4: "staged C 1x16", 5: "staged D 1x8",
          6: "staged E 2x4 split", 7: "staged F 2x8 split"}
WIDE_SELECT = {8: "v2 G 2x8", 9: "v2 H 1x16", 10: "v2 G 2x8 NT8", 11: "v2 H 1x16 NT8"}
V5_SELECT = {12: "v5 (12)", 13: "pre-v5 (13)"}
V6_SELECT = {14: "v6 D 1x8 (14)", 15: "v6 B 2x4 (15)", 16: "v6 D 1x8 x3 (16)"}
SELECT_MAX = 16
PRE_V5 = 13
NS = [2, 7, 9, 16, 23, 24, 31, 32]
# n = 33..64: each NT 6 / NT 8 edge and the prefill's 64
WIDE_NS = [33, 41, 48, 57, 64]
# (301, 7 blocks): one item per block, partial last row group; (4099, 16 blocks): 2-4 items per block in every
# shape (272 / 528 items on 132-396 blocks), so blocks flush mid-range and use both x buffers.
SHAPES = [(301, 256 * 7), (4099, 256 * 16)]
# the 27B FFN shape: ~10 items per block, several row-group wraps per block
MANY_ITEMS_SHAPE = (17408, 5120)
NAMES = {**SELECT, **WIDE_SELECT, **V5_SELECT, **V6_SELECT}


def select(which: int) -> None:
    lib().call("lb_qmm_smalln_select", which)


def initial_select() -> int:
    """The select the library started at: LUCEBOX_QMM_SMALLN_SELECT as gemm_q_smalln.cu reads it (0 unless an integer
    in 0..SELECT_MAX). Every test here puts it back when done, so that a gpu run under the knob (an A/B of the engine
    tests) keeps it in the files after this one."""
    v = os.environ.get("LUCEBOX_QMM_SMALLN_SELECT", "")
    return int(v) if v.isdigit() and int(v) <= SELECT_MAX else 0


def restore() -> None:
    select(initial_select())


def errors(qt: str, rows: int, k: int, ns, selects) -> list[tuple[int, int, int, float]]:
    """(select, n, accumulate, relative RMS error) of every combination; the reference product is computed once
    per n. Raises on an unwritten (NaN) output."""
    w, ref = case(qt, rows, k)
    out = []
    try:
        for n in ns:
            rng = np.random.default_rng(2000 + n)
            x = rng.standard_normal((n, k)).astype(np.float32)  # column-major X[k, n]: vector j contiguous
            y0 = rng.standard_normal((n, rows)).astype(np.float32)
            prod = x.astype(np.float64) @ ref.T
            xd = Dev.of(x)
            try:
                for sel in selects:
                    select(sel)
                    for acc in (0, 1):
                        yd = Dev.of(y0) if acc else Dev(4 * n * rows)
                        try:
                            if not acc:
                                lib().call("lb_dev_memset", yd.ptr, 0xFF, yd.nbytes)  # NaN everywhere
                            lib().call("lb_gemm_q_smalln", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, acc, None)
                            got = yd.get(np.float32, n * rows).reshape(n, rows).astype(np.float64)
                        finally:
                            yd.close()
                        bad = int((~np.isfinite(got)).sum())
                        assert not bad, f"{qt} N{rows} K{k} n={n} {NAMES[sel]} acc={acc}: {bad} NaN/unwritten outputs"
                        out.append((sel, n, acc, rel_rms(got - y0 if acc else got, prod)))
            finally:
                xd.close()
    finally:
        restore()
    return out


def check(qt, rows, k, ns, selects):
    errs = errors(qt, rows, k, ns, selects)
    bad = [f"{NAMES[s]} n={n} acc={a}: {e:.2e}" for s, n, a, e in errs if not e < TOL]
    assert not bad, f"{qt} N{rows} K{k}: relative RMS over {TOL}: " + "; ".join(bad)


@pytest.mark.parametrize("qt", list(QTYPES))
@pytest.mark.parametrize("rows,k", SHAPES, ids=[f"N{r}-K{k}" for r, k in SHAPES])
def test_staged_smalln(qt, rows, k):
    check(qt, rows, k, NS, [*SELECT, *V5_SELECT])


@pytest.mark.parametrize("qt", list(QTYPES))
def test_staged_smalln_many_items(qt):
    check(qt, *MANY_ITEMS_SHAPE, [9, 23, 32], [0, 2, 3, 4, 5, 6, 7, *V5_SELECT])


# small-N v2: n = 33..64 through the staged kernel (every new select value and select 0, which ships shape G
# there), the register kernel (select 1) as the control; the n <= 32 widths under the new values must still be
# the shipped choice.
@pytest.mark.parametrize("qt", list(QTYPES))
@pytest.mark.parametrize("rows,k", SHAPES, ids=[f"N{r}-K{k}" for r, k in SHAPES])
def test_staged_wide(qt, rows, k):
    check(qt, rows, k, WIDE_NS, [0, 1, *WIDE_SELECT])


@pytest.mark.parametrize("qt", list(QTYPES))
def test_staged_wide_many_items(qt):
    check(qt, *MANY_ITEMS_SHAPE, [41, 64], list(WIDE_SELECT))


def test_wide_selects_keep_small_n_shipped():
    check("Q4_K", 301, 256 * 7, [2, 23, 32], list(WIDE_SELECT))


# small-N v5 (the shipped kernel, select 0; 12 is the same) against the pre-v5 kernel (13): Q4_K and the tiled Q4_K at
# every n = 2..32 (each column-tile count at its edges and between), the odd shapes (partial last row group; several
# items per block, both x buffers) and the 27B FFN shape (many items per block, row-group wraps); n = 1 and n = 33..64
# under 12..16 are the shipped choice.
V5_NS = [2, 3, 5, 7, 8, 9, 12, 16, 17, 20, 23, 24, 25, 29, 31, 32]


@pytest.mark.parametrize("qt", ["Q4_K", "Q4_K_T"])
@pytest.mark.parametrize("rows,k", SHAPES + [MANY_ITEMS_SHAPE], ids=[f"N{r}-K{k}" for r, k in SHAPES + [MANY_ITEMS_SHAPE]])
def test_v5_smalln(qt, rows, k):
    ns = V5_NS if rows * k < 10**7 else [2, 9, 23, 32]
    check(qt, fit_rows(qt, rows), k, ns, [0, *V5_SELECT])


@pytest.mark.parametrize("qt", ["Q4_K", "Q4_K_T", "Q6_K", "Q6_K_T"])
def test_new_selects_keep_other_widths_shipped(qt):
    ns = [1, 33, 64] if qt in ("Q4_K", "Q4_K_T", "Q6_K_T") else [1, 9, 23, 33]
    check(qt, fit_rows(qt, 301), 256 * 7, ns, [*V5_SELECT, *V6_SELECT])


# The tiled Q4_K (qtype 268) runs the shipped shapes only (the launch-shape selects do not apply to it): every width
# n = 2..64 at the shapes above with rows rounded up to whole 16-row tiles, and the 27B FFN shape, under the shipped
# kernel, the pre-v5 one and a Q6_K_T-only select.
@pytest.mark.parametrize("rows,k", SHAPES + [MANY_ITEMS_SHAPE], ids=[f"N{r}-K{k}" for r, k in SHAPES + [MANY_ITEMS_SHAPE]])
def test_tiled_q4k_shipped(rows, k):
    check("Q4_K_T", fit_rows("Q4_K_T", rows), k, NS + WIDE_NS, [0, PRE_V5, 14])


# The tiled Q6_K (qtype 270) likewise: Q6_K's shipped choices (the register kernel through Traits<Q6_K_T>::piece at
# n <= 8, shape D at 9..32, G above), every width, rows rounded up to whole tiles, and the 27B ffn_down shape.
@pytest.mark.parametrize("rows,k", SHAPES + [(5120, 17408)], ids=[f"N{r}-K{k}" for r, k in SHAPES + [(5120, 17408)]])
def test_tiled_q6k_shipped(rows, k):
    check("Q6_K_T", fit_rows("Q6_K_T", rows), k, NS + WIDE_NS, [0])


# small-N v6 (selects 14..16) on the tiled Q6_K at every n = 2..32: the odd shapes (a partial last row group of the
# 2x4 shape: 304 rows are 19 tiles; several items per block), the 27B ffn_down (many items per block, row-group wraps)
# and attn_qkv shapes.
V6_SHAPES = SHAPES + [(5120, 17408), (10240, 5120)]


@pytest.mark.parametrize("rows,k", V6_SHAPES, ids=[f"N{r}-K{k}" for r, k in V6_SHAPES])
def test_v6_smalln(rows, k):
    ns = V5_NS if rows * k < 10**7 else [2, 9, 23, 32]
    # 0: the shipped choice (v6 in its per-width shape since session 9), 13: the pre-v6 kernel
    check("Q6_K_T", fit_rows("Q6_K_T", rows), k, ns, [0, PRE_V5, *V6_SELECT])


# lb_gemm_q_smalln_seg: one tensor's rows sent to up to four outputs (the engine's back-to-back projections at
# t > 1). Segments of odd sizes that cut row groups mid-way; n across the staged (n <= 32) and wide (33..64)
# shapes it instantiates; outputs NaN-poisoned (accumulate 0) or preset (accumulate 1).
SEGS = [(301, 256 * 7, [100, 48, 48, 105]), (4099, 256 * 16, [3000, 1099]), (17408, 5120, [6144, 48, 48, 11168])]


@pytest.mark.parametrize("sel", [0, PRE_V5], ids=["shipped", "pre-v5"])  # (Q4_K, Q4_K_T at n <= 32: v5 / pre-v5)
@pytest.mark.parametrize("qt", ["Q4_K", "Q5_K", "Q4_K_T"])  # the types whose consecutive tensors are one block stream
@pytest.mark.parametrize("rows,k,parts", SEGS, ids=[f"N{r}-{len(p)}seg" for r, _, p in SEGS])
def test_segmented_outputs(qt, rows, k, parts, sel):
    if sel and qt == "Q5_K":
        pytest.skip("select 13 changes nothing for Q5_K")
    select(sel)
    try:
        segmented_case(qt, rows, k, parts)
    finally:
        restore()


def segmented_case(qt, rows, k, parts):
    if fit_rows(qt, rows) != rows:  # the tiled layout: the last segment grows to whole 16-row tiles
        parts = [*parts[:-1], parts[-1] + fit_rows(qt, rows) - rows]
        rows = fit_rows(qt, rows)

    w, ref = case(qt, rows, k)
    starts = np.cumsum([0, *parts])
    for n in (2, 7, 23, 41, 64) if rows < 10000 else (23, 64):  # the 27B shape: the verify's and prefill's n
        rng = np.random.default_rng(3000 + n)
        x = rng.standard_normal((n, k)).astype(np.float32)
        prod = x.astype(np.float64) @ ref.T  # [n, rows]
        xd = Dev.of(x)
        try:
            for acc in (0, 1):
                y0 = [rng.standard_normal((n, r)).astype(np.float32) for r in parts]
                yd = [Dev.of(y) if acc else Dev(4 * n * r) for y, r in zip(y0, parts)]
                try:
                    if not acc:
                        for d in yd:
                            lib().call("lb_dev_memset", d.ptr, 0xFF, d.nbytes)  # NaN everywhere
                    seg_rows = (ctypes.c_int32 * len(parts))(*parts)
                    outs = (ctypes.c_void_p * len(parts))(*[d.ptr.value for d in yd])
                    lib().call("lb_gemm_q_smalln_seg", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, len(parts),
                               ctypes.addressof(seg_rows), ctypes.addressof(outs), acc, None)
                    for i, (d, r) in enumerate(zip(yd, parts)):
                        got = d.get(np.float32, n * r).reshape(n, r).astype(np.float64)
                        want = prod[:, starts[i] : starts[i + 1]]
                        assert np.isfinite(got).all(), f"{qt} n={n} acc={acc} segment {i}: unwritten outputs"
                        err = rel_rms(got - y0[i] if acc else got, want)
                        assert err < TOL, f"{qt} N{rows} n={n} acc={acc} segment {i}: relative RMS {err:.2e}"
                finally:
                    for d in yd:
                        d.close()
        finally:
            xd.close()


# LUCEBOX_QMM_SMALLN_SELECT=<select> (read once when the library loads) is the initial select: a child process under
# it must compute what this one computes under lb_qmm_smalln_select(<select>), bit for bit. The case is deterministic
# (one 256-block: every output gets one atomic add onto zeros) and tells the shipped kernel (v5) from the pre-v5 one.
ENV_CASE = ("Q4_K_T", 256, 256, 23)


def env_case_output() -> np.ndarray:
    """y of ENV_CASE's one call under the current select."""
    qt, rows, k, n = ENV_CASE
    w, _ = case(qt, rows, k)
    x = np.random.default_rng(77).standard_normal((n, k)).astype(np.float32)
    xd, yd = Dev.of(x), Dev(4 * n * rows)
    try:
        lib().call("lb_gemm_q_smalln", ALL_QTYPES[qt], w.ptr, rows, k, xd.ptr, n, yd.ptr, 0, None)
        return yd.get(np.float32, n * rows)
    finally:
        for d in (xd, yd):  # w belongs to case()'s cache: closing it left the next call a NULL pointer
            d.close()


def selected_output(sel: int) -> np.ndarray:
    select(sel)
    try:
        return env_case_output()
    finally:
        restore()


@pytest.mark.parametrize("value,expect", [(str(PRE_V5), PRE_V5), ("0", 0), ("13x", 0), ("99", 0)],
                         ids=["13", "0", "not-a-number", "out-of-range"])
def test_env_select(value, expect, tmp_path):
    out = tmp_path / "y.npy"
    env = dict(os.environ, LUCEBOX_QMM_SMALLN_SELECT=value)
    r = subprocess.run([sys.executable, __file__, "--dump-env-case", str(out)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    child = np.load(out)
    want, other = selected_output(expect), selected_output(0 if expect else PRE_V5)
    assert not np.array_equal(want, other), "v5 and pre-v5 agree bit for bit: the case cannot tell the selects apart"
    assert np.array_equal(child, want), f"LUCEBOX_QMM_SMALLN_SELECT={value}: the library did not start at {expect}"
    ignored = f"LUCEBOX_QMM_SMALLN_SELECT={value} ignored" in r.stderr
    assert ignored == (value in ("13x", "99")), r.stderr[-2000:]


def test_select_rejects_unknown():
    from lucebox_cli.errors import LuceboxError

    with pytest.raises(LuceboxError, match=f"0..{SELECT_MAX}"):
        select(SELECT_MAX + 1)
    with pytest.raises(LuceboxError):
        select(-1)


# ---- bench (script mode) ---------------------------------------------------------------------------

BENCH_SHAPES = [("ffn_gate/up", 17408, 5120), ("ffn_down", 5120, 17408), ("attn_qkv", 10240, 5120),
                ("ssm_out/o", 5120, 6144)]


def bench_us(qt: str, rows: int, k: int, n: int, sel: int, iters: int = 50) -> float:
    select(sel)
    try:
        ms = ctypes.c_float()
        lib().call("lb_bench_qmm", ALL_QTYPES[qt], rows, k, n, iters, ctypes.byref(ms))
        return ms.value * 1e3
    finally:
        restore()


def _bench_table(out, sels, names, cases, last_head, last_col) -> None:
    """One markdown row per (type, tensor, rows, K, n) case: the n = 1 time (measured once per tensor), the time
    of each select, and last_col(times) (a ratio)."""
    head = "| type | tensor | N×K | n | n = 1 µs | " + " | ".join(f"{names[s]} µs" for s in sels) + f" | {last_head} |"
    out(head)
    out("|" + "---|" * (head.count("|") - 1))
    one = {}
    for qt, name, r, k, n in cases:
        if (qt, r, k) not in one:
            one[(qt, r, k)] = bench_us(qt, r, k, 1, 0)
        us = [bench_us(qt, r, k, n, s) for s in sels]
        out(f"| {qt} | {name} | {r}×{k} | {n} | {one[(qt, r, k)]:.1f} | " + " | ".join(f"{u:.1f}" for u in us)
            + f" | {last_col(us, one[(qt, r, k)]):.2f} |")
        sys.stdout.flush()


def bench(out=print) -> None:
    cases = [("Q4_K", name, r, k, 23) for name, r, k in BENCH_SHAPES]
    cases += [(qt, "ffn_down", 5120, 17408, 23) for qt in ("Q5_K", "Q6_K", "Q8_0")]
    cases += [("Q6_K", "attn_qkv", 10240, 5120, 23)]
    cases += [(qt, "ffn_down", 5120, 17408, n) for qt in ("Q4_K", "Q6_K") for n in (2, 8, 16, 24, 32)]
    cases += [(qt, "ffn_down", 5120, 17408, n) for qt in ("Q5_K", "Q8_0") for n in (8, 16, 32)]
    _bench_table(out, [0, 1, 2, 3, 4, 5, 6, 7, *V5_SELECT], NAMES, cases, "shipped / n = 1",
                 lambda us, one: us[0] / one)


def bench_tiled(out=print) -> None:
    """The verify's n = 23 on the tiled layouts the engine uploads (Q4_K_T, Q6_K_T) under every select that applies to
    them: the shipped kernel (0: v5 for Q4_K_T), the pre-v5 one (13: the session-8 shipped kernel for Q4_K_T) and
    small-N v6 (14..16: Q6_K_T only; on Q4_K_T the shipped kernel again, a noise check). Last column: best / shipped."""
    cases = [("Q4_K_T", name, r, k, 23) for name, r, k in BENCH_SHAPES]
    cases += [("Q4_K_T", "ffn_gate/up", 17408, 5120, n) for n in (2, 8, 16, 32)]
    cases += [("Q6_K_T", name, r, k, 23) for name, r, k in BENCH_SHAPES[1:3]]
    _bench_table(out, [0, PRE_V5, *V6_SELECT], NAMES, cases, "best / shipped", lambda us, one: min(us) / us[0])


def bench_v5(out=print) -> None:
    """The shipped kernel (0: small-N v5 since session 9) against the pre-v5 one (13) at the verify's n = 23 and each
    column-tile count, on Q4_K_T (what the engine uploads) and Q4_K; last column: shipped / pre-v5."""
    cases = [("Q4_K_T", name, r, k, 23) for name, r, k in BENCH_SHAPES]
    cases += [("Q4_K_T", "ffn_gate/up", 17408, 5120, n) for n in (2, 8, 16, 24, 32)]
    cases += [("Q4_K", name, r, k, 23) for name, r, k in BENCH_SHAPES]
    _bench_table(out, [0, PRE_V5], NAMES, cases, "shipped / pre-v5", lambda us, one: us[0] / us[1])


# the 27B Q4_K_M's Q6_K tensors at the verify: ffn_down and attn_qkv of the layers the mix gives Q6_K, and the LM head
V6_BENCH_SHAPES = [("ffn_down", 5120, 17408), ("attn_qkv", 10240, 5120), ("lm_head", 248320, 5120)]


def bench_v6(out=print) -> None:
    """small-N v6 (selects 14..16) against the shipped kernel (0) on Q6_K_T at the verify's n = 23, and each column-tile
    count at ffn_down; last column: best v6 / shipped."""
    cases = [("Q6_K_T", name, r, k, 23) for name, r, k in V6_BENCH_SHAPES]
    cases += [("Q6_K_T", "ffn_down", 5120, 17408, n) for n in (2, 8, 16, 24, 32)]
    _bench_table(out, [0, *V6_SELECT], NAMES, cases, "best v6 / shipped", lambda us, one: min(us[1:]) / us[0])


WIDE_BENCH_SHAPES = BENCH_SHAPES + [("attn_gate/q", 6144, 5120)]


def bench_wide(out=print) -> None:
    """small-N v2: n = 64 (the prefill chunk) on the 27B shapes, the register kernel (select 1, shipped at n > 32
    before v2) against each new shape (select 8 is what select 0 ships); n = 33..57 at ffn_down for NT 6 (8, 9)
    against NT 8 (10, 11)."""
    cases = [("Q4_K", name, r, k, 64) for name, r, k in WIDE_BENCH_SHAPES]
    cases += [(qt, name, r, k, 64) for qt in ("Q5_K", "Q6_K") for name, r, k in WIDE_BENCH_SHAPES[:3]]
    cases += [("Q8_0", "ffn_down", 5120, 17408, 64)]
    cases += [(qt, "ffn_down", 5120, 17408, n) for qt in ("Q4_K", "Q6_K") for n in (33, 41, 48, 57)]
    _bench_table(out, [1, *WIDE_SELECT], NAMES, cases, "best / register", lambda us, one: min(us[1:]) / us[0])


def _main(argv: list[str]) -> int:
    if "--dump-env-case" in argv:  # test_env_select's child: ENV_CASE under the select the environment gave
        np.save(argv[argv.index("--dump-env-case") + 1], env_case_output())
        return 0
    failed = 0
    if "--bench-only" not in argv:
        for qt in QTYPES:
            for rows, k in SHAPES:
                try:
                    check(qt, rows, k, NS, [*SELECT, *V5_SELECT])
                    check(qt, rows, k, WIDE_NS, [0, 1, *WIDE_SELECT])
                    if qt == "Q4_K":
                        check("Q4_K_T", fit_rows("Q4_K_T", rows), k, V5_NS, [0, *V5_SELECT])
                    if qt == "Q6_K":
                        check("Q6_K_T", fit_rows("Q6_K_T", rows), k, V5_NS, [0, *V6_SELECT])
                    print(f"PASS {qt} N{rows} K{k}", flush=True)
                except AssertionError as exc:
                    failed += 1
                    print(f"FAIL {exc}", flush=True)
    if "--bench-v5" in argv:
        bench_v5()
        return 0
    if "--bench-v6" in argv:
        bench_v6()
        return 0
    if "--bench-tiled" in argv:
        bench_tiled()
        return 0
    if "--bench" in argv or "--bench-only" in argv:
        bench_wide()  # first: the new rows matter most if the run is cut short
        bench()
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
