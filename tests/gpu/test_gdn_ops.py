"""27B Gated DeltaNet ops (cuda/ops/gdn_*.cu) against the CPU engine's math (engines/cpu.py).

Every op on random inputs at the 27B head counts (Hk16-Hv48) and a small odd one (Hk2-Hv6), outputs
NaN-poisoned before the call, compared by relative RMS error (< 1e-4: fp32 throughout), final recurrent
and conv states too. Trees are random with branches (10-23 slots); the commit is checked against the
CPU's per-slot state of the accepted node. A 2,000-step decode checks that the GPU state drifts from a
float64 reference no more than the CPU's own fp32 does. The chunked prefill runs on the tensor cores (split bf16
products, ~6e-6) and, in a child process, on the fp32 kernels (LUCEBOX_DN_PREFILL=old), both at the same 1e-4.

The fused one-kernel decode step (gdn_decode_fused.cu, lb_gdn_decode_step's default at t = 1 on sm_90) is
checked over consecutive steps against the chained CPU math, against the three-kernel path
(LUCEBOX_GDN_DECODE=split in a child process) and under CUDA-graph replays.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_gdn_ops.py`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
from gdn_attn_dev import Pool, assert_close, call, rel_rms

from lucebox_cli.engines.base import Tree
from lucebox_cli.engines.cpu import (_l2_norm, _rms_norm, _sigmoid, _silu, _tile_heads, gated_delta_chunked,
                                     gated_delta_recurrent, gated_delta_tree)
from lucebox_cli.engines.gdn_tree_plan import save_plan

pytestmark = pytest.mark.gpu

D = 128
EPS = 1e-6
TOL = 1e-4
HEADS = [(16, 48), (2, 6)]
HEAD_IDS = ["Hk16-Hv48", "Hk2-Hv6"]
f32 = np.float32


def weights(hk: int, hv: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    c = (2 * hk + hv) * D
    return {
        "conv_w": (rng.standard_normal((c, 4)) * 0.5).astype(f32),
        "ssm_a": (-np.exp(rng.standard_normal(hv) * 0.5)).astype(f32),
        "dt_bias": (rng.standard_normal(hv) * 0.5).astype(f32),
        "norm_w": (1.0 + 0.1 * rng.standard_normal(D)).astype(f32),
    }


def layer_inputs(t: int, hk: int, hv: int, seed: int, dtype=f32) -> dict:
    rng = np.random.default_rng(seed)
    c = (2 * hk + hv) * D
    return {
        "pre": rng.standard_normal((t, c)).astype(dtype),
        "a": rng.standard_normal((t, hv)).astype(dtype),
        "b": rng.standard_normal((t, hv)).astype(dtype),
        "z": rng.standard_normal((t, hv * D)).astype(dtype),
        "conv": rng.standard_normal((3, c)).astype(dtype),
    }


def delta_inputs(n: int, hk: int, hv: int, seed: int):
    rng = np.random.default_rng(seed)
    q = (_l2_norm(rng.standard_normal((n, hk, D))) / np.sqrt(D)).astype(f32)
    k = _l2_norm(rng.standard_normal((n, hk, D))).astype(f32)
    v = rng.standard_normal((n, hv, D)).astype(f32)
    g = (-np.abs(rng.standard_normal((n, hv))) * 0.3).astype(f32)
    beta = rng.uniform(0.05, 0.95, (n, hv)).astype(f32)
    state = (rng.standard_normal((hv, D, D)) * 0.1).astype(f32)
    return q, k, v, g, beta, state


def random_tree(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    par = np.full(n, -1, dtype=np.int32)
    for i in range(1, n):
        par[i] = i - 1 if rng.random() < 0.6 else rng.integers(0, i)
    return par


def tree_windows(parents) -> np.ndarray:
    """CPUEngine._tree_windows: rows of concat(conv_state, pre) forming each slot's window."""
    tree = Tree(np.zeros(len(parents), dtype=np.int64), np.asarray(parents, dtype=np.int64))
    rows = [([0, 1, 2] + [3 + s for s in tree.path_to(i)])[-4:] for i in range(tree.size)]
    return np.asarray(rows, dtype=np.int64)


