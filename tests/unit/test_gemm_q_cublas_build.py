"""The cuBLAS prefill GEMM without a GPU: fp16 dequantization and lb_gemm_q_cublas build for both profiles' archs
without spills; their C ABI rows agree with lucebox.h; through ctypes on the built library, lb_gemm_q_cublas
refuses bad arguments and then reports "cuBLAS not loaded" before any CUDA work; the memory plan counts its
scratch (the formula of lb_gemm_q_cublas_scratch_bytes) only where a pass can use it, so the 3090's plan is
unchanged; the engine decides the path once (LUCEBOX_PREFILL_GEMM) and, on a CPU emulation of the C API with
cuBLAS "loaded", sends the wide pass's projections through lb_gemm_q_cublas with the same logits as the CPU
engine. The kernels themselves run in tests/gpu/test_gemm_q_cublas.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_build import assert_api_rows, compile_cu, needs_nvcc, spill_stores
from dflash_fake_lib import FakeLib
from dflash_tiny import branched_tree, make_tiny_q4km

from lucebox_cli.config import get_profile
from lucebox_cli.engines import _lib
from lucebox_cli.engines import memory_plan as mp
from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.engines.dflash import DFlashTargetEngine, prefill_gemm_path, prefill_gu_mode, prefill_merge_mode
from lucebox_cli.engines.dflash_layers import Pass
from lucebox_cli.errors import EngineUnavailable, UsageError
from lucebox_cli.models.qwen35_gguf import load_model_gguf

API = ["lb_dequant_f16", "lb_blas_ready", "lb_gemm_q_cublas_scratch_bytes", "lb_gemm_q_cublas", "lb_gemm_f16w_cublas",
       "lb_cublas_set_sm_target", "lb_gemm_q_cublas_x16_h", "lb_df_swiglu_f16_rows"]
SOURCES = ["cuda/ops/dequant_f16.cu", "cuda/ops/gemm_q_cublas.cu", "cuda/core/cublas_gemm.cu",
           "cuda/dflash/df_small.cu"]
Q4_K = 12


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, arch: str, tmp_path: Path):
    returncode, log = compile_cu(source, arch, tmp_path)
    assert returncode == 0, log[-4000:]
    assert not any(spill_stores(log)), "register spills:\n" + log[-4000:]


def test_api_rows_in_header_and_table():
    assert_api_rows(API)


@pytest.fixture(scope="module")
def built():
    path = next((p for p in (_lib.lib_path(n) for n in ("rtx3090-sm86", "h200-sm90")) if p.exists()), None)
    if path is None:
        pytest.skip("no built liblucebox.so (make build PROFILE=…)")
    return _lib.open_lib(path)


def test_not_loaded_error_through_ctypes(built):
    """Host-side checks first, then the clean "cuBLAS not loaded" (no pointer is touched: fake addresses)."""
    fn, a = built.fn, 1 << 40  # 256-byte aligned, never dereferenced
    assert fn.lb_blas_ready() == 0 and not _lib.cublas_ready(built)
    n, k, rows = 65, 512, 301
    need = fn.lb_gemm_q_cublas_scratch_bytes(n, k, rows)
    assert need == mp.cublas_scratch(n, k, rows) == 66560 + 308224
    assert fn.lb_gemm_q_cublas_scratch_bytes(0, k, rows) == 0 and fn.lb_gemm_q_cublas_scratch_bytes(n, 300, 1) == 0
    assert fn.lb_gemm_q_cublas(Q4_K, a, rows, k, a, n, a, 0, a, need, None) == _lib.LB_ERR_NOT_FOUND
    assert "cuBLAS not loaded" in built.last_error()
    # argument errors come first, with their own messages
    assert fn.lb_gemm_q_cublas(99, a, rows, k, a, n, a, 0, a, need, None) == _lib.LB_ERR_UNSUPPORTED
    assert "qtype 99" in built.last_error()
    assert fn.lb_gemm_q_cublas(Q4_K, a, rows, 300, a, n, a, 0, a, need, None) == _lib.LB_ERR_INVALID_ARG
    small = fn.lb_gemm_q_cublas_scratch_bytes(n, k, 1) - 1
    assert fn.lb_gemm_q_cublas(Q4_K, a, rows, k, a, n, a, 0, a, small, None) == _lib.LB_ERR_INVALID_ARG
    assert "scratch" in built.last_error()
    assert fn.lb_gemm_q_cublas(Q4_K, a, rows, k, a, n, a, 0, a + 16, need, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_dequant_f16(Q4_K, a, rows, k, 300, 2, a, None) == _lib.LB_ERR_INVALID_ARG  # past the last row
    assert fn.lb_dequant_f16(Q4_K, a, rows, k, 0, 1, a + 8, None) == _lib.LB_ERR_INVALID_ARG  # out alignment
    # the fp16-weight GEMM and the SM target (scripts/bench_prefill_overlap.py): arguments, then "not loaded"
    assert fn.lb_gemm_f16w_cublas(None, rows, k, a, n, a, 0, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_gemm_f16w_cublas(a, rows, k, a, n, a, 0, None) == _lib.LB_ERR_NOT_FOUND
    assert fn.lb_cublas_set_sm_target(-1) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_cublas_set_sm_target(100) == _lib.LB_ERR_NOT_FOUND and "not loaded" in built.last_error()
    # the fp16-output form: accumulate = 1 and a misaligned y16 are refused before "not loaded"
    assert fn.lb_gemm_q_cublas_x16_h(Q4_K, a, rows, k, a, n, a, 1, a, need, None) == _lib.LB_ERR_INVALID_ARG
    assert "accumulate" in built.last_error()
    assert fn.lb_gemm_q_cublas_x16_h(Q4_K, a, rows, k, a, n, a + 8, 0, a, need, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_gemm_q_cublas_x16_h(Q4_K, a, rows, k, a, n, a, 0, a, 2 * k - 1, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_gemm_q_cublas_x16_h(Q4_K, a, rows, k, a, n, a, 0, a, need, None) == _lib.LB_ERR_NOT_FOUND
    # the rows SwiGLU's argument checks (no CUDA work)
    assert fn.lb_df_swiglu_f16_rows(None, a, 4, 8, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_df_swiglu_f16_rows(a, a, 0, 8, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_df_swiglu_f16_rows(a, a, 4, 0, None) == _lib.LB_ERR_INVALID_ARG


# ---- memory plan ----


@pytest.fixture(scope="module")
def big():
    cfg = mp.qwen35_27b_config()
    return cfg, mp.sizes_from_mix(cfg, "Q4_K_M")


def test_plan_counts_the_scratch(big):
    """With the path on, 1024-row passes: fp16 x at ffn_down's K (35.7 MB) + gate + up as one fp16 tensor (356 MB:
    LUCEBOX_PREFILL_GU=merged16's one GEMM over both)."""
    cfg, sizes = big
    p = mp.plan(cfg, sizes, context=4096, budget=40, prefill_rows=1024, cublas=True)
    # x at ffn_down's K = 17408; the chunk: gate + up, 2 x 17408 rows of K = 5120 (= 10240 rows of 17408)
    want = mp.cublas_scratch(1024, cfg.ffn, 2 * cfg.hidden)
    assert p.bytes_of("cublas gemm scratch") == mp.cublas_gemm_scratch(cfg, 1024) == want
    assert want == 2 * 1024 * 17408 + 2 * (2 * 17408) * 5120
    off = mp.plan(cfg, sizes, context=4096, budget=40, prefill_rows=1024)
    assert p.total - off.total == want and p.cublas and not off.cublas
    names = [b.name for b in mp.buffer_list(cfg, context=4096, budget=40, prefill_rows=1024, cublas=True)]
    assert names[-1] == "gemm_scratch"


