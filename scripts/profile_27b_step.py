"""Kernel timeline of one 27B decode step and one 23-slot verify (device only; needs torch for its profiler).

    python3 scripts/profile_27b_step.py FILE.gguf [--json out.json]

Why: the bench gives the step's wall time; this splits it into GPU-busy time per kernel family and the idle
gaps between kernels (launch overhead, host work, syncs), which is what decides between faster kernels and
CUDA graphs. torch.profiler records every kernel of the process's CUDA context through CUPTI, so the
library's kernels (launched through ctypes, on its own stream, or replayed from a CUDA graph) show up too.

With the engine's CUDA graphs on (the default) it also times the device-resident greedy loop
(greedy_tokens: steps queued ahead, per step) and, as the A/B, the decode step and the verify with
graphs off (use_graphs = False: the recorded Programs, one ctypes call per kernel).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict


def _events(prof) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of the GPU kernels, in start order."""
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) is None or "CUDA" not in str(e.device_type):
            continue
        if e.name.startswith(("Memcpy", "Memset", "cudaMemcpy")):
            kind = "memcpy"
        else:
            kind = "kernel"
        start = e.time_range.start
        out.append((e.name if kind == "kernel" else "[" + e.name + "]", float(start), float(e.time_range.elapsed_us())))
    out.sort(key=lambda r: r[1])
    return out


def _summary(label: str, wall_ms: float, ev: list[tuple[str, float, float]], reps: int) -> dict:
    busy = sum(d for _, _, d in ev) / 1e3 / reps
    span = (ev[-1][1] + ev[-1][2] - ev[0][1]) / 1e3 / reps if ev else 0.0
    gaps = [ev[i + 1][1] - (ev[i][1] + ev[i][2]) for i in range(len(ev) - 1)]
    big = sorted(gaps, reverse=True)[: 5 * reps]
    fam: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, d in ev:
        short = name.replace("(anonymous namespace)::", "").replace("void ", "")
        short = short.split("<")[0].split("(")[0][:60]
        fam[short][0] += 1
        fam[short][1] += d
    rows = sorted(fam.items(), key=lambda kv: -kv[1][1])
    print(f"== {label}: wall {wall_ms:.3f} ms per call; GPU busy {busy:.3f} ms; first-to-last kernel {span:.3f} ms; "
          f"{len(ev) / reps:.0f} GPU ops per call; idle inside the span {span - busy:.3f} ms "
          f"(median gap {sorted(gaps)[len(gaps) // 2] if gaps else 0:.2f} µs; largest {[round(g, 1) for g in big[:5]]})")
    for name, (n, d) in rows[:16]:
        print(f"   {d / 1e3 / reps:8.3f} ms  {n / reps:6.0f}x  {d / n:8.2f} µs each  {name}")
    return {"label": label, "wall_ms": wall_ms, "busy_ms": busy, "span_ms": span, "ops": len(ev) / reps,
            "families": [{"name": k, "count": v[0] / reps, "ms": v[1] / 1e3 / reps} for k, v in rows]}