def prep_ref(x: dict, w: dict, hk: int, hv: int, windows=None):
    """cpu.py CPUEngine._deltanet from pre to (q, k, v, g, beta) and the advanced conv state."""
    pre = x["pre"]
    t = pre.shape[0]
    history = np.concatenate([x["conv"], pre], axis=0)
    cw = w["conv_w"].astype(pre.dtype)
    if windows is None:
        mixed = sum(history[j : j + t] * cw[:, j] for j in range(4))
    else:
        mixed = np.einsum("tkc,ck->tc", history[windows], cw)
    mixed = _silu(mixed)
    qk = hk * D
    q = _l2_norm(mixed[:, :qk].reshape(t, hk, D)) / np.sqrt(D).astype(pre.dtype)
    k = _l2_norm(mixed[:, qk : 2 * qk].reshape(t, hk, D))
    v = mixed[:, 2 * qk :].reshape(t, hv, D)
    beta = _sigmoid(x["b"])
    g = w["ssm_a"].astype(pre.dtype) * np.logaddexp(0.0, x["a"] + w["dt_bias"].astype(pre.dtype))
    return q, k, v, g.astype(pre.dtype), beta.astype(pre.dtype), history[-3:]


def out_ref(o: np.ndarray, z: np.ndarray, norm_w: np.ndarray, hv: int) -> np.ndarray:
    t = o.shape[0]
    return (_rms_norm(o, norm_w, EPS) * _silu(z.reshape(t, hv, D))).reshape(t, hv * D)


def _wdev(p: Pool, w: dict) -> dict:
    return {k: p.of(v) for k, v in w.items()}


def _prep_outputs(p: Pool, t: int, hk: int, hv: int):
    return (p.nan(t * hk * D * 4), p.nan(t * hk * D * 4), p.nan(t * hv * D * 4), p.nan(t * hv * 4),
            p.nan(t * hv * 4))


def _get_prep(bufs, t, hk, hv):
    q, k, v, g, b = bufs
    return (q.get(f32, (t, hk, D)), k.get(f32, (t, hk, D)), v.get(f32, (t, hv, D)), g.get(f32, (t, hv)),
            b.get(f32, (t, hv)))


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t", [1, 5, 130])
def test_conv_prep_sequential(hk, hv, t):
    w, x = weights(hk, hv, 1), layer_inputs(t, hk, hv, 2 + t)
    want = prep_ref(x, w, hk, hv)
    c = (2 * hk + hv) * D
    with Pool() as p:
        wd, pre, a, b, conv = _wdev(p, w), p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["conv"])
        outs = _prep_outputs(p, t, hk, hv)
        call("lb_gdn_conv_prep", pre.ptr, c, a.ptr, b.ptr, wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr,
             conv.ptr, None, *[o.ptr for o in outs], t, hk, hv, 1, None)
        got = _get_prep(outs, t, hk, hv)
        for name, gv, wv in zip("q k v g beta".split(), got, want):
            assert_close(gv, wv, TOL, name)
        assert np.array_equal(conv.get(f32, (3, c)), want[5]), "conv state not advanced to the last 3 inputs"


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("n,seed", [(10, 3), (23, 4)])
def test_conv_prep_tree(hk, hv, n, seed):
    par = random_tree(n, seed)
    w, x = weights(hk, hv, seed), layer_inputs(n, hk, hv, seed + 10)
    want = prep_ref(x, w, hk, hv, tree_windows(par))
    c = (2 * hk + hv) * D
    with Pool() as p:
        wd, pre, a, b, conv = _wdev(p, w), p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["conv"])
        outs = _prep_outputs(p, n, hk, hv)
        call("lb_gdn_conv_prep", pre.ptr, c, a.ptr, b.ptr, wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr,
             conv.ptr, p.of(par).ptr, *[o.ptr for o in outs], n, hk, hv, 0, None)
        for name, gv, wv in zip("q k v g beta".split(), _get_prep(outs, n, hk, hv), want):
            assert_close(gv, wv, TOL, name)
        assert np.array_equal(conv.get(f32, (3, c)), x["conv"]), "verify must not touch the conv state"


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t", [1, 7, 130])  # 130: three prefetch bursts of at most 64 steps
def test_delta_recurrent(hk, hv, t):
    q, k, v, g, beta, state = delta_inputs(t, hk, hv, 20 + t)
    o_ref, s_ref = gated_delta_recurrent(q, k, v, g, beta, state)
    with Pool() as p:
        st, o = p.of(state), p.nan(t * hv * D * 4)
        call("lb_gdn_delta", p.of(q).ptr, p.of(k).ptr, p.of(v).ptr, p.of(g).ptr, p.of(beta).ptr, st.ptr, o.ptr, None,
             None, 0, t, hk, hv, 1, None)
        assert_close(o.get(f32, (t, hv, D)), o_ref, TOL, "o")
        assert_close(st.get(f32, state.shape), s_ref, TOL, "state")


