#!/usr/bin/env python
"""Quantization throughput (MB/s of float32 input, per core) at the real Qwen3.5-0.8B shapes.

A benchmark, not a test: random N(0, 0.02) weights, best of --reps runs after a warm-up (numba
compiles or loads its cache first). `--threads 1` (default) gives the per-core figure; with
llama-cpp-python installed the same rows go through llama.cpp's reference quantizer for comparison.

    python scripts/bench_quant.py                 # per core, all types, all shapes
    python scripts/bench_quant.py --threads 0     # all cores numba may use
    python scripts/bench_quant.py --types Q6_K    # one type
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# 0.8B matrices (numpy shape = [out, in]); the embedding / LM head [248320, 1024] is timed on 8192 rows.
SHAPES = {
    "ffn_gate/up": (3584, 1024),
    "ffn_down": (1024, 3584),
    "attn_qkv": (6144, 1024),
    "token_embd[:8192]": (8192, 1024),
}
TYPES = ("BF16", "F16", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def _best(fn, x, reps: int) -> float:
    fn(x)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return min(times)


def _llama_ref():
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
        from ggml_ref import reference_quantize
        from lucebox_cli.quant.blocks import TYPES as BT

        reference_quantize(BT["Q8_0"].ggml_type, np.zeros((1, 256), np.float32))
        return lambda name: (lambda x: reference_quantize(BT[name].ggml_type, x))
    except BaseException:  # pytest.skip raises a BaseException subclass when llama_cpp is absent
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="numba threads (0 = all)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES, metavar="TYPE",
                    help=f"types to time (default all: {' '.join(TYPES)})")
    args = ap.parse_args()

    import numba

    from lucebox_cli.quant.convert import encode

    if args.threads:
        numba.set_num_threads(args.threads)
    threads = numba.get_num_threads()
    ref = _llama_ref()
    rng = np.random.default_rng(0)
    print(f"numba threads: {threads}; MB/s of float32 input" + ("" if threads == 1 else f" (÷{threads} per core)"))
    header = f"{'type':6} {'shape':34} {'ours MB/s':>10} {'per core':>9}" + (f" {'llama.cpp 1 core':>17}" if ref else "")
    print(header)
    for qtype in args.types:
        for label, shape in SHAPES.items():
            x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            mb = x.nbytes / 1e6
            ours = mb / _best(lambda a: encode(a, qtype), x, args.reps)
            line = f"{qtype:6} {label + ' ' + str(list(shape)):34} {ours:10.1f} {ours / threads:9.1f}"
            if ref and qtype not in ("BF16", "F16"):
                line += f" {mb / _best(ref(qtype), x, args.reps):17.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
