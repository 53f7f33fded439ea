"""Speed measurement: warm-up, repetitions, raw samples, mean ± sd and median, like llama-bench.

`speed_rows(model, engine, profile, n_prompt, n_gen, reps)` returns one row per test:
  - pp<N>: reset, then time prefill of N prompt tokens (random ids, fixed seed);
  - tg<N>: reset, prefill the same N-token prompt untimed, then time N generated tokens starting from
    that context (engine.decode(n) where the engine has it, else its greedy loop greedy_tokens(tok, n) from
    the prefill's argmax: N decode steps, queued ahead on the device by engines/dflash.py, else a greedy
    step loop). The prefill's own argmax token is not counted.
Warm-up runs (default 1 per test) are excluded. Energy (NVML) is read around each timed region only
(the tg test's untimed prefill is outside it); when the timed regions add up to under a second, extra
runs extend the energy window, so tok/J does not rest on a counter that ticked once.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from lucebox_cli.bench.energy import EnergyMeter, joules_between
from lucebox_cli.engines.base import greedy_step, greedy_verify

MIN_ENERGY_S = 1.0


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """mean, sd (sample, 0 for one value), median of tokens/s samples."""
    xs = [float(x) for x in samples]
    return {
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "median": statistics.median(xs),
    }


def repeat(run_once: Callable[[], tuple[float, int, Optional[float]]], *, reps: int, warmup: int = 1,
           need_energy: bool = False) -> tuple[list[float], Optional[float]]:
    """run_once() -> (seconds, tokens, joules of the timed region or None).

    Returns (tokens/s per rep, tokens per joule or None). Energy sums only timed regions; when they add
    up to under MIN_ENERGY_S, extra runs extend the energy window (their speed is not sampled).
    """
    for _ in range(warmup):
        run_once()
    rates, total_s, total_tok, total_j = [], 0.0, 0, 0.0
    for _ in range(reps):
        s, n, j = run_once()
        rates.append(n / s)
        total_s, total_tok = total_s + s, total_tok + n
        total_j = total_j + j if (j is not None and total_j is not None) else None
    while need_energy and total_j is not None and total_s < MIN_ENERGY_S:
        s, n, j = run_once()
        total_s, total_tok = total_s + s, total_tok + n
        total_j = total_j + j if j is not None else None
    return rates, (total_tok / total_j if total_j else None)


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, min(vocab, 150000), n)]


def _energy(meter: Optional[EnergyMeter]) -> Optional[float]:
    return meter.read_j() if meter is not None else None


def make_pp(engine: Any, prompt: list[int], meter: Optional[EnergyMeter] = None):
    def once() -> tuple[float, int, Optional[float]]:
        engine.reset()
        e0, t0 = _energy(meter), time.perf_counter()
        engine.prefill(prompt)
        dt = time.perf_counter() - t0
        return dt, len(prompt), joules_between(e0, _energy(meter))

    return once


def make_tg(engine: Any, prompt: list[int], n_gen: int, meter: Optional[EnergyMeter] = None):
    def once() -> tuple[float, int, Optional[float]]:
        engine.reset()
        logits = engine.prefill(prompt)
        e0, t0 = _energy(meter), time.perf_counter()
        if hasattr(engine, "decode"):
            engine.decode(n_gen)
        elif hasattr(engine, "greedy_tokens"):
            for _ in engine.greedy_tokens(int(np.argmax(logits)), n_gen):
                pass
        else:
            tok = int(np.argmax(logits))
            for _ in range(n_gen):
                tok = greedy_step(engine, tok)
        dt = time.perf_counter() - t0
        return dt, n_gen, joules_between(e0, _energy(meter))

    return once


def verify_tree(n: int, vocab: int, seed: int = 0) -> Any:
    """A branched n-slot tree like DDTree's: a spine of up to 16 slots, then siblings off random nodes."""
    from lucebox_cli.engines.base import Tree

    rng = np.random.default_rng(seed)
    spine = min(n, 16)
    parents = list(range(-1, spine - 1)) + [int(rng.integers(0, spine)) for _ in range(n - spine)]
    return Tree(rng.integers(0, min(vocab, 150000), n), np.asarray(parents))


def make_verify(engine: Any, prompt: list[int], n: int, vocab: int, steps: int = 8):
    """One n-slot verify on top of the prompt, timed; `ar_ms` (set as a side effect) is one decode step's
    time measured right before, so the row can state the verify in AR-step units. Both are the greedy
    calls (base.greedy_step / greedy_verify: argmax ids only, as the spec loop at T = 0 makes them)."""
    tree = verify_tree(n, vocab)
    timing: dict[str, float] = {}

    def once() -> tuple[float, int, Optional[float]]:
        engine.reset()
        logits = engine.prefill(prompt)
        tok = int(np.argmax(logits))
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = greedy_step(engine, tok)
        timing["ar_ms"] = (time.perf_counter() - t0) / steps * 1e3
        t0 = time.perf_counter()
        greedy_verify(engine, tree)
        dt = time.perf_counter() - t0
        timing["verify_ms"] = dt * 1e3
        return dt, n, None

    return once, timing