def test_plan_without_a_wide_pass_is_unchanged(big):
    """Passes narrower than CUBLAS_MIN_ROWS never reach cuBLAS: no scratch, so the 3090 (64-row passes) keeps its
    largest context with the draft, and its profile names no cuBLAS pass length."""
    cfg, sizes = big
    prof = get_profile("rtx3090-sm86")
    assert prof.run.prefill_rows < mp.CUBLAS_MIN_ROWS and prof.run.prefill_rows_cublas is None
    on = mp.plan(cfg, sizes, context=4096, budget=22, prefill_rows=64, cublas=True)
    assert on.bytes_of("cublas gemm scratch") == 0 and not on.cublas
    card = mp.card_bytes_of_profile(prof)
    assert mp.largest_context(cfg, sizes, card, budget=22, draft=mp.DFLASH_27B_BF16, cublas=True) == 41_690


def test_h200_cublas_passes_fit(big):
    cfg, sizes = big
    prof = get_profile("h200-sm90")
    assert prof.run.prefill_rows_cublas == 1024 and prof.run.prefill_rows == 256
    p = mp.plan(cfg, sizes, context=prof.run.max_context, budget=prof.run.budget, draft=mp.DFLASH_27B_BF16,
                prefill_rows=1024, cublas=True)
    mp.fit(p, mp.card_bytes_of_profile(prof))
    p256 = mp.plan(cfg, sizes, context=prof.run.max_context, budget=prof.run.budget, draft=mp.DFLASH_27B_BF16,
                   prefill_rows=256)
    assert p.total - p256.total < 1.5 * 2**30