def _tree_plan(par: np.ndarray) -> int:
    idx = np.empty(par.size, dtype=np.int32)
    cnt = ctypes.c_int()
    call("lb_gdn_tree_plan", par.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), par.size,
         idx.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ctypes.byref(cnt))
    assert idx.tolist() == save_plan(par).tolist()
    return cnt.value


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("n,seed", [(10, 5), (17, 6), (23, 7)], ids=["N10", "N17", "N23"])
def test_delta_tree_and_commit(hk, hv, n, seed):
    q, k, v, g, beta, state = delta_inputs(n, hk, hv, seed)
    par = random_tree(n, seed)
    o_ref, states = gated_delta_tree(q, k, v, g, beta, state, par)
    n_saves = _tree_plan(par)
    c = (2 * hk + hv) * D
    rng = np.random.default_rng(seed)
    pre, conv0 = rng.standard_normal((n, c)).astype(f32), rng.standard_normal((3, c)).astype(f32)
    leaf = int(np.argmax(Tree(np.zeros(n, dtype=np.int64), par.astype(np.int64)).depth))
    path = np.asarray(Tree(np.zeros(n, dtype=np.int64), par.astype(np.int64)).path_to(leaf), dtype=np.int32)
    with Pool() as p:
        st, o, saves = p.of(state), p.nan(n * hv * D * 4), p.nan(max(n_saves, 1) * hv * D * D * 4)
        kd, vd, gd, bd = p.of(k), p.of(v), p.of(g), p.of(beta)
        call("lb_gdn_delta", p.of(q).ptr, kd.ptr, vd.ptr, gd.ptr, bd.ptr, st.ptr, o.ptr, p.of(par).ptr, saves.ptr,
             n_saves, n, hk, hv, 0, None)
        assert_close(o.get(f32, (n, hv, D)), o_ref, TOL, "tree o")
        assert np.array_equal(st.get(f32, state.shape), state), "verify must not write the committed state"
        conv = p.of(conv0)
        call("lb_gdn_commit", kd.ptr, vd.ptr, gd.ptr, bd.ptr, p.of(pre).ptr, c, st.ptr, conv.ptr, p.of(path).ptr,
             path.size, hk, hv, None)
        assert_close(st.get(f32, state.shape), states[leaf], TOL, f"committed state after path {path.tolist()}")
        want_conv = np.concatenate([conv0, pre[path]], axis=0)[-3:]
        assert np.array_equal(conv.get(f32, (3, c)), want_conv), "conv state after commit"


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
def test_delta_tree_many_saves(hk, hv):
    """A comb: a 20-slot spine, each spine slot also parent of a side slot -> 20 saves, more than the
    kernel keeps in shared memory, so the walk mixes on-chip and global saves (and the 40-step burst)."""
    n = 40
    par = np.array([-1] + list(range(19)) + list(range(20)), dtype=np.int32)
    q, k, v, g, beta, state = delta_inputs(n, hk, hv, 41)
    o_ref, _ = gated_delta_tree(q, k, v, g, beta, state, par)
    n_saves = _tree_plan(par)
    assert n_saves == 20
    with Pool() as p:
        o, saves = p.nan(n * hv * D * 4), p.nan(n_saves * hv * D * D * 4)
        call("lb_gdn_delta", p.of(q).ptr, p.of(k).ptr, p.of(v).ptr, p.of(g).ptr, p.of(beta).ptr, p.of(state).ptr,
             o.ptr, p.of(par).ptr, saves.ptr, n_saves, n, hk, hv, 0, None)
        assert_close(o.get(f32, (n, hv, D)), o_ref, TOL, "comb tree o")


def test_tree_scratch_too_small_poisons():
    hk, hv, n = 2, 6, 6
    q, k, v, g, beta, state = delta_inputs(n, hk, hv, 9)
    par = np.array([-1, 0, 1, 0, 3, 1], dtype=np.int32)  # slots 3 and 5 reload saved states
    with Pool() as p:
        o = p.nan(n * hv * D * 4)
        call("lb_gdn_delta", p.of(q).ptr, p.of(k).ptr, p.of(v).ptr, p.of(g).ptr, p.of(beta).ptr, p.of(state).ptr,
             o.ptr, p.of(par).ptr, None, 0, n, hk, hv, 0, None)
        got = o.get(f32, (n, hv, D))
    assert np.isfinite(got[:3]).all() and np.isnan(got[3]).all() and np.isnan(got[5]).all()


