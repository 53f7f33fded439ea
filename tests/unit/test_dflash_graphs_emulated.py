"""The 27B engine's CUDA graphs and device-resident greedy loop (engines/dflash.py), on the CPU emulation
of the C API (dflash_fake_lib.FakeLib(graphs=True): a capture records the calls, a launch replays them,
the _at ops read n_past from the device state at replay). Graph and no-graph runs of the same session
must agree: logits, tap features, greedy tokens, n_past; the greedy loop must equal step_argmax in a
loop, stop after a stop token and count the steps queued past it; a capture that hits an unsafe call
must fail cleanly. The GPU runs the same comparisons in tests/gpu/test_dflash_graphs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from dflash_fake_lib import FakeLib
from dflash_tiny import branched_tree, make_tiny_q4km

from lucebox_cli.engines.dflash import DFlashTargetEngine

TAPS = (0, 2)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_tiny_q4km(tmp_path_factory.mktemp("dflash_graphs") / "m4", n_layers=4, hv_ratio=3)


def engine(gguf, taps=TAPS, graphs=True):
    lib = FakeLib(graphs=True)
    eng = DFlashTargetEngine(gguf, max_context=256, budget=22, tap_layers=taps, lib=lib, card_bytes=8 << 30)
    eng.use_graphs = graphs
    return eng, lib


def session(eng, ids, trees):
    """prefill, steps with host logits, verify + commit (logits and argmax forms), greedy steps."""
    out = [eng.prefill(ids)]
    tok = int(np.argmax(out[-1]))
    for _ in range(3):
        out.append(eng.step(tok))
        tok = int(np.argmax(out[-1]))
    for j, tree in enumerate(trees):
        res = eng.verify(tree, want_logits=j % 2 == 0)
        out.append(res.logits if res.logits is not None else res.argmax)
        out.append(eng.last_verify_features)
        eng.commit(tree.path_to(int(np.argmax(tree.depth))))
        tok = eng.step_argmax(tok)
        out.append(np.asarray([tok]))
    out.append(eng.features)
    out.append(np.asarray([eng.n_past]))
    return out


def test_graphs_equal_programs(gguf):
    """The same session with and without graphs: equal results (the emulation's math is the same in both;
    only where positions come from differs), and the graph run launches graphs, not passes."""
    ids = np.random.default_rng(11).integers(0, 4096, 70)
    trees = [branched_tree(12, 17), branched_tree(13, 17), branched_tree(14, 23)]
    runs = {}
    for graphs in (False, True):
        eng, lib = engine(gguf, graphs=graphs)
        runs[graphs] = (session(eng, ids, trees), lib)
        eng.close()
    (ref, lib_ref), (got, lib_g) = runs[False], runs[True]
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert lib_ref.launches == 0
    assert lib_g.launches == 3 + 3 * 2  # 3 steps, then per tree a verify and a step
    # two verify graphs (17 and 23 slots) and one step graph, captured once each
    assert lib_g.calls.count("lb_graph_end") == 3


def test_greedy_loop_equals_steps(gguf):
    """greedy_tokens (device loop: no taps, device embedding) == step_argmax in a loop; n_past advances."""
    ids = np.random.default_rng(2).integers(0, 4096, 9)
    ref_eng, _ = engine(gguf, taps=(), graphs=False)
    tok = int(np.argmax(ref_eng.prefill(ids)))
    ref = []
    for _ in range(12):
        tok = ref_eng.step_argmax(tok)
        ref.append(tok)
    eng, lib = engine(gguf, taps=())
    first = int(np.argmax(eng.prefill(ids)))
    assert eng._emb_dev is not None  # untied: token_embd uploaded for the loop
    got = list(eng.greedy_tokens(first, 12, ahead=4))
    assert got == ref
    assert eng.n_past == ref_eng.n_past == 9 + 12
    assert lib.launches == 12 and "lb_df_embed_q" in lib.calls and "lb_dev_h2d" in lib.calls
    # then more steps from there, on the same state
    assert eng.step_argmax(got[-1]) == ref_eng.step_argmax(ref[-1])
    eng.close()
    ref_eng.close()


def test_greedy_loop_stops_and_counts_queued_steps(gguf):
    """A stop token ends the tokens; the steps already queued past it ran and are in n_past."""
    ids = np.random.default_rng(5).integers(0, 4096, 9)
    eng, _ = engine(gguf, taps=())
    first = int(np.argmax(eng.prefill(ids)))
    full = list(eng.greedy_tokens(first, 10, ahead=3))
    eng.reset()
    eng.prefill(ids)
    stop = full[4]
    got = list(eng.greedy_tokens(first, 10, stop_ids=[stop], ahead=3))
    cut = full.index(stop) + 1
    assert got == full[:cut]
    # steps queued: `ahead` at the start, one more per token read before the stop
    assert eng.n_past == 9 + min(10, cut - 1 + 3)
    eng.close()


def test_greedy_loop_closed_early_waits(gguf):
    """A caller that breaks out closes the generator: the queued steps are counted, nothing is lost."""
    eng, _ = engine(gguf, taps=())
    eng.prefill([1, 2, 3])
    gen = eng.greedy_tokens(7, 20, ahead=5)
    got = [next(gen) for _ in range(2)]
    gen.close()
    assert len(got) == 2 and eng.n_past == 3 + 2 + 5


def test_greedy_loop_with_taps_falls_back(gguf):
    """With tap layers the loop is step_argmax per token (features kept per step)."""
    eng, lib = engine(gguf)
    eng.prefill([1, 2, 3, 4])
    toks = list(eng.greedy_tokens(9, 4))
    assert len(toks) == 4 and eng.n_past == 8 and eng.features.shape == (8, 2 * eng.cfg.hidden)
    assert "lb_event_sync" not in lib.calls
    eng.close()


def test_room_is_checked_before_queueing(gguf):
    from lucebox_cli.errors import LuceboxError

    eng, lib = engine(gguf, taps=())
    eng.prefill([1, 2, 3])
    with pytest.raises(LuceboxError):
        list(eng.greedy_tokens(1, 254))
    assert lib.launches == 0 and eng.n_past == 3
    eng.close()


def test_failed_capture_leaves_capture_mode(gguf):
    """An unsafe call inside a capture fails it; the error surfaces, no graph is kept, and the engine still
    runs afterwards (the next capture starts clean)."""
    eng, lib = engine(gguf, taps=())
    L = eng._layers
    with pytest.raises(RuntimeError):
        L.capture(lambda: lib.call("lb_dev_memset", eng._bufs.x, 0, 16))
    assert lib._capture is None and not eng._graphs
    eng.prefill([1, 2, 3])
    assert isinstance(eng.step_argmax(4), int)
    eng.close()


def test_env_turns_graphs_off(gguf, monkeypatch):
    monkeypatch.setenv("LUCEBOX_GRAPHS", "0")
    eng = DFlashTargetEngine(gguf, max_context=64, budget=4, lib=FakeLib(graphs=True), card_bytes=8 << 30)
    assert not eng.use_graphs
    eng.close()
    monkeypatch.delenv("LUCEBOX_GRAPHS")
    eng = DFlashTargetEngine(gguf, max_context=64, budget=4, lib=FakeLib(graphs=True), card_bytes=8 << 30)
    assert eng.use_graphs
    eng.close()
    # a library without the graph API: off, and asking for it says why
    eng = DFlashTargetEngine(gguf, max_context=64, budget=4, lib=FakeLib(), card_bytes=8 << 30)
    assert not eng.use_graphs
    with pytest.raises(Exception, match="no CUDA graphs"):
        eng.use_graphs = True
    eng.close()


@pytest.mark.parametrize("max_tokens,max_context,eos_at", [(12, 256, None), (12, 256, 5), (30, 20, None)])
def test_spec_none_through_the_loop(gguf, max_tokens, max_context, eos_at):
    """speculative_generate(--spec none, T = 0) over the greedy loop: the step loop's tokens and stop reason
    (max_tokens, an EOS, a full context)."""
    from lucebox_cli.config import RunConfig
    from lucebox_cli.spec.loop import speculative_generate

    prompt = np.random.default_rng(8).integers(0, 4096, 9).tolist()
    ref_eng, _ = engine(gguf, taps=(), graphs=False)
    cfg = RunConfig(model="m4", max_tokens=max_tokens, max_context=max_context)
    ref = speculative_generate(ref_eng, None, cfg, prompt)
    eos = [ref.tokens[eos_at]] if eos_at is not None else []
    if eos:
        ref = speculative_generate(ref_eng, None, cfg, prompt, eos_ids=eos)
    eng, lib = engine(gguf, taps=())
    got = speculative_generate(eng, None, cfg, prompt, eos_ids=eos)
    assert got.tokens == ref.tokens and got.stop_reason == ref.stop_reason and got.steps == ref.steps
    assert lib.launches >= got.steps and "lb_event_sync" in lib.calls
    eng.close()
    ref_eng.close()


def test_bench_tg_row_runs_the_loop(gguf):
    """bench speed's tg row over the engine's greedy loop: n decode steps from the prompt's context (the
    prefill's argmax is the first token fed, not counted)."""
    from lucebox_cli.bench.runner import make_tg

    eng, lib = engine(gguf, taps=())
    prompt = list(range(1, 12))
    dt, n, _ = make_tg(eng, prompt, 9)()
    assert n == 9 and dt > 0 and eng.n_past == len(prompt) + 9
    assert lib.launches == 9 and lib.calls.count("lb_event_sync") == 9
    eng.close()


