#!/usr/bin/env python3
"""lb_dequant_f16 on the 27B prefill's shapes, per LUCEBOX_DEQUANT variant, against a device copy (the roofline).

    python3 scripts/bench_dequant.py --variants [all | base,fast,...] [--reps 20]

Each variant runs in its own process (the switch is read once per process: cuda/ops/dequant_f16.cu); the names come
from the kernel's table. Per shape (the real rows and k of the 27B Q4_K_M's prefill matrices), the median of --reps
calls after 3 warm-up calls (CUDA events around each call; a spin kernel before each start event keeps the host's
launch time out of the interval), with as many copies of weights + output as make the working set pass 2× L2
(rotated call by call, so neither the quant bytes nor the fp16 lines are L2 hits from the last call). "moved" = quant
bytes read + fp16 bytes written. The roofline rows: torch's device-to-device copy of the same fp16 output bytes (read
+ write, TB/s of bytes moved) and a write-only fill; "floor" = the shape's moved bytes at the copy's rate. Weights from lb_quant_fill_random (random quants, small positive scales). Needs torch with CUDA and the
built library (build/<profile>/liblucebox.so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

Q4_K_T, Q6_K_T = 268, 270
# (name, qtype, rows, k): the 27B's prefill matrices (gate+up fused as one 34816-row matrix)
SHAPES = [
    ("ffn_gate+up Q4_K_T", Q4_K_T, 34816, 5120),
    ("ffn_down Q6_K_T", Q6_K_T, 5120, 17408),
    ("ffn_down Q4_K_T", Q4_K_T, 5120, 17408),
    ("attn_qkv Q4_K_T", Q4_K_T, 10240, 5120),
    ("attn_qkv Q6_K_T", Q6_K_T, 10240, 5120),
    ("ssm_out Q4_K_T", Q4_K_T, 5120, 6144),
]
BLOCK_BYTES = {Q4_K_T: 144, Q6_K_T: 210}


def variant_names() -> list[str]:
    text = (REPO / "cuda" / "ops" / "dequant_f16.cu").read_text()
    block = text[text.index("#define LB_DEQUANT_VARIANTS(X)") :]
    return re.findall(r'X\("(\w+)"', block[: block.index("\n\n")])


def timed(torch, fns, reps: int) -> float:
    """Median µs of one call, the calls cycling through fns (one per weight/output copy), after 3 warm-up calls."""
    for i in range(3):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    us = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # keep the GPU busy (~100 µs) while the host records the start and enqueues the call, so that the interval
        # holds the kernel alone, not the ~10 µs of a ctypes call and launch (a fifth of the smaller shapes)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000)
        a.record()
        fns[i % len(fns)]()
        b.record()
        b.synchronize()
        us.append(1e3 * a.elapsed_time(b))
    return statistics.median(us)


def copies_for(torch, nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, math.ceil(2 * l2 / nbytes))


def child(reps: int) -> None:
    """This process's variant (LUCEBOX_DEQUANT) on every shape: one JSON line per shape."""
    import torch

    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    L = _lib.load(resolve_profile(None, _lib.probe_gpus().gpus))
    stream = torch.cuda.current_stream().cuda_stream
    for name, qt, rows, k in SHAPES:
        q_bytes = rows * (k // 256) * BLOCK_BYTES[qt]
        f_bytes = rows * k * 2
        n = copies_for(torch, q_bytes + f_bytes)
        ws = [torch.empty(q_bytes, dtype=torch.uint8, device="cuda") for _ in range(n)]
        outs = [torch.empty(rows, k, dtype=torch.float16, device="cuda") for _ in range(n)]
        for i, w in enumerate(ws):
            L.call("lb_quant_fill_random", qt, w.data_ptr(), rows, k, 1234 + i, stream)
        fns = [
            (lambda w=w, o=o: L.call("lb_dequant_f16", qt, w.data_ptr(), rows, k, 0, rows, o.data_ptr(), stream))
            for w, o in zip(ws, outs)
        ]
        us = timed(torch, fns, reps)
        print(json.dumps({"shape": name, "us": us, "moved": q_bytes + f_bytes, "copies": n}), flush=True)
        del ws, outs
        torch.cuda.empty_cache()


def roofline(reps: int) -> dict[str, tuple[float, float]]:
    """shape -> (copy µs, fill µs) for the shape's fp16 output bytes; prints the rows."""
    import torch

    res = {}
    for name, _, rows, k in SHAPES:
        f_bytes = rows * k * 2
        n = copies_for(torch, 2 * f_bytes)
        src = [torch.empty(rows * k, dtype=torch.float16, device="cuda").normal_() for _ in range(n)]
        dst = [torch.empty_like(s) for s in src]
        t_copy = timed(torch, [(lambda s=s, d=d: d.copy_(s)) for s, d in zip(src, dst)], reps)
        t_fill = timed(torch, [(lambda d=d: d.fill_(1.0)) for d in dst], reps)
        res[name] = (t_copy, t_fill)
        print(f"  {name:20s} {rows:6d}x{k:<6d} copy of {f_bytes / 1e6:6.1f} MB fp16: {t_copy:8.1f} us "
              f"{2 * f_bytes / t_copy / 1e6:5.2f} TB/s moved | write-only fill {t_fill:8.1f} us "
              f"{f_bytes / t_fill / 1e6:5.2f} TB/s")
        del src, dst
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="?", const="all", default="all",
                    help="comma-separated LUCEBOX_DEQUANT names, or all (the kernel's table)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.reps)
        return 0
    names = variant_names() if args.variants == "all" else args.variants.split(",")
    import torch

    print(f"device: {torch.cuda.get_device_name(0)}, L2 {torch.cuda.get_device_properties(0).L2_cache_size >> 20} MiB;"
          f" median of {args.reps} after 3 warm-up calls")
    print("roofline (torch, the same fp16 bytes):")
    roof = roofline(args.reps)
    results: dict[str, dict] = {}
    for v in names:
        env = dict(os.environ, LUCEBOX_DEQUANT=v)
        proc = subprocess.run([sys.executable, __file__, "--child", "--reps", str(args.reps)], env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or "not a dequantization variant" in proc.stderr:
            print(f"variant {v}: FAILED\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            continue
        results[v] = {r["shape"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    base = results.get("base")
    for name, qt, rows, k in SHAPES:
        moved = next(iter(results.values()))[name]["moved"] if results else 0
        t_copy = roof[name][0]
        floor = moved * t_copy / (4 * rows * k)  # moved bytes at the copy's rate (the copy moves 2 · 2 · rows · k)
        print(f"\n{name} {rows}x{k}: {moved / 1e6:.1f} MB moved; floor at copy rate {floor:.1f} us")
        for v, r in results.items():
            rel = f" {100 * (r[name]['us'] / base[name]['us'] - 1):+6.1f}% vs base" if base else ""
            print(f"  {v:14s} {r[name]['us']:8.1f} us  {moved / r[name]['us'] / 1e6:5.2f} TB/s moved  "
                  f"{100 * floor / r[name]['us']:5.1f}% of copy{rel}")
    print("\nsum over the shapes (one of each):")
    for v, r in results.items():
        tot = sum(x["us"] for x in r.values())
        rel = f" {100 * (tot / sum(x['us'] for x in base.values()) - 1):+6.1f}% vs base" if base else ""
        print(f"  {v:14s} {tot:9.1f} us{rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