def _layer_call(name, p, x, w, hk, hv, t, conv, st, y, scratch):
    wd = _wdev(p, w)
    call(name, p.of(x["pre"]).ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr, wd["conv_w"].ptr,
         wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr, scratch.ptr, t, hk, hv,
         ctypes.c_float(EPS), None)


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t", [1, 3])
def test_decode_step(hk, hv, t):
    from gdn_attn_dev import lib

    w, x = weights(hk, hv, 30), layer_inputs(t, hk, hv, 31)
    state = delta_inputs(1, hk, hv, 32)[5]
    q, k, v, g, beta, conv_new = prep_ref(x, w, hk, hv)
    o, s_ref = gated_delta_recurrent(q, k, v, g, beta, state)
    y_ref = out_ref(o, x["z"], w["norm_w"], hv)
    c = (2 * hk + hv) * D
    with Pool() as p:
        conv, st, y = p.of(x["conv"]), p.of(state), p.nan(t * hv * D * 4)
        scratch = p.nan(lib().fn.lb_gdn_step_scratch_bytes(t, hk, hv))
        _layer_call("lb_gdn_decode_step", p, x, w, hk, hv, t, conv, st, y, scratch)
        assert_close(y.get(f32, (t, hv * D)), y_ref, TOL, "y")
        assert_close(st.get(f32, state.shape), s_ref, TOL, "state")
        assert np.array_equal(conv.get(f32, (3, c)), conv_new)


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t", [1, 64, 65, 200, 520])
def test_chunked(hk, hv, t):
    from gdn_attn_dev import lib

    q, k, v, g, beta, state = delta_inputs(t, hk, hv, 40 + t)
    o_ref, s_ref = gated_delta_chunked(q, k, v, g, beta, state)
    with Pool() as p:
        st, o = p.of(state), p.nan(t * hv * D * 4)
        scratch = p.nan(lib().fn.lb_gdn_chunked_scratch_bytes(t, hv))
        call("lb_gdn_chunked", p.of(q).ptr, p.of(k).ptr, p.of(v).ptr, p.of(g).ptr, p.of(beta).ptr, st.ptr, o.ptr,
             scratch.ptr, t, hk, hv, None)
        assert_close(o.get(f32, (t, hv, D)), o_ref, TOL, "o")
        assert_close(st.get(f32, state.shape), s_ref, TOL, "state")


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t", [1, 64, 150, 520])
def test_prefill(hk, hv, t):
    """One layer's prompt segment (lb_gdn_prefill: on the tensor-core path the conv inside the chunk prep and the
    out_norm inside the chunk output): y, the state and the conv state (exact) against cpu.py's math."""
    from gdn_attn_dev import lib

    w, x = weights(hk, hv, 50), layer_inputs(t, hk, hv, 51)
    state = delta_inputs(1, hk, hv, 52)[5]
    q, k, v, g, beta, conv_new = prep_ref(x, w, hk, hv)
    o, s_ref = gated_delta_chunked(q, k, v, g, beta, state)
    c = (2 * hk + hv) * D
    with Pool() as p:
        conv, st, y = p.of(x["conv"]), p.of(state), p.nan(t * hv * D * 4)
        scratch = p.nan(lib().fn.lb_gdn_prefill_scratch_bytes(t, hk, hv))
        _layer_call("lb_gdn_prefill", p, x, w, hk, hv, t, conv, st, y, scratch)
        assert_close(y.get(f32, (t, hv * D)), out_ref(o, x["z"], w["norm_w"], hv), TOL, "y")
        assert_close(st.get(f32, state.shape), s_ref, TOL, "state")
        assert np.array_equal(conv.get(f32, (3, c)), conv_new)


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("t,pad,form", [(1, 0, "all"), (150, 0, "all"), (520, 0, "all"), (65, 8, "all"),
                                        (150, 0, "ab"), (520, 0, "ab"), (65, 8, "ab")])