# ---- the engine's decision and the emulated path ----


def test_gemm_mode_knob():
    assert prefill_gemm_path(FakeLib(), {}) == "own"  # auto, no cuBLAS
    assert prefill_gemm_path(FakeLib(blas=True), {}) == "cublas"
    assert prefill_gemm_path(FakeLib(blas=True), {"LUCEBOX_PREFILL_GEMM": "own"}) == "own"
    assert prefill_gemm_path(FakeLib(blas=True), {"LUCEBOX_PREFILL_GEMM": " CUBLAS "}) == "cublas"
    with pytest.raises(EngineUnavailable, match="no cuBLAS"):
        prefill_gemm_path(FakeLib(), {"LUCEBOX_PREFILL_GEMM": "cublas"})
    with pytest.raises(UsageError, match="LUCEBOX_PREFILL_GEMM"):
        prefill_gemm_path(FakeLib(), {"LUCEBOX_PREFILL_GEMM": "fast"})


def test_gu_and_merge_mode_knobs():
    assert prefill_gu_mode({}) == "merged16"
    assert prefill_gu_mode({"LUCEBOX_PREFILL_GU": " Merged16 "}) == "merged16"
    assert prefill_gu_mode({"LUCEBOX_PREFILL_GU": "split"}) == "split"
    with pytest.raises(UsageError, match="LUCEBOX_PREFILL_GU"):
        prefill_gu_mode({"LUCEBOX_PREFILL_GU": "merged"})
    assert prefill_merge_mode({}) == "on" and prefill_merge_mode({"LUCEBOX_PREFILL_MERGE": "off"}) == "off"
    with pytest.raises(UsageError, match="LUCEBOX_PREFILL_MERGE"):
        prefill_merge_mode({"LUCEBOX_PREFILL_MERGE": "all"})


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_tiny_q4km(tmp_path_factory.mktemp("dflash_cublas") / "m4", n_layers=4, hv_ratio=3)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


