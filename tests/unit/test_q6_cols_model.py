"""n = 1 Q6_K_T, one mma column per (sub-block, lane) (cuda/common/qmm_gemv_rows.cuh: Q6Cols, q6c_xs_store,
q6c_word, q6c_chunk, q6c_scale, q6c_share, gemv_q6_cols_kernel: the default; also the Q6 part of gemv_q6q4_tile_kernel),
modelled lane by lane on the CPU.

The model builds random GGUF Q6_K blocks for one 16-row tile, lays them out as the Q6_K_T tile (q6t_offset), and runs
one item the way the kernel does: each lane's eleven loads at the kernel's offsets, its A fragments by the kernel's
bit operations (select / PRMT: fp16 1024 + q), the −1056 mma per chunk (B: the natural-order fp16 x), its B fragments from the per-warp buffer that q6c_xs_store
writes (cvt.rn pairs at Q6Cols::store_off, zeros elsewhere; the zero kilobyte for the lanes that feed no column),
the m16n8k16 mma on those fragments (the PTX fragment layout), then q6c_scale and the flush's sum over t. The result
must equal the float64 GGUF dequantization times x (up to fp16 x and fp32 sums), and the A values must be exactly
1024 + q. The formulas it copies are also looked up in the CUDA source, so an edit there that this model does not
follow fails here. Bank conflicts of the buffer's loads are checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

# the Q6_K_T tile layout (quant_blocks.cuh q6t_offset and its region starts): one model, shared with the small-N map
from test_qmm_smalln_v6_map import KD, KQH, KSC, q6t_offset

ROOT = Path(__file__).resolve().parents[2]
ROWS_SRC = ROOT / "cuda/common/qmm_gemv_rows.cuh"
QMM_SRC = ROOT / "cuda/common/qmm.cuh"



def entry(c: int, u: int, t: int, e: int) -> int:  # Q6Cols::entry
    return 128 * (4 * c + u) + 16 * (2 * t + e)


def store_off(lane: int) -> int:  # Q6Cols::store_off
    return entry(0, lane & 3, (lane >> 2) & 3, lane >> 4) + 4 * (lane >> 4)


def random_blocks(rng: np.random.Generator) -> np.ndarray:
    raw = rng.integers(0, 256, size=(16, 210), dtype=np.uint8)
    d = (5e-4 * (1.0 + rng.random(16))).astype(np.float16)
    raw[:, 208:210] = d.view(np.uint8).reshape(16, 2)
    return raw


def dequant(raw: np.ndarray) -> np.ndarray:
    """GGUF Q6_K dequantization of 16 blocks -> [16, 256] float64 (the reference formula)."""
    out = np.zeros((16, 256))
    for r in range(16):
        b = raw[r]
        ql, qh, sc = b[:128].astype(int), b[128:192].astype(int), b[192:208].view(np.int8).astype(int)
        d = float(b[208:210].view(np.float16)[0])
        for n in range(2):
            for l in range(32):
                s = n * 8 + l // 16
                q1 = (ql[64 * n + l] & 15 | ((qh[32 * n + l] >> 0) & 3) << 4) - 32
                q2 = (ql[64 * n + l + 32] & 15 | ((qh[32 * n + l] >> 2) & 3) << 4) - 32
                q3 = (ql[64 * n + l] >> 4 | ((qh[32 * n + l] >> 4) & 3) << 4) - 32
                q4 = (ql[64 * n + l + 32] >> 4 | ((qh[32 * n + l] >> 6) & 3) << 4) - 32
                out[r, 128 * n + l] = d * sc[s] * q1
                out[r, 128 * n + l + 32] = d * sc[s + 2] * q2
                out[r, 128 * n + l + 64] = d * sc[s + 4] * q3
                out[r, 128 * n + l + 96] = d * sc[s + 6] * q4
    return out


def tile_of(raw: np.ndarray) -> np.ndarray:
    tile = np.zeros(3360, dtype=np.uint8)
    for r in range(16):
        for o in range(210):
            tile[q6t_offset(r, o)] = raw[r, o]
    return tile


def words(b: np.ndarray) -> list[int]:
    return [int(w) for w in b.view("<u4")]


def half_bits(u: int) -> tuple[float, float]:
    v = np.array([u & 0xFFFF, u >> 16], dtype=np.uint16).view(np.float16)
    return float(v[0]), float(v[1])


def prmt(a: int, b: int, sel: int) -> int:  # __byte_perm
    src = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    return int.from_bytes(bytes(src[(sel >> (4 * i)) & 7] for i in range(4)), "little")


def select(a: int, b: int, c: int) -> int:  # lop3 kSelect: (a & c) | (b & ~c)
    return ((a & c) | (b & ~c)) & 0xFFFFFFFF


def q6c_word(w: int, hq: int):
    """-> (lo02, lo13, hi02, hi13), each a pair of floats (low half first)"""
    wl = select(w, (hq << 4) & 0xFFFFFFFF, 0x0F0F0F0F)
    wh = select(w >> 4, hq, 0x0F0F0F0F)
    return (half_bits(prmt(wl, 0x64646464, 0x4240)), half_bits(prmt(wl, 0x64646464, 0x4341)),
            half_bits(prmt(wh, 0x64646464, 0x4240)), half_bits(prmt(wh, 0x64646464, 0x4341)))


def run_item(tile: np.ndarray, x: np.ndarray, f32: bool = False) -> tuple[np.ndarray, dict]:
    """The kernel's item on one tile and 256 x, then the flush: y[16] (fp64 sums, or with f32 each mma's and the
    epilogue's sums rounded to fp32 as the kernel's are)."""
    # the B buffer (q6c_xs_store), zeros elsewhere; the zero kilobyte
    bs = np.zeros(512, dtype=np.uint16)  # 1024 bytes as halves
    nat = np.zeros(256, dtype=np.uint16)  # the natural-order copy, 512 bytes
    written = np.zeros(512, dtype=int)
    nat_written = np.zeros(256, dtype=int)
    for lane in range(32):
        for h in range(2):
            xv = x[128 * h + 4 * lane : 128 * h + 4 * lane + 4].astype(np.float32)
            so = store_off(lane) + 512 * h
            for off, (a, b) in ((so, (xv[0], xv[2])), (so + 8, (xv[1], xv[3]))):
                pair = np.array([a, b], dtype=np.float16).view(np.uint16)
                bs[off // 2 : off // 2 + 2] = pair
                written[off // 2 : off // 2 + 2] += 1
            no = 8 * (32 * h + lane)  # make_uint2(p02, p13) at nat + 8·(32h + lane)
            nat[no // 2 : no // 2 + 4] = np.array([xv[0], xv[2], xv[1], xv[3]], dtype=np.float16).view(np.uint16)
            nat_written[no // 2 : no // 2 + 4] += 1
    assert written.max() == 1 and (nat_written == 1).all()
    zero = np.zeros(512, dtype=np.uint16)
    facts = {"A_exact": True}
    # per lane: A fragments, B fragments, then the mma over the warp
    Cacc = {}  # (c) -> D[16][8]
    A = {}  # (c, u, p) -> [16][16] float
    B = {}
    Bc = {c: np.zeros((16, 8)) for c in range(2)}  # B of the −1056 mma of chunk c
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        v = {}
        for h in range(2):
            for c in range(2):
                v[(h, c)] = words(tile[16 * lane + 512 * (2 * c + h) :][:16])
                v[(h, 2 + c)] = words(tile[KQH + 32 * g + 16 * (t & 1) + 256 * (2 * c + h) :][:16])
            v[(h, 4)] = words(tile[KSC + 16 * g + 128 * h :][:16])
        s2 = 2 * (t >> 1)
        part = (g >> 1) == t
        base = entry(0, 0, t, g & 1) if part else 0
        nl = 8 * (16 * (g & 1) + 4 * (g >> 1) + t)
        for c in range(2):
            bc = [int(nat[(nl + 256 * c) // 2 + 2 * i]) | int(nat[(nl + 256 * c) // 2 + 2 * i + 1]) << 16 for i in range(2)]
            Bc[c][2 * t : 2 * t + 2, g] = half_bits(bc[0])
            Bc[c][2 * t + 8 : 2 * t + 10, g] = half_bits(bc[1])
            for u in range(4):
                src = bs if part else zero
                b = [int(src[(base + entry(c, u, 0, 0)) // 2 + 2 * i]) | int(src[(base + entry(c, u, 0, 0)) // 2 + 2 * i + 1]) << 16
                     for i in range(4)]
                frs = []
                for h in range(2):
                    hq = (v[(h, 2 + c)][u] >> s2) & 0x33333333
                    frs.append(q6c_word(v[(h, c)][u], hq))
                for p in range(2):
                    Am = A.setdefault((c, u, p), np.zeros((16, 16)))
                    Bm = B.setdefault((c, u, p), np.zeros((16, 8)))
                    lo = [frs[h][p] for h in range(2)]  # a0 (row g), a1 (row g + 8)
                    hi = [frs[h][2 + p] for h in range(2)]  # a2, a3
                    for h in range(2):
                        Am[g + 8 * h, 2 * t : 2 * t + 2] = lo[h]
                        Am[g + 8 * h, 2 * t + 8 : 2 * t + 10] = hi[h]
                    Bm[2 * t : 2 * t + 2, g] = half_bits(b[2 * p])
                    Bm[2 * t + 8 : 2 * t + 10, g] = half_bits(b[2 * p + 1])
    # A must be q - 32 of the right weights: check against the tile's raw q via the reference's structure below
    for c in range(2):
        rnd = (lambda v: v.astype(np.float32).astype(np.float64)) if f32 else (lambda v: v)
        D = rnd(np.full((16, 16), -1056.0) @ Bc[c])
        for u in range(4):
            for p in range(2):
                D = rnd(D + A[(c, u, p)] @ B[(c, u, p)])
        Cacc[c] = D
    # q6c_scale + flush
    y = np.zeros(16)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        dw = words(tile[KD + 4 * g :][:4])[0]
        d = half_bits(dw)
        for h in range(2):
            sw = words(tile[KSC + 16 * g + 128 * h :][:16])
            sc = [np.int8(np.uint8((w >> (8 * t)) & 0xFF)) for w in sw]
            s = (float(sc[0]) * Cacc[0][g + 8 * h, 2 * t] + float(sc[1]) * Cacc[0][g + 8 * h, 2 * t + 1]
                 + float(sc[2]) * Cacc[1][g + 8 * h, 2 * t] + float(sc[3]) * Cacc[1][g + 8 * h, 2 * t + 1])
            y[g + 8 * h] += d[h] * s
    facts["A"] = A
    return y, facts


def test_item_matches_reference():
    rng = np.random.default_rng(7)
    for _ in range(3):
        raw = random_blocks(rng)
        x = rng.standard_normal(256).astype(np.float32)
        y, facts = run_item(tile_of(raw), x)
        ref = dequant(raw)
        xh = x.astype(np.float16).astype(np.float64)
        want = ref @ xh  # with the kernel's fp16 x: equal up to fp32/fp64 sums
        assert np.allclose(y, want, rtol=1e-9, atol=1e-9 * np.abs(want).max()), np.abs(y - want).max()
        # the mma's fp32 sums cancel 1056·Σx: still far inside the fp16 rounding of x
        y32, _ = run_item(tile_of(raw), x, f32=True)
        assert np.sqrt(np.mean((y32 - want) ** 2)) / np.sqrt(np.mean(want**2)) < 2e-5
        # against exact x: the fp16 rounding of x only
        exact = ref @ x.astype(np.float64)
        assert np.sqrt(np.mean((y - exact) ** 2)) / np.sqrt(np.mean(exact**2)) < 1e-3


def test_a_fragments_are_exact_1024_plus_q():
    rng = np.random.default_rng(3)
    raw = random_blocks(rng)
    _, facts = run_item(tile_of(raw), np.ones(256, dtype=np.float32))
    for (c, u, p), Am in facts["A"].items():
        assert np.all(Am == np.round(Am)) and Am.min() >= 1024 and Am.max() <= 1087
    # every (row, weight) appears once: lane t, word u, byte 2j + p of chunk c is weight 128c + 16t + 4u + 2j + p (lo)
    # and + 64 (hi); k slots 2t + j (lo), 2t + 8 + j (hi)
    sc = raw[:, 192:208].view(np.int8).astype(np.float64)
    d = raw[:, 208:210].copy().view(np.float16).astype(np.float64)[:, 0]
    ref = dequant(raw)
    for (c, u, p), Am in facts["A"].items():
        for t in range(4):
            for j in range(2):
                for e in range(2):
                    wi = 128 * c + 64 * e + 16 * t + 4 * u + 2 * j + p
                    col = 2 * t + 8 * e + j
                    sub = wi // 16
                    ok = sc[:, sub] != 0
                    q = ref[ok, wi] / (d[ok] * sc[ok, sub])
                    assert np.allclose(Am[ok, col] - 1056, q), (c, u, p, t, j, e)


def test_b_loads_and_stores_banks():
    # each LDS.128 of a (c, u): the 8 feeding lanes read 8 distinct 16-byte entries of one 128-byte row (all 32 banks
    # once), the other 24 one 16-byte run of the zero kilobyte (a broadcast): at most 2 wavefronts
    for c in range(2):
        for u in range(4):
            offs = sorted(entry(c, u, t, e) for t in range(4) for e in range(2))
            assert offs == list(range(entry(c, u, 0, 0), entry(c, u, 0, 0) + 128, 16))
    # the stores write each nonzero half pair exactly once (run_item asserts it) at 4-byte aligned offsets
    assert all(store_off(l) % 4 == 0 for l in range(32))


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s)


def test_source_formulas():
    rows = _squash(ROWS_SRC.read_text())
    qmm = _squash(QMM_SRC.read_text())
    assert "return 128 * (4 * c + u) + 16 * (2 * t + e);" in rows
    assert "return entry(0, lane & 3, (lane >> 2) & 3, lane >> 4) + 4 * (lane >> 4);" in rows
    assert "const uint32_t wl = lop3<kSelect>(w, hq << 4, 0x0F0F0F0Fu);" in rows
    assert "const uint32_t wh = lop3<kSelect>(w >> 4, hq, 0x0F0F0F0Fu);" in rows
    assert "constexpr uint32_t kSelect = 0xE4;" in rows
    assert rows.count("__byte_perm(wl, 0x64646464u, 0x4240)") == 1 and rows.count("__byte_perm(wh, 0x64646464u, 0x4341)") == 1
    assert "const uint32_t hq = ((&r[h].v[2 + C].x)[u] >> s2) & 0x33333333u;" in rows
    assert "const uint8_t* const bl = (g >> 1) == t ? bs + Q6Cols::entry(0, 0, t, g & 1) : zero_kb;" in rows
    assert "const int s2 = 2 * (t >> 1), sh8 = 8 * t;" in rows
    assert "mma16816(acc, lo13[0], lo13[1], hi13[0], hi13[1], b.z, b.w);" in rows
    assert "mma16816(acc, lo02[0], lo02[1], hi02[0], hi02[1], b.x, b.y);" in rows
    assert "static constexpr uint32_t kNeg1056 = 0xE420E420u;" in rows
    assert "const uint2 bc = *reinterpret_cast<const uint2*>(nl + 256 * C);" in rows
    assert "mma16816_zero(acc, k, k, k, k, bc.x, bc.y);" in rows
    assert "const uint8_t* const nl = nat + 8 * (16 * (g & 1) + 4 * (g >> 1) + t);" in rows
    assert "*reinterpret_cast<uint2*>(nat + 8 * (32 * h + lane)) = make_uint2(p02, p13);" in rows
    assert "lo02 = __byte_perm(wl, 0x64646464u, 0x4240);" in rows
    # the switch: cols is the default (unset or any other value), LUCEBOX_Q6_GEMV=xs / old the two earlier kernels
    assert "if (!e) return Q6Gemv::cols;" in rows
    assert 'if (std::strcmp(e, "xs") == 0) return Q6Gemv::xs;' in rows
    assert 'if (std::strcmp(e, "old") == 0) return Q6Gemv::old;' in rows
    assert "cols2\")" not in rows and "kSplit" not in rows  # removed (no gain measured)
    assert "if (mode == Q6Gemv::cols) {" in qmm
    assert "launch_pdl(gemv_q6_cols_kernel<6>," in qmm
    assert "xs ? gemv_q6_tile_kernel<6, true> : gemv_q6_tile_kernel<6, false>" in qmm
    # the pair's Q6 part follows the same switch and runs the same device function as gemv_q6_cols_kernel
    assert "const bool cols = gemv_q6_mode() == Q6Gemv::cols;" in qmm
    assert "cols ? gemv_q6q4_tile_kernel<kBlocks, true> : gemv_q6q4_tile_kernel<kBlocks, false>" in qmm
    assert rows.count("q6c_share(a") == 2  # gemv_q6_cols_kernel and gemv_q6q4_tile_kernel<kB, true>
    assert "q6c_share(a6, it0, (int)(min(end0, pc.n6) - it0), buf, zero_kb, lane, warp);" in rows