def test_prefill_ld(hk, hv, t, pad, form):
    """lb_gdn_prefill_ld on the rows the engine's fewer GEMMs write (Layers.zab_plan): "all" z | beta | alpha in rows
    of one stride hv*128 + 2*hv (+ pad), "ab" z packed and beta | alpha in rows of 2*hv (+ pad); the pad NaN-filled.
    y, the state and the conv state bit for bit those of lb_gdn_prefill on packed copies (the same kernels, other
    strides). On the fp32 path (the child of test_chunked_fp32_path) it refuses with LB_ERR_UNSUPPORTED and writes
    nothing."""
    from gdn_attn_dev import lib

    w, x = weights(hk, hv, 60), layer_inputs(t, hk, hv, 61)
    state = delta_inputs(1, hk, hv, 62)[5]
    c, vd = (2 * hk + hv) * D, hv * D
    z0 = vd if form == "all" else 0  # where beta starts in the strided rows
    ld = z0 + 2 * hv + pad
    rows = np.full((t, ld), np.nan, np.float32)
    if form == "all":
        rows[:, :vd] = x["z"].reshape(t, vd)
    rows[:, z0:z0 + hv], rows[:, z0 + hv:z0 + 2 * hv] = x["b"], x["a"]
    with Pool() as p:
        wd = _wdev(p, w)
        outs = []
        for strided in (False, True):
            conv, st, y = p.of(x["conv"]), p.of(state), p.nan(t * vd * 4)
            scratch = p.nan(lib().fn.lb_gdn_prefill_scratch_bytes(t, hk, hv))
            tail = (wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr,
                    scratch.ptr, t, hk, hv, ctypes.c_float(EPS), None)
            if strided:
                base = p.of(rows).ptr.value
                if form == "all":
                    zp, ld_z = base, ld
                else:
                    zp, ld_z = p.of(x["z"]).ptr.value, vd
                rc = lib().fn.lb_gdn_prefill_ld(p.of(x["pre"]).ptr, base + 4 * (z0 + hv), base + 4 * z0, zp, ld_z, ld,
                                                *tail)
                if lib().fn.lb_deltanet_chunked_path() == 0:
                    assert rc == 6 and np.isnan(y.get(f32, (t, vd))).all()  # LB_ERR_UNSUPPORTED
                    return
                assert rc == 0, lib().fn.lb_last_error()
            else:
                call("lb_gdn_prefill", p.of(x["pre"]).ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr, *tail)
            outs.append((y.get(f32, (t, vd)), st.get(f32, state.shape), conv.get(f32, (3, c))))
        (y0, s0, c0), (y1, s1, c1) = outs
        assert np.isfinite(y1).all()
        for a_, b_, what in ((y1, y0, "y"), (s1, s0, "state"), (c1, c0, "conv")):
            assert np.array_equal(a_.view(np.uint32), b_.view(np.uint32)), what


def test_chunked_fp32_path():
    """test_chunked and test_prefill again on the fp32 kernels (LUCEBOX_DN_PREFILL=old: relayout, transposed state,
    separate out_norm), in a child process since the switch is read once per process; this process runs the
    tensor-core path (lb_deltanet_chunked_path)."""
    from gdn_attn_dev import lib

    if os.environ.get("LUCEBOX_DN_PREFILL") == "old":
        assert lib().fn.lb_deltanet_chunked_path() == 0
        pytest.skip("LUCEBOX_DN_PREFILL=old in this process: this is the child")
    assert lib().fn.lb_deltanet_chunked_path() == 1
    env = dict(os.environ, LUCEBOX_DN_PREFILL="old")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k",
                        "test_chunked or test_prefill"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


@pytest.mark.parametrize("hk,hv", HEADS, ids=HEAD_IDS)
def test_tree_verify_layer(hk, hv):
    n, seed = 19, 60
    par = random_tree(n, seed)
    w, x = weights(hk, hv, seed), layer_inputs(n, hk, hv, seed + 1)
    state = delta_inputs(1, hk, hv, seed + 2)[5]
    q, k, v, g, beta, _ = prep_ref(x, w, hk, hv, tree_windows(par))
    o, _ = gated_delta_tree(q, k, v, g, beta, state, par)
    n_saves = _tree_plan(par)
    with Pool() as p:
        wd = _wdev(p, w)
        conv, st, y = p.of(x["conv"]), p.of(state), p.nan(n * hv * D * 4)
        outs = _prep_outputs(p, n, hk, hv)
        od, saves = p.nan(n * hv * D * 4), p.nan(max(n_saves, 1) * hv * D * D * 4)
        call("lb_gdn_tree_verify", p.of(x["pre"]).ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr,
             wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, p.of(par).ptr,
             *[b.ptr for b in outs], od.ptr, saves.ptr, n_saves, y.ptr, n, hk, hv, ctypes.c_float(EPS), None)
        assert_close(y.get(f32, (n, hv * D)), out_ref(o, x["z"], w["norm_w"], hv), TOL, "y")
        for name, gv, wv in zip("q k v g beta".split(), _get_prep(outs, n, hk, hv), (q, k, v, g, beta)):
            assert_close(gv, wv, TOL, f"saved {name}")


