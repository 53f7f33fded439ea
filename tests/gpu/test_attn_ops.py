"""27B gated attention ops (cuda/ops/attn_*.cu) against the CPU engine's math (engines/cpu.py).

lb_attn_prep vs RMSNorm1p + the CPU's rotate-half RoPE table (positions up to ~4K, where an fp32 angle
would already be off); lb_attn_decode / lb_attn_tree / lb_attn_causal vs cpu._attend over the same
f16 / bf16 cache values (so the comparison is of the fp32 math: relative RMS < 1e-4), with and without
split-KV partials, GQA groups 1, 4, 6 (27B: 24 / 4) and 8, trees with branches up to 64 slots, and
outputs NaN-poisoned before each call.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_attn_ops.py`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from gdn_attn_dev import Pool, assert_close, call, from_kv, lib, to_kv

from lucebox_cli.engines.base import Tree
from lucebox_cli.engines.cpu import _attend, _rms_norm, _sigmoid

pytestmark = pytest.mark.gpu

HD = 256
EPS = 1e-6
THETA = 1e7
ROPE = 64
TOL = 1e-4
f32 = np.float32
KV = {"f16": 0, "bf16": 1}


def rope_ref(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """CPUEngine._rope: float64 angles rounded to fp32 cos / sin, rotate-half on dims [0, 64)."""
    half = ROPE // 2
    inv = THETA ** (-np.arange(half, dtype=np.float64) * 2.0 / ROPE)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(f32)[:, None, :], np.sin(ang).astype(f32)[:, None, :]
    a, b = x[..., :half], x[..., half : 2 * half]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half :]], axis=-1)


def random_tree(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    par = np.full(n, -1, dtype=np.int64)
    for i in range(1, n):
        par[i] = i - 1 if rng.random() < 0.6 else rng.integers(0, i)
    return par


def mask_bits(anc: np.ndarray) -> np.ndarray:
    """[N, N] bool ancestor mask -> [N] uint64 (bit j = slot j visible)."""
    bits = np.zeros(anc.shape[0], dtype=np.uint64)
    for j in range(anc.shape[1]):
        bits |= anc[:, j].astype(np.uint64) << np.uint64(j)
    return bits


class Case:
    """Random cache [nkv, max_ctx, 256] (as the cache type), queries and q|gate rows for one launch."""

    def __init__(self, nh, nkv, kv_dtype, rows, t, seed):
        rng = np.random.default_rng(seed)
        self.nh, self.nkv, self.kv, self.t = nh, nkv, kv_dtype, t
        self.max_ctx = rows + 5
        k = rng.standard_normal((nkv, self.max_ctx, HD)).astype(f32)
        v = rng.standard_normal((nkv, self.max_ctx, HD)).astype(f32)
        self.kbits, self.vbits = to_kv(k, kv_dtype), to_kv(v, kv_dtype)
        # the reference reads exactly what the cache holds: [S, nkv, 256]
        self.keys = from_kv(self.kbits, kv_dtype).transpose(1, 0, 2)
        self.values = from_kv(self.vbits, kv_dtype).transpose(1, 0, 2)
        self.qf = rng.standard_normal((t, nh, HD)).astype(f32)
        self.qg = rng.standard_normal((t, nh * 2 * HD)).astype(f32)

    def want(self, n_rows: int, mask: np.ndarray) -> np.ndarray:
        o = _attend(self.qf, self.keys[:n_rows], self.values[:n_rows], mask)
        gate = self.qg.reshape(self.t, self.nh, 2 * HD)[..., HD:]
        return (o * _sigmoid(gate)).reshape(self.t, self.nh * HD)

    def run(self, fn: str, max_splits: int, *tail) -> np.ndarray:
        with Pool() as p:
            kc, vc, qf, qg = p.of(self.kbits), p.of(self.vbits), p.of(self.qf), p.of(self.qg)
            out = p.nan(self.t * self.nh * HD * 4)
            nbytes = lib().fn.lb_attn_partials_bytes(self.t, self.nh, max_splits)
            part = p.nan(nbytes) if nbytes else None
            call(fn, qf.ptr, kc.ptr, vc.ptr, self.kv, qg.at(HD * 4), self.nh * 2 * HD, 2 * HD, out.ptr,
                 part.ptr if part else None, max_splits, *tail)
            return out.get(f32, (self.t, self.nh * HD))


GROUPS = [(24, 4), (8, 2), (16, 2), (6, 6)]
GROUP_IDS = ["H24-KV4", "H8-KV2", "H16-KV2", "H6-KV6"]


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("n_ctx", [1, 37, 4097])
@pytest.mark.parametrize("splits", [1, 64], ids=["one", "split"])
def test_attn_decode(kv, nh, nkv, n_ctx, splits):
    c = Case(nh, nkv, KV[kv], n_ctx, 1, seed=n_ctx + nh)
    got = c.run("lb_attn_decode", splits, n_ctx, nh, nkv, c.max_ctx, None)
    assert_close(got, c.want(n_ctx, np.ones((1, n_ctx), dtype=bool)), TOL, "decode")


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", GROUPS[:3], ids=GROUP_IDS[:3])
@pytest.mark.parametrize("n_past,n", [(0, 10), (45, 23), (3001, 17), (100, 64)])
@pytest.mark.parametrize("splits", [1, 64], ids=["one", "split"])
def test_attn_tree(kv, nh, nkv, n_past, n, splits):
    par = random_tree(n, n + n_past)
    anc = Tree(np.zeros(n, dtype=np.int64), par).ancestor_mask()
    c = Case(nh, nkv, KV[kv], n_past + n, n, seed=n_past + 7 * n)
    with Pool() as p:
        masks = p.of(mask_bits(anc))
        got = c.run("lb_attn_tree", splits, masks.ptr, n, n_past, nh, nkv, c.max_ctx, None)
    mask = np.concatenate([np.ones((n, n_past), dtype=bool), anc], axis=1)
    assert_close(got, c.want(n_past + n, mask), TOL, "tree")


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("splits", [1, 64], ids=["one", "split"])
def test_attn_tree_nan_past_the_tree(kv, splits):
    """Cache rows past the tree's hold NaN (never written in a real cache): the kernels must not let
    them into the output (the tensor-core tree kernel zero-fills keys past the end of its range)."""
    nh, nkv, n_past, n = 24, 4, 70, 23
    par = random_tree(n, 3)
    anc = Tree(np.zeros(n, dtype=np.int64), par).ancestor_mask()
    c = Case(nh, nkv, KV[kv], n_past + n, n, seed=11)
    want = c.want(n_past + n, np.concatenate([np.ones((n, n_past), dtype=bool), anc], axis=1))
    c.kbits[:, n_past + n :] = 0xFFFF
    c.vbits[:, n_past + n :] = 0xFFFF
    with Pool() as p:
        masks = p.of(mask_bits(anc))
        got = c.run("lb_attn_tree", splits, masks.ptr, n, n_past, nh, nkv, c.max_ctx, None)
    assert_close(got, want, TOL, "tree with NaN rows after it")


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", GROUPS, ids=GROUP_IDS)
@pytest.mark.parametrize("pos0,t", [(0, 1), (0, 7), (50, 130), (0, 520)])
def test_attn_causal(kv, nh, nkv, pos0, t):
    c = Case(nh, nkv, KV[kv], pos0 + t, t, seed=pos0 + t)
    got = c.run("lb_attn_causal", 8, t, pos0, nh, nkv, c.max_ctx, None)
    mask = np.arange(pos0 + t)[None, :] <= (pos0 + np.arange(t))[:, None]
    assert_close(got, c.want(pos0 + t, mask), TOL, "causal")


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", [(24, 4), (8, 2)], ids=["H24-KV4", "H8-KV2"])
@pytest.mark.parametrize("t", [1, 2, 17, 64, 65, 200, 333])
@pytest.mark.parametrize("pos0", [0, 301])
@pytest.mark.parametrize("splits", [1, 8], ids=["one", "split"])
def test_attn_causal_tc_sizes(kv, nh, nkv, t, pos0, splits):
    """Causal prefill on the tensor cores (T > 1; T = 1 stays on the fp32 decode kernel) at sizes that end
    mid query tile and mid key tile, from an empty cache and after a 301-row prefix, with and without
    split-KV partials. Same 1e-4 as every attention form: the kernel is tc::tree_kernel's split-precision
    math (Q and P as hi + lo halves, ~1e-6 f16 / ~4e-6 bf16 relative RMS), only the visibility differs.
    Cache rows past the prompt hold NaN (never written in a real cache)."""
    c = Case(nh, nkv, KV[kv], pos0 + t, t, seed=3 * pos0 + t + nh)
    mask = np.arange(pos0 + t)[None, :] <= (pos0 + np.arange(t))[:, None]
    want = c.want(pos0 + t, mask)
    c.kbits[:, pos0 + t :] = 0xFFFF
    c.vbits[:, pos0 + t :] = 0xFFFF
    got = c.run("lb_attn_causal", splits, t, pos0, nh, nkv, c.max_ctx, None)
    assert_close(got, want, TOL, "causal (tensor cores)")


def test_attn_causal_fp32_switch():
    """LUCEBOX_ATTN_PREFILL=fp32 (read once per process) puts causal prefill back on the fp32 kernel: the
    27B-shaped causal cases again, in a child process under the switch."""
    env = dict(os.environ, LUCEBOX_ATTN_PREFILL="fp32")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
           "causal and H24-KV4 and not fp32_switch"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def _prep(p, qg, k, v, w_q, w_k, positions, pos0, kc, vc, kv, t, nh, nkv, max_ctx):
    qf = p.nan(t * nh * HD * 4)
    call("lb_attn_prep", p.of(qg).ptr, nh * 2 * HD, p.of(k).ptr, p.of(v).ptr, nkv * HD, p.of(w_q).ptr, p.of(w_k).ptr,
         p.of(positions).ptr if positions is not None else None, pos0, qf.ptr, kc.ptr, vc.ptr, kv, t, nh, nkv, max_ctx,
         ROPE, ctypes.c_float(EPS), ctypes.c_float(THETA), None)
    return qf.get(f32, (t, nh, HD))


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("nh,nkv", [(24, 4), (8, 2)], ids=["H24-KV4", "H8-KV2"])
@pytest.mark.parametrize("pos0,tree", [(0, False), (4090, False), (3000, True)], ids=["p0", "p4090", "tree"])
def test_attn_prep(kv, nh, nkv, pos0, tree):
    rng = np.random.default_rng(pos0 + nh)
    t = 6
    max_ctx = pos0 + t + 3
    qg = rng.standard_normal((t, nh * 2 * HD)).astype(f32)
    k, v = rng.standard_normal((t, nkv * HD)).astype(f32), rng.standard_normal((t, nkv * HD)).astype(f32)
    w_q, w_k = (1 + 0.2 * rng.standard_normal(HD)).astype(f32), (1 + 0.2 * rng.standard_normal(HD)).astype(f32)
    par = np.array([-1, 0, 1, 0, 3, 1])
    positions = (pos0 + Tree(np.zeros(t, dtype=np.int64), par).depth).astype(np.int32) if tree else None
    pos = positions if tree else pos0 + np.arange(t)
    q_ref = rope_ref(_rms_norm(qg.reshape(t, nh, 2 * HD)[..., :HD], w_q, EPS), pos)
    k_ref = rope_ref(_rms_norm(k.reshape(t, nkv, HD), w_k, EPS), pos)
    with Pool() as p:
        kc, vc = p.nan(nkv * max_ctx * HD * 2), p.nan(nkv * max_ctx * HD * 2)
        qf = _prep(p, qg, k, v, w_q, w_k, positions, pos0, kc, vc, KV[kv], t, nh, nkv, max_ctx)
        kbits = kc.get(np.uint16, (nkv, max_ctx, HD))[:, pos0 : pos0 + t].transpose(1, 0, 2)
        vbits = vc.get(np.uint16, (nkv, max_ctx, HD))[:, pos0 : pos0 + t].transpose(1, 0, 2)
    assert_close(qf, q_ref, 1e-5, "qf")
    # cache values: the rounding of the reference K (a last-bit tie may differ) and exactly V's rounding
    assert np.mean(kbits == to_kv(k_ref, KV[kv])) > 0.99
    assert_close(from_kv(kbits, KV[kv]), k_ref, 1e-2, "K in cache")
    assert np.array_equal(vbits, to_kv(v.reshape(t, nkv, HD), KV[kv]))


@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("n_run,t,pos0", [(3, 7, 0), (2, 7, 0), (3, 33, 1000), (2, 5, 90)])
def test_attn_prep_ld(kv, n_run, t, pos0):
    """lb_attn_prep_ld on the rows one prefill GEMM writes (Layers.qkv_plan): [q+gate | k | v] of one stride
    (n_run = 3), or [q+gate | k] with v from its own packed GEMM (n_run = 2); a NaN-filled pad after each row. qf
    and both caches bit for bit lb_attn_prep's on packed copies (the same kernel, other strides)."""
    nh, nkv = 24, 4
    rng = np.random.default_rng(7 * t + n_run)
    max_ctx = pos0 + t + 2
    qg = rng.standard_normal((t, nh * 2 * HD)).astype(f32)
    k, v = rng.standard_normal((t, nkv * HD)).astype(f32), rng.standard_normal((t, nkv * HD)).astype(f32)
    w_q, w_k = (1 + 0.2 * rng.standard_normal(HD)).astype(f32), (1 + 0.2 * rng.standard_normal(HD)).astype(f32)
    wq_, wk_ = nh * 2 * HD, nkv * HD
    ld = wq_ + wk_ * (n_run - 1) + 8  # the pad: read by nothing
    rows = np.full((t, ld), np.nan, f32)
    rows[:, :wq_], rows[:, wq_:wq_ + wk_] = qg, k
    if n_run == 3:
        rows[:, wq_ + wk_:wq_ + 2 * wk_] = v
    out = []
    with Pool() as p:
        for strided in (False, True):
            kc, vc = p.nan(nkv * max_ctx * HD * 2), p.nan(nkv * max_ctx * HD * 2)
            if strided:
                base = p.of(rows).ptr.value
                qf = p.nan(t * nh * HD * 4)
                vp, ld_v = (base + 4 * (wq_ + wk_), ld) if n_run == 3 else (p.of(v).ptr.value, wk_)
                call("lb_attn_prep_ld", base, ld, base + 4 * wq_, ld, vp, ld_v, p.of(w_q).ptr, p.of(w_k).ptr, None, pos0,
                     qf.ptr, kc.ptr, vc.ptr, KV[kv], t, nh, nkv, max_ctx, ROPE, ctypes.c_float(EPS),
                     ctypes.c_float(THETA), None)
                qf = qf.get(f32, (t, nh, HD))
            else:
                qf = _prep(p, qg, k, v, w_q, w_k, None, pos0, kc, vc, KV[kv], t, nh, nkv, max_ctx)
            out.append((qf, kc.get(np.uint16, (nkv, max_ctx, HD)), vc.get(np.uint16, (nkv, max_ctx, HD))))
    (q0, k0, v0), (q1, k1, v1) = out
    assert np.isfinite(q1).all() and np.array_equal(q1.view(np.uint32), q0.view(np.uint32))
    assert np.array_equal(k1, k0) and np.array_equal(v1, v0)


