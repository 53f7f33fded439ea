#!/usr/bin/env python3
"""A/B of the 0.8B megakernel's per-warp weight ring (device only): tg128 for each (slots, bytes per slot).

    python3 scripts/ab_mk_ring.py [--rings auto,2x4096,3x2048,2x2048,4x1024,3x1024,2x1024] [--reps 3] [--json out.json]

A ring written with "+hold" (e.g. auto+hold, 2x4096+hold) runs with ring_hold 1: refills for later phases wait
for the next GEMV phase's start (lb_mk_config_t.ring_hold; docs/perf.md "All-block timeline and ring_hold").

Why: docs/perf.md (0.8B "v3") found each layer's ~12 dependent L2 round trips waiting ~2-3 µs behind the
weight copies the rings keep queued (3 slots × 4 KB × 16 warps × 132 SMs ≈ 25 MB in flight, against the
~4-6 MB that 4 TB/s × ~1-1.5 µs of loaded latency needs), and prefetching further ahead was slower. If the
queue is what the critical loads wait in, a shallower ring should shorten each layer without starving HBM.
Each ring gets its own engine on the same random weights (real 0.8B shapes, 24 layers): prefill of a
520-token prompt, 16 warm-up steps, then `--reps` timed launches of 128 decode steps (median reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_hold(text: str):
    if text == "profile":
        return None  # the profile's ring_hold
    return {"": 0, "hold": 1}[text.partition("+")[2]]


def parse_ring(text: str):
    text = text.split("+")[0]
    if text == "profile":
        return None  # the profile's ring (build.megakernel.ring_*)
    if text == "auto":
        return 0, 0  # the largest that fits
    slots, nbytes = text.lower().split("x")
    return int(slots), int(nbytes)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rings", default="auto,2x4096,3x2048,2x2048,4x1024,3x1024,2x1024")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    from make_random_08b import config_08b, random_internal_weights

    from lucebox_cli.engines import megakernel as mkmod

    cfg = config_08b(24)
    w = random_internal_weights(cfg, 0)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab, 520)]
    rows = []
    for text in a.rings.split(","):
        eng = mkmod.MegakernelEngine(cfg, w, max_context=520 + 16 + a.tg * (a.reps + 1) + 8, ring=parse_ring(text),
                                     ring_hold=parse_hold(text))
        try:
            eng.prefill(prompt)
            eng.decode(16)  # warm-up
            times = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                eng.decode(a.tg)  # blocks until the launch is done
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            row = {"ring": text, "nslots": eng.info["nslots"], "smem_bytes": eng.info["smem_bytes"],
                   "tok_s": a.tg / med, "samples_s": times}
        finally:
            eng.close()
        rows.append(row)
        print(f"ring {text:>10}: {row['nslots']} slots, {row['smem_bytes']} B smem/block: tg{a.tg} "
              f"{row['tok_s']:8.1f} tok/s (median of {a.reps})", flush=True)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
