"""Resident fp16 prefill weights (LUCEBOX_PREFILL_WEIGHTS=f16, DFlashTargetEngine(prefill_weights="f16")) on the CPU.

The knob; the memory plan's item (every quantized layer matrix at 2 B a weight, 48.7 GB on the 27B: a 24 GB card is
refused with a hint that names the knob, a 141 GB one fits); and the engine on the CPU emulation of the C API
(tests/unit/dflash_fake_lib.py) on a 256-row cuBLAS pass with the merged forms on: every layer matrix dequantized once
at load into one arena laid out in the quantized arena's order (so back-to-back tensors stay one tensor and the merged
GEMMs still run), every cuBLAS call of the pass reading those copies (qtype LB_QT_F16, no lb_dequant_f16 in the
pass), the same calls otherwise, the logits of the quantized path up to the fp16 rounding of the weights, and the
small-N tail, verify and decode steps on the quantized bytes. The device side (the C entry points with LB_QT_F16, the
engine on the GPU) is tests/gpu/test_prefill_f16_weights.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from dflash_fake_lib import FakeLib
from dflash_tiny import branched_tree, make_tiny_q4km

from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.engines.dflash import DFlashTargetEngine, prefill_weights_mode
from lucebox_cli.errors import OutOfMemory, UsageError
from lucebox_cli.models.qwen35_gguf import load_model_gguf

F16 = 1  # LB_QT_F16
WIDE = ("lb_gemm_q_cublas", "lb_gemm_q_cublas_x16", "lb_gemm_q_cublas_x16_h")


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def test_knob():
    assert prefill_weights_mode(None, {}) == "q"
    assert prefill_weights_mode(None, {"LUCEBOX_PREFILL_WEIGHTS": " F16 "}) == "f16"
    assert prefill_weights_mode("q", {"LUCEBOX_PREFILL_WEIGHTS": "f16"}) == "q"  # the argument wins
    with pytest.raises(UsageError, match="LUCEBOX_PREFILL_WEIGHTS"):
        prefill_weights_mode(None, {"LUCEBOX_PREFILL_WEIGHTS": "bf16"})
    with pytest.raises(UsageError, match="expected one of q, f16"):
        prefill_weights_mode("fp16", {})


def test_plan_item_on_the_27b():
    cfg = mp.qwen35_27b_config()
    sizes = mp.sizes_from_mix(cfg, "Q4_K_M")
    layer = [s for n, s in sizes.items() if n.startswith("blk.") and len(s.shape) == 2 and s.ggml_type != "F32"]
    want = sum(2 * int(np.prod(s.shape)) for s in layer)
    assert mp.prefill_f16_bytes(cfg, sizes) == want
    # 24.35e9 layer weights (everything but the embedding and the LM head): 48.7 GB
    assert want == 48_701_112_320
    off = mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=1024, cublas=True)
    on = mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=1024, cublas=True, prefill_f16=True)
    assert off.bytes_of("prefill f16 weights") == 0 and on.bytes_of("prefill f16 weights") == want
    assert on.total - off.total == want and "prefill f16 weights" in on.table()
    mp.fit(on, 141_000_000_000)  # the H200 holds it (and ~100k tokens of context more)
    with pytest.raises(OutOfMemory) as e:
        mp.fit(on, 24_000_000_000)
    assert "LUCEBOX_PREFILL_WEIGHTS" in e.value.hint
    # the largest context shrinks by the copy's bytes over the per-token cost, never below what fits without it
    card = 80_000_000_000
    a = mp.largest_context(cfg, sizes, card, budget=22, prefill_rows=1024, cublas=True)
    b = mp.largest_context(cfg, sizes, card, budget=22, prefill_rows=1024, cublas=True, prefill_f16=True)
    assert 0 < b < a


@pytest.fixture(scope="module")
def gguf_hv16(tmp_path_factory):
    """Hv = 16: ssm_beta / ssm_alpha tiled like attn_gate, so the merged mixer GEMMs run (as on the 27B)."""
    return make_tiny_q4km(tmp_path_factory.mktemp("prefill_f16") / "m4", n_layers=4, hv_ratio=8)


def _engine(path, lib, mode, **kw):
    return DFlashTargetEngine(path, max_context=512, budget=22, lib=lib, card_bytes=8 << 30, prefill_rows=256,
                              prefill_weights=mode, **kw)


def test_emulated_engine_reads_the_copies(gguf_hv16, monkeypatch):
    for k in ("LUCEBOX_PREFILL_GEMM", "LUCEBOX_PREFILL_GU", "LUCEBOX_PREFILL_MERGE", "LUCEBOX_PREFILL_WEIGHTS"):
        monkeypatch.delenv(k, raising=False)
    cfg, weights = load_model_gguf(gguf_hv16)[:2]
    ids = np.random.default_rng(5).integers(0, 4096, 300)  # one 256-row cuBLAS pass + a 44-row small-N tail
    tree = branched_tree(9, 23, 4096)
    path = tree.path_to(int(np.argmax(tree.depth)))
    logits, logs, verify, steps = {}, {}, {}, {}
    for mode in ("q", "f16"):
        lib = FakeLib(blas=True)
        lib.log = []
        gpu = _engine(gguf_hv16, lib, mode)
        try:
            load = lib.log
            assert gpu.info["prefill_weights"] == mode and gpu.info["prefill_gemm"] == "cublas"
            L = gpu._layers
            blk = sorted((n for n in L.m if n.startswith("blk.")), key=lambda n: L.m[n].ptr)
            deq = [a for name, a in load if name == "lb_dequant_f16"]
            if mode == "q":
                assert not deq and not L.m16 and gpu.plan.bytes_of("prefill f16 weights") == 0
            else:
                # one dequantization per layer matrix, whole, in arena order, back to back
                assert [a[1] for a in deq] == [L.m[n].ptr for n in blk] and all(a[4] == 0 for a in deq)
                assert sorted(L.m16) == sorted(blk) and all(L.m16[n].qtype == F16 for n in blk)
                base = L.m16[blk[0]].ptr
                offs = np.cumsum([0] + [2 * L.m[n].rows * L.m[n].k for n in blk])
                assert [L.m16[n].ptr - base for n in blk] == list(offs[:-1])
                assert offs[-1] == gpu.plan.bytes_of("prefill f16 weights") > 0
                f16_lo, f16_hi = base, base + int(offs[-1])
            # the merged forms hold either way: zab (DeltaNet), q|k(|v) (attention), gate+up as one fp16 GEMM
            assert gpu.info["prefill_gu"] == "merged16" and gpu.info["prefill_merge"] == "on"
            lib.log = []
            gpu.poison()
            logits[mode] = gpu.prefill(ids)
            logs[mode] = lib.log
            lib.log = []
            verify[mode] = gpu.verify(tree).logits
            gpu.commit(path)
            steps[mode] = gpu.step(5)
            later = lib.log
            lib.log = None
        finally:
            gpu.close()
        # the small-N tail, verify and decode steps read the quantized bytes only
        assert not any(name in WIDE for name, _ in later)
        small = [a for name, a in logs[mode] + later if name.startswith(("lb_gemm_q_smalln", "lb_gemv_q"))]
        assert small and all(a[0] != F16 for a in small)
        if mode == "f16":
            wide = [a for name, a in logs[mode] if name in WIDE]
            assert wide and all(a[0] == F16 and f16_lo <= a[1] < f16_hi for a in wide)
            assert not any(name == "lb_dequant_f16" for name, _ in logs[mode] + later)
    # the same calls in the same order, only the weights they read differ
    names = lambda log: [n for n, _ in log]  # noqa: E731
    assert names(logs["q"]) == names(logs["f16"])
    # the fp16-rounded weights (the GPU's q path rounds the same way: lb_dequant_f16 before every cuBLAS GEMM; the
    # emulation's q path uses them unrounded) move the logits by ~1e-4
    assert rel(logits["f16"], logits["q"]) < 2e-3
    assert rel(verify["f16"], verify["q"]) < 2e-3 and rel(steps["f16"], steps["q"]) < 2e-3
    cpu = CPUEngine(cfg, weights, max_context=512)
    assert rel(logits["f16"], cpu.prefill(ids)) < 5e-3


def test_refused_without_a_cublas_pass_and_when_it_does_not_fit(gguf_hv16, monkeypatch):
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    monkeypatch.setenv("LUCEBOX_PREFILL_WEIGHTS", "f16")
    # 64-row passes: no cuBLAS pass would read the copies
    with pytest.raises(UsageError, match="cuBLAS prefill path") as e:
        DFlashTargetEngine(gguf_hv16, max_context=256, budget=22, lib=FakeLib(blas=True), card_bytes=8 << 30)
    assert "LUCEBOX_PREFILL_WEIGHTS" in e.value.hint
    with pytest.raises(UsageError, match="no cuBLAS loaded"):
        _engine(gguf_hv16, FakeLib(), None)
    # a card that holds the plan without the copies but not with them
    monkeypatch.setenv("LUCEBOX_PREFILL_WEIGHTS", "q")
    gpu = _engine(gguf_hv16, FakeLib(blas=True), None)
    try:
        need = gpu.plan.total
    finally:
        gpu.close()
    lib = FakeLib(blas=True)
    with pytest.raises(OutOfMemory) as e:
        DFlashTargetEngine(gguf_hv16, max_context=512, budget=22, lib=lib, card_bytes=need + 1024, prefill_rows=256,
                           prefill_weights="f16")
    assert "LUCEBOX_PREFILL_WEIGHTS" in e.value.hint
    assert not any(name == "lb_dev_alloc" for name in lib.calls), "refused before allocating"


def test_run_config_and_cli_flags(tmp_path, monkeypatch):
    """RunConfig.prefill_weights: None unless given (the engine then reads LUCEBOX_PREFILL_WEIGHTS); resolved runs read
    the same variable; `run` and `bench speed` refuse other values in one line, before loading anything; api hands the
    value to the 27B engine (a RunConfig field the CPU engine ignores: a CPU run with it set still generates)."""
    from typer.testing import CliRunner

    from lucebox_cli.cli.app import make_app
    from lucebox_cli.config import RunConfig, resolve_run_config

    assert RunConfig(model="m").prefill_weights is None
    assert resolve_run_config({"model": "m"}, None, env={"LUCEBOX_PREFILL_WEIGHTS": "f16"}).prefill_weights == "f16"
    assert resolve_run_config({"model": "m", "prefill_weights": "q"}, None,
                              env={"LUCEBOX_PREFILL_WEIGHTS": "f16"}).prefill_weights == "q"
    missing = str(tmp_path / "nothing-here")
    for args in (["run", missing, "--prompt-ids", "1", "--prefill-weights", "bf16"],
                 ["bench", "speed", missing, "--prefill-weights", "bf16"]):
        res = CliRunner().invoke(make_app(), args)
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert "--prefill-weights" in res.stderr and "no such file" not in res.stderr.lower(), res.stderr
    from tiny_models import make_tiny_checkpoint

    model = make_tiny_checkpoint(tmp_path / "m", n_layers=2, hidden=64)
    res = CliRunner().invoke(make_app(), ["bench", "speed", str(model), "--engine", "cpu", "-p", "4", "-n", "2", "-r",
                                          "1", "--warmup", "0", "--prefill-weights", "f16", "--json"])
    assert res.exit_code == 0, res.output
    import json

    assert {r["config"]["prefill_weights"] for r in json.loads(res.stdout)} == {"f16"}
