"""engines/dflash.py's call sequence, run on a CPU emulation of the C API (dflash_fake_lib), against the
CPU engine on the same tiny Q4_K_M GGUF (dequantized). Pointers are real host addresses, so every
buffer offset, leading dimension, region layout and the tree / commit bookkeeping are exercised; the
only numeric difference from the CPU engine is the f16 K/V cache (relative RMS < 5e-3 on logits).
The GPU runs the same engine in tests/gpu/test_dflash_engine.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from dflash_fake_lib import FakeLib
from dflash_tiny import branched_tree, make_tiny_q4km

from lucebox_cli.engines.base import Tree
from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.engines.dflash import DFlashTargetEngine, tree_mask_bits
from lucebox_cli.errors import EngineUnavailable, OutOfMemory, UsageError
from lucebox_cli.models.qwen35_gguf import load_model_gguf

TOL = 5e-3
TAPS = (0, 2)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_tiny_q4km(tmp_path_factory.mktemp("dflash") / "m4", n_layers=4, hv_ratio=3)


@pytest.fixture(scope="module")
def cpu_model(gguf):
    cfg, weights, _ = load_model_gguf(gguf)
    return cfg, weights


def engines(gguf, cpu_model, **kw):
    cfg, weights = cpu_model
    lib = FakeLib()
    gpu = DFlashTargetEngine(gguf, max_context=256, budget=22, tap_layers=TAPS, lib=lib, card_bytes=8 << 30, **kw)
    cpu = CPUEngine(cfg, weights, tap_layers=TAPS, max_context=256)
    return gpu, cpu, lib


def test_prefill_two_chunks_and_steps(gguf, cpu_model):
    gpu, cpu, _ = engines(gguf, cpu_model)
    ids = np.random.default_rng(1).integers(0, 4096, 70)  # 64 + 6: two prefill passes
    lg, lc = gpu.prefill(ids), cpu.prefill(ids)
    assert rel(lg, lc) < TOL
    assert np.allclose(gpu.features, cpu.features, rtol=0, atol=5e-3 * np.abs(cpu.features).max())
    tok_g = tok_c = int(np.argmax(lc))
    for _ in range(6):
        lg, lc = gpu.step(tok_g), cpu.step(tok_c)
        assert rel(lg, lc) < TOL
        tok_g, tok_c = int(np.argmax(lg)), int(np.argmax(lc))
        assert tok_g == tok_c
    assert gpu.n_past == cpu.n_past == 76
    gpu.close()


def test_prefill_passes_of_more_rows(gguf, cpu_model):
    """prefill_rows = 128: a 200-token prompt is one 128-row pass (its GEMMs two 64-column calls) and one of
    72 rows; logits, tap features and the steps after it match the CPU engine as the 64-row passes do."""
    gpu, cpu, lib = engines(gguf, cpu_model, prefill_rows=128)
    ids = np.random.default_rng(5).integers(0, 4096, 200)
    lib.log = []
    lg, lc = gpu.prefill(ids), cpu.prefill(ids)
    log, lib.log = lib.log, None
    assert rel(lg, lc) < TOL
    assert np.allclose(gpu.features, cpu.features, rtol=0, atol=5e-3 * np.abs(cpu.features).max())
    # two passes: the norms see 128 and 72 rows, the GEMMs at most 64 columns (the FakeLib asserts n <= 64)
    norm_rows = sorted({a[3] for name, a in log if name == "lb_df_rmsnorm"})
    assert 128 in norm_rows and 72 in norm_rows and max(norm_rows) == 128
    assert {a[5] for name, a in log if name == "lb_gemm_q_smalln"} >= {64, 8}
    tok = int(np.argmax(lc))
    for _ in range(3):
        lg, lc = gpu.step(tok), cpu.step(tok)
        assert rel(lg, lc) < TOL
        tok = int(np.argmax(lc))
    gpu.close()


def test_prefill_rows_must_be_a_multiple_of_64(gguf, cpu_model):
    with pytest.raises(UsageError, match="multiple of 64"):
        engines(gguf, cpu_model, prefill_rows=100)


@pytest.mark.parametrize("seed", [3, 4])
def test_verify_commit_then_step(gguf, cpu_model, seed):
    gpu, cpu, lib = engines(gguf, cpu_model)
    ids = np.random.default_rng(seed).integers(0, 4096, 9)
    gpu.prefill(ids)
    cpu.prefill(ids)
    tree = branched_tree(seed, 17, 4096)
    rg, rc = gpu.verify(tree), cpu.verify(tree)
    assert rel(rg.logits, rc.logits) < TOL
    assert rel(gpu.last_verify_features, cpu.last_verify_features) < TOL
    leaf = int(np.argmax(tree.depth))
    path = tree.path_to(leaf)
    gpu.poison()  # commit must not need scratch
    gpu.commit(path)
    cpu.commit(path)
    assert gpu.n_past == cpu.n_past
    assert rel(gpu.features, cpu.features) < TOL
    gpu.poison()
    assert rel(gpu.step(5), cpu.step(5)) < TOL
    assert "lb_gdn_commit" in lib.calls and "lb_df_kv_compact" in lib.calls
    gpu.close()


def test_poisoned_scratch_changes_nothing(gguf, cpu_model):
    gpu, cpu, _ = engines(gguf, cpu_model)
    ids = [1, 2, 3, 4, 5]
    gpu.poison()
    a = gpu.prefill(ids)
    gpu.reset()
    b = gpu.prefill(ids)
    assert np.array_equal(a, b) and np.isfinite(a).all()
    gpu.close()


def test_mask_bits():
    tree = Tree(np.zeros(4, np.int64), np.array([-1, 0, 0, 2]))
    assert tree_mask_bits(tree).tolist() == [1, 3, 5, 13]


def test_refusals(gguf, cpu_model):
    with pytest.raises(OutOfMemory, match="up to .* tokens of context; asked for 100000000"):
        DFlashTargetEngine(gguf, max_context=100_000_000, budget=22, lib=FakeLib(), card_bytes=1 << 30)
    gpu, _, lib = engines(gguf, cpu_model)
    with pytest.raises(UsageError, match="budget"):
        gpu.prefill([1])
        gpu.verify(branched_tree(1, 30, 4096))
    with pytest.raises(UsageError, match="verify"):
        gpu.commit([0])
    gpu.close()


def test_unsupported_shapes(tmp_path):
    from tiny_models import make_tiny_checkpoint

    from lucebox_cli.quant.convert import quantize

    folder = make_tiny_checkpoint(tmp_path / "small", hidden=256, vocab=512)
    out = tmp_path / "small.gguf"
    quantize(folder, out, "Q8_0")
    with pytest.raises(EngineUnavailable, match="head_dim 64"):
        DFlashTargetEngine(out, max_context=64, budget=4, lib=FakeLib(), card_bytes=1 << 30)


def test_greedy_entry_points_copy_ids_only(gguf, cpu_model):
    """step_argmax / verify_argmax run lb_df_topk (the fake: numpy argmax) and return the CPU engine's ids."""
    gpu, cpu, lib = engines(gguf, cpu_model)
    ids = np.random.default_rng(7).integers(0, 4096, 11)
    tok = int(np.argmax(gpu.prefill(ids)))
    assert tok == int(np.argmax(cpu.prefill(ids)))
    for _ in range(4):
        tg, tc = gpu.step_argmax(tok), cpu.step_argmax(tok)
        assert tg == tc
        tok = tg
    tree = branched_tree(9, 23, 4096)
    rg, rc = gpu.verify_argmax(tree), cpu.verify(tree)
    assert rg.logits is None and rg.argmax.tolist() == np.argmax(rc.logits, axis=-1).tolist()
    assert "lb_df_topk" in lib.calls
    full = gpu.verify(tree)  # same call: the device top-k of the rows just copied back
    assert gpu.device_topk(23, 1)[:, 0].tolist() == np.argmax(full.logits, axis=-1).tolist()
    gpu.commit(tree.path_to(int(np.argmax(tree.depth))))
    gpu.close()


