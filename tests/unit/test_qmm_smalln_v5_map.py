"""small-N v5's k map (cuda/common/qmm_smalln.cuh, TraitsK4V5: the shipped kernel of Q4_K and Q4_K_T at n = 2..32 since
session 9; lb_qmm_smalln_select 13 keeps the pre-v5 one), modelled on the CPU.

The kernel gives lane t of quad g the qs bytes [32t, 32t + 32) of rows g and g + 8 (two 16-byte pieces C = 0, 1),
and feeds the m16n8k16 mma with word u of piece C, nibble step S, at mma step q = (2C + S)·4 + u, slots 2t, 2t + 1,
2t + 8, 2t + 9 = bytes 0, 2, 1, 3 of the word (TraitsK45::frag). x is staged by XStager through the generic
smalln_group search over klane(t) + kstep(C, 0, S) and read back by smalln_item's LDS index. This model follows
each of those index formulas, places every element by the PTX ISA's fragment ownership rules for mma.m16n8k16 with
.f16 A/B (A row-major: a0..a3 = (row g, k 2t..2t+1), (row g + 8, same), (row g, k 2t + 8..), (row g + 8, same);
B: b0, b1 = (k 2t, 2t + 1; column g), b2, b3 = (k 2t + 8, 2t + 9; column g)), and checks on random Q4_K blocks
(both the GGUF and the tiled Q4_K_T layout) that sum over steps of A_q · B_q equals W · x with W from gguf's own
Q4_K dequantization (which also checks the per-lane (scale, min) decode of prep). Formulas the model copies are
also looked up in the CUDA source, so an edit there that the model does not follow fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from smalln_stage_model import find_group
from smalln_stage_model import stage as stage_x

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
QK = 256
BLOCK = 144


# ---- the kernel's formulas (TraitsK4V5, TraitsK45, XStager, smalln_group, smalln_item_v5) ----------------

def klane(t: int) -> int:
    return 64 * t


def kstep(c: int, u: int, s: int) -> int:
    return 16 * c + 32 * s + 4 * u


def block_index(row: int, kb: int, nb: int, tile: bool) -> int:
    return ((row >> 4) * nb + kb) * 16 + (row & 15) if tile else row * nb + kb


def piece(row: int, kb: int, nb: int, t: int, p: int, tile: bool) -> int:
    """byte address of piece p (0 header, 1 and 2 the qs halves) of lane part t"""
    b = block_index(row, kb, nb, tile) * BLOCK
    return b if p == 0 else b + 16 + 32 * t + 16 * (p - 1)


def word(buf: bytes, addr: int, u: int) -> int:
    return int.from_bytes(buf[addr + 4 * u: addr + 4 * u + 4], "little")


def prep(hdr: bytes, t: int, s: int) -> tuple[float, float]:
    """(scale per unit of the decoded nibble value, negated min) as TraitsK4V5::prep computes them (in float64);
    the hi step decodes 16q, hence the 1/16."""
    h = [int.from_bytes(hdr[4 * i: 4 * i + 4], "little") for i in range(4)]
    sh = 8 * (2 * (t & 1) + s)
    b1, b2, b3 = (h[1] >> sh) & 0xFF, (h[2] >> sh) & 0xFF, (h[3] >> sh) & 0xFF
    hi = t >= 2
    sc = ((b3 & 0xF) | (b1 >> 6 << 4)) if hi else (b1 & 63)
    mn = ((b3 >> 4) | (b2 >> 6 << 4)) if hi else (b2 & 63)
    d = float(np.frombuffer(hdr[0:2], np.float16)[0])
    dmin = float(np.frombuffer(hdr[2:4], np.float16)[0])
    return d * sc * (0.0625 if s else 1.0), -dmin * mn


def frag(wq: int, s: int, scale: float, neg_min: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """TraitsK45::frag: (s02, s13) as pairs (low half, high half): lop3(wq, mask, magic) and lop3(wq >> 8, ...),
    magic removed, then scale and min."""
    mask = 0x00F000F0 if s else 0x000F000F

    def pair(v: int) -> tuple[float, float]:
        m = v & mask
        return ((m & 0xFFFF) * scale + neg_min, (m >> 16) * scale + neg_min)

    return pair(wq), pair(wq >> 8)


def smalln_group(grp: int) -> tuple[int, int]:
    return find_group(grp, klane, kstep)


def stage(x: np.ndarray, kb: int, nt: int, w_warps: int) -> dict:
    return stage_x(x, kb, nt, w_warps, smalln_group)


# ---- the model ----------------------------------------------------------------------------------

def random_q4k(rows: int, k: int, rng) -> bytes:
    nb = k // QK
    blocks = rng.integers(0, 256, size=(rows * nb, BLOCK), dtype=np.uint8)
    dd = (rng.uniform(0.5, 2.0, size=(rows * nb, 2)) * 1e-2).astype(np.float16)
    blocks[:, 0:4] = dd.view(np.uint8).reshape(rows * nb, 4)
    return blocks.tobytes()


def tiled(raw: bytes, rows: int, nb: int) -> bytes:
    src = np.frombuffer(raw, np.uint8).reshape(rows * nb, BLOCK)
    out = np.empty_like(src)
    for r in range(rows):
        for kb in range(nb):
            out[block_index(r, kb, nb, True)] = src[r * nb + kb]
    return out.tobytes()


def model_product(dev: bytes, rows: int, k: int, x: np.ndarray, tile: bool, w_warps: int) -> np.ndarray:
    """Y[rows, 8·nt] as the kernel's mma sequence computes it (float64), one 16-row tile per (row tile, kb)."""
    nb = k // QK
    nt = x.shape[1] // 8
    y = np.zeros((rows, 8 * nt))
    for kb in range(nb):
        buf = stage(x, kb, nt, w_warps)
        for r0 in range(0, rows, 16):
            a_cnt = np.zeros((16, QK), dtype=int)  # how often each weight of the tile enters an A fragment
            for s in range(2):
                for c in range(2):
                    for u in range(4):
                        q = (c * 2 + s) * 4 + u
                        a = np.full((16, 16), np.nan)
                        b = np.full((16, 8 * nt), np.nan)
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            regs = []
                            for h in range(2):  # rows g, g + 8
                                row = r0 + g + 8 * h
                                hdr = dev[piece(row, kb, nb, t, 0, tile):][:16]
                                scale, neg_min = prep(hdr, t, s)
                                wq = word(dev, piece(row, kb, nb, t, 1 + c, tile), u)
                                regs.append(frag(wq, s, scale, neg_min))
                                for b_ in range(4):  # which weight each slot is (for the coverage check)
                                    a_cnt[g + 8 * h, klane(t) + kstep(c, u, s) + b_] += 1
                            # mma16816(acc, a0, a1, a2, a3): a0, a2 from row g (s02, s13), a1, a3 from row g + 8
                            a0, a2 = regs[0]
                            a1, a3 = regs[1]
                            for reg, (rr, kk) in zip((a0, a1, a2, a3), ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8),
                                                                         (g + 8, 2 * t + 8))):
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
                        y[r0: r0 + 16] += a @ b
            assert (a_cnt == 1).all(), "every weight of the tile enters exactly one A slot"
    return y