def _sequence(label: str, ev: list[tuple[str, float, float]], reps: int, head: int, tail: int) -> list[dict]:
    """The kernels of the last call in issue order (the first `head` and last `tail`): duration and the idle gap
    before each, so that one layer's launches can be read one by one (which GEMV took how long)."""
    per = len(ev) // reps if reps else 0
    if per == 0:
        return []
    one = ev[(reps - 1) * per: reps * per]
    rows = []
    print(f"== sequence of one {label} ({per} ops; first {head}, last {tail}): start µs, gap µs, duration µs, kernel")
    for i, (name, start, dur) in enumerate(one):
        if head <= i < per - tail:
            continue
        gap = start - (one[i - 1][1] + one[i - 1][2]) if i else 0.0
        short = name.replace("(anonymous namespace)::", "").replace("void ", "")[:90]
        print(f"   {i:4d} {start - one[0][1]:9.2f} {gap:6.2f} {dur:8.2f}  {short}")
        rows.append({"i": i, "start_us": start - one[0][1], "gap_us": gap, "us": dur, "name": short})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=520)
    ap.add_argument("--prefill-selects", default="0",
                    help="comma list of lb_qmm_smalln_select values to time one prefill of --prompt tokens under "
                         "(A/B of the small-N kernels the 64-row prefill chunks run through); empty: no prefill")
    ap.add_argument("--sequence", type=int, default=40,
                    help="print the first N (and the last 8) kernels of one decode step and one verify (0: none)")
    a = ap.parse_args(argv)

    import numpy as np
    import torch  # noqa: F401  (its profiler; the engine does not use torch)
    from torch.profiler import ProfilerActivity, profile

    from lucebox_cli.bench.runner import verify_tree
    from lucebox_cli.engines.base import greedy_step, greedy_verify
    from lucebox_cli.engines.dflash import DFlashTargetEngine

    eng = DFlashTargetEngine(a.gguf, max_context=a.prompt + 256)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, eng.cfg.vocab, a.prompt)]
    tok = int(np.argmax(eng.prefill(prompt)))
    for _ in range(4):  # warm-up: programs recorded, clocks up
        tok = greedy_step(eng, tok)
    tree = verify_tree(23, eng.cfg.vocab)
    out = []

    def step_and_verify(tag: str) -> None:
        nonlocal tok
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.reps):
                tok = greedy_step(eng, tok)
            wall = (time.perf_counter() - t0) / a.reps * 1e3
        ev = _events(prof)
        out.append(_summary(f"decode step{tag}", wall, ev, a.reps))
        if a.sequence and not tag.startswith(" (no"):
            out[-1]["sequence"] = _sequence("decode step", ev, a.reps, a.sequence, 8)
        greedy_verify(eng, tree)  # warm-up of the tree program / graph
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.reps):
                greedy_verify(eng, tree)
            wall = (time.perf_counter() - t0) / a.reps * 1e3
        ev = _events(prof)
        out.append(_summary(f"verify 23{tag}", wall, ev, a.reps))
        if a.sequence and not tag.startswith(" (no"):
            out[-1]["sequence"] = _sequence("verify", ev, a.reps, a.sequence, 8)

    graphs = bool(getattr(eng, "use_graphs", False))
    step_and_verify(" (graphs)" if graphs else "")
    if graphs:
        n_loop = 4 * a.reps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            toks = list(eng.greedy_tokens(tok, n_loop))
            wall = (time.perf_counter() - t0) / n_loop * 1e3
        tok = toks[-1]
        out.append(_summary(f"greedy loop (graphs, {n_loop} steps queued ahead), per step", wall, _events(prof),
                            n_loop))
        eng.use_graphs = False
        for _ in range(2):  # warm-up of the step program
            tok = greedy_step(eng, tok)
        step_and_verify(" (no graphs, A/B)")
        eng.use_graphs = True

    for sel in [int(v) for v in a.prefill_selects.split(",") if v.strip()]:
        eng.lib.call("lb_qmm_smalln_select", sel)
        eng.reset()
        eng.prefill(prompt)  # warm-up under this select
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(2):
                eng.reset()
                eng.prefill(prompt)
            wall = (time.perf_counter() - t0) / 2 * 1e3
        ev = _events(prof)
        res = _summary(f"prefill {a.prompt} (small-N select {sel}; {a.prompt / wall * 1e3:.0f} tok/s)", wall, ev, 2)
        res["select"] = sel
        if a.sequence:  # the first layers' launches one by one (each projection's dequantization and GEMM)
            res["sequence"] = _sequence("prefill", ev, 2, 2 * a.sequence, 8)
        out.append(res)
    eng.lib.call("lb_qmm_smalln_select", 0)
    eng.close()
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
