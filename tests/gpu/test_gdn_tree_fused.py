"""The fused tree-verify DeltaNet layer (cuda/ops/gdn_tree_fused.cu: lb_gdn_tree_verify's default on sm_90, one
cluster kernel for conv_prep + tree delta + out_norm) against the three-kernel path and a float64 reference.

- fused vs split: the same verify in a child process under LUCEBOX_GDN_TREE=split (read once per process), then
  lb_gdn_commit of the deepest root-to-leaf path on both: y, o, the kept q / k / v / g / beta, the committed state
  and conv state after the commit must be BIT-identical (same formulas and summation orders), the verify must leave
  state and conv state untouched, and every save both paths wrote to `saves` (the ones past their on-chip budgets)
  must be identical too. Trees: the B = 22 DDTree, a 23-slot chain, N = 1, 2, random trees of 7, 23, 32 and 64 slots,
  a star and a 40-slot comb (20 saves: on-chip and global); heads Hk16-Hv48 (the 27B), Hk2-Hv6, Hk4-Hv4.
- fused vs float64: conv, norms, the tree walk and the gated norm in float64 numpy (cpu.py's math), relative RMS
  < 1e-4 on every output and on the committed state.
- a saves buffer too small for the plan poisons exactly the slots that needed a missing save (as delta_kernel);
- a captured CUDA graph of the verify replays to the same bits.
Every output is NaN-poisoned before each call.

Runs under pytest (marker gpu) or as a script: `python tests/gpu/test_gdn_tree_fused.py`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from gdn_attn_dev import Pool, assert_close, call
from test_gdn_ops import (D, EPS, TOL, _tree_plan, _wdev, delta_inputs, layer_inputs, out_ref, prep_ref, random_tree,
                          tree_windows, weights)

from lucebox_cli.engines.base import Tree
from lucebox_cli.engines.cpu import _delta_step, _tile_heads

pytestmark = pytest.mark.gpu

f32 = np.float32
HEADS = [(16, 48), (2, 6), (4, 4)]
HEAD_IDS = ["Hk16-Hv48", "Hk2-Hv6", "Hk4-Hv4"]
TREES = {
    "ddtree23": [-1] + list(range(15)) + [0, 0, 0, 0, 1, 0, 16],  # the B = 22 DDTree of scripts/bench_gdn_attn.py
    "chain23": list(range(-1, 22)),
    "n1": [-1],
    "n2": [-1, 0],
    "rand7": random_tree(7, 101).tolist(),
    "rand23": random_tree(23, 102).tolist(),
    "rand32": random_tree(32, 103).tolist(),
    "rand64": random_tree(64, 104).tolist(),
    "star16": [-1] + [0] * 15,
    "comb40": [-1] + list(range(19)) + list(range(20)),
}
CASES = [(name, hk, hv) for name in TREES for hk, hv in HEADS]
CASE_IDS = [f"{name}-{hid}" for name in TREES for hid in HEAD_IDS]
FIELDS = ("y", "o", "q", "k", "v", "g", "beta", "state", "conv")


def _case_key(name: str, hk: int, hv: int) -> str:
    return f"{name}-Hk{hk}-Hv{hv}"


def _case(name: str, hk: int, hv: int):
    """(parents, weights, layer inputs, committed state) of one case, from a seed fixed by the case."""
    par = np.asarray(TREES[name], dtype=np.int32)
    seed = 1000 + 37 * list(TREES).index(name) + hk + hv
    return par, weights(hk, hv, seed), layer_inputs(par.size, hk, hv, seed + 1), delta_inputs(1, hk, hv, seed + 2)[5]


def _deepest_path(par: np.ndarray) -> np.ndarray:
    tree = Tree(np.zeros(par.size, dtype=np.int64), par.astype(np.int64))
    return np.asarray(tree.path_to(int(np.argmax(tree.depth))), dtype=np.int32)


def _save_digests(raw: np.ndarray) -> list[str]:
    """Per save slot: '' if never written (still all 0xFF bytes), else a digest of its bytes."""
    out = []
    for s in raw:
        b = s.tobytes()
        out.append("" if b == b"\xff" * len(b) else hashlib.sha1(b).hexdigest())
    return out


def _verify_run(name: str, hk: int, hv: int, max_saves: int | None = None) -> dict:
    """lb_gdn_tree_verify of one case (all outputs NaN-poisoned), then lb_gdn_commit of the deepest path."""
    from gdn_attn_dev import lib

    par, w, x, state0 = _case(name, hk, hv)
    n = par.size
    c = (2 * hk + hv) * D
    n_saves = _tree_plan(par)
    cap = n_saves if max_saves is None else max_saves
    path = _deepest_path(par)
    out = {"tree_path": np.int32(lib().fn.lb_gdn_tree_path(n, hk, hv)), "path": path}
    with Pool() as p:
        wd = _wdev(p, w)
        pre, conv, st = p.of(x["pre"]), p.of(x["conv"]), p.of(state0)
        qd, kd, vd = p.nan(n * hk * D * 4), p.nan(n * hk * D * 4), p.nan(n * hv * D * 4)
        gd, bd = p.nan(n * hv * 4), p.nan(n * hv * 4)
        od, yd = p.nan(n * hv * D * 4), p.nan(n * hv * D * 4)
        saves = p.nan(max(cap, 1) * hv * D * D * 4)
        call("lb_gdn_tree_verify", pre.ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr, wd["conv_w"].ptr,
             wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, conv.ptr, st.ptr, p.of(par).ptr, qd.ptr, kd.ptr,
             vd.ptr, gd.ptr, bd.ptr, od.ptr, saves.ptr, cap, yd.ptr, n, hk, hv, ctypes.c_float(EPS), None)
        out.update(y=yd.get(f32, (n, hv * D)), o=od.get(f32, (n, hv, D)), q=qd.get(f32, (n, hk, D)),
                   k=kd.get(f32, (n, hk, D)), v=vd.get(f32, (n, hv, D)), g=gd.get(f32, (n, hv)),
                   beta=bd.get(f32, (n, hv)))
        out["state_untouched"] = np.bool_(np.array_equal(st.get(f32, state0.shape), state0))
        out["conv_untouched"] = np.bool_(np.array_equal(conv.get(f32, (3, c)), x["conv"]))
        if cap > 0:
            out["saves"] = np.asarray(_save_digests(saves.get(np.uint8, (cap, hv * D * D * 4))))
        call("lb_gdn_commit", kd.ptr, vd.ptr, gd.ptr, bd.ptr, pre.ptr, c, st.ptr, conv.ptr, p.of(path).ptr, path.size,
             hk, hv, None)
        out["state"] = st.get(f32, state0.shape)
        out["conv"] = conv.get(f32, (3, c))
    return out


def _fused_expected() -> int:
    """What lb_gdn_tree_path must say for a supported shape here: 1 on an sm_90+ GPU unless the knob says split."""
    from lucebox_cli.engines import _lib

    if os.environ.get("LUCEBOX_GDN_TREE") == "split":
        return 0
    return int(_lib.probe_gpus().gpus[0]["cc_major"] >= 9)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=f32).view(np.uint32)


def _assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    diff = _bits(got) != _bits(want)
    if diff.any():
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        raise AssertionError(f"{what}: {int(diff.sum())} of {diff.size} values differ in their bits, max |diff| "
                             f"{np.nanmax(np.abs(g64 - w64)):.3g} (first at {np.argwhere(diff)[0].tolist()})")


@pytest.fixture(scope="module")
def split_results(tmp_path_factory):
    """Every case through the three-kernel path, in one child process under LUCEBOX_GDN_TREE=split."""
    out = tmp_path_factory.mktemp("gdn_tree") / "split.npz"
    env = dict(os.environ, LUCEBOX_GDN_TREE="split")
    r = subprocess.run([sys.executable, __file__, "--dump", str(out)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return dict(np.load(out))


def test_tree_path():
    """The knob and the fallbacks: fused for 1 <= n <= 64 and Hv / Hk <= 4 on sm_90 (unless LUCEBOX_GDN_TREE=split)."""
    from gdn_attn_dev import lib

    fn, want = lib().fn, _fused_expected()
    assert [fn.lb_gdn_tree_path(n, hk, hv) for n in (1, 23, 64) for hk, hv in HEADS] == [want] * 9
    assert fn.lb_gdn_tree_path(23, 1, 4) == want and fn.lb_gdn_tree_path(23, 16, 32) == want
    assert fn.lb_gdn_tree_path(0, 16, 48) == 0 and fn.lb_gdn_tree_path(65, 16, 48) == 0
    assert fn.lb_gdn_tree_path(23, 1, 8) == 0 and fn.lb_gdn_tree_path(23, 2, 32) == 0  # Hv / Hk > 4
    assert fn.lb_gdn_tree_path(23, 16, 40) == 0  # Hv not a multiple of Hk


@pytest.mark.parametrize("name,hk,hv", CASES, ids=CASE_IDS)
def test_fused_vs_split(name, hk, hv, split_results):
    key = _case_key(name, hk, hv)
    split = {f: split_results[f"{key}/{f}"] for f in (*FIELDS, "tree_path") if f"{key}/{f}" in split_results}
    assert int(split["tree_path"]) == 0, "LUCEBOX_GDN_TREE=split did not select the three-kernel path"
    fused = _verify_run(name, hk, hv)
    assert int(fused["tree_path"]) == _fused_expected()
    assert fused["state_untouched"] and fused["conv_untouched"], "verify must only read state and conv state"
    assert bool(split_results[f"{key}/state_untouched"]) and bool(split_results[f"{key}/conv_untouched"])
    for f in ("y", "o", "q", "k", "v", "g", "beta"):
        assert not np.isnan(fused[f]).any(), f"fused {f}: NaN (unwritten) outputs"
        _assert_same_bits(fused[f], split[f], f"fused vs split {f}")
    path = fused["path"].tolist()
    _assert_same_bits(fused["state"], split["state"], f"committed state after path {path}")
    _assert_same_bits(fused["conv"], split["conv"], f"conv state after path {path}")
    if f"{key}/saves" in split_results:
        both = [(a, b) for a, b in zip(fused["saves"], split_results[f"{key}/saves"]) if a and b]
        assert all(a == b for a, b in both), "a save written by both paths differs"


def _tree64(q, k, v, g, beta, state, parents):
    """cpu.gated_delta_tree in float64: (o [N, Hv, dv], states [N, Hv, dk, dv])."""
    hv = v.shape[1]
    qt, kt = _tile_heads(q, hv), _tile_heads(k, hv)
    o, states = np.empty(v.shape), np.empty((len(parents), *state.shape))
    for i, pp in enumerate(parents):
        o[i], states[i] = _delta_step(state if pp < 0 else states[pp], qt[i], kt[i], v[i], g[i], beta[i])
    return o, states


@pytest.mark.parametrize("name,hk,hv", CASES, ids=CASE_IDS)
def test_fused_vs_float64(name, hk, hv):
    par, w, x, state0 = _case(name, hk, hv)
    x64 = {key: val.astype(np.float64) for key, val in x.items()}
    w64 = {key: val.astype(np.float64) for key, val in w.items()}
    q, k, v, g, beta, _ = prep_ref(x64, w64, hk, hv, tree_windows(par))
    o, states = _tree64(q, k, v, g, beta, state0.astype(np.float64), par)
    y = out_ref(o, x64["z"], w64["norm_w"], hv)
    got = _verify_run(name, hk, hv)
    for f, want in zip(("y", "o", "q", "k", "v", "g", "beta"), (y, o, q, k, v, g, beta)):
        assert_close(got[f], want, TOL, f"{f} vs float64")
    leaf = int(got["path"][-1])
    assert_close(got["state"], states[leaf], TOL, f"committed state after path {got['path'].tolist()} vs float64")
    want_conv = np.concatenate([x["conv"], x["pre"][got["path"]]], axis=0)[-3:]
    assert np.array_equal(got["conv"], want_conv), "conv state after commit"


def _poisoned_slots(par: np.ndarray) -> np.ndarray:
    """Slots whose state came from a save that a zero-capacity scratch could not hold, or continue one."""
    bad = np.zeros(par.size, dtype=bool)
    for i in range(1, par.size):
        bad[i] = bad[i - 1] if par[i] == i - 1 else par[i] >= 0
    return bad


@pytest.mark.parametrize("hk,hv", HEADS[:2], ids=HEAD_IDS[:2])
def test_scratch_too_small_poisons(hk, hv):
    """max_saves = 0 on the DDTree: the branch slots (and the spine continuing from them) come out NaN, as delta_kernel
    does, and the rest matches the full-scratch run bit for bit."""
    name = "ddtree23"
    par = np.asarray(TREES[name], dtype=np.int32)
    got, full = _verify_run(name, hk, hv, max_saves=0), _verify_run(name, hk, hv)
    bad = _poisoned_slots(par)
    assert bad.any() and not bad.all()
    assert np.isnan(got["o"][bad]).all() and np.isnan(got["y"][bad]).all()
    _assert_same_bits(got["o"][~bad], full["o"][~bad], "o of the slots that need no save")
    _assert_same_bits(got["y"][~bad], full["y"][~bad], "y of the slots that need no save")
    for f in ("q", "k", "v", "g", "beta"):
        _assert_same_bits(got[f], full[f], f"kept {f} (no save involved)")


def test_graph_replays():
    """The verify of the 27B DDTree captured in a CUDA graph (as the engine does) and replayed twice, outputs poisoned
    between replays: the same bits as the direct call."""
    from gdn_attn_dev import lib

    L, name, hk, hv = lib(), "ddtree23", 16, 48
    want = _verify_run(name, hk, hv)
    par, w, x, state0 = _case(name, hk, hv)
    n = par.size
    n_saves = _tree_plan(par)
    s, exe = ctypes.c_void_p(), ctypes.c_void_p()
    L.call("lb_stream_create", ctypes.byref(s))
    try:
        with Pool() as p:
            wd = _wdev(p, w)
            outs = {"q": p.nan(n * hk * D * 4), "k": p.nan(n * hk * D * 4), "v": p.nan(n * hv * D * 4),
                    "g": p.nan(n * hv * 4), "beta": p.nan(n * hv * 4), "o": p.nan(n * hv * D * 4),
                    "y": p.nan(n * hv * D * 4)}
            saves = p.nan(max(n_saves, 1) * hv * D * D * 4)
            args = (p.of(x["pre"]).ptr, p.of(x["a"]).ptr, p.of(x["b"]).ptr, p.of(x["z"]).ptr, wd["conv_w"].ptr,
                    wd["ssm_a"].ptr, wd["dt_bias"].ptr, wd["norm_w"].ptr, p.of(x["conv"]).ptr, p.of(state0).ptr,
                    p.of(par).ptr, *[outs[f].ptr for f in ("q", "k", "v", "g", "beta", "o")], saves.ptr, n_saves,
                    outs["y"].ptr, n, hk, hv, ctypes.c_float(EPS))
            L.call("lb_graph_begin", s)
            L.call("lb_gdn_tree_verify", *args, s)
            L.call("lb_graph_end", s, ctypes.byref(exe))
            try:
                shapes = {"q": (n, hk, D), "k": (n, hk, D), "v": (n, hv, D), "g": (n, hv), "beta": (n, hv),
                          "o": (n, hv, D), "y": (n, hv * D)}
                for i in range(2):
                    for buf in outs.values():
                        L.call("lb_dev_memset", buf.ptr, 0xFF, buf.nbytes)
                    L.call("lb_graph_launch", exe, s)
                    L.call("lb_dev_sync")
                    for f, buf in outs.items():
                        _assert_same_bits(buf.get(f32, shapes[f]), want[f], f"{f}, replay {i}")
            finally:
                L.call("lb_graph_destroy", exe)
    finally:
        L.call("lb_stream_destroy", s)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":  # test_fused_vs_split's child (LUCEBOX_GDN_TREE=split)
        dump = {}
        for name_, hk_, hv_ in CASES:
            for field, val in _verify_run(name_, hk_, hv_).items():
                dump[f"{_case_key(name_, hk_, hv_)}/{field}"] = val
        np.savez(sys.argv[2], **dump)
        sys.exit(0)
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
