"""small-N v6's k map for the tiled Q6_K (cuda/common/qmm_smalln.cuh, Traits<Q6_K_T_V6>, smalln_item_v6;
lb_qmm_smalln_select 14, 15, 16), modelled on the CPU.

Lane t = 2c' + e of quad g owns, in rows g and g + 8 of a 16-row tile, the weights 128c' + 32j + l (j = 0..3, l = 16e
.. 16e + 15): three 16-byte runs (ql A = bytes 64c' + 16e .., ql B = 64c' + 32 + 16e .., qh = 32c' + 16e ..), 8 scale
bytes 8c' .. 8c' + 7 and the 4-byte pair of fp16 d of rows g and g + 8, each at its place in the 3360-byte Q6_K_T tile
(q6t_offset). Word u of the three runs gives four words of clean 6-bit values (words(): bitselect of a nibble and a
masked, shifted qh pair), and two PRMTs per word the (1024 + q) half2 of bytes (0, 2) and (1, 3): run j of word u
feeds mma step q = 4j + u at slots 2t, 2t + 1 (bytes 0, 2) and 2t + 8, 2t + 9 (bytes 1, 3), times the scale pair of
sub-block 8c' + 2j + e (scales(): PRMT, the 0x64 / sign-flip magic and an exact HSUB2 give the int8 scale, times d). x
is staged by the generic XStager through smalln_group over klane(t) + kstep(c, 0, s) (j = 2c + s) and read back by
smalln_item's LDS index. This model follows each of those formulas bit for bit (the fp16 magic values decoded through
numpy's float16; the scale and weight products in float64, where the kernel rounds them to fp16), places every element
by the PTX ISA's fragment ownership for mma.m16n8k16 (.f16), and checks on random Q6_K blocks in the tiled layout that
every A element is gguf's Q6_K dequantized weight at the k the staging gives B, and that the sum over steps of A_q ·
B_q equals W · x. Formulas the model copies are also looked up in the CUDA source, so an edit there that the model
does not follow fails here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from smalln_stage_model import find_group
from smalln_stage_model import stage as stage_x

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
QK = 256
BLOCK = 210
TILE = 16 * BLOCK  # 3360
KQL, KQH, KSC, KD = 0, 2048, 3072, 3328


# ---- the layout (quant_blocks.cuh q6t_offset) and the kernel's formulas ----------------------------------------

def q6t_offset(r16: int, o: int) -> int:
    h, g = r16 >> 3, r16 & 7
    if o < 128:
        return KQL + 512 * (2 * (o >> 6) + h) + 64 * g + (o & 63)
    if o < 192:
        return KQH + 256 * (2 * ((o - 128) >> 5) + h) + 32 * g + ((o - 128) & 31)
    if o < 208:
        return KSC + 128 * h + 16 * g + (o - 192)
    return KD + 4 * g + 2 * h + (o - 208)


def klane(t: int) -> int:
    return 128 * (t >> 1) + 16 * (t & 1)


def kstep(c: int, u: int, s: int) -> int:
    return 64 * c + 32 * s + 4 * u


def lane_offsets(g: int, t: int) -> tuple[int, int, int, int]:
    """Traits<Q6_K_T_V6>::lane_offsets: ql A, qh, scales, d of row g (row g + 8: + 512, 256, 128)."""
    return (KQL + 1024 * (t >> 1) + 64 * g + 16 * (t & 1), KQH + 512 * (t >> 1) + 32 * g + 16 * (t & 1),
            KSC + 16 * g + 8 * (t >> 1), KD + 4 * g)


def u32(buf: bytes, addr: int) -> int:
    return int.from_bytes(buf[addr: addr + 4], "little")


def byte_perm(x: int, y: int, s: int) -> int:
    """__byte_perm(x, y, s): result byte i = byte (s >> 4i) & 7 of the 8 bytes y:x (sign-replication mode unused)."""
    src = (x & 0xFFFFFFFF) | ((y & 0xFFFFFFFF) << 32)
    out = 0
    for i in range(4):
        sel = (s >> (4 * i)) & 7
        out |= ((src >> (8 * sel)) & 0xFF) << (8 * i)
    return out


def halves(w: int) -> tuple[float, float]:
    """the two fp16 of a 32-bit word (low, high)"""
    return tuple(float(v) for v in np.array([w & 0xFFFF, w >> 16], np.uint16).view(np.float16))


def load(tile: bytes, g: int, t: int) -> list[dict]:
    """Traits<Q6_K_T_V6>::load: the pieces of rows g (h = 0) and g + 8 (h = 1) as lists of 32-bit words."""
    ql, qh, sc, d = lane_offsets(g, t)
    rows = []
    for h in range(2):
        rows.append({
            "a": [u32(tile, ql + 512 * h + 4 * u) for u in range(4)],
            "b": [u32(tile, ql + 512 * h + 32 + 4 * u) for u in range(4)],
            "h": [u32(tile, qh + 256 * h + 4 * u) for u in range(4)],
            "sc": [u32(tile, sc + 128 * h + 4 * i) for i in range(2)],
        })
    rows[0]["d2"] = u32(tile, d)
    return rows


def scales(r: list[dict], t: int) -> list[tuple[float, float]]:
    """Traits<Q6_K_T_V6>::scales: per j the (row g, row g + 8) scale d·sc, here unrounded."""
    e = t & 1
    sel0 = e | (4 + e) << 8
    sel1 = sel0 + 0x202
    d_g, d_g8 = halves(r[0]["d2"])
    out = []
    for j in range(4):
        w = byte_perm(r[0]["sc"][j >> 1], r[1]["sc"][j >> 1], sel1 if j & 1 else sel0)
        hv = (w & 0x00FF00FF) ^ 0x64806480
        lo, hi = halves(hv)
        out.append(((lo - 1152) * d_g, (hi - 1152) * d_g8))
    return out


def words(r: dict, u: int) -> list[int]:
    """Traits<Q6_K_T_V6>::words: four words of clean 6-bit values."""
    a, b, h = r["a"][u], r["b"][u], r["h"][u]
    h02 = h & 0x33333333
    h13 = (h >> 2) & 0x33333333
    nib = 0x0F0F0F0F

    def bitsel(x: int, y: int) -> int:  # lop3 0xE4: (x & nib) | (y & ~nib)
        return ((x & nib) | (y & ~nib)) & 0xFFFFFFFF

    return [bitsel(a, h02 << 4), bitsel(b, h13 << 4), bitsel(a >> 4, h02), bitsel(b >> 4, h13)]


def deq(v: int, hi: bool, scale: float) -> tuple[float, float]:
    """Traits<Q6_K_T_V6>::deq: PRMT of bytes (0, 2) or (1, 3) under 0x64, minus 1056, times the scale."""
    p = byte_perm(v, 0x64646464, 0x4341 if hi else 0x4240)
    lo, hh = halves(p)
    return ((lo - 1056) * scale, (hh - 1056) * scale)


def smalln_group(grp: int) -> tuple[int, int]:
    return find_group(grp, klane, kstep)


def stage(x: np.ndarray, kb: int, nt: int, w_warps: int) -> dict:
    return stage_x(x, kb, nt, w_warps, smalln_group)


# ---- the model ----------------------------------------------------------------------------------

def random_q6k(rows: int, k: int, rng) -> bytes:
    nb = k // QK
    blocks = rng.integers(0, 256, size=(rows * nb, BLOCK), dtype=np.uint8)
    dd = (rng.uniform(0.5, 2.0, size=(rows * nb, 1)) * 1e-3).astype(np.float16)
    blocks[:, 208:210] = dd.view(np.uint8).reshape(rows * nb, 2)
    return blocks.tobytes()


def tiled(raw: bytes, rows: int, nb: int) -> bytes:
    """lb_quant_repack's Q6_K_T: tile (r / 16, kb) at ((r / 16)·nb + kb)·3360, byte o of row r's block at q6t_offset."""
    src = np.frombuffer(raw, np.uint8).reshape(rows, nb, BLOCK)
    out = np.zeros(rows * nb * BLOCK, np.uint8)
    offs = np.array([[q6t_offset(r16, o) for o in range(BLOCK)] for r16 in range(16)])
    for r in range(rows):
        for kb in range(nb):
            out[((r >> 4) * nb + kb) * TILE + offs[r & 15]] = src[r, kb]
    return out.tobytes()


def model_product(dev: bytes, rows: int, k: int, x: np.ndarray, w_warps: int, w_ref: np.ndarray) -> np.ndarray:
    """Y[rows, 8·nt] as the kernel's mma sequence computes it (float64), one 16-row tile per (tile, kb); every A element
    is also checked against w_ref at the k its B partner stands for."""
    nb = k // QK
    nt = x.shape[1] // 8
    y = np.zeros((rows, 8 * nt))
    xpos = {float(v): i for i, v in enumerate(x[:, 0])}  # column 0 of x tells which k a B element is
    for kb in range(nb):
        buf = stage(x, kb, nt, w_warps)
        for tile_row in range(rows // 16):
            tile = dev[(tile_row * nb + kb) * TILE:][:TILE]
            lanes = [load(tile, lane >> 2, lane & 3) for lane in range(32)]
            scs = [scales(lanes[lane], lane & 3) for lane in range(32)]
            covered = np.zeros((16, QK), dtype=int)
            for u in range(4):
                ws = [[words(lanes[lane][h], u) for h in range(2)] for lane in range(32)]
                for j in range(4):
                    q = 4 * j + u
                    a = np.full((16, 16), np.nan)
                    b = np.full((16, 8 * nt), np.nan)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        sg, sg8 = scs[lane][j]
                        regs = [deq(ws[lane][0][j], False, sg), deq(ws[lane][1][j], False, sg8),
                                deq(ws[lane][0][j], True, sg), deq(ws[lane][1][j], True, sg8)]
                        slots = ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))
                        for reg, (rr, kk) in zip(regs, slots):
                            for i in range(2):
                                assert np.isnan(a[rr, kk + i]), "A element owned twice"
                                a[rr, kk + i] = reg[i]
                        for ct in range(nt):
                            b0, b1 = buf[(q * nt + ct) * 32 + (lane ^ u)]
                            for reg, kk in ((b0, 2 * t), (b1, 2 * t + 8)):
                                for i in range(2):
                                    assert np.isnan(b[kk + i, 8 * ct + g]), "B element owned twice"
                                    b[kk + i, 8 * ct + g] = reg[i]
                    assert not np.isnan(a).any() and not np.isnan(b).any(), "fragments cover the 16×16 / 16×8"
                    # A[r, i] must be the weight at the k that B[i, :] holds (column 0 identifies it)
                    for i in range(16):
                        kk = xpos[float(b[i, 0])] - kb * QK
                        for r in range(16):
                            want = w_ref[16 * tile_row + r, kb * QK + kk]
                            assert a[r, i] == pytest.approx(want, rel=1e-6, abs=1e-12), (
                                f"tile {tile_row} kb {kb} step {q} row {r} slot {i}: A {a[r, i]} vs W[k = {kk}] {want}")
                            covered[r, kk] += 1
                    y[16 * tile_row: 16 * tile_row + 16] += a @ b
            assert (covered == 1).all(), "every weight of the tile enters exactly one A slot"
    return y


@pytest.mark.parametrize("nt,w_warps", [(1, 8), (3, 8), (3, 4), (4, 8)])
def test_v6_map_matches_w_times_x(nt, w_warps):
    rng = np.random.default_rng(60 + nt + w_warps)
    rows, k = 32, 2 * QK
    raw = random_q6k(rows, k, rng)
    w = gguf.quants.dequantize(np.frombuffer(raw, np.uint8), gguf.GGMLQuantizationType.Q6_K).astype(np.float64)
    w = w.reshape(rows, k)
    # column 0: distinct values, so a B element names its k; the others random
    x = rng.standard_normal((k, 8 * nt))
    x[:, 0] = np.arange(1, k + 1) * 0.5 + 0.25
    got = model_product(tiled(raw, rows, k // QK), rows, k, x, w_warps, w)
    want = w @ x
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_v6_map_permutes_k():
    """klane(t) + kstep(c, u, s) + b runs over 0..255 once; lane t's 64 k are the sub-blocks 8(t >> 1) + 2j + (t & 1),
    one per j = 2c + s, and word u, byte b of run j is weight 128c' + 32j + l, l = 16e + 4u + b (the ggml order)."""
    ks = sorted(klane(t) + kstep(c, u, s) + b for t in range(4) for c in range(2) for s in range(2) for u in range(4)
                for b in range(4))
    assert ks == list(range(QK))
    for t in range(4):
        for c in range(2):
            for s in range(2):
                j = 2 * c + s
                sub = {(klane(t) + kstep(c, u, s) + b) // 16 for u in range(4) for b in range(4)}
                assert sub == {8 * (t >> 1) + 2 * j + (t & 1)}
                for u in range(4):
                    for b in range(4):
                        assert klane(t) + kstep(c, u, s) + b == 128 * (t >> 1) + 32 * j + 16 * (t & 1) + 4 * u + b


def test_v6_loads_read_each_tile_byte_once():
    """The lane loads of one tile (32 lanes × (ql A, ql B, qh) × 2 rows of 16 bytes, scales 2 × 8, d 4) cover the 3360
    bytes: every ql / qh byte by exactly one lane, every scale byte by the two lanes t, t ^ 1, d by the quad."""
    count = np.zeros(TILE, dtype=int)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ql, qh, sc, d = lane_offsets(g, t)
        for h in range(2):
            for base, n in ((ql + 512 * h, 16), (ql + 512 * h + 32, 16), (qh + 256 * h, 16), (sc + 128 * h, 8)):
                count[base: base + n] += 1
        count[d: d + 4] += 1
    assert (count[:KSC] == 1).all()
    assert (count[KSC:KD] == 2).all()
    assert (count[KD:] == 4).all()


def test_model_formulas_are_the_kernels():
    src = (ROOT / "cuda/common/qmm_smalln.cuh").read_text()
    body = src[src.index("struct Traits<Q6_K_T_V6>"):]
    body = body[: body.index("\n};")]
    for needle in [
        "__device__ static int klane(int t) { return 128 * (t >> 1) + 16 * (t & 1); }",
        "static constexpr int kstep(int c, int u, int s) { return 64 * c + 32 * s + 4 * u; }",
        "static constexpr int kHQl = 512, kHQh = 256, kHSc = 128;",
        "keep<kKeep>(Q6T::kQl + 1024 * (t >> 1) + 64 * g + 16 * (t & 1))",
        "keep<kKeep>(Q6T::kQh + 512 * (t >> 1) + 32 * g + 16 * (t & 1))",
        "keep<kKeep>(Q6T::kSc + 16 * g + 8 * (t >> 1)), keep<kKeep>(Q6T::kD + 4 * g)",
        "r[h].v[0] = ldg_stream(ql + kHQl * h);",
        "r[h].v[1] = ldg_stream(ql + kHQl * h + 32);",
        "r[h].v[2] = ldg_stream(qh + kHQh * h);",
        "r[h].sc = ldg_stream8_v6(sc + kHSc * h);",
        "r[0].d2 = ldg_stream4(tile + ln.d);",
        "const uint32_t sel0 = e | (4 + e) << 8, sel1 = sel0 + 0x202;",
        "const uint32_t w = __byte_perm(j < 2 ? r[0].sc.x : r[0].sc.y, j < 2 ? r[1].sc.x : r[1].sc.y,",
        "j & 1 ? sel1 : sel0);",
        "const uint32_t hv = lop3<kAndXor>(w, 0x00FF00FFu, 0x64806480u);",
        "s[j] = __hmul2(__hsub2(bits_h2(hv), kSub1152()), d);",
        "static constexpr uint32_t kAndXor = 0x6A;  // (a & b) ^ c",
        "static constexpr uint32_t kBitSel = 0xE4;  // (a & c) | (b & ~c)",
        "const uint32_t h02 = h & 0x33333333u, h13 = (h >> 2) & 0x33333333u;",
        "constexpr uint32_t kNib = 0x0F0F0F0Fu;",
        "v[0] = lop3<kBitSel>(a, shl4(h02), kNib);",
        "v[1] = lop3<kBitSel>(b, shl4(h13), kNib);",
        "v[2] = lop3<kBitSel>(a >> 4, h02, kNib);",
        "v[3] = lop3<kBitSel>(b >> 4, h13, kNib);",
        'asm("shl.b32 %0, %1, 4;" : "=r"(y) : "r"(x));',
        "const uint32_t p = __byte_perm(v, 0x64646464u, kHi ? 0x4341 : 0x4240);",
        "return h2_bits(__hmul2(__hsub2(bits_h2(p), kSub1056()), scale));",
    ]:
        assert needle in body, needle
    item = src[src.index("void smalln_item_v6"):]
    item = item[: item.index("// The kernel's item")]
    for needle in ["for (int m = 0; m < MT; ++m) Tr::scales(rr[m], t, sc[m]);",
                   "Tr::words(rr[m][0], u, v[m][0]);", "Tr::words(rr[m][1], u, v[m][1]);",
                   "const int q = 4 * j + u;", "buf[(q * NT + ct) * 32 + (lane ^ u)]",
                   "const __half2 sg = __low2half2(sc[m][j]), sg8 = __high2half2(sc[m][j]);",
                   "const uint32_t a0 = Tr::template deq<false>(v[m][0][j], sg);",
                   "const uint32_t a1 = Tr::template deq<false>(v[m][1][j], sg8);",
                   "const uint32_t a2 = Tr::template deq<true>(v[m][0][j], sg);",
                   "const uint32_t a3 = Tr::template deq<true>(v[m][1][j], sg8);",
                   "mma16816(acc[m][ct], a0, a1, a2, a3, b[ct].x, b[ct].y);"]:
        assert needle in item, needle
    load_fn = src[src.index("__device__ __forceinline__ void smalln_load("):]
    assert "Tr::load(a.w + (tile * nb + kb) * Q6T::kBytes, ln, rr[m]);" in load_fn
    assert "int64_t tile = (row0 >> 4) + m;" in load_fn
    stager = src[src.index("struct XStager"):]
    assert "const uint32_t d = ((4 * q4 + u) * NT) * 32 + ((4 * g + t) ^ u);" in stager
    assert "xl = a.x + (int64_t)g * a.k + 16 * warp + 4 * u;" in stager
    assert "h2_bits(__floats2half2_rn(v[i][ct].x, v[i][ct].z))" in stager
    blocks = (ROOT / "cuda/common/quant_blocks.cuh").read_text()
    for needle in ["static constexpr int kQl = 0, kQh = 2048, kSc = 3072, kD = 3328, kBytes = 3360;",
                   "return o < 128   ? Q6T::kQl + 512 * (2 * (o >> 6) + h) + 64 * g + (o & 63)",
                   ": o < 192 ? Q6T::kQh + 256 * (2 * ((o - 128) >> 5) + h) + 32 * g + ((o - 128) & 31)",
                   ": o < 208 ? Q6T::kSc + 128 * h + 16 * g + (o - 192)",
                   ": Q6T::kD + 4 * g + 2 * h + (o - 208);",
                   "__device__ __forceinline__ __half2 kSub1056() { return bits_h2(0x64206420u); }",
                   "__device__ __forceinline__ __half2 kSub1152() { return bits_h2(0x64806480u); }"]:
        assert needle in blocks, needle