@pytest.mark.parametrize("graphs", [False, True], ids=["calls", "graphs"])
def test_emulated_engine_on_the_cublas_path(gguf, graphs, monkeypatch):
    """prefill_rows 256 with cuBLAS "loaded": a 300-token prompt's 256-row pass runs every projection through
    lb_gemm_q_cublas / lb_gemm_q_cublas_x16 on fp16 inputs from the norm and SwiGLU (one call per matrix, with the plan's scratch), its 44-row tail and the verify after it stay
    on small-N (never inside a capture), and logits match the CPU engine as the small-N path does."""
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    # the per-matrix forms (merged16: test_emulated_engine_gate_up_merged16; merge on: the Hv = 16 test below)
    monkeypatch.setenv("LUCEBOX_PREFILL_GU", "split")
    monkeypatch.setenv("LUCEBOX_PREFILL_MERGE", "off")
    cfg, weights = load_model_gguf(gguf)[:2]
    lib = FakeLib(graphs=graphs, blas=True)
    gpu = DFlashTargetEngine(gguf, max_context=512, budget=22, tap_layers=(0, 2), lib=lib, card_bytes=8 << 30,
                             prefill_rows=256)
    cpu = CPUEngine(cfg, weights, tap_layers=(0, 2), max_context=512)
    try:
        assert gpu.info["prefill_gemm"] == "cublas" and gpu.plan.bytes_of("cublas gemm scratch") > 0
        ids = np.random.default_rng(7).integers(0, 4096, 300)
        lib.log = []
        gpu.poison()
        lg, lc = gpu.prefill(ids), cpu.prefill(ids)
        log, lib.log = lib.log, None
        assert rel(lg, lc) < 5e-3 and rel(gpu.features, cpu.features) < 5e-3
        wide = [a for name, a in log if name == "lb_gemm_q_cublas"]
        x16 = [a for name, a in log if name == "lb_gemm_q_cublas_x16"]
        # one call per matrix. The mixer's out projection converts its input itself and adds onto x; every other
        # matrix reads an fp16 input written straight into the scratch by the op before it (the norm: q, k, v /
        # qkv, gate, beta, alpha / gate, up, written with beta = 0, so that norm cleared nothing; SwiGLU: down,
        # which adds onto x)
        assert len(wide) == cfg.n_layers and {a[5] for a in wide} == {256} and {a[7] for a in wide} == {1}
        assert all(a[9] == gpu._bufs.gemm_scratch_bytes for a in wide)
        want = sum(3 if cfg.is_attention(i) else 4 for i in range(cfg.n_layers)) + 3 * cfg.n_layers
        assert len(x16) == want and {a[5] for a in x16} == {256}
        assert sorted(a[7] for a in x16) == [0] * (want - cfg.n_layers) + [1] * cfg.n_layers
        assert all(a[4] == gpu._bufs.gemm_scratch for a in x16)
        assert not any(name == "lb_f32_to_f16" for name, _ in log)
        assert len([a for name, a in log if name == "lb_df_rmsnorm_f16" and a[3] == 256]) == 2 * cfg.n_layers
        assert not [a for name, a in log if name == "lb_df_rmsnorm" and a[3] == 256]
        assert len([a for name, a in log if name == "lb_df_swiglu_f16"]) == cfg.n_layers
        assert {a[5] for name, a in log if name == "lb_gemm_q_smalln"} == {44}
        tree = branched_tree(3, 23)
        lib.log = []
        rg, rc = gpu.verify(tree), cpu.verify(tree)
        assert rel(rg.logits, rc.logits) < 5e-3
        assert lib.log and not any(name == "lb_gemm_q_cublas" for name, _ in lib.log)
    finally:
        gpu.close()


def test_emulated_engine_keeps_small_n_for_narrow_passes(gguf, monkeypatch):
    """cuBLAS "loaded" but 64-row passes (no profile, no prefill_rows): the path stays off and costs nothing."""
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    gpu = DFlashTargetEngine(gguf, max_context=256, budget=22, lib=FakeLib(blas=True), card_bytes=8 << 30)
    try:
        assert gpu.info["prefill_gemm"] == "own" and gpu.prefill_rows == 64
        assert gpu.plan.bytes_of("cublas gemm scratch") == 0 and gpu._bufs.gemm_scratch == 0
    finally:
        gpu.close()