def test_engine_info_says_whether_graphs_run(tmp_path):
    # every bench row carries engine_info: a number must say whether it was made with graphs
    g = make_tiny_q4km(tmp_path / "m", n_layers=4, hv_ratio=3)
    eng = DFlashTargetEngine(g, max_context=128, budget=8, lib=FakeLib(graphs=True), card_bytes=8 << 30)
    try:
        assert eng.info["cuda_graphs"] is eng.use_graphs
        eng.use_graphs = not eng.use_graphs
        assert eng.info["cuda_graphs"] is eng.use_graphs
    finally:
        eng.close()


def test_captured_step_runs_the_fused_attention_at(gguf):
    """The step graph holds lb_attn_decode_fused_at (n_past read at replay), the uncaptured step the host form;
    both give the same logits at every position (covered by test_graphs_equal_programs), and graph replays
    leave the tickets zero (the fake asserts it at every fused call)."""
    ids = np.random.default_rng(5).integers(0, 4096, 9)
    eng, lib = engine(gguf, graphs=True)
    eng.prefill(ids)
    lib.log = []
    tok = 1
    for _ in range(3):
        tok = int(np.argmax(eng.step(tok)))
    names = [n for n, _ in lib.log]
    lib.log = None
    n_attn = sum(eng.cfg.is_attention(i) for i in range(eng.cfg.n_layers))
    # recorded once at capture (the fake runs the record at each launch, outside the log)
    assert names.count("lb_attn_decode_fused_at") == n_attn and "lb_attn_prep_at" not in names
    eng.use_graphs = False
    lib.log = []
    eng.step(tok)
    names = [n for n, _ in lib.log]
    lib.log = None
    assert names.count("lb_attn_decode_fused") == n_attn and "lb_attn_decode_fused_at" not in names
    eng.close()


@pytest.mark.parametrize("env,want", [(None, 1), ("step", 1), ("1", 1), ("0", 0), ("off", 0)])
def test_step_graph_is_captured_with_pdl(gguf, monkeypatch, env, want):
    """The decode-step graph is captured with the C library's PDL switch on (unless LUCEBOX_PDL=0), the verify's
    without it, and the switch is back where it was after each capture."""
    if env is None:
        monkeypatch.delenv("LUCEBOX_PDL", raising=False)
    else:
        monkeypatch.setenv("LUCEBOX_PDL", env)
    eng, lib = engine(gguf, taps=())
    tok = int(np.argmax(eng.prefill(np.arange(5))))
    eng.step_argmax(tok)
    eng.verify(branched_tree(8, 9))
    assert lib.pdl == 0
    step, tree = [eng._graphs[k] for k in sorted(eng._graphs, key=lambda k: k[0] != "step")]
    assert (lib.graph_pdl[step], lib.graph_pdl[tree]) == (want, 0)
    assert eng.info["step_pdl"] == bool(want)
    eng.close()
