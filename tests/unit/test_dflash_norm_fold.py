"""The RMSNorm fold of decode steps (engines/dflash_layers.py FoldPlan: lb_gemv_q_norm reads x and normalizes it,
lb_gemv_q_clear zeroes the next group's outputs), on the CPU emulation of the C API (dflash_fake_lib): the calls a
step issues with the fold on and off (LUCEBOX_NORM_FOLD=0), each folded group's outputs cleared by the GEMV right
before it, and the same results both ways, bit for bit (the emulation computes the folded norm with the norm's own
numpy ops), with and without CUDA graphs, and against the CPU engine. Two tiny Q4_K_M models: "mixed" (Hv = 6: the
DeltaNet groups hold the 6-row ssm_alpha / ssm_beta in the GGUF Q4_K layout and keep their norm) and "all-fold"
(Hv = 16: every group but layer 0's mixer folds, as in the 27B). The kernels' numerics are
tests/gpu/test_gemv_norm.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
from dflash_fake_lib import FakeLib
from dflash_tiny import branched_tree, make_tiny_q4km

from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.engines.dflash import DFlashTargetEngine
from lucebox_cli.engines.dflash_layers import F32, Pass
from lucebox_cli.models.qwen35_gguf import load_model_gguf

TOL = 5e-3
GEMVS = ("lb_gemv_q", "lb_gemv_q_norm", "lb_gemv_q_clear")


@pytest.fixture(scope="module", params=[3, 8], ids=["mixed", "all-fold"])
def gguf(tmp_path_factory, request):
    return make_tiny_q4km(tmp_path_factory.mktemp("dflash_fold") / f"m4-hv{request.param}", n_layers=4,
                          hv_ratio=request.param)


def engine(gguf, monkeypatch, fold: bool, graphs: bool = False, lib_fold: bool = True, taps=()):
    monkeypatch.setenv("LUCEBOX_NORM_FOLD", "1" if fold else "0")
    lib = FakeLib(graphs=graphs, fold=lib_fold)
    eng = DFlashTargetEngine(gguf, max_context=256, budget=22, tap_layers=taps, lib=lib, card_bytes=8 << 30)
    eng.use_graphs = graphs
    return eng, lib


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def step_log(eng, lib, tok: int = 42) -> list:
    eng.prefill([5, 17, 99, 3])
    lib.log = []
    eng.step(tok)
    log, lib.log = lib.log, None
    return log


def test_step_calls_fold_on(gguf, monkeypatch):
    """Fold on: the norm kernels left are those of the groups that cannot fold (layer 0's mixer, groups with a
    matrix of another type); every folded group reads x through lb_gemv_q_norm with its norm weight, right after
    the lb_gemv_q_clear that zeroes exactly its outputs (its first GEMV's start to its last GEMV's end), and no
    clear is issued for a group that keeps its norm."""
    eng, lib = engine(gguf, monkeypatch, fold=True)
    L, cfg = eng._layers, eng.cfg
    assert L.norm_fold and eng.info["norm_fold"]
    plan = L.fold_plan(Pass("step", 1, 0))
    assert plan is not None and not plan.mixer[0] and all(plan.mlp) and plan.head
    if "hv8" in gguf.name:
        assert all(plan.mixer[1:])
    else:
        assert any(plan.mixer) and not all(plan.mixer[1:]), "the model should have both kinds of mixer groups"
    assert L.fold_plan(Pass("tree", 1, 0)) is None and L.fold_plan(Pass("prefill", 1, 0)) is None
    log = step_log(eng, lib)
    names = [n for n, _ in log]
    kept = (cfg.n_layers - sum(plan.mixer)) + (cfg.n_layers - sum(plan.mlp)) + (not plan.head)
    assert names.count("lb_df_rmsnorm") == kept
    norm_ws = {eng._layers.v[f"blk.{i}.{n}.weight"] for i in range(cfg.n_layers)
               for n in ("attn_norm", "post_attention_norm")} | {eng._layers.v["output_norm.weight"]}
    j = 0
    groups = 0
    while j < len(log):
        name, a = log[j]
        if name == "lb_gemv_q_clear":
            clear0, clear1 = a[7], a[7] + a[8]
            assert j + 1 < len(log) and log[j + 1][0] == "lb_gemv_q_norm", "a clear not followed by a folded group"
            k = j + 1
            lo, hi = None, None
            while k < len(log) and log[k][0] == "lb_gemv_q_norm":
                g = log[k][1]
                assert g[4] == eng._bufs.x and g[5] in norm_ws and g[8] == 1 and g[9] is None
                lo = g[7] if lo is None else min(lo, g[7])
                hi = max(hi or 0, g[7] + g[2] * F32)
                k += 1
            assert clear0 <= lo and hi <= clear1, "the clear does not cover the group's outputs"
            # the range is the group's packed regions, nothing more (16-byte starts between them)
            assert lo == clear0 and clear1 - hi < 16 * 4
            groups += 1
            j = k
            continue
        if name == "lb_gemv_q_norm":
            pytest.fail(f"call {j}: a folded group without a clear right before it")
        j += 1
    assert groups == sum(plan.mixer) + sum(plan.mlp) + plan.head
    eng.close()


@pytest.mark.parametrize("why", ["env", "library"])
def test_step_calls_fold_off(gguf, monkeypatch, why):
    """LUCEBOX_NORM_FOLD=0, or a library without the fold forms: a norm kernel before every group and the LM head,
    plain GEMVs only (today's calls)."""
    eng, lib = engine(gguf, monkeypatch, fold=why == "library", lib_fold=why == "env")
    assert not eng._layers.norm_fold and not eng.info["norm_fold"]
    assert eng._layers.fold_plan(Pass("step", 1, 0)) is None
    names = [n for n, _ in step_log(eng, lib)]
    assert names.count("lb_df_rmsnorm") == 2 * eng.cfg.n_layers + 1
    assert "lb_gemv_q_norm" not in names and "lb_gemv_q_clear" not in names
    eng.close()


def session(eng, ids, trees):
    """prefill, steps (host logits, argmax, a second LM head of the same step), verify + commit, steps."""
    out = [eng.prefill(ids)]
    tok = int(np.argmax(out[-1]))
    for _ in range(3):
        out.append(eng.step(tok))
        tok = int(np.argmax(out[-1]))
    # the head again after that step: it must not fold a second time (nothing cleared the logits for it)
    out.append(eng._logits(0, 1)[0])
    for j, tree in enumerate(trees):
        res = eng.verify(tree, want_logits=j % 2 == 0)
        out.append(res.logits if res.logits is not None else res.argmax)
        eng.commit(tree.path_to(int(np.argmax(tree.depth))))
        tok = eng.step_argmax(tok)
        out.append(np.asarray([tok]))
    for _ in range(2):
        out.append(eng.step(tok))
        tok = int(np.argmax(out[-1]))
    out.append(eng.features if eng.tap_layers else np.zeros(1))
    return out


@pytest.mark.parametrize("graphs", [False, True], ids=["programs", "graphs"])
def test_fold_on_and_off_give_the_same_results(gguf, monkeypatch, graphs):
    """A session of prefill, decode steps, verifies and commits: the same logits, ids and tap features with the fold
    on and off, bit for bit, and the fold-on steps within TOL of the CPU engine."""
    ids = np.random.default_rng(21).integers(0, 4096, 70)
    trees = [branched_tree(22, 9), branched_tree(23, 17)]
    runs = {}
    for fold in (False, True):
        eng, lib = engine(gguf, monkeypatch, fold=fold, graphs=graphs, taps=(0, 2))
        runs[fold] = session(eng, ids, trees)
        if graphs:
            assert lib.launches > 0
        eng.close()
    assert len(runs[False]) == len(runs[True])
    for a, b in zip(runs[False], runs[True]):
        assert np.array_equal(a, b)
    cfg, weights, _ = load_model_gguf(gguf)
    cpu = CPUEngine(cfg, weights, max_context=256)
    eng, _ = engine(gguf, monkeypatch, fold=True, graphs=graphs)
    assert rel(eng.prefill(ids[:9]), cpu.prefill(ids[:9])) < TOL
    tok = 7
    for _ in range(3):
        got, ref = eng.step(tok), cpu.step(tok)
        assert rel(got, ref) < TOL
        tok = int(np.argmax(ref))
    eng.close()


def test_captured_step_folds_the_head(gguf, monkeypatch):
    """The step graph: the last layer's ffn_down clears the logits row, the head is lb_gemv_q_norm with the output
    norm, then the argmax; the verify graph keeps the head's norm kernel."""
    eng, lib = engine(gguf, monkeypatch, fold=True, graphs=True)
    eng.prefill([1, 2, 3])
    lib.log = []
    eng.step_argmax(4)
    names = [n for n, _ in lib.log]
    args = [a for _, a in lib.log]
    lib.log = None
    head = max(i for i, n in enumerate(names) if n in GEMVS)
    assert names[head] == "lb_gemv_q_norm" and args[head][5] == eng._layers.v["output_norm.weight"]
    assert args[head][7] == eng._bufs.logits
    down = max(i for i, n in enumerate(names[:head]) if n in GEMVS)
    assert names[down] == "lb_gemv_q_clear" and args[down][7] == eng._bufs.logits
    assert args[down][8] == eng.cfg.vocab * F32
    lib.log = []
    eng.verify(branched_tree(3, 5))
    names = [n for n, _ in lib.log]
    lib.log = None
    assert "lb_gemv_q_norm" not in names and "lb_gemv_q_clear" not in names
    eng.close()
