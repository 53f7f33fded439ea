"""small-N v7's x staging (cuda/common/qmm_smalln.cuh, XStagerAsync; lb_qmm_smalln_select 17), modelled on the CPU.

v7 keeps v5's and v6's A maps, items and B reads; what is new is the path of x into the B buffer: at the top of an item
thread tid = 32·warp + lane copies (cp.async, 16 bytes) for each of its 16/W groups i (grp = warp + W·i) and column
tiles ct the float4 x[8ct + g][kb·256 + 16·grp + 4u .. +3] (g = lane >> 2, u = lane & 3) into its own fp32 slot,
float4 index (i·NT + ct)·32W + tid of the area after the two B buffers, and after the item reads the slot back
(LDS.128), converts it (fp16 pairs (x0, x2), (x1, x3)) and stores it at XStager's uint2 index
((4·q4 + u)·NT)·32 + ((4g + t) ^ u) + 32ct. The model follows those formulas for W = 4 and 8 warps, NT = 3 and 4 column tiles, n = 17..32 and both maps (v5:
klane 64t, kstep 16c + 32s + 4u; v6: klane 128(t >> 1) + 16(t & 1), kstep 64c + 32s + 4u), and checks that
- every slot is written by one (thread, i, ct), read back only by that thread, lies inside smalln_v7_raw_bytes, and a
  warp's 32 copies / reads of one (i, ct) are 512 contiguous bytes (conflict-free);
- the global address each copy reads is x[column][k] of the column and k the slot stands for;
- the B buffer the conversion writes is XStager::stage's (smalln_stage_model.stage), element for element;
- every lane of every reading warp, through smalln_item's LDS index buf[(q·NT + ct)·32 + (lane ^ u)] and the PTX
  fragment ownership of mma.m16n8k16's B (b0: k rows 2t', 2t' + 1, b1: 2t' + 8, 2t' + 9 of column g'), gets x at the
  actual k of the map (klane(t') + kstep(c, u, s) + b at slots 2t', 2t' + 8, 2t' + 1, 2t' + 9 for b = 0, 1, 2, 3), and
  0 for columns ≥ n;
- a deliberately wrong slot formula is caught (the check is not vacuous);
- the formulas are the kernel's (looked up in the CUDA source);
- select 18's Q4_K_T loads (Traits<Q4_K_T_V7L>: tile pointer (tile·nb + kb)·2304, lane offsets 144g and 144g + 16 + 32t,
  immediates +16 and +1152) address exactly TraitsK4V5::piece's bytes (block_index<true>·144 + 0 | 16 + 32t | 32 + 32t)
  for every row, block and lane.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from smalln_stage_model import find_group
from smalln_stage_model import stage as stage_x

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "cuda" / "common" / "qmm_smalln.cuh"
QK = 256
STEPS = 16

MAPS = {
    "v5": (lambda t: 64 * t, lambda c, u, s: 16 * c + 32 * s + 4 * u),
    "v6": (lambda t: 128 * (t >> 1) + 16 * (t & 1), lambda c, u, s: 64 * c + 32 * s + 4 * u),
}


def raw_bytes(nt: int) -> int:
    """smalln_v7_raw_bytes"""
    return STEPS * nt * 32 * 16


def issue(x_cm: np.ndarray, k: int, kb: int, n: int, nt: int, w: int, slot_of=None) -> tuple[dict, dict]:
    """XStagerAsync::issue for every thread: ({float4 slot: (tid, values)}, {(tid, i, ct): slot}). x_cm is x as the
    kernel holds it, column-major [n · K] floats (column c at c·K)."""
    slot_of = slot_of or (lambda i, ct, tid: (i * nt + ct) * (32 * w) + tid)
    raw, where = {}, {}
    flat = x_cm.reshape(-1)
    for warp in range(w):
        for lane in range(32):
            tid = 32 * warp + lane
            g, u = lane >> 2, lane & 3
            xl = g * k + 16 * warp + 4 * u  # XStagerAsync::xl (floats from x)
            p = xl + kb * QK
            for ct in range(nt):
                for i in range(STEPS // w):
                    if 8 * ct + g < n:
                        src = p + 16 * w * i
                        # the address is x[8ct + g][kb·256 + 16·grp + 4u]
                        assert src == (8 * ct + g) * k + kb * QK + 16 * (warp + w * i) + 4 * u
                        slot = slot_of(i, ct, tid)
                        assert 0 <= slot < raw_bytes(nt) // 16, "a slot outside the fp32 area"
                        assert slot not in raw, "two copies into one slot"
                        raw[slot] = (tid, flat[src: src + 4].copy())
                        where[(tid, i, ct)] = slot
                p += 8 * k  # col_stride
    return raw, where


def convert(raw: dict, n: int, nt: int, w: int, group, dst_of=None) -> dict:
    """XStagerAsync::convert for every thread into one B buffer: {uint2 index: ((x0, x2), (x1, x3))}; the slot it reads
    back is its own formula (raws[(i·NT + ct)·32W], raws = this thread's slot 0), not issue's record."""
    dst_of = dst_of or (lambda q4, t, g, u: ((4 * q4 + u) * nt) * 32 + ((4 * g + t) ^ u))
    buf = {}
    for warp in range(w):
        for lane in range(32):
            tid = 32 * warp + lane
            g, u = lane >> 2, lane & 3
            for ct in range(nt):
                for i in range(STEPS // w):
                    q4, t = group(warp + w * i)
                    d = dst_of(q4, t, g, u)
                    if 8 * ct + g < n:
                        slot = (i * nt + ct) * (32 * w) + tid
                        assert slot in raw, "a thread reads back a slot no copy wrote"
                        owner, v = raw[slot]
                        assert owner == tid, "a thread reads back a slot another thread copied"
                    else:
                        v = np.zeros(4, np.float32)
                    idx = d + 32 * ct
                    assert idx not in buf
                    buf[idx] = ((v[0], v[2]), (v[1], v[3]))
    return buf


def check_reads(buf: dict, x: np.ndarray, kb: int, n: int, nt: int, klane, kstep) -> None:
    """Every reading lane's B fragments (smalln_item's LDS index, PTX B ownership) against x at the map's actual k.
    x is [k, 8·nt] (columns past n zero)."""
    for c in range(2):
        for s in range(2):
            for u in range(4):
                q = (2 * c + s) * 4 + u  # smalln_item / smalln_item_v5 (v6: q = 4j + u, j = 2c + s: the same q)
                for ct in range(nt):
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        b0, b1 = buf[(q * nt + ct) * 32 + (lane ^ u)]
                        # b0 = B[2t][g], B[2t + 1][g]; b1 = B[2t + 8][g], B[2t + 9][g];
                        # slot 2t ↔ byte 0, 2t + 1 ↔ 2, 2t + 8 ↔ 1, 2t + 9 ↔ 3
                        k0 = kb * QK + klane(t) + kstep(c, u, s)
                        col = 8 * ct + g
                        want = [x[k0 + b, col] if col < n else 0.0 for b in range(4)]
                        got = [b0[0], b1[0], b0[1], b1[1]]
                        assert np.array_equal(np.float32(got), np.float32(want)), \
                            f"lane {lane} step {q} ct {ct}: B {got} != x {want}"


def run_case(map_name: str, nt: int, w: int, n: int, slot_of=None, dst_of=None) -> None:
    klane, kstep = MAPS[map_name]
    k = 3 * QK
    rng = np.random.default_rng(1000 * nt + 10 * w + n)
    xn = rng.standard_normal((n, k)).astype(np.float32)  # x as the kernel takes it: [n, K], column c at c·K
    x_pad = np.zeros((k, 8 * nt), np.float32)
    x_pad[:, :n] = xn.T  # smalln_stage_model's [k, 8·nt] view
    group = lambda grp: find_group(grp, klane, kstep)  # noqa: E731
    x_cm = np.zeros((8 * nt, k), np.float32)  # reads past column n never happen (asserted by the zero fill)
    x_cm[:n] = xn
    for kb in range(k // QK):
        raw, _ = issue(x_cm, k, kb, n, nt, w, slot_of)
        buf = convert(raw, n, nt, w, group, dst_of)
        ref = stage_x(x_pad, kb, nt, w, group)
        assert buf.keys() == ref.keys()
        for idx in ref:
            assert np.array_equal(np.float32(buf[idx]), np.float32(ref[idx])), f"buffer entry {idx}"
        check_reads(buf, x_pad, kb, n, nt, klane, kstep)


@pytest.mark.parametrize("map_name", ["v5", "v6"])
@pytest.mark.parametrize("nt,w", [(3, 4), (4, 8), (3, 8), (4, 4)])
def test_v7_stage_matches_reads(map_name, nt, w):
    for n in range(8 * (nt - 1) + 1, 8 * nt + 1, 3 if nt == 4 else 2):
        run_case(map_name, nt, w, n)


@pytest.mark.parametrize("nt,w", [(3, 4), (4, 8)])
def test_v7_slots_conflict_free(nt, w):
    """A warp's 32 lanes copy / read one (i, ct) at 32 consecutive float4 slots (512 contiguous bytes)."""
    for warp in range(w):
        for i in range(STEPS // w):
            for ct in range(nt):
                slots = [(i * nt + ct) * (32 * w) + 32 * warp + lane for lane in range(32)]
                assert slots == list(range(slots[0], slots[0] + 32))
    # every (tid, i, ct) a distinct slot filling the area exactly
    all_slots = sorted((i * nt + ct) * (32 * w) + tid for tid in range(32 * w) for i in range(STEPS // w)
                       for ct in range(nt))
    assert all_slots == list(range(raw_bytes(nt) // 16))


def test_wrong_formulas_are_caught():
    """The checks can fail: copies into slots that the read-back does not use (two lanes' slots swapped; the slots in
    (ct, i) order), and a B index without the XOR by u."""
    def swapped(i, ct, tid):
        good = (i * 3 + ct) * 128 + tid
        return good ^ 1 if (i, ct) == (1, 2) else good
    for bad in (swapped, lambda i, ct, tid: (ct * 4 + i) * 128 + tid):
        with pytest.raises(AssertionError):
            run_case("v5", 3, 4, 23, slot_of=bad)
    with pytest.raises(AssertionError):
        run_case("v6", 3, 4, 23, dst_of=lambda q4, t, g, u: ((4 * q4 + u) * 3) * 32 + 4 * g + t)


def test_model_formulas_are_the_kernels():
    src = SRC.read_text()
    for line in [
        "constexpr size_t smalln_v7_raw_bytes(int nt) { return (size_t)kSmallnSteps * nt * 32 * 16; }",
        "xl = a.x + (int64_t)g * a.k + 16 * warp + 4 * u;",
        "dst[i] = ((4 * q4 + u) * NT) * 32 + ((4 * g + t) ^ u);",
        "raws = raw_area + 32 * warp + lane;",
        "raw + 16u * (uint32_t)((i * NT + ct) * kThreads)),",
        '"l"(p + 16 * W * i)',
        "const float4 v = 8 * ct + g < n ? raws[(i * NT + ct) * kThreads] : make_float4(0.f, 0.f, 0.f, 0.f);",
        "buf[dst[i] + 32 * ct] = make_uint2(h2_bits(__floats2half2_rn(v.x, v.z)),",
        "h2_bits(__floats2half2_rn(v.y, v.w)));",
        "const XA xa(a, warp, lane, reinterpret_cast<float4*>(xs_dyn + 2 * kBuf));",
        "if (more) xa.issue(nkb, a.n);",
        "if (more) xa.convert(a.n, xs[buf ^ 1]);",
        "for (int ct = 0; ct < NT; ++ct) b[ct] = buf[(q * NT + ct) * 32 + (lane ^ u)];",
    ]:
        assert line in src, f"qmm_smalln.cuh no longer has: {line}"


def test_v7l_lane_offsets_are_v5_pieces():
    """Traits<Q4_K_T_V7L>::load's addresses against TraitsK4V5::piece (block_index<true>) for rows g, g + 8 of every
    tile, every block column, every lane."""
    blk, nb = 144, 5
    for tile in range(3):
        for kb in range(nb):
            base = (tile * nb + kb) * 16 * blk  # smalln_load: (tile · nb + kb) · kTileBytes
            for g in range(8):
                for t in range(4):
                    hdr, qs = blk * g, blk * g + 16 + 32 * t  # lane_offsets
                    for h in range(2):
                        row = 16 * tile + g + 8 * h
                        b = (((row >> 4) * nb + kb) * 16 + (row & 15)) * blk  # block_index<true> · kBlockBytes
                        got = [base + hdr + 8 * blk * h, base + qs + 8 * blk * h, base + qs + 8 * blk * h + 16]
                        assert got == [b, b + 16 + 32 * t, b + 16 + 32 * t + 16], (tile, kb, g, t, h)
    src = SRC.read_text()
    for line in [
        "return {keep<kKeep>(Base5::kBlockBytes * g), keep<kKeep>(Base5::kBlockBytes * g + 16 + 32 * t)};",
        "static constexpr int kHalf = 8 * Base5::kBlockBytes;",
        "r[h].v[Base5::kHdr] = ldg_l1_first(hd + kHalf * h);",
        "r[h].v[Base5::kQs] = ldg_l1_first(qs + kHalf * h);",
        "r[h].v[Base5::kQs + 1] = ldg_l1_first(qs + kHalf * h + 16);",
        "Tr::load(a.w + (tile * nb + kb) * Tr::kTileBytes, ln, rr[m]);",
        "const uint8_t* hd = tile + ln.hdr;",
        "const uint8_t* qs = tile + ln.qs;",
    ]:
        assert line in src, f"qmm_smalln.cuh no longer has: {line}"