def _session(gpu, ids, trees):
    """prefill (two chunks), greedy steps, a verify + commit, more steps, a greedy verify + commit."""
    out = [gpu.prefill(ids)]
    tok = int(np.argmax(out[-1]))
    for _ in range(3):
        out.append(gpu.step(tok))
        tok = int(np.argmax(out[-1]))
    for tree in trees:
        res = gpu.verify(tree)
        out.append(res.logits)
        gpu.commit(tree.path_to(int(np.argmax(tree.depth))))
        tok = gpu.step_argmax(tok)
        out.append(np.asarray([tok]))
    out.append(gpu.features)
    return out


def test_programs_issue_the_reference_calls(gguf, cpu_model):
    """The prebuilt call lists (recorded once per (mode, t), n_past and save counts patched per call) give
    the same calls, argument for argument, and the same results as issuing every call directly."""
    gpu, _, lib = engines(gguf, cpu_model)
    ids = np.random.default_rng(11).integers(0, 4096, 70)
    trees = [branched_tree(12, 17, 4096), branched_tree(13, 17, 4096), branched_tree(14, 23, 4096)]
    runs = {}
    for programs in (True, False):
        gpu.reset()
        gpu._layers.use_programs = programs
        lib.log = []
        res = _session(gpu, ids, trees)
        runs[programs] = (lib.log, res)
        lib.log = None
    (log_p, res_p), (log_d, res_d) = runs[True], runs[False]
    assert [n for n, _ in log_p] == [n for n, _ in log_d]
    # host arrays' addresses differ between runs (a numpy array's; the segment tables of lb_gemm_q_smalln_seg,
    # whose contents the equal results below vouch for)
    host_arg = {"lb_dev_h2d": (1,), "lb_dev_d2h": (0,), "lb_gemm_q_smalln_seg": (7, 8)}
    for (name, a), (_, b) in zip(log_p, log_d):
        if name in host_arg:
            a, b = [tuple(x for j, x in enumerate(c) if j not in host_arg[name]) for c in (a, b)]
        assert a == b, name
    for a, b in zip(res_p, res_d):
        assert np.array_equal(a, b)
    # the step pass was recorded once and replayed at 6 other positions, the 17-slot tree pass twice
    assert ("pass", "step", 1) in gpu._layers._programs and ("pass", "tree", 17) in gpu._layers._programs
    gpu.close()


