"""Speed measurement: warm-up, repetitions, raw samples, mean ± sd and median, like llama-bench.

`speed_rows(model, engine, profile, n_prompt, n_gen, reps)` returns one row per test:
  - pp<N>: reset, then time prefill of N prompt tokens (random ids, fixed seed);
  - tg<N>: reset, prefill the same N-token prompt untimed, then time N generated tokens starting from
    that context (engine.decode(n) where the engine has it, else a greedy step loop). The prefill's own
    argmax token is not counted.
Warm-up runs (default 1 per test) are excluded. Energy (NVML) is read around the timed repetitions;
when they last under a second, extra untimed-for-speed repetitions extend the energy window, so tok/J
does not rest on a counter that ticked once.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from lucebox_cli.bench.energy import EnergyMeter, joules_between

MIN_ENERGY_S = 1.0


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """mean, sd (sample, 0 for one value), median of tokens/s samples."""
    xs = [float(x) for x in samples]
    return {
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "median": statistics.median(xs),
    }


def repeat(run_once: Callable[[], tuple[float, int]], *, reps: int, warmup: int = 1,
           meter: Optional[EnergyMeter] = None) -> tuple[list[float], Optional[float]]:
    """run_once() -> (seconds, tokens). Returns (tokens/s per rep, tokens per joule or None)."""
    for _ in range(warmup):
        run_once()
    e0 = meter.read_j() if meter else None
    rates, total_s, total_tok = [], 0.0, 0
    for _ in range(reps):
        s, n = run_once()
        rates.append(n / s)
        total_s, total_tok = total_s + s, total_tok + n
    while meter is not None and e0 is not None and total_s < MIN_ENERGY_S:
        s, n = run_once()
        total_s, total_tok = total_s + s, total_tok + n
    joules = joules_between(e0, meter.read_j() if meter else None)
    return rates, (total_tok / joules if joules else None)


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, min(vocab, 150000), n)]


def make_pp(engine: Any, prompt: list[int]) -> Callable[[], tuple[float, int]]:
    def once() -> tuple[float, int]:
        engine.reset()
        t0 = time.perf_counter()
        engine.prefill(prompt)
        return time.perf_counter() - t0, len(prompt)

    return once


def make_tg(engine: Any, prompt: list[int], n_gen: int) -> Callable[[], tuple[float, int]]:
    def once() -> tuple[float, int]:
        engine.reset()
        logits = engine.prefill(prompt)
        t0 = time.perf_counter()
        if hasattr(engine, "decode"):
            engine.decode(n_gen)
        else:
            tok = int(np.argmax(logits))
            for _ in range(n_gen):
                tok = int(np.argmax(engine.step(tok)))
        return time.perf_counter() - t0, n_gen

    return once


def bytes_per_token(cfg: Any, weight_bytes: int, context: float) -> float:
    """Bytes one decode step must move: weights, DeltaNet state read + written (fp32), KV rows read (bf16)."""
    n_attn = sum(1 for i in range(cfg.n_layers) if cfg.is_attention(i))
    n_dn = cfg.n_layers - n_attn
    state = 2 * n_dn * cfg.hv * cfg.dk * cfg.dv * 4
    kv = n_attn * 2 * cfg.n_kv_heads * cfg.head_dim * 2 * context
    return float(weight_bytes + state + kv)


def speed_rows(model: Any, engine: Any, *, profile: Any, n_prompt: int, n_gen: int, reps: int, warmup: int = 1,
               energy: bool = True, base: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """Rows for pp<n_prompt> (if > 0) and tg<n_gen> (if > 0). `base` is merged into every row."""
    cfg = model.cfg
    meter = EnergyMeter() if energy and engine.name != "cpu" else None
    info = getattr(engine, "info", None) or {}
    params = sum(int(np.prod(w.shape)) for w in model.weights.values())
    weight_bytes = int(info.get("weight_bytes") or sum(w.nbytes for w in model.weights.values()))
    prompt = _prompt(max(n_prompt, 1), cfg.vocab)
    hw = profile.hardware if profile is not None else None
    tests = []
    if n_prompt > 0:
        tests.append((f"pp{n_prompt}", make_pp(engine, prompt), n_prompt / 2))
    if n_gen > 0:
        tests.append((f"tg{n_gen}", make_tg(engine, prompt, n_gen), n_prompt + n_gen / 2))
    rows = []
    for test, once, ctx in tests:
        rates, tok_j = repeat(once, reps=reps, warmup=warmup, meter=meter)
        st = summarize(rates)
        gbps = st["mean"] * bytes_per_token(cfg, weight_bytes, ctx) / 1e9
        row = dict(base or {})
        row.update({
            "engine": engine.name, "test": test, "tok_s": st["mean"], "sd": st["sd"], "median": st["median"],
            "samples": rates, "reps": reps, "warmup": warmup, "params_m": params / 1e6,
            "size_gib": weight_bytes / 2**30, "gbps": gbps,
            "pct_bw": 100.0 * gbps / hw.bandwidth_gbps if hw else None,
            "pct_bw_measured": (100.0 * gbps / hw.bandwidth_measured_gbps
                                if hw and getattr(hw, "bandwidth_measured_gbps", None) else None),
            "tok_per_j": tok_j,
        })
        rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return rows
