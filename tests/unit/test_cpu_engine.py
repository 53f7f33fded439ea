"""engines/cpu.py without HF: DeltaNet forms agree, verify/commit equal sequential decoding, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from lucebox_cli.engines.base import Engine, Tree
from lucebox_cli.engines.cpu import CPUEngine, gated_delta_chunked, gated_delta_recurrent, gated_delta_tree
from lucebox_cli.errors import UsageError
from lucebox_cli.models.qwen35 import load_hf_checkpoint
from lucebox_cli.spec.sampling import probs, sample
from tiny_models import make_tiny_checkpoint

TAPS = (0, 2, 3)


def rel_rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))


def delta_inputs(t_len: int, hk: int, hv: int, dk: int = 16, dv: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = (unit(rng.standard_normal((t_len, hk, dk))) / np.sqrt(dk)).astype(np.float32)
    k = unit(rng.standard_normal((t_len, hk, dk))).astype(np.float32)
    v = rng.standard_normal((t_len, hv, dv)).astype(np.float32)
    g = (-rng.uniform(0.0, 1.5, (t_len, hv))).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, (t_len, hv)).astype(np.float32)
    state = rng.standard_normal((hv, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("hk,hv,t_len", [(2, 2, 1), (2, 6, 23), (3, 3, 64), (2, 6, 65), (1, 3, 131), (2, 6, 517)],
                         ids=lambda x: str(x))
def test_gated_delta_chunked_equals_recurrent(hk, hv, t_len):
    q, k, v, g, beta, state = delta_inputs(t_len, hk, hv)
    o_rec, s_rec = gated_delta_recurrent(q, k, v, g, beta, state)
    o_chk, s_chk = gated_delta_chunked(q, k, v, g, beta, state)
    assert o_chk.shape == (t_len, hv, v.shape[-1]) and s_chk.shape == state.shape
    assert rel_rms(o_chk, o_rec) < 1e-5 and rel_rms(s_chk, s_rec) < 1e-5
    o_zero, _ = gated_delta_chunked(q, k, v, g, beta, None, chunk=16)
    assert rel_rms(o_zero, gated_delta_recurrent(q, k, v, g, beta)[0]) < 1e-5


def test_gated_delta_tree_chain_is_recurrent():
    q, k, v, g, beta, state = delta_inputs(9, 2, 6)
    o_tree, states = gated_delta_tree(q, k, v, g, beta, state, np.arange(-1, 8))
    o_rec, s_rec = gated_delta_recurrent(q, k, v, g, beta, state)
    np.testing.assert_array_equal(o_tree, o_rec)
    np.testing.assert_array_equal(states[-1], s_rec)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("eng"), hv_ratio=3, tied=False, vocab=1000, seed=3)
    return load_hf_checkpoint(folder)


def engine_after(model, prompt, tokens=()):
    cfg, weights = model
    e = CPUEngine(cfg, weights, tap_layers=TAPS, max_context=64)
    e.prefill(prompt)
    for t in tokens:
        e.step(int(t))
    return e


PROMPT = [5, 17, 900, 3, 44, 44, 7, 123, 8, 999, 1]
# Depth up to 4 so some conv windows lie entirely inside the tree; siblings share positions.
TREE = Tree(np.array([11, 20, 21, 22, 30, 31, 32, 40, 50, 51]), np.array([-1, 0, 0, 0, 1, 1, 2, 4, 7, 7]))


def test_engine_satisfies_protocol(model):
    assert isinstance(CPUEngine(*model), Engine)


def test_verify_equals_decoding_each_path(model):
    e = engine_after(model, PROMPT)
    res = e.verify(TREE)
    assert res.logits.shape == (TREE.size, 1000)
    np.testing.assert_array_equal(res.argmax, res.logits.argmax(-1))
    feats = e.last_verify_features
    assert feats.shape == (TREE.size, len(TAPS) * model[0].hidden)
    leaves = [i for i in range(TREE.size) if i not in set(TREE.parents)]
    for leaf in leaves:
        path = TREE.path_to(leaf)
        ref = engine_after(model, PROMPT)
        for slot in path:
            logits = ref.step(int(TREE.tokens[slot]))
            assert rel_rms(res.logits[slot], logits) < 1e-5, (leaf, slot)
            assert rel_rms(feats[slot], ref.features[-1]) < 1e-5
    assert e.n_past == len(PROMPT)  # verify commits nothing


@pytest.mark.parametrize("leaf", [0, 3, 6, 9], ids=lambda x: f"slot{x}")
def test_commit_equals_sequential_state(model, leaf):
    e = engine_after(model, PROMPT)
    e.verify(TREE)
    path = TREE.path_to(leaf)
    e.commit(path)
    ref = engine_after(model, PROMPT, TREE.tokens[path])
    n = len(PROMPT) + len(path)
    assert e.n_past == ref.n_past == n
    for i in e._k_cache:
        np.testing.assert_allclose(e._k_cache[i][:n], ref._k_cache[i][:n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(e._v_cache[i][:n], ref._v_cache[i][:n], rtol=1e-5, atol=1e-5)
    for i in e._state:
        np.testing.assert_allclose(e._state[i], ref._state[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(e._conv[i], ref._conv[i], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.features, ref.features, rtol=1e-5, atol=1e-5)
    assert rel_rms(e.step(77), ref.step(77)) < 1e-5


def test_commit_rejects_bad_paths(model):
    e = engine_after(model, PROMPT)
    with pytest.raises(UsageError, match="verify"):
        e.commit([0])
    e.verify(TREE)
    for bad in ([], [1], [0, 2, 4], [0, 1, 4, 8]):
        with pytest.raises(UsageError, match="root-to-node"):
            e.commit(bad)
    e.step(3)  # any append drops the pending tree
    with pytest.raises(UsageError, match="verify"):
        e.commit([0])


def test_context_limit_and_reset(model):
    e = engine_after(model, PROMPT)
    with pytest.raises(UsageError, match="context full"):
        e.prefill(list(range(64)))
    first = CPUEngine(*model).prefill(PROMPT)
    e.reset()
    assert e.n_past == 0 and e.features.shape == (0, len(TAPS) * model[0].hidden)
    assert rel_rms(e.prefill(PROMPT), first) < 1e-6


def test_sampling_greedy_and_reproducible():
    logits = np.random.default_rng(0).standard_normal(500).astype(np.float32)
    assert sample(logits, 0.0) == int(np.argmax(logits))
    assert probs(logits, 0.0)[np.argmax(logits)] == 1.0
    draws = lambda seed: [sample(logits, 0.8, 50, 0.9, np.random.default_rng(seed)) for _ in range(5)]  # noqa: E731
    a, b = draws(123), draws(123)
    assert a == b
    rng1, rng2 = np.random.default_rng(9), np.random.default_rng(9)
    assert [sample(logits, 1.0, 0, 1.0, rng1) for _ in range(20)] == [sample(logits, 1.0, 0, 1.0, rng2) for _ in range(20)]


def test_sampling_distribution():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    np.testing.assert_allclose(probs(logits, 1.0), [0.5, 0.2, 0.15, 0.1, 0.05])
    np.testing.assert_allclose(probs(logits, 1.0, top_k=2), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    # top-p keeps the smallest prefix reaching 0.8: 0.5 + 0.2 + 0.15.
    np.testing.assert_allclose(probs(logits, 1.0, top_p=0.8), np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    hot = probs(logits, 0.5)
    np.testing.assert_allclose(hot, np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2 / np.sum(np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2))
    rng = np.random.default_rng(1)
    counts = np.bincount([sample(logits, 1.0, 0, 0.8, rng) for _ in range(4000)], minlength=5)
    np.testing.assert_allclose(counts / 4000, probs(logits, 1.0, top_p=0.8), atol=0.03)
    with pytest.raises(UsageError):
        probs(logits, -1.0)
    with pytest.raises(UsageError):
        probs(logits, 1.0, top_p=0.0)