def test_stub_library_takes_every_call(gguf, tmp_path):
    """Over a compiled stub of the whole C API (real ctypes argtypes, no device), every pass's prebuilt
    arguments convert to the declared C types, and host_times measures something."""
    import shutil

    from dflash_fake_lib import host_times, stub_lib

    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    lib = stub_lib(tmp_path)
    gpu = DFlashTargetEngine(gguf, max_context=256, budget=22, tap_layers=TAPS, lib=lib, card_bytes=8 << 30)
    gpu.prefill(list(range(70)))
    gpu.step_argmax(1)
    tree = branched_tree(5, 23, 4096)
    gpu.verify(tree, want_logits=False)
    gpu.commit(tree.path_to(int(np.argmax(tree.depth))))
    assert gpu.n_past == 71 + int(tree.depth.max()) + 1
    gpu.close()
    t = host_times(gguf, lib, steps=5, verifies=2)
    assert t["layers"] == 4 and 0 < t["step_ms"] < 1e3 and 0 < t["verify_ms"] < 1e3


@pytest.mark.parametrize("spec,rate", [("chain", 0.0), ("ddtree", 0.3)])
def test_speculative_decoding_is_lossless(gguf, spec, rate):
    """The spec loop over the target engine (replay draft): the --spec none tokens, in fewer verify steps."""
    from lucebox_cli.config import RunConfig
    from lucebox_cli.spec.drafts import ReplayDraft
    from lucebox_cli.spec.loop import speculative_generate

    eng = DFlashTargetEngine(gguf, max_context=256, budget=22, lib=FakeLib(), card_bytes=8 << 30)
    prompt = np.random.default_rng(4).integers(0, eng.cfg.vocab, 20).tolist()
    plain = speculative_generate(eng, None, RunConfig(model="m4", max_tokens=24), prompt).tokens
    res = speculative_generate(eng, ReplayDraft(rate=rate, seed=1), RunConfig(model="m4", spec=spec, max_tokens=24),
                               prompt)
    assert res.tokens == plain
    assert len(res.accept_lengths) < len(plain), "the draft was never accepted"
    eng.close()


