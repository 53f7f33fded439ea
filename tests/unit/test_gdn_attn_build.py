"""27B DeltaNet / attention ops on the CPU: they build for both profiles' archs without register spills,
their C ABI rows agree with lucebox.h, and the tree-verify scheme (save plan, spine walk, replay
commit) equals cpu.gated_delta_tree on branched trees (a numpy emulation of the kernel's walk). The
kernels themselves run in tests/gpu/test_gdn_ops.py and tests/gpu/test_attn_ops.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from lucebox_cli.engines import _lib
from lucebox_cli.engines.base import Tree
from lucebox_cli.engines.cpu import gated_delta_tree
from lucebox_cli.engines.gdn_tree_plan import (STATE_BYTES_27B, emulate_tree_delta, replay, save_plan,
                                               verify_state_traffic)
from lucebox_cli.spec.ddtree import build_ddtree
from cuda_build import REPO, assert_api_rows, compile_cu, needs_nvcc, spill_stores

SOURCES = ["gdn_conv.cu", "gdn_delta.cu", "gdn_decode_fused.cu", "gdn_chunked.cu", "attn_rope.cu", "attn_decode.cu",
           "attn_tree.cu", "attn_decode_fused.cu"]
API = ["lb_gdn_conv_prep", "lb_gdn_out_norm", "lb_gdn_tree_plan", "lb_gdn_delta", "lb_gdn_commit",
       "lb_gdn_step_scratch_bytes", "lb_gdn_decode_step", "lb_gdn_decode_path", "lb_gdn_tree_verify", "lb_gdn_chunked_scratch_bytes",
       "lb_gdn_chunked", "lb_gdn_prefill_scratch_bytes", "lb_gdn_prefill", "lb_attn_prep", "lb_attn_partials_bytes",
       "lb_attn_decode", "lb_attn_tree", "lb_attn_causal", "lb_attn_decode_fused", "lb_attn_decode_fused_at"]


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, arch: str, tmp_path: Path):
    returncode, log = compile_cu(f"cuda/ops/{source}", arch, tmp_path)
    assert returncode == 0, log[-4000:]
    spills = spill_stores(log)
    # attn_tree.cu holds only host entry points (no kernels, so no ptxas lines)
    assert (spills or source == "attn_tree.cu") and not any(spills), "register spills:\n" + log[-4000:]


def test_api_rows_in_header_and_table():
    assert_api_rows(API)


def random_tree(n: int, seed: int) -> np.ndarray:
    """Parents of an n-slot tree with a long spine and branches (parents precede children)."""
    rng = np.random.default_rng(seed)
    par = np.full(n, -1, dtype=np.int64)
    for i in range(1, n):
        par[i] = i - 1 if rng.random() < 0.6 else rng.integers(0, i)
    return par


def ddtree_parents(budget: int = 22, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lp = np.sort(np.log(rng.dirichlet(np.ones(8) * 0.3, size=15)), axis=1)[:, ::-1]
    ids = np.tile(np.arange(8), (15, 1))
    return build_ddtree(0, lp, ids, budget).tree.parents


@pytest.mark.parametrize("seed", range(6))
def test_save_plan_rule(seed: int):
    par = random_tree(10 + 3 * seed, seed)
    plan = save_plan(par)
    for i in range(par.size):
        children = [c for c in range(par.size) if par[c] == i]
        assert (plan[i] >= 0) == any(c != i + 1 for c in children)
    assert sorted(plan[plan >= 0].tolist()) == list(range(int((plan >= 0).sum())))


def test_save_plan_chain_and_star():
    assert (save_plan(np.arange(-1, 15)) == -1).all()
    star = np.array([-1] + [0] * 9)
    assert save_plan(star).tolist() == [0] + [-1] * 9


def _inputs(n, hk, hv, d, seed):
    rng = np.random.default_rng(seed)

    def l2(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    q = (l2(rng.standard_normal((n, hk, d))) / np.sqrt(d)).astype(np.float32)
    k = l2(rng.standard_normal((n, hk, d))).astype(np.float32)
    v = rng.standard_normal((n, hv, d)).astype(np.float32)
    g = (-np.abs(rng.standard_normal((n, hv))) * 0.3).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (n, hv)).astype(np.float32)
    state = (rng.standard_normal((hv, d, d)) * 0.1).astype(np.float32)
    return q, k, v, g, beta, state


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


@pytest.mark.parametrize("hk,hv,d,n,seed", [(2, 6, 128, 23, 1), (16, 48, 16, 17, 2), (1, 3, 32, 10, 3)],
                         ids=["Hk2-Hv6-N23", "Hk16-Hv48-d16-N17", "Hk1-Hv3-N10"])
def test_spine_walk_and_replay_equal_cpu_tree(hk, hv, d, n, seed):
    q, k, v, g, beta, state = _inputs(n, hk, hv, d, seed)
    par = random_tree(n, seed)
    o_ref, states = gated_delta_tree(q, k, v, g, beta, state, par)
    o, saves, reloads = emulate_tree_delta(q, k, v, g, beta, state, par)
    assert not np.isnan(o).any()
    assert _rel(o, o_ref) < 1e-5
    assert saves.shape[0] == int((save_plan(par) >= 0).sum()) and reloads >= saves.shape[0]
    tree = Tree(np.zeros(n, dtype=np.int64), par)
    for slot in range(n):
        assert _rel(replay(k, v, g, beta, state, tree.path_to(slot)), states[slot]) < 1e-5


def test_c_planner_matches_python():
    lib_file = _lib.lib_path("rtx3090-sm86")
    if not lib_file.exists():
        pytest.skip("library not built (make build PROFILE=rtx3090-sm86)")
    cdll = ctypes.CDLL(str(lib_file))
    if not hasattr(cdll, "lb_gdn_tree_plan"):
        pytest.skip("library built from an older tree")
    fn = cdll.lb_gdn_tree_plan
    fn.restype, fn.argtypes = _lib.DECLS["lb_gdn_tree_plan"]
    for seed in range(8):
        par = (ddtree_parents(22, seed) if seed % 2 else random_tree(5 + 7 * seed, seed)).astype(np.int32)
        out = np.empty(par.size, dtype=np.int32)
        count = ctypes.c_int(-1)
        assert fn(par.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), par.size,
                  out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ctypes.byref(count)) == 0
        assert out.tolist() == save_plan(par).tolist() and count.value == int((out >= 0).sum())
    bad = np.array([0, 0], dtype=np.int32)
    assert fn(bad.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 2, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
              ctypes.byref(count)) == _lib.LB_ERR_INVALID_ARG


def test_traffic_of_a_ddtree_verify():
    par = ddtree_parents(22)
    t = verify_state_traffic(par)
    assert t["slots"] == 23 and t["saves"] <= 7
    # a state per node writes 23 states of 144 MiB; the spine writes only the branch points
    assert t["every_node_bytes"] == STATE_BYTES_27B * 26
    assert t["saved_bytes"] >= STATE_BYTES_27B * 23 - STATE_BYTES_27B * 2 * 7
