"""n = 1 Q6_K_T with x staged per warp (cuda/common/qmm_gemv_rows.cuh: Q6Xs, q6_xs_store, q6_item_xs,
gemv_q6_tile_kernel<kBlocks, true>), modelled on the CPU against today's qmm_item<Q6_K, 1, 1> x path.

Today (LUCEBOX_Q6_GEMV=old), lane (g, t) feeds mma step (c, s, u) of an item, in the order c, s, u, with
xv = float4 at x + kb·256 + klane(t) + kstep(c, u, s) (Traits<Q6_K>: 16t and 128c + 64s + 4u) and
b0 = cvt.rn(xv.x, xv.z), b1 = cvt.rn(xv.y, xv.w) (__floats2half2_rn: low half first). The staged kernel copies
float4 lane and 32 + lane of the item's 256 x (cp.async, the lane's own 32 bytes of an fp32 buffer at 16·lane and
+512), converts each float4 i into the same (b0, b1) and stores it at Q6Xs::off(i) (+256 for i = 32 + lane), and
step (c, s, u) of lane (g, t) reads 8 bytes at xs + 16t + Q6Xs::off(16(2c + s) + u). The model checks, for every
lane and step, that the two halves read are the same x elements in the same half slots, with the same fp16 bits
(numpy's float32 -> float16 rounds to nearest even, as cvt.rn), that the buffer is written exactly once per half,
and that the stores and loads are free of shared-memory bank conflicts. The formulas it copies are also looked up
in the CUDA source, so an edit there that this model does not follow fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
ROWS_SRC = ROOT / "cuda/common/qmm_gemv_rows.cuh"
QMM_SRC = ROOT / "cuda/common/qmm.cuh"
QB_SRC = ROOT / "cuda/common/quant_blocks.cuh"

QK = 256
STEPS = [(c, s, u) for c in range(2) for s in range(2) for u in range(4)]  # qmm_item's static_for / loop order


# ---- the kernels' formulas ---------------------------------------------------------------------------------

def klane(t: int) -> int:  # Traits<Q6_K>::klane
    return 16 * t


def kstep(c: int, u: int, s: int) -> int:  # Traits<Q6_K>::kstep
    return 128 * c + 64 * s + 4 * u


def xs_off(i: int) -> int:  # Q6Xs::off
    return 128 * (i >> 4) + 64 * ((i & 3) >> 1) + 16 * ((i >> 2) & 3) + 8 * (i & 1)


def old_b(t: int, c: int, s: int, u: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """x indices (within the item's 256) of (b0.lo, b0.hi), (b1.lo, b1.hi) that qmm_item feeds lane t at step (c, s, u)"""
    k = klane(t) + kstep(c, u, s)
    return (k + 0, k + 2), (k + 1, k + 3)  # (xv.x, xv.z), (xv.y, xv.w)


def staged_buffer() -> dict[int, int]:
    """half offset (bytes / 2) of the 512-byte buffer -> the x index stored there, by q6_xs_store over 32 lanes"""
    buf: dict[int, int] = {}
    for lane in range(32):
        for h in range(2):
            i = lane + 32 * h  # cp.async: fp32 at 16·lane + 512·h of the lane's buffer = float4 lane + 32h
            assert xs_off(lane) + 256 * h == xs_off(i)
            base = xs_off(lane) + 256 * h
            # make_uint2(cvt(x0, x2), cvt(x1, x3)): halves at bytes 0, 2, 4, 6
            for slot, e in enumerate((0, 2, 1, 3)):
                half = base // 2 + slot
                assert half not in buf, f"half {half} written twice"
                buf[half] = 4 * i + e
    return buf


def staged_b(buf: dict[int, int], t: int, c: int, s: int, u: int) -> tuple[tuple[int, int], tuple[int, int]]:
    addr = 16 * t + xs_off(16 * (2 * c + s) + u)  # q6_item_xs: xs_t = xs + 16t
    assert addr % 8 == 0
    h = addr // 2
    return (buf[h], buf[h + 1]), (buf[h + 2], buf[h + 3])


# ---- the checks --------------------------------------------------------------------------------------------

def test_buffer_is_a_permutation_of_x():
    buf = staged_buffer()
    assert sorted(buf) == list(range(256))
    assert sorted(buf.values()) == list(range(256))


def test_every_lane_reads_todays_b_fragments():
    buf = staged_buffer()
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for c, s, u in STEPS:
            assert staged_b(buf, t, c, s, u) == old_b(t, c, s, u), (g, t, c, s, u)


def test_same_fp16_bits_on_random_x():
    """The halves the staged kernel feeds are bit-identical to today's (same elements, same cvt.rn rounding),
    over several items of a row of x (kb = 0..3) with values that round differently in fp16."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4 * QK) * np.exp2(rng.integers(-20, 20, 4 * QK))).astype(np.float32)
    x[:8] = [65504.0, 65520.0, -1e-8, 6e-8, 1e5, -0.0, np.inf, 2049.0]
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)  # RNE, overflow to inf: cvt.rn.f16.f32
    buf = staged_buffer()
    for kb in range(4):
        for t in range(4):
            for c, s, u in STEPS:
                got = staged_b(buf, t, c, s, u)
                want = old_b(t, c, s, u)
                for (a0, a1), (b0, b1) in zip(got, want):
                    assert (h[kb * QK + a0], h[kb * QK + a1]) == (h[kb * QK + b0], h[kb * QK + b1])


def _banks(addr: int, nbytes: int) -> set[int]:
    return {(addr // 4 + w) % 32 for w in range(nbytes // 4)}


def test_stores_conflict_free():
    """STS.64 of float4 lane (+256 for 32 + lane): each half-warp's 16 stores hit 32 distinct banks."""
    for h in range(2):
        for half in range(2):
            seen: list[int] = []
            for lane in range(16 * half, 16 * half + 16):
                seen += sorted(_banks(xs_off(lane) + 256 * h, 8))
            assert len(seen) == len(set(seen)) == 32


def test_loads_conflict_free():
    """Each step's load: the four distinct addresses (one per t, broadcast over g) fall in distinct banks; and
    steps u, u + 1 (u even) are one aligned 16-byte run per t (what lets ptxas merge them into one LDS.128)."""
    for c, s, u in STEPS:
        addrs = {16 * t + xs_off(16 * (2 * c + s) + u) for t in range(4)}
        assert len(addrs) == 4
        banks = [b for a in sorted(addrs) for b in sorted(_banks(a, 8))]
        assert len(banks) == len(set(banks))
        if u % 2 == 0:
            for t in range(4):
                a = 16 * t + xs_off(16 * (2 * c + s) + u)
                assert a % 16 == 0 and 16 * t + xs_off(16 * (2 * c + s) + u + 1) == a + 8
    # the fp32 buffer: lane L's own 16 bytes at 16L (+512): its two LDS.128 are contiguous over the warp
    assert sorted(16 * lane for lane in range(32)) == list(range(0, 512, 16))


# ---- the source still says what the model follows ----------------------------------------------------------

def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_source_formulas():
    rows = _squash(ROWS_SRC.read_text())
    qmm = _squash(QMM_SRC.read_text())
    qb = _squash(QB_SRC.read_text())
    # Q6Xs::off, the store, the read, the copies
    assert "return 128 * (i >> 4) + 64 * ((i & 3) >> 1) + 16 * ((i >> 2) & 3) + 8 * (i & 1);" in rows
    assert ("*reinterpret_cast<uint2*>(xs + Q6Xs::off(lane) + 256 * h) = make_uint2(h2_bits(__floats2half2_rn("
            "xv[h].x, xv[h].z)), h2_bits(__floats2half2_rn(xv[h].y, xv[h].w)));") in rows
    assert ': "r"(xf + 512 * h)' in rows
    assert "xs_t + Q6Xs::off(16 * (2 * c + st) + u)" in rows
    assert "mma16816(acc, a0, a1, a2, a3, b.x, b.y);" in rows
    assert "q6_item_xs(rr[0], acc[0][0], xs + 16 * t, t);" in rows
    assert "xf = (uint32_t)__cvta_generic_to_shared(xf_all[warp] + 16 * lane);" in rows
    assert "const float* xp = a.x + kb * QK + 4 * lane; q6_cp_async16(xf, xp); q6_cp_async16(xf + 512, xp + 128);" in rows
    # the staged item runs qmm_item's steps in its order: static_for C, S, then u
    item = rows[rows.index("void q6_item_xs("):]
    item = item[: item.index("// ---- n = 1, Q6_K_T (the tiled")]
    assert item.index("static_for<Tr::kChunks>") < item.index("static_for<Tr::kHiLo>") < item.index(
        "for (int u = 0; u < 4; ++u)")
    # today's x path (qmm_item, Traits<Q6_K>)
    assert ("b[ct][0] = h2_bits(__floats2half2_rn(xv.x, xv.z)); b[ct][1] = h2_bits(__floats2half2_rn(xv.y, xv.w));"
            in qmm)
    assert "const float4 xv = __ldg(reinterpret_cast<const float4*>(xb[ct] + ks));" in qmm
    assert "const int ks = Tr::kstep(c, u, st);" in qmm
    assert "const float* const xb[1] = {a.x + kb * QK + Traits<Q6_K>::klane(t)};" in rows
    t6 = qb[qb.index("struct Traits<Q6_K> {"):]
    t6 = t6[: t6.index("struct Traits<Q6_K_T>")]
    assert "__device__ static int klane(int t) { return 16 * t; }" in t6
    assert "static constexpr int kstep(int c, int u, int s) { return 128 * c + 64 * s + 4 * u; }" in t6
    # the switch: LUCEBOX_Q6_GEMV=old keeps today's kernel
    assert 'std::getenv("LUCEBOX_Q6_GEMV")' in rows and 'std::strcmp(e, "old") == 0' in rows
    assert "xs ? gemv_q6_tile_kernel<6, true> : gemv_q6_tile_kernel<6, false>" in qmm