def _delta64(s, q, k, v, g, beta, hv):
    """One token, float64, the per-token form of cpu.py (the drift reference)."""
    qt, kt = _tile_heads(q, hv)[0], _tile_heads(k, hv)[0]
    s = s * np.exp(g[0])[:, None, None]
    u = beta[0][:, None] * (v[0] - np.einsum("hk,hkv->hv", kt, s))
    s = s + kt[:, :, None] * u[:, None, :]
    return np.einsum("hk,hkv->hv", qt, s), s


def test_decode_drift_2000():
    from gdn_attn_dev import lib

    hk, hv, steps = 2, 6, 2000
    w = weights(hk, hv, 70)
    x = layer_inputs(steps, hk, hv, 71)
    c = (2 * hk + hv) * D
    state0 = delta_inputs(1, hk, hv, 72)[5]
    s32, s64 = state0.copy(), state0.astype(np.float64)
    conv32, conv64 = x["conv"].copy(), x["conv"].astype(np.float64)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    errs = []
    with Pool() as p:
        wd = _wdev(p, w)
        pre, a, b, z = p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["z"])
        conv, st, y = p.of(x["conv"]), p.of(state0), p.nan(steps * hv * D * 4)
        scratch = p.nan(lib().fn.lb_gdn_step_scratch_bytes(1, hk, hv))
        for i in range(steps):
            call("lb_gdn_decode_step", pre.at(i * c * 4), a.at(i * hv * 4), b.at(i * hv * 4), z.at(i * hv * D * 4),
                 wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr,
                 y.at(i * hv * D * 4), scratch.ptr, 1, hk, hv, ctypes.c_float(EPS), None)
            xi = {k: x[k][i : i + 1] for k in ("pre", "a", "b", "z")}
            q, k, v, g, bt, conv32 = prep_ref({**xi, "conv": conv32}, w, hk, hv)
            _, s32 = gated_delta_recurrent(q, k, v, g, bt, s32)
            xi64 = {k: vv.astype(np.float64) for k, vv in xi.items()}
            q, k, v, g, bt, conv64 = prep_ref({**xi64, "conv": conv64}, w64, hk, hv)
            o64, s64 = _delta64(s64, q, k, v, g, bt, hv)
            if (i + 1) % 500 == 0:
                gpu = st.get(f32, state0.shape)
                errs.append((i + 1, rel_rms(gpu, s64), rel_rms(s32, s64)))
        y_last = y.get(f32, (steps, hv * D))[-1:]
    y64 = out_ref(o64[None], x["z"][-1:].astype(np.float64), w64["norm_w"], hv)
    for step, gpu_err, cpu_err in errs:
        # fp32 rounding level: within a small factor of the CPU's own fp32 error, never growing past 1e-5
        assert gpu_err < max(8 * cpu_err, 1e-6) and gpu_err < 1e-5, f"step {step}: gpu {gpu_err:.2e} cpu {cpu_err:.2e}"
    assert_close(y_last, y64, TOL, "y after 2000 steps")


# ---- the fused decode step (gdn_decode_fused.cu) ----

FUSED_HEADS = [(16, 48), (2, 6), (4, 4)]
FUSED_IDS = ["Hk16-Hv48", "Hk2-Hv6", "Hk4-Hv4"]
FUSED_STEPS = 8
# fused vs three kernels: the same formulas and summation orders, so bit-identical unless nvcc contracts an
# expression into FMAs differently in the two kernels; 1e-6 allows that and catches any real difference
SPLIT_TOL = 1e-6


