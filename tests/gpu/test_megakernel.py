"""The 0.8B decode megakernel against the CPU reference engine, at the real widths with random weights.

Weights are drawn once per layer count and rounded to bf16 for both engines, so the comparison measures
the kernel's arithmetic (fp32 activations, bf16 KV cache), not weight rounding. Every launch is preceded
by poison(): activations, partials and logits are NaN until the kernel writes them.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from lucebox_cli.engines import megakernel as mkmod
from lucebox_cli.engines.cpu import CPUEngine
from lucebox_cli.errors import LuceboxError
from lucebox_cli.models.qwen35 import DELTANET, ATTENTION, Qwen35Config

pytestmark = pytest.mark.gpu

MAX_CTX = 1024


def real_config(n_layers: int) -> Qwen35Config:
    kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(n_layers))
    return Qwen35Config(hidden=1024, n_layers=n_layers, n_heads=8, n_kv_heads=2, head_dim=256, hk=16, hv=16,
                        dk=128, dv=128, conv_kernel=4, ffn=3584, vocab=248320, rope_theta=1e7, rope_dims=64,
                        eps=1e-6, tied=True, layer_types=kinds, full_attention_interval=4)


@functools.lru_cache(maxsize=2)
def model(n_layers: int, seed: int = 0) -> tuple[Qwen35Config, dict[str, np.ndarray]]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_random_08b import random_internal_weights

    cfg = real_config(n_layers)
    w = random_internal_weights(cfg, seed)
    return cfg, {k: mkmod.bf16_bits_to_f32(mkmod.to_bf16_bits(v)) for k, v in w.items()}


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def engines(n_layers: int, **kw):
    # These tests are about the decode kernel: its own one-token-per-step prefill is the reference
    # (the tensor-core prefill has its tests in test_prefill.py).
    kw.setdefault("prefill_mode", "decode")
    cfg, w = model(n_layers)
    return CPUEngine(cfg, w, max_context=MAX_CTX), mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, **kw)


def test_logits_match_cpu_for_64_steps_24_layers():
    cpu, gpu = engines(24)
    tok = 1000
    worst = 0.0
    for step in range(64):
        ref = cpu.step(tok)
        gpu.poison()
        got = gpu.step(tok)
        assert np.isfinite(got).all(), f"step {step}: unwritten or NaN logits"
        err = rel_rms(got, ref)
        worst = max(worst, err)
        assert err < 1e-2, f"step {step}: relative RMS {err:.2e}"
        tok = int(np.argmax(ref))
    print(f"worst relative RMS over 64 steps: {worst:.2e}")
    gpu.close()


def cpu_greedy(cpu, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """The CPU engine's logits after the prompt and its first n greedy tokens."""
    logits = first = cpu.prefill(prompt)
    want = []
    for _ in range(n):
        want.append(int(np.argmax(logits)))
        logits = cpu.step(want[-1])
    return first, want


def test_greedy_tokens_identical_4_layers():
    cpu, gpu = engines(4)
    prompt = [11, 2222, 33333, 4444, 55]
    _, want = cpu_greedy(cpu, prompt, 40)
    gpu.poison()
    g_logits = gpu.prefill(prompt)
    assert int(np.argmax(g_logits)) == want[0] == gpu.pending
    got = [want[0]] + gpu.decode(39).tolist()
    assert got == want
    gpu.close()


def test_stream_equals_decode_and_prefill_equals_stepping():
    _, a = engines(4)
    _, b = engines(4)
    prompt = [7, 77, 777, 7777, 77777, 9]
    la = a.prefill(prompt)
    lb = None
    for t in prompt:
        b.poison()
        lb = b.step(t)
    # shared-memory atomics sum in a run-dependent order: equal up to fp32 rounding, not bitwise
    assert rel_rms(la, lb) < 1e-3
    ta = a.decode(24).tolist()
    tb = list(b.decode_stream(24))
    assert ta == tb
    a.close()
    b.close()


def test_recurrent_state_after_512_steps_vs_fp32_reference():
    cpu, gpu = engines(4)
    prompt = [101, 202, 303]
    gpu.prefill(prompt)
    fed = prompt + [gpu.pending]
    fed += gpu.decode(509)[:-1].tolist()
    for t in fed:
        cpu.step(int(t))
    assert cpu.n_past == gpu.n_past == 512
    for layer in range(4):
        if cpu.cfg.is_attention(layer):
            k_ref = cpu._k_cache[layer][:512]
            k_got = gpu.read(mkmod.READ_KCACHE, layer)[:512]
            assert rel_rms(k_got, k_ref) < 1e-2
            continue
        s_ref = cpu._state[layer]
        s_got = gpu.read(mkmod.READ_STATE, layer)
        err = rel_rms(s_got, s_ref)
        print(f"layer {layer}: state relative RMS after 512 steps {err:.2e}")
        assert err < 1e-2
        conv = gpu.read(mkmod.READ_CONV, layer)
        n = 512
        ring = np.stack([conv[(n - 3 + j) % 4] for j in range(3)])
        assert rel_rms(ring, cpu._conv[layer]) < 1e-2
    gpu.close()


def test_more_blocks_than_co_resident_is_refused():
    cfg, w = model(4)
    with pytest.raises(LuceboxError):
        mkmod.MegakernelEngine(cfg, w, max_context=64, n_blocks=100000)


def test_verify_is_unavailable():
    _, gpu = engines(4)
    from lucebox_cli.engines.base import Tree

    with pytest.raises(LuceboxError, match="not supported by the 0.8B megakernel"):
        gpu.verify(Tree.chain([1, 2]))
    gpu.close()


@pytest.mark.parametrize("ring,hold", [((2, 1024), 0), ((3, 1024), 0), ((2, 2048), 0), ((3, 2048), 0),
                                       ((2, 4096), 0), ((4, 2048), 0), ((8, 1024), 0), ((2, 1024), 1),
                                       ((3, 4096), 1), ((8, 1024), 1)])
def test_named_weight_ring_gives_the_same_tokens(ring, hold):
    # the ring (and when its refills are issued) only changes how far ahead the weights are copied: tokens and
    # logits must not move
    cpu, gpu = engines(4, ring=ring, ring_hold=hold)
    assert gpu.info["nslots"] == ring[0]
    prompt = [11, 2222, 33333, 4444, 55]
    ref0, want = cpu_greedy(cpu, prompt, 24)
    gpu.poison()
    g_logits = gpu.prefill(prompt)
    assert rel_rms(g_logits, ref0) < 1e-2
    assert [int(np.argmax(g_logits))] + gpu.decode(23).tolist() == want
    gpu.close()


@pytest.mark.parametrize("ring,match", [((1, 4096), "need 2..8 slots"), ((3, 3000), "need 2..8 slots"),
                                        ((8, 4096), "needs .* B of shared memory per block")])
def test_bad_weight_ring_is_refused(ring, match):
    cfg, w = model(4)
    with pytest.raises(LuceboxError, match=match):
        mkmod.MegakernelEngine(cfg, w, max_context=64, ring=ring, prefill_mode="decode")


def test_bad_ring_hold_is_refused():
    cfg, w = model(4)
    with pytest.raises(LuceboxError, match="ring_hold 2; need 0 or 1"):
        mkmod.MegakernelEngine(cfg, w, max_context=64, ring_hold=2, prefill_mode="decode")