@pytest.mark.parametrize("tile", ["0", "1"], ids=["gguf-q4k", "tiled-q4k"])
def test_decode_step_fuses_back_to_back_projections(gguf, cpu_model, tile, monkeypatch):
    """At t = 1, Q4_K/Q5_K matrices that sit back to back in the arena with back-to-back outputs run as one
    GEMV (ffn_gate + ffn_up at least); a verify (t > 1) keeps one call per matrix; the results do not move
    (the step's logits against the CPU engine, as in test_prefill_two_chunks_and_steps). With LUCEBOX_Q4K_TILE=1
    the Q4_K matrices of whole 16-row tiles are qtype 268 (tiled; read back by the fake through untile_q4k) and
    fuse among themselves."""
    monkeypatch.setenv("LUCEBOX_Q4K_TILE", tile)
    gpu, cpu, lib = engines(gguf, cpu_model)
    assert gpu.info["q4k_tile"] == (tile == "1")
    assert any(w.qtype == 268 for w in gpu._layers.m.values()) == (tile == "1")
    cfg = gpu.cfg
    prompt = [5, 17, 99, 3]
    gpu.prefill(prompt)
    cpu.prefill(prompt)
    lib.log = []
    got = gpu.step(42)
    ref = cpu.step(42)
    step_log, lib.log = lib.log, None
    assert rel(got, ref) < TOL
    gemv_rows = [a[2] for name, a in step_log if name == "lb_gemv_q"]
    m = gpu._layers.m
    for i in range(cfg.n_layers):
        gate, up = m[f"blk.{i}.ffn_gate.weight"], m[f"blk.{i}.ffn_up.weight"]
        if gate.qtype in (12, 13, 268) and gate.qtype == up.qtype:
            assert gate.rows + up.rows in gemv_rows, f"layer {i}: gate and up not fused"
    # the DeltaNet input projections: every matrix of attn_qkv, attn_gate, ssm_beta, ssm_alpha that sits right
    # after the one before it in the arena, with the same type, launches with it (the 48-row beta and alpha
    # of the 27B would otherwise pay a whole GEMV launch each)
    fused_any = False
    for i in range(cfg.n_layers):
        if cfg.is_attention(i):
            continue
        names = [f"blk.{i}.{n}.weight" for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")]
        run = [m[names[0]]]
        for name in names[1:]:
            w, prev = m[name], run[-1]
            nbytes = prev.rows * (prev.k // 256) * {12: 144, 13: 176, 268: 144}.get(prev.qtype, 0)
            if prev.qtype in (12, 13, 268) and w.qtype == prev.qtype and w.ptr == prev.ptr + nbytes:
                run.append(w)
            else:
                assert len(run) == 1 or sum(x.rows for x in run) in gemv_rows, f"layer {i}: {len(run)} not fused"
                fused_any |= len(run) > 1
                run = [w]
        assert len(run) == 1 or sum(x.rows for x in run) in gemv_rows, f"layer {i}: {len(run)} not fused"
        fused_any |= len(run) > 1
    assert fused_any, "no DeltaNet projections sat back to back: the tiny model no longer tests this"
    # one launch fewer per fused pair: fewer GEMVs than matrices
    n_mats = sum(1 for name in m if name.startswith("blk.") and name.endswith(".weight") and m[name].rows > 0)
    assert len(gemv_rows) < n_mats
    # a verify (t > 1, token-major [t, rows] outputs) runs the same runs as one segmented GEMM each, every
    # matrix's rows to its own output, and its logits stay the CPU engine's
    tree = branched_tree(3, 5, cfg.vocab)
    lib.log = []
    got = gpu.verify(tree)
    verify_log, lib.log = lib.log, None
    ref = cpu.verify(tree)
    assert rel(got.logits, ref.logits) < TOL
    segs = [a for name, a in verify_log if name == "lb_gemm_q_smalln_seg"]
    assert segs, "no segmented GEMM in the verify"
    import ctypes

    for a in segs:
        counts = list((ctypes.c_int32 * a[6]).from_address(a[7]))
        assert sum(counts) == a[2] and all(c in {w.rows for w in m.values()} for c in counts)
    # and the single GEMMs left are whole matrices
    assert all(a[2] in {w.rows for w in m.values()} for name, a in verify_log if name == "lb_gemm_q_smalln")
    gpu.close()


@pytest.mark.parametrize("q4", ["0", "1"], ids=["gguf-q4k", "tiled-q4k"])
def test_tiled_q6k_prefill_verify_and_steps(gguf, cpu_model, q4, monkeypatch):
    """LUCEBOX_Q6K_TILE=1 at creation: every Q6_K matrix of whole 16-row tiles (the tiny Q4_K_M's LM head and Q6_K
    FFN / attention matrices) uploads as qtype 270 (read back by the fake through untile_q6k), nothing else moves,
    and prefill, a tree verify with its commit, and the steps after it match the CPU engine as in the other tests."""
    monkeypatch.setenv("LUCEBOX_Q4K_TILE", q4)
    monkeypatch.setenv("LUCEBOX_Q6K_TILE", "1")
    gpu, cpu, lib = engines(gguf, cpu_model)
    assert gpu.info["q6k_tile"] and gpu.info["q4k_tile"] == (q4 == "1")
    qtypes = {w.qtype for w in gpu._layers.m.values()}
    assert 270 in qtypes and 14 not in qtypes, qtypes
    ids = np.random.default_rng(7).integers(0, 4096, 70)  # 64 + 6: two prefill passes
    lib.log = []
    lg, lc = gpu.prefill(ids), cpu.prefill(ids)
    log, lib.log = lib.log, None
    assert any(a[0] == 270 for name, a in log if name.startswith("lb_gemm_q")), "no tiled Q6_K product in prefill"
    assert rel(lg, lc) < TOL
    tree = branched_tree(7, 17, 4096)
    rg, rc = gpu.verify(tree), cpu.verify(tree)
    assert rel(rg.logits, rc.logits) < TOL
    path = tree.path_to(int(np.argmax(tree.depth)))
    gpu.commit(path)
    cpu.commit(path)
    tok_g = tok_c = 5
    for _ in range(4):
        lg, lc = gpu.step(tok_g), cpu.step(tok_c)
        assert rel(lg, lc) < TOL
        tok_g, tok_c = int(np.argmax(lg)), int(np.argmax(lc))
        assert tok_g == tok_c
    gpu.close()


def test_q6k_tile_is_on_by_default_and_off_by_switch(gguf, cpu_model, monkeypatch):
    monkeypatch.delenv("LUCEBOX_Q6K_TILE", raising=False)
    gpu, _, _ = engines(gguf, cpu_model)
    assert gpu.info["q6k_tile"] and 270 in {w.qtype for w in gpu._layers.m.values()}
    gpu.close()
    monkeypatch.setenv("LUCEBOX_Q6K_TILE", "0")
    gpu, _, _ = engines(gguf, cpu_model)
    assert not gpu.info["q6k_tile"] and 270 not in {w.qtype for w in gpu._layers.m.values()}
    gpu.close()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "prep+decode"])
