#!/usr/bin/env python3
"""Time the tensor-core 0.8B prefill (random weights at the real shapes) and break it down by op.

    python scripts/bench_prefill.py [-p 520] [-r 10] [--layers 24] [--no-ops]

Prints pp<P> in tok/s from the GPU time of lb_mk_prefill (CUDA events on the handle's stream, warm-up
excluded) and from wall-clock, the megakernel's token-by-token prefill for comparison, then (with torch)
the time of each op at M = P: every GEMM shape of a forward, the chunked DeltaNet and attention, with
TFLOP/s and their share of one forward.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def time_prefill(engine, pf, prompt, reps: int) -> tuple[list[float], list[float]]:
    gpu_ms, wall_ms = [], []
    for i in range(reps + 3):
        engine.reset()
        t0 = time.perf_counter()
        pf.run(prompt, want_logits=False)
        wall = (time.perf_counter() - t0) * 1e3
        if i >= 3:
            gpu_ms.append(engine.last_kernel_ms())
            wall_ms.append(wall)
    return gpu_ms, wall_ms


def rate(n: int, ms: list[float]) -> str:
    r = [n / (m * 1e-3) for m in ms]
    return f"{statistics.mean(r):,.0f} ± {statistics.pstdev(r):,.0f} tok/s ({statistics.mean(ms):.3f} ms)"


def op_breakdown(lib, n: int, layers: int) -> None:
    import torch

    def timed(fn, iters: int = 20) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    n_dn, n_at = layers - layers // 4, layers // 4
    x = torch.randn(2, n, 3584, device="cuda").to(torch.bfloat16)  # split pair (hi, lo) as the prefill feeds
    rows = []
    # (name, N, K, epilogue, calls per forward); SwiGLU reads 2N weight rows
    for name, nn, k, epi, calls in [("dn in-proj", 8224, 1024, 0, n_dn), ("attn in-proj", 5120, 1024, 0, n_at),
                                    ("out-proj +res", 1024, 2048, 1, layers), ("gate/up swiglu", 3584, 1024, 2, layers),
                                    ("down +res", 1024, 3584, 1, layers)]:
        w = torch.randn(2 * nn if epi == 2 else nn, k, device="cuda").to(torch.bfloat16)
        y = torch.zeros(n, nn, device="cuda")  # fp32 [n, nn], or the [2, n, nn] bf16 SwiGLU pair
        ms = timed(lambda: lib.call("lb_gemm_bf16", p(x), p(w), p(y), n, nn, k, epi | 8, None))
        flops = 2.0 * n * k * w.shape[0]  # useful FLOPs; the split input issues twice as many MMAs
        rows.append((name, ms, calls, f"{flops / ms / 1e9:.0f} TFLOP/s"))
    unit = lambda a: a / a.norm(dim=-1, keepdim=True)  # noqa: E731
    q, kk = unit(torch.randn(16, n, 128, device="cuda")) / 128**0.5, unit(torch.randn(16, n, 128, device="cuda"))
    v, g, b = torch.randn(16, n, 128, device="cuda"), -torch.rand(16, n, device="cuda"), torch.rand(16, n, device="cuda")
    s, o = torch.zeros(16, 128, 128, device="cuda"), torch.empty(n, 2048, device="cuda")
    scr = torch.empty(int(lib.fn.lb_deltanet_chunked_scratch_bytes(n, 16)), dtype=torch.uint8, device="cuda")
    ms = timed(lambda: lib.call("lb_deltanet_chunked", p(q), p(kk), p(v), p(g), p(b), p(s), p(o), p(scr), n, 16, None))
    rows.append(("deltanet chunked", ms, n_dn, ""))
    qf, y = torch.randn(n, 8, 256, device="cuda"), torch.randn(n, 4096, device="cuda")
    kc = torch.randn(2, n, 256, device="cuda").to(torch.bfloat16)
    out = torch.empty(2, n, 2048, dtype=torch.bfloat16, device="cuda")
    ms = timed(lambda: lib.call("lb_attn_prefill", p(qf), p(kc), p(kc), ctypes.c_void_p(y.data_ptr() + 1024), 4096, 512,
                                p(out), n, 0, 8, 2, n, None))
    att_flops = 4.0 * 8 * 256 * n * (n + 1) / 2
    rows.append(("attention (fp32)", ms, n_at, f"{att_flops / ms / 1e9:.1f} TFLOP/s"))
    total = sum(ms * calls for _, ms, calls, _ in rows)
    print(f"\nops at M = {n} (µs per call, calls per forward, share of their {total:.3f} ms sum):")
    for name, ms, calls, extra in rows:
        print(f"  {name:18s} {ms * 1e3:9.1f} µs x {calls:2d} = {ms * calls:7.3f} ms ({100 * ms * calls / total:4.1f}%)  {extra}")


def profile_prefill(engine, pf, prompt) -> None:
    """Kernel families of one prefill (torch.profiler; scripts/profile_27b_step.py's summary)."""
    from profile_27b_step import _events, _summary
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(2):
            engine.reset()
            pf.run(prompt, want_logits=False)
        wall = (time.perf_counter() - t0) / 2 * 1e3
    _summary(f"0.8B prefill {len(prompt)}", wall, _events(prof), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", type=int, default=520)
    ap.add_argument("-r", type=int, default=10)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--profile", action="store_true", help="kernel families of one prefill (torch.profiler)")
    args = ap.parse_args()

    from make_random_08b import config_08b, random_internal_weights

    from lucebox_cli.engines import megakernel as mkmod
    from lucebox_cli.engines.prefill_tc import TensorCorePrefill

    cfg = config_08b(args.layers)
    weights = random_internal_weights(cfg, 0)
    engine = mkmod.MegakernelEngine(cfg, weights, max_context=args.p + 64)
    del weights
    pf = TensorCorePrefill(engine)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab, args.p)
    gpu_ms, wall_ms = time_prefill(engine, pf, prompt, args.r)
    print(f"pp{args.p} tensor-core prefill, {args.layers} layers: GPU {rate(args.p, gpu_ms)}; wall {rate(args.p, wall_ms)}")
    engine.reset()
    engine.prefill(prompt)
    print(f"pp{args.p} megakernel token-by-token prefill: {rate(args.p, [engine.last_kernel_ms()])}")
    if args.profile:
        profile_prefill(engine, pf, prompt)
    if not args.no_ops:
        op_breakdown(engine.lib, args.p, args.layers)
    pf.close()
    engine.close()


if __name__ == "__main__":
    main()