def test_prep_then_tree_verify():
    """A verify's attention end to end: prep at n_past + depth into rows n_past + slot, then the tree."""
    nh, nkv, kv, n_past, n = 24, 4, 0, 333, 19
    rng = np.random.default_rng(5)
    par = random_tree(n, 5)
    tree = Tree(np.zeros(n, dtype=np.int64), par)
    c = Case(nh, nkv, kv, n_past + n, n, seed=6)
    qg = rng.standard_normal((n, nh * 2 * HD)).astype(f32)
    k, v = rng.standard_normal((n, nkv * HD)).astype(f32), rng.standard_normal((n, nkv * HD)).astype(f32)
    w_q, w_k = (1 + 0.2 * rng.standard_normal(HD)).astype(f32), (1 + 0.2 * rng.standard_normal(HD)).astype(f32)
    positions = (n_past + tree.depth).astype(np.int32)
    with Pool() as p:
        kc, vc = p.of(c.kbits), p.of(c.vbits)
        qf = _prep(p, qg, k, v, w_q, w_k, positions, n_past, kc, vc, kv, n, nh, nkv, c.max_ctx)
        out = p.nan(n * nh * HD * 4)
        part = p.nan(lib().fn.lb_attn_partials_bytes(n, nh, 32))
        call("lb_attn_tree", p.of(qf).ptr, kc.ptr, vc.ptr, kv, p.of(qg).at(HD * 4), nh * 2 * HD, 2 * HD, out.ptr,
             part.ptr, 32, p.of(mask_bits(tree.ancestor_mask())).ptr, n, n_past, nh, nkv, c.max_ctx, None)
        got = out.get(f32, (n, nh * HD))
        keys = from_kv(kc.get(np.uint16, c.kbits.shape), kv).transpose(1, 0, 2)[: n_past + n]
        values = from_kv(vc.get(np.uint16, c.vbits.shape), kv).transpose(1, 0, 2)[: n_past + n]
    k_ref = rope_ref(_rms_norm(k.reshape(n, nkv, HD), w_k, EPS), positions)
    assert_close(keys[n_past:], k_ref, 1e-3, "tree K rows at n_past + slot")
    mask = np.concatenate([np.ones((n, n_past), dtype=bool), tree.ancestor_mask()], axis=1)
    o = _attend(qf, keys, values, mask)
    want = (o * _sigmoid(qg.reshape(n, nh, 2 * HD)[..., HD:])).reshape(n, nh * HD)
    assert_close(got, want, TOL, "tree verify output")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