@pytest.fixture(scope="module")
def gguf_hv16(tmp_path_factory):
    """Hv = 16 (8 per key head): ssm_beta / ssm_alpha of 16 rows, tiled like attn_gate, as on the 27B (48)."""
    return make_tiny_q4km(tmp_path_factory.mktemp("dflash_cublas_hv16") / "m4", n_layers=4, hv_ratio=8)


def test_emulated_prefill_merge_matches_per_matrix_gemms(gguf_hv16, monkeypatch):
    """LUCEBOX_PREFILL_MERGE=on (the default) on a 256-row cuBLAS pass: a DeltaNet layer's attn_gate | ssm_beta |
    ssm_alpha as one GEMM read in place by lb_gdn_prefill_ld (Layers.zab_plan), an attention layer's attn_q | attn_k
    (| attn_v where it is back to back) as one read by lb_attn_prep_ld and lb_attn_causal (Layers.qkv_plan), against
    one GEMM per matrix (=off): the same logits up to float rounding, and the CPU engine's. (lb_gdn_prefill_ld itself,
    bit for bit against lb_gdn_prefill on packed copies: tests/gpu/test_gdn_ops.py.)"""
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    monkeypatch.setenv("LUCEBOX_PREFILL_GU", "split")  # three x16 GEMMs a layer for the FFN, counted below
    cfg, weights = load_model_gguf(gguf_hv16)[:2]
    ids = np.random.default_rng(3).integers(0, 4096, 256)
    attn = [i for i in range(cfg.n_layers) if cfg.is_attention(i)]
    n_dn = cfg.n_layers - len(attn)
    ld = cfg.hv * cfg.dv + 2 * cfg.hv
    out = []
    for f in ("on", "off"):
        monkeypatch.setenv("LUCEBOX_PREFILL_MERGE", f)
        lib = FakeLib(blas=True)
        gpu = DFlashTargetEngine(gguf_hv16, max_context=512, budget=22, lib=lib, card_bytes=8 << 30,
                                 prefill_rows=256)
        try:
            assert gpu.info["prefill_merge"] == f
            plans = [gpu._layers.qkv_plan(tuple(f"blk.{i}.attn_{n}.weight" for n in "qkv"), Pass("prefill", 256, 0))
                     for i in attn]
            assert all(pl is not None for pl in plans) == (f == "on")
            lib.log = []
            out.append(gpu.prefill(ids))
            log = lib.log
            names = [n for n, _ in log]
            zab = [a for name, a in log if name == "lb_gdn_prefill_ld"]
            assert ("lb_gdn_prefill" in names) == (f == "off") and ("lb_attn_prep" in names) == (f == "off")
            assert names.count("lb_attn_prep_ld") == (len(attn) if f == "on" else 0)
            x16 = [a for name, a in log if name == "lb_gemm_q_cublas_x16"]
            if f == "off":
                assert not zab
                want_mixer = sum(3 if cfg.is_attention(i) else 4 for i in range(cfg.n_layers))
            else:
                assert len(zab) == n_dn and {tuple(a[4:6]) for a in zab} == {(ld, ld)}
                assert len([a for a in x16 if a[2] == ld]) == n_dn
                # q | k (| v) one GEMM, v its own where not in the run
                want_mixer = 2 * n_dn + sum(1 if pl[1] == 3 else 2 for pl in plans)
            assert len(x16) == want_mixer + 3 * cfg.n_layers
        finally:
            gpu.close()
    # the same weights and math; numpy's float32 GEMM rounds a wider product differently from narrower ones (~6e-7
    # relative per output), which the four random-weight layers amplify to ~3e-4 of the logits
    assert rel(out[0], out[1]) < 2e-3
    cpu = CPUEngine(cfg, weights, max_context=512)
    assert rel(out[0], cpu.prefill(ids)) < 5e-3