def test_decode_step_attention_calls(gguf, cpu_model, fused):
    """A decode step's attention is one lb_attn_decode_fused call per attention layer where the library has it
    (prep, split-KV attention and merge in one kernel), else lb_attn_prep + lb_attn_decode; the logits stay the
    CPU engine's either way, and the tickets the fused call takes are carved state (not scratch: poisoning
    leaves them zero, the fake asserts so at every call), zeroed again by reset()."""
    cfg, weights = cpu_model
    lib = FakeLib(fused=fused)
    gpu = DFlashTargetEngine(gguf, max_context=256, budget=22, lib=lib, card_bytes=8 << 30)
    cpu = CPUEngine(cfg, weights, max_context=256)
    assert gpu._layers.fused_decode == fused
    assert gpu.info["attn_decode"] == ("fused" if fused else "prep+decode")
    prompt = [5, 17, 99, 3]
    gpu.prefill(prompt)
    cpu.prefill(prompt)
    gpu.poison()
    lib.log = []
    got, ref = gpu.step(42), cpu.step(42)
    log, lib.log = [n for n, _ in lib.log], None
    assert rel(got, ref) < TOL
    n_attn = sum(cfg.is_attention(i) for i in range(cfg.n_layers))
    assert n_attn > 0
    if fused:
        assert log.count("lb_attn_decode_fused") == n_attn
        assert "lb_attn_prep" not in log and "lb_attn_decode" not in log
    else:
        assert log.count("lb_attn_prep") == n_attn and log.count("lb_attn_decode") == n_attn
        assert "lb_attn_decode_fused" not in log
    # a verify and a prefill keep prep + tree / causal
    lib.log = []
    gpu.verify(branched_tree(3, 5, cfg.vocab))
    assert "lb_attn_prep" in [n for n, _ in lib.log] and "lb_attn_decode_fused" not in [n for n, _ in lib.log]
    lib.log = None
    # reset() zeroes the tickets (a launch that failed half way would leave a count behind)
    from dflash_fake_lib import view

    tickets = view(gpu._bufs.tickets, np.uint32, cfg.n_kv_heads)
    tickets[:] = 7
    gpu.reset()
    assert not tickets.any()
    gpu.close()


def test_tickets_are_state_in_the_plan(gguf):
    from lucebox_cli.engines import memory_plan as mp
    from lucebox_cli.models.qwen35_gguf import read_model_config
    from lucebox_cli.gguf_io import GGUFModel

    cfg = read_model_config(GGUFModel(gguf))
    bufs = {b.name: b for b in mp.buffer_list(cfg, context=256, budget=22)}
    t = bufs["attn_tickets"]
    assert not t.scratch and t.nbytes >= 4 * cfg.n_kv_heads and t.category == "attn_partials"


def test_attn_decode_path_names_the_switch():
    from lucebox_cli.engines.dflash import attn_decode_path

    assert attn_decode_path(True, {}) == "fused"
    assert attn_decode_path(True, {"LUCEBOX_ATTN_DECODE": "split"}) == "split"
    assert attn_decode_path(True, {"LUCEBOX_ATTN_DECODE": "other"}) == "fused"
    assert attn_decode_path(False, {"LUCEBOX_ATTN_DECODE": "split"}) == "prep+decode"