def weight_sizes(weights: Any) -> tuple[int, int]:
    """(parameters, stored bytes) of a model's weights. A GGUF's lazy mapping answers from its tensor infos
    (the file's block bytes; nothing is dequantized); an in-memory dict from its arrays."""
    infos = getattr(weights, "infos", None)
    if infos is not None:
        tensors = [(i.shape, i.nbytes) for i in infos()]
    else:
        tensors = [(w.shape, w.nbytes) for w in weights.values()]
    return (sum(int(np.prod(shape, dtype=np.int64)) for shape, _ in tensors),
            sum(int(nbytes) for _, nbytes in tensors))


def bytes_per_token(cfg: Any, weight_bytes: int, context: float) -> float:
    """Bytes one decode step must move: weights, DeltaNet state read + written (fp32), KV rows read (bf16)."""
    n_attn = sum(1 for i in range(cfg.n_layers) if cfg.is_attention(i))
    n_dn = cfg.n_layers - n_attn
    state = 2 * n_dn * cfg.hv * cfg.dk * cfg.dv * 4
    kv = n_attn * 2 * cfg.n_kv_heads * cfg.head_dim * 2 * context
    return float(weight_bytes + state + kv)


def speed_rows(model: Any, engine: Any, *, profile: Any, n_prompt: int, n_gen: int, reps: int, warmup: int = 1,
               energy: bool = True, base: Optional[dict[str, Any]] = None, depth: int = 0,
               verify_n: int = 0) -> list[dict[str, Any]]:
    """Rows for pp<n_prompt> (if > 0), tg<n_gen> (if > 0), tg<n_gen>@d<depth> (if both > 0) and
    verify<verify_n> (if > 0: one tree verify on top of the prompt, also in AR-step units).
    `base` is merged into every row."""
    cfg = model.cfg
    meter = EnergyMeter() if energy and engine.name != "cpu" else None
    info = getattr(engine, "info", None) or {}
    params, stored_bytes = weight_sizes(model.weights)
    weight_bytes = int(info.get("weight_bytes") or stored_bytes)
    prompt = _prompt(max(n_prompt, 1), cfg.vocab)
    hw = profile.hardware if profile is not None else None
    tests = []
    if n_prompt > 0:
        tests.append((f"pp{n_prompt}", make_pp(engine, prompt, meter), n_prompt / 2))
    if n_gen > 0:
        tests.append((f"tg{n_gen}", make_tg(engine, prompt, n_gen, meter), n_prompt + n_gen / 2))
    if n_gen > 0 and depth > 0:
        tests.append((f"tg{n_gen}@d{depth}", make_tg(engine, _prompt(depth, cfg.vocab, 1), n_gen, meter),
                      depth + n_gen / 2))
    timing: dict[str, float] = {}
    if verify_n > 0:
        once_v, timing = make_verify(engine, prompt, verify_n, cfg.vocab)
        tests.append((f"verify{verify_n}", once_v, n_prompt))
    rows = []
    for test, once, ctx in tests:
        is_verify = test.startswith("verify")
        rates, tok_j = repeat(once, reps=reps, warmup=warmup, need_energy=meter is not None and not is_verify)
        st = summarize(rates)
        # Decode is bandwidth-bound: GB/s against the card's bandwidth. Prefill reads the weights once
        # for all its tokens and is compute-bound: it reports TFLOP/s (2 FLOPs per weight per token) instead.
        is_pp = test.startswith("pp")
        gbps = None if is_pp else st["mean"] * bytes_per_token(cfg, weight_bytes, ctx) / 1e9
        tflops = 2.0 * params * st["mean"] / 1e12 if is_pp else None
        row = dict(base or {})
        row.update({
            "engine": engine.name, "test": test, "tok_s": st["mean"], "sd": st["sd"], "median": st["median"],
            "samples": rates, "reps": reps, "warmup": warmup, "params_m": params / 1e6,
            "size_gib": weight_bytes / 2**30, "gbps": gbps, "tflops": tflops,
            "pct_bw": 100.0 * gbps / hw.bandwidth_gbps if hw and gbps is not None else None,
            "pct_bw_measured": (100.0 * gbps / hw.bandwidth_measured_gbps
                                if hw and gbps is not None and getattr(hw, "bandwidth_measured_gbps", None) else None),
            "tok_per_j": tok_j,
        })
        if is_verify:
            # tok_s = slots per second of the verify; the row's point is its time in AR decode steps
            verify_ms = 1e3 * verify_n / st["mean"]
            row.update({"gbps": None, "pct_bw": None, "pct_bw_measured": None, "verify_ms": verify_ms,
                        "ar_step_ms": timing["ar_ms"], "verify_in_steps": verify_ms / timing["ar_ms"]})
        rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return rows