def _fused_expected() -> int:
    """What lb_gdn_decode_path(1, hk, hv <= 8 hk) must say here: 1 on an sm_90+ GPU unless the knob says split."""
    from lucebox_cli.engines import _lib

    if os.environ.get("LUCEBOX_GDN_DECODE") == "split":
        return 0
    return int(_lib.probe_gpus().gpus[0]["cc_major"] >= 9)


def _fused_case(hk: int, hv: int, steps: int, seed: int, repeat: bool = False):
    w, x = weights(hk, hv, seed), layer_inputs(steps, hk, hv, seed + 1)
    if repeat:  # one token's inputs every step (a replayed graph reads the same buffers)
        x = {k: (np.repeat(v[:1], steps, axis=0) if k != "conv" else v) for k, v in x.items()}
    return w, x, delta_inputs(1, hk, hv, seed + 2)[5]


def _chained_ref(w, x, state0, hk, hv, steps):
    """cpu.py's step, token after token: y [steps, 1, Hv·128], states and conv states after each step."""
    conv, s = x["conv"].copy(), state0.copy()
    ys, states, convs = [], [], []
    for i in range(steps):
        xi = {k: x[k][i : i + 1] for k in ("pre", "a", "b", "z")}
        q, k, v, g, bt, conv = prep_ref({**xi, "conv": conv}, w, hk, hv)
        o, s = gated_delta_recurrent(q, k, v, g, bt, s)
        ys.append(out_ref(o, xi["z"], w["norm_w"], hv))
        states.append(s)
        convs.append(conv)
    return np.stack(ys), np.stack(states), np.stack(convs)


def _decode_run(hk: int, hv: int, steps: int, seed: int) -> dict:
    """`steps` consecutive lb_gdn_decode_step calls on one layer (t = 1; y and scratch NaN-poisoned before
    every call): y, state and conv state after each step, and the path the library chose."""
    from gdn_attn_dev import lib

    w, x, state0 = _fused_case(hk, hv, steps, seed)
    c = (2 * hk + hv) * D
    ys, states, convs = [], [], []
    with Pool() as p:
        wd = _wdev(p, w)
        pre, a, b, z = p.of(x["pre"]), p.of(x["a"]), p.of(x["b"]), p.of(x["z"])
        conv, st = p.of(x["conv"]), p.of(state0)
        nbytes = lib().fn.lb_gdn_step_scratch_bytes(1, hk, hv)
        for i in range(steps):
            y, scratch = p.nan(hv * D * 4), p.nan(nbytes)
            call("lb_gdn_decode_step", pre.at(i * c * 4), a.at(i * hv * 4), b.at(i * hv * 4), z.at(i * hv * D * 4),
                 wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr,
                 scratch.ptr, 1, hk, hv, ctypes.c_float(EPS), None)
            ys.append(y.get(f32, (1, hv * D)))
            states.append(st.get(f32, state0.shape))
            convs.append(conv.get(f32, (3, c)))
    return {"y": np.stack(ys), "state": np.stack(states), "conv": np.stack(convs),
            "path": np.int32(lib().fn.lb_gdn_decode_path(1, hk, hv))}


def _fused_seed(hk: int, hv: int) -> int:
    return 80 + hk + hv


def test_decode_path():
    """The knob and the fallbacks: fused at t = 1 on sm_90 (unless LUCEBOX_GDN_DECODE=split), never for t > 1
    or Hv / Hk > 8."""
    from gdn_attn_dev import lib

    fn, want = lib().fn, _fused_expected()
    assert [fn.lb_gdn_decode_path(1, hk, hv) for hk, hv in FUSED_HEADS] == [want] * len(FUSED_HEADS)
    assert fn.lb_gdn_decode_path(1, 1, 8) == want
    assert fn.lb_gdn_decode_path(3, 16, 48) == 0 and fn.lb_gdn_decode_path(2, 2, 6) == 0
    assert fn.lb_gdn_decode_path(1, 1, 9) == 0 and fn.lb_gdn_decode_path(1, 2, 32) == 0


@pytest.mark.parametrize("hk,hv", FUSED_HEADS, ids=FUSED_IDS)
def test_decode_steps(hk, hv):
    """8 consecutive decode steps (state and conv state carried on the device) against cpu.py's math, after
    every step: y (NaN-poisoned before), the recurrent state, the conv state (exact: a copy of inputs)."""
    got = _decode_run(hk, hv, FUSED_STEPS, _fused_seed(hk, hv))
    assert int(got["path"]) == _fused_expected()
    w, x, state0 = _fused_case(hk, hv, FUSED_STEPS, _fused_seed(hk, hv))
    y_ref, s_ref, c_ref = _chained_ref(w, x, state0, hk, hv, FUSED_STEPS)
    for i in range(FUSED_STEPS):
        assert_close(got["y"][i], y_ref[i], TOL, f"y, step {i}")
        assert_close(got["state"][i], s_ref[i], TOL, f"state, step {i}")
        assert np.array_equal(got["conv"][i], c_ref[i]), f"conv state, step {i}"