@pytest.mark.parametrize("tile", [False, True], ids=["Q4_K", "Q4_K_T"])
@pytest.mark.parametrize("nt,w_warps", [(1, 4), (3, 4), (4, 8)])
def test_v5_map_matches_w_times_x(tile, nt, w_warps):
    rng = np.random.default_rng(5 + nt + 10 * tile)
    rows, k = 32, 2 * QK
    raw = random_q4k(rows, k, rng)
    w = gguf.quants.dequantize(np.frombuffer(raw, np.uint8), gguf.GGMLQuantizationType.Q4_K).astype(np.float64)
    w = w.reshape(rows, k)
    x = rng.standard_normal((k, 8 * nt))
    dev = tiled(raw, rows, k // QK) if tile else raw
    got = model_product(dev, rows, k, x, tile, w_warps)
    want = w @ x
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_v5_map_permutes_k():
    """klane(t) + kstep(C, u, S) + b runs over 0..255 exactly once (per lane part t: its own 64 k, sub-blocks 2t
    (S = 0) and 2t + 1 (S = 1))."""
    ks = sorted(klane(t) + kstep(c, u, s) + b for t in range(4) for c in range(2) for s in range(2) for u in range(4)
                for b in range(4))
    assert ks == list(range(QK))
    for t in range(4):
        for s in range(2):
            sub = {(klane(t) + kstep(c, u, s) + b) // 32 for c in range(2) for u in range(4) for b in range(4)}
            assert sub == {2 * t + s}


def test_model_formulas_are_the_kernels():
    src = (ROOT / "cuda/common/qmm_smalln.cuh").read_text()
    body = src[src.index("struct TraitsK4V5"):]
    body = body[: body.index("};")]
    for needle in ["return p == Base::kHdr ? b : b + 16 + 32 * t + 16 * (p - Base::kQs);",
                   "__device__ static int klane(int t) { return 64 * t; }",
                   "static constexpr int kstep(int c, int u, int s) { return 16 * c + 32 * s + 4 * u; }",
                   "const int sh = 8 * (2 * (t & 1) + S);",
                   "const bool hi = t >= 2;",
                   "const int sc = hi ? (int)((b3 & 0xF) | (b1 >> 6 << 4)) : (int)(b1 & 63);",
                   "const int mn = hi ? (int)((b3 >> 4) | (b2 >> 6 << 4)) : (int)(b2 & 63);",
                   "(S ? 0.0625f : 1.0f)"]:
        assert needle in body, needle
    item = src[src.index("void smalln_item_v5"):]
    item = item[: item.index("// The kernel's item")]
    for needle in ["const int q = (c * Tr::kHiLo + st) * 4 + u;", "buf[(q * NT + ct) * 32 + (lane ^ u)]",
                   "Tr::template frag<c, st>(rr[m][0], sc[m][0], u, t, a0, a2);",
                   "Tr::template frag<c, st>(rr[m][1], sc[m][1], u, t, a1, a3);",
                   "mma16816(acc[m][ct], a0, a1, a2, a3, b[ct].x, b[ct].y);",
                   "Tr::template prep<0, st>(rr[m][0], t)"]:
        assert needle in item, needle
    stager = src[src.index("struct XStager"):]
    assert "const uint32_t d = ((4 * q4 + u) * NT) * 32 + ((4 * g + t) ^ u);" in stager
    assert "xl = a.x + (int64_t)g * a.k + 16 * warp + 4 * u;" in stager
    assert "h2_bits(__floats2half2_rn(v[i][ct].x, v[i][ct].z))" in stager
    blocks = (ROOT / "cuda/common/quant_blocks.cuh").read_text()
    assert re.search(r"constexpr uint32_t mask = S \? 0x00F000F0u : 0x000F000Fu;", blocks)
    assert "s13 = deq2(lop3<kAndOr>(wq >> 8, mask, or13)" in blocks
    assert "if constexpr (kTile) return ((row >> 4) * nb + kb) * kTileRows + (row & (kTileRows - 1));" in blocks