def test_emulated_engine_gate_up_merged16(gguf, monkeypatch):
    """LUCEBOX_PREFILL_GU=merged16 on the emulated cuBLAS path: per layer of the 256-row pass, gate + up are ONE
    lb_gemm_q_cublas_x16_h over 2·ffn rows (the two Q4_K tensors back to back in the arena) into the gate region,
    read by one lb_df_swiglu_f16_rows that writes the down GEMM's fp16 input at the scratch's start; no
    lb_df_swiglu_f16 and two fewer fp32 x16 GEMMs per layer. The logits equal the split path's up to the fp16
    rounding of gate and up (rel RMS < 1e-3) and the CPU engine's as before; info reports the mode."""
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    cfg, weights = load_model_gguf(gguf)[:2]
    ids = np.random.default_rng(11).integers(0, 4096, 300)
    out, logs = {}, {}
    for mode in ("split", "merged16"):
        monkeypatch.setenv("LUCEBOX_PREFILL_GU", mode)
        lib = FakeLib(blas=True)
        gpu = DFlashTargetEngine(gguf, max_context=512, budget=22, lib=lib, card_bytes=8 << 30, prefill_rows=256)
        try:
            assert gpu.info["prefill_gu"] == mode and gpu.info["prefill_gemm"] == "cublas"
            gpu.poison()
            lib.log = []
            out[mode] = gpu.prefill(ids)
            logs[mode], lib.log = lib.log, None
            bufs, ffn = gpu._bufs, cfg.ffn
        finally:
            gpu.close()
    merged, split = logs["merged16"], logs["split"]
    h = [a for name, a in merged if name == "lb_gemm_q_cublas_x16_h"]
    rows = [a for name, a in merged if name == "lb_df_swiglu_f16_rows"]
    assert len(h) == len(rows) == cfg.n_layers
    assert {(a[2], a[5], a[7]) for a in h} == {(2 * ffn, 256, 0)}  # 2·ffn rows, the wide pass's columns, no accumulate
    assert all(a[4] == bufs.gemm_scratch and a[6] == bufs.proj for a in h)
    assert all(a[8] == bufs.gemm_scratch + 2 * 256 * cfg.hidden and a[8] + a[9] == bufs.gemm_scratch
               + bufs.gemm_scratch_bytes for a in h)
    assert {(a[0], a[1], a[2], a[3]) for a in rows} == {(bufs.proj, bufs.gemm_scratch, 256, ffn)}
    assert not any(name == "lb_df_swiglu_f16" for name, _ in merged)
    x16 = lambda log: [a for name, a in log if name == "lb_gemm_q_cublas_x16"]  # noqa: E731
    assert len(x16(split)) - len(x16(merged)) == 2 * cfg.n_layers
    # the small-N tail (44 rows) is the same calls either way
    seg = lambda log: [a for name, a in log if name == "lb_gemm_q_smalln_seg"]  # noqa: E731
    assert len(seg(merged)) == len(seg(split)) > 0
    cpu = CPUEngine(cfg, weights, max_context=512)
    lc = cpu.prefill(ids)
    assert rel(out["merged16"], out["split"]) < 1e-3
    assert rel(out["merged16"], lc) < 5e-3


def test_merged16_falls_back_where_gate_up_are_not_one_tensor(gguf, monkeypatch):
    """merged16 needs gate and up back to back (same type and K) and a library with both entry points; otherwise the
    cuBLAS pass keeps today's calls."""
    monkeypatch.delenv("LUCEBOX_PREFILL_GEMM", raising=False)
    monkeypatch.setenv("LUCEBOX_PREFILL_GU", "merged16")
    gpu = DFlashTargetEngine(gguf, max_context=512, budget=22, lib=FakeLib(blas=True), card_bytes=8 << 30,
                             prefill_rows=256)
    try:
        L = gpu._layers
        names = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight")
        assert L._gu_merged(names)
        assert not L._gu_merged(names[::-1])  # up does not end where gate starts
        L.prefill_gu = "split"
        assert not L._gu_merged(names)
    finally:
        gpu.close()