@pytest.mark.parametrize("hk,hv", FUSED_HEADS, ids=FUSED_IDS)
def test_decode_fused_vs_split(hk, hv, tmp_path):
    """The same 8 steps in a child process under LUCEBOX_GDN_DECODE=split (read once per process): the
    child must take the three-kernel path, and the two paths must agree to fp32 rounding (conv states bit for
    bit)."""
    out = tmp_path / "split.npz"
    env = dict(os.environ, LUCEBOX_GDN_DECODE="split")
    r = subprocess.run([sys.executable, __file__, "--dump", str(out), str(hk), str(hv)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    split = dict(np.load(out))
    assert int(split["path"]) == 0, "LUCEBOX_GDN_DECODE=split did not select the three-kernel path"
    fused = _decode_run(hk, hv, FUSED_STEPS, _fused_seed(hk, hv))
    assert int(fused["path"]) == _fused_expected()
    for i in range(FUSED_STEPS):
        assert_close(fused["y"][i], split["y"][i], SPLIT_TOL, f"fused vs split y, step {i}")
        assert_close(fused["state"][i], split["state"][i], SPLIT_TOL, f"fused vs split state, step {i}")
        assert np.array_equal(fused["conv"][i], split["conv"][i]), f"fused vs split conv state, step {i}"


@pytest.mark.parametrize("hk,hv", [(16, 48), (2, 6)], ids=["Hk16-Hv48", "Hk2-Hv6"])
def test_decode_graph_replays(hk, hv):
    """One decode step captured in a CUDA graph (as the engine does) and replayed 6 times on the same input
    buffers: each replay advances state and conv state once more; y poisoned between replays."""
    from gdn_attn_dev import lib

    L, steps = lib(), 6
    w, x, state0 = _fused_case(hk, hv, steps, _fused_seed(hk, hv) + 7, repeat=True)
    y_ref, s_ref, c_ref = _chained_ref(w, x, state0, hk, hv, steps)
    c = (2 * hk + hv) * D
    s, exe = ctypes.c_void_p(), ctypes.c_void_p()
    L.call("lb_stream_create", ctypes.byref(s))
    try:
        with Pool() as p:
            wd = _wdev(p, w)
            conv, st, y = p.of(x["conv"]), p.of(state0), p.nan(hv * D * 4)
            scratch = p.nan(L.fn.lb_gdn_step_scratch_bytes(1, hk, hv))
            args = (p.of(x["pre"][:1]).ptr, p.of(x["a"][:1]).ptr, p.of(x["b"][:1]).ptr, p.of(x["z"][:1]).ptr,
                    wd["conv_w"].ptr, wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, y.ptr,
                    scratch.ptr, 1, hk, hv, ctypes.c_float(EPS))
            L.call("lb_graph_begin", s)
            L.call("lb_gdn_decode_step", *args, s)
            L.call("lb_graph_end", s, ctypes.byref(exe))
            try:
                for i in range(steps):
                    L.call("lb_dev_memset", y.ptr, 0xFF, y.nbytes)
                    L.call("lb_graph_launch", exe, s)
                    L.call("lb_dev_sync")
                    assert_close(y.get(f32, (1, hv * D)), y_ref[i], TOL, f"y, replay {i}")
                    assert_close(st.get(f32, state0.shape), s_ref[i], TOL, f"state, replay {i}")
                    assert np.array_equal(conv.get(f32, (3, c)), c_ref[i]), f"conv state, replay {i}"
            finally:
                L.call("lb_graph_destroy", exe)
    finally:
        L.call("lb_stream_destroy", s)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--dump":  # test_decode_fused_vs_split's child
        hk_, hv_ = int(sys.argv[3]), int(sys.argv[4])
        np.savez(sys.argv[2], **_decode_run(hk_, hv_, FUSED_STEPS, _fused_seed(hk_, hv_)))
        sys.exit(0)
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
