#!/usr/bin/env python3
"""Where the host time of `lucebox bench speed`'s pp row goes (0.8B, random weights, tensor-core prefill).

    python scripts/time_pp_row.py [-p 520] [-r 15]

The pp row times engine.prefill(prompt) from the host; bench_prefill.py's wall-clock times
TensorCorePrefill.run(want_logits=False). This prints, for the same engine and prompt, the median wall time of
each layer of that call stack and of its pieces (logits copy or not, the bench's own once() with and without the
NVML energy reads), next to the GPU span of the same call (CUDA events inside lb_mk_prefill), so the gap between
the two numbers can be assigned to a piece instead of guessed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed(label: str, engine, fn, reps: int, warmup: int = 3) -> None:
    walls, gpus = [], []
    for i in range(warmup + reps):
        engine.reset()
        t0 = time.perf_counter()
        fn()
        wall = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            walls.append(wall)
            gpus.append(engine.last_kernel_ms())
    w, g = statistics.median(walls), statistics.median(gpus)
    print(f"{label:<46} wall {w:7.3f} ms   GPU span {g:7.3f} ms   host over GPU {w - g:6.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", type=int, default=520)
    ap.add_argument("-r", type=int, default=15)
    ap.add_argument("--max-context", type=int, default=4096)
    args = ap.parse_args()

    from make_random_08b import config_08b, random_internal_weights

    from lucebox_cli.bench import runner
    from lucebox_cli.bench.energy import EnergyMeter
    from lucebox_cli.engines import megakernel as mkmod

    cfg = config_08b(24)
    weights = random_internal_weights(cfg, 0)
    engine = mkmod.MegakernelEngine(cfg, weights, max_context=args.max_context)
    del weights
    pf = engine._tc_prefill
    if pf is None:
        sys.exit("no tensor-core prefill in this engine")
    prompt = runner._prompt(args.p, cfg.vocab)
    arr = np.asarray(prompt, dtype=np.int32)
    meter = EnergyMeter()
    print(f"pp{args.p}, max_context {args.max_context}, NVML energy {'on' if meter.read_j() is not None else 'off'}")

    timed("pf.run(int32 array, want_logits=False)", engine, lambda: pf.run(arr, want_logits=False), args.r)
    timed("pf.run(int32 array, want_logits=True)", engine, lambda: pf.run(arr, want_logits=True), args.r)
    timed("engine.prefill(list)", engine, lambda: engine.prefill(prompt), args.r)
    out = np.empty(cfg.vocab, dtype=np.float32)
    timed("np.empty(vocab) + touch (host only)", engine, lambda: np.empty(cfg.vocab, np.float32).fill(0), args.r)
    timed("copy into a reused array (host only)", engine, lambda: out.fill(1.0), args.r)

    for label, m in (("bench once(), NVML on", meter), ("bench once(), NVML off", None)):
        once = runner.make_pp(engine, prompt, m)
        secs = []
        for i in range(3 + args.r):
            dt, _, _ = once()
            if i >= 3:
                secs.append(dt * 1e3)
        print(f"{label:<46} timed region {statistics.median(secs):7.3f} ms "
              f"({args.p / statistics.median(secs) * 1e3:,.0f} tok/s)")
    engine.close()


if __name__ == "__main__":
    main()
