"""The one-kernel decode attention (cuda/ops/attn_decode_fused.cu: lb_attn_decode_fused and its graph form
lb_attn_decode_fused_at) against the CPU engine's math and against the three-kernel path it replaces
(lb_attn_prep + lb_attn_decode, or their _at forms).

Every case: one token at row n_past of a cache whose earlier rows are random (as the cache type) and whose rows
from n_past on hold NaN (never written in a real cache; row n_past is the op's to write), outputs and partials
NaN-poisoned, contexts 1, 2, 37, 600 and 4097 (one key, one tile, a split ending mid tile, the 27B measurement's
depth, a last split whose last tile holds only the new row), split counts 1 (no partials), 8 and 64, GQA groups
6 (27B: 24 / 4), 4 (8 / 2) and 8 (16 / 2: the new K's norm takes a second round of the block's warps), f16 and
bf16. Checked: the output against cpu._attend over the reference cache (relative RMS < 1e-4, the tolerance of
every attention form) and against the three-kernel path (< 1e-5: the same split ranges and fp32 math, the
kernels differ only where the compiler contracts a multiply-add differently); the K/V row it writes equals
lb_attn_prep's (V bit for bit, K to the last-bit ties of the f16 / bf16 rounding) and no other row changes; the
tickets are zero after every call; qf stays untouched (the fused kernel never writes it).

Graph-like use: the _at form called again and again on the same tickets and partials, the position advancing as
decode does (and once at the same position), every output checked: a ticket left behind by one launch would
merge the next one's splits early. LUCEBOX_ATTN_DECODE=split (read once per process) is checked in a child
process: the entry points then run the three kernels (qf written) with the same results.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_attn_decode_fused.py`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from gdn_attn_dev import Pool, assert_close, call, from_kv, lib, rel_rms, to_kv
from test_attn_ops import EPS, HD, KV, ROPE, THETA, TOL, rope_ref

from lucebox_cli.engines.cpu import _attend, _rms_norm, _sigmoid

pytestmark = pytest.mark.gpu

f32 = np.float32
TOL_SPLIT = 1e-5  # fused vs the three kernels


class Step:
    """One decode step's inputs: the token at row n_past, a cache with rows [0, n_past) random, the rest NaN."""

    def __init__(self, nh, nkv, kv, n_past, seed):
        rng = np.random.default_rng(seed)
        self.nh, self.nkv, self.kv, self.n_past = nh, nkv, kv, n_past
        self.max_ctx = n_past + 5
        self.qg = rng.standard_normal(nh * 2 * HD).astype(f32)
        self.k = rng.standard_normal(nkv * HD).astype(f32)
        self.v = rng.standard_normal(nkv * HD).astype(f32)
        self.w_q = (1 + 0.2 * rng.standard_normal(HD)).astype(f32)
        self.w_k = (1 + 0.2 * rng.standard_normal(HD)).astype(f32)
        self.kbits = np.full((nkv, self.max_ctx, HD), 0xFFFF, np.uint16)
        self.vbits = np.full((nkv, self.max_ctx, HD), 0xFFFF, np.uint16)
        self.kbits[:, :n_past] = to_kv(rng.standard_normal((nkv, n_past, HD)), kv)
        self.vbits[:, :n_past] = to_kv(rng.standard_normal((nkv, n_past, HD)), kv)

    def want(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(output [nh*256], K row [nkv, 256] fp32 before rounding, V row bits) from the CPU engine's math."""
        n, pos = self.n_past, np.asarray([self.n_past])
        q = rope_ref(_rms_norm(self.qg.reshape(1, self.nh, 2 * HD)[..., :HD], self.w_q, EPS), pos)
        k_row = rope_ref(_rms_norm(self.k.reshape(1, self.nkv, HD), self.w_k, EPS), pos)[0]
        v_bits = to_kv(self.v.reshape(self.nkv, HD), self.kv)
        keys = np.concatenate([from_kv(self.kbits[:, :n], self.kv), from_kv(to_kv(k_row, self.kv), self.kv)[:, None]],
                              axis=1)
        vals = np.concatenate([from_kv(self.vbits[:, :n], self.kv), from_kv(v_bits, self.kv)[:, None]], axis=1)
        o = _attend(q.astype(f32), keys.transpose(1, 0, 2), vals.transpose(1, 0, 2), np.ones((1, n + 1), bool))
        gate = self.qg.reshape(1, self.nh, 2 * HD)[..., HD:]
        return (o * _sigmoid(gate)).reshape(-1), k_row, v_bits


def _pos(p, form: str, n_past: int):
    return p.of(np.asarray([n_past, 0, 0, 0], np.int32)).ptr if form == "at" else n_past


def run_fused(c: Step, form: str, max_splits: int, repeats: int = 1):
    """lb_attn_decode_fused(_at) `repeats` times (fresh NaN output each time, same tickets and partials): the
    outputs, the caches after, the tickets after each call, qf after."""
    fn = "lb_attn_decode_fused_at" if form == "at" else "lb_attn_decode_fused"
    with Pool() as p:
        kc, vc = p.of(c.kbits), p.of(c.vbits)
        qf = p.nan(c.nh * HD * 4)
        nbytes = lib().fn.lb_attn_partials_bytes(1, c.nh, max_splits)
        part = p.nan(nbytes) if nbytes else None
        tickets = p.of(np.zeros(c.nkv, np.uint32))
        outs, after = [], []
        for _ in range(repeats):
            out = p.nan(c.nh * HD * 4)
            call(fn, p.of(c.qg).ptr, p.of(c.k).ptr, p.of(c.v).ptr, p.of(c.w_q).ptr, p.of(c.w_k).ptr,
                 _pos(p, form, c.n_past), qf.ptr, kc.ptr, vc.ptr, c.kv, out.ptr, part.ptr if part else None, max_splits,
                 tickets.ptr, c.nh, c.nkv, c.max_ctx, ROPE, ctypes.c_float(EPS), ctypes.c_float(THETA), None)
            outs.append(out.get(f32, (c.nh * HD,)))
            after.append(tickets.get(np.uint32, (c.nkv,)))
        return (outs, kc.get(np.uint16, c.kbits.shape), vc.get(np.uint16, c.vbits.shape), after,
                qf.get(np.uint32, (c.nh * HD,)))


def run_split(c: Step, form: str, max_splits: int):
    """The three-kernel path the engine used to issue: lb_attn_prep(_at) + lb_attn_decode(_at)."""
    with Pool() as p:
        kc, vc, qf = p.of(c.kbits), p.of(c.vbits), p.nan(c.nh * HD * 4)
        qg = p.of(c.qg)
        prep = "lb_attn_prep_at" if form == "at" else "lb_attn_prep"
        call(prep, qg.ptr, c.nh * 2 * HD, p.of(c.k).ptr, p.of(c.v).ptr, c.nkv * HD, p.of(c.w_q).ptr, p.of(c.w_k).ptr,
             None, _pos(p, form, c.n_past), qf.ptr, kc.ptr, vc.ptr, c.kv, 1, c.nh, c.nkv, c.max_ctx, ROPE,
             ctypes.c_float(EPS), ctypes.c_float(THETA), None)
        out = p.nan(c.nh * HD * 4)
        nbytes = lib().fn.lb_attn_partials_bytes(1, c.nh, max_splits)
        part = p.nan(nbytes) if nbytes else None
        common = (qf.ptr, kc.ptr, vc.ptr, c.kv, qg.at(HD * 4), c.nh * 2 * HD, 2 * HD, out.ptr,
                  part.ptr if part else None, max_splits)
        if form == "at":
            call("lb_attn_decode_at", *common, _pos(p, form, c.n_past), c.nh, c.nkv, c.max_ctx, None)
        else:
            call("lb_attn_decode", *common, c.n_past + 1, c.nh, c.nkv, c.max_ctx, None)
        return out.get(f32, (c.nh * HD,)), kc.get(np.uint16, c.kbits.shape), vc.get(np.uint16, c.vbits.shape)


def check_rows(c: Step, kc: np.ndarray, vc: np.ndarray, k_row: np.ndarray, v_bits: np.ndarray, what: str):
    """Row n_past holds the token's K (the reference's rounding, up to last-bit ties) and V (exactly); every
    other row is as it was."""
    n = c.n_past
    others = np.ones(c.max_ctx, bool)
    others[n] = False
    assert np.array_equal(kc[:, others], c.kbits[:, others]), f"{what}: K rows other than n_past changed"
    assert np.array_equal(vc[:, others], c.vbits[:, others]), f"{what}: V rows other than n_past changed"
    assert np.array_equal(vc[:, n], v_bits), f"{what}: V row"
    assert np.mean(kc[:, n] == to_kv(k_row, c.kv)) > 0.99, f"{what}: K row bits"
    assert_close(from_kv(kc[:, n], c.kv), k_row, 1e-2, f"{what}: K row")


GROUPS = [(24, 4), (8, 2), (16, 2)]
GROUP_IDS = ["H24-KV4", "H8-KV2", "H16-KV2"]


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("n_ctx", [1, 2, 37, 600, 4097])
@pytest.mark.parametrize("splits", [1, 8, 64])
@pytest.mark.parametrize("form", ["host", "at"])
def test_fused_decode(kv, nh, nkv, n_ctx, splits, form):
    c = Step(nh, nkv, KV[kv], n_ctx - 1, seed=n_ctx + nh + splits)
    want, k_row, v_bits = c.want()
    (got,), kc, vc, (tickets,), qf = run_fused(c, form, splits)
    assert_close(got, want, TOL, "fused vs reference")
    check_rows(c, kc, vc, k_row, v_bits, "fused")
    assert not tickets.any(), f"tickets left at {tickets}"
    if os.environ.get("LUCEBOX_ATTN_DECODE") != "split":  # (under the switch the three kernels write qf)
        assert (qf == 0xFFFFFFFF).all(), "the fused kernel wrote qf"
    ref, kc_s, vc_s = run_split(c, form, splits)
    assert not np.isnan(ref).any()
    err = rel_rms(got, ref)
    assert err < TOL_SPLIT, f"fused vs three kernels: relative RMS {err:.3g}"
    assert np.array_equal(vc, vc_s), "V row differs from lb_attn_prep's"
    assert np.array_equal(np.delete(kc, c.n_past, axis=1), np.delete(kc_s, c.n_past, axis=1))
    assert np.mean(kc[:, c.n_past] == kc_s[:, c.n_past]) > 0.99, "K row differs from lb_attn_prep's beyond ties"


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("splits", [8, 64])
def test_fused_decode_at_repeated(kv, splits):
    """Graph replays: the _at form on the same tickets / partials, positions 600, 601, 602 (one cache, each step's
    row written before the next reads it, as decode does), then 602 again; each output checked."""
    nh, nkv = 24, 4
    c = Step(nh, nkv, KV[kv], 600, seed=splits)
    rng = np.random.default_rng(99)
    with Pool() as p:
        kc, vc = p.of(c.kbits), p.of(c.vbits)
        qf = p.nan(nh * HD * 4)
        part = p.nan(lib().fn.lb_attn_partials_bytes(1, nh, splits))
        tickets = p.of(np.zeros(nkv, np.uint32))
        pos = p.of(np.zeros(4, np.int32))
        for n_past in (600, 601, 602, 602):
            c.n_past = n_past
            c.kbits, c.vbits = kc.get(np.uint16, c.kbits.shape), vc.get(np.uint16, c.vbits.shape)
            c.kbits[:, n_past:] = 0xFFFF  # rows past the context: NaN again (602 twice: its row is rewritten)
            c.vbits[:, n_past:] = 0xFFFF
            kc.put(c.kbits)
            vc.put(c.vbits)
            c.qg, c.k, c.v = (rng.standard_normal(a.size).astype(f32) for a in (c.qg, c.k, c.v))
            want, k_row, v_bits = c.want()
            pos.put(np.asarray([n_past, 0, 0, 0], np.int32))
            out = p.nan(nh * HD * 4)
            call("lb_attn_decode_fused_at", p.of(c.qg).ptr, p.of(c.k).ptr, p.of(c.v).ptr, p.of(c.w_q).ptr,
                 p.of(c.w_k).ptr, pos.ptr, qf.ptr, kc.ptr, vc.ptr, c.kv, out.ptr, part.ptr, splits, tickets.ptr, nh, nkv,
                 c.max_ctx, ROPE, ctypes.c_float(EPS), ctypes.c_float(THETA), None)
            assert_close(out.get(f32, (nh * HD,)), want, TOL, f"replay at n_past {n_past}")
            check_rows(c, kc.get(np.uint16, c.kbits.shape), vc.get(np.uint16, c.vbits.shape), k_row, v_bits,
                       f"replay at n_past {n_past}")
            assert not tickets.get(np.uint32, (nkv,)).any(), f"tickets left after n_past {n_past}"


def test_fused_decode_three_in_a_row_host():
    """The host form three times on one buffer set (outputs re-poisoned in between): identical each time."""
    c = Step(24, 4, 0, 599, seed=3)
    want, _, _ = c.want()
    outs, _, _, tickets, _ = run_fused(c, "host", 64, repeats=3)
    for o, t in zip(outs, tickets):
        assert_close(o, want, TOL, "host form, repeated")
        assert not t.any()
    assert all(np.array_equal(outs[0], o) for o in outs[1:]), "repeated calls differ"


def test_fused_refusals():
    """Bad arguments come back as LB_ERR_INVALID_ARG before any launch."""
    from lucebox_cli.engines import _lib

    fn, p = lib().fn, ctypes.c_void_p(16)
    args = [p] * 5 + [7, p, p, p, 0, p, p, 64, p, 24, 4, 100, 64, ctypes.c_float(EPS), ctypes.c_float(THETA), None]

    def status(**change):
        a = list(args)
        for i, x in change.items():
            a[int(i[1:])] = x
        return fn.lb_attn_decode_fused(*a)

    assert status(a13=None) == _lib.LB_ERR_INVALID_ARG  # split-KV without tickets
    assert status(a5=100) == _lib.LB_ERR_INVALID_ARG  # the row outside the cache
    assert status(a15=5) == _lib.LB_ERR_INVALID_ARG  # 24 heads over 5 kv heads
    assert status(a17=63) == _lib.LB_ERR_INVALID_ARG  # odd rope_dims
    assert status(a9=2) == _lib.LB_ERR_INVALID_ARG  # kv dtype


def test_split_switch():
    """LUCEBOX_ATTN_DECODE=split (read once per process) runs the three kernels behind the same entry points:
    in a child process, the fused tests (except the qf check, which the split path writes) pass under it."""
    env = dict(os.environ, LUCEBOX_ATTN_DECODE="split")
    code = ("import sys; sys.path[:0] = [%r]; import numpy as np, test_attn_decode_fused as t\n"
            "for form in ('host', 'at'):\n"
            "    for n_ctx, splits in ((1, 64), (600, 64), (4097, 8), (37, 1)):\n"
            "        c = t.Step(24, 4, 0, n_ctx - 1, seed=n_ctx)\n"
            "        want, k_row, v_bits = c.want()\n"
            "        (got,), kc, vc, _, qf = t.run_fused(c, form, splits)\n"
            "        t.assert_close(got, want, t.TOL, 'split switch')\n"
            "        t.check_rows(c, kc, vc, k_row, v_bits, 'split switch')\n"
            "        assert not (qf == 0xFFFFFFFF).all(), 'qf untouched: the switch did not take'\n"
            "print('ok')\n") % os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=repo)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
