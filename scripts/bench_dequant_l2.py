#!/usr/bin/env python3
"""Does an L2-sized fp16 scratch take the 27B prefill's dequantization off HBM? (a measurement for the next design)

    python3 scripts/bench_dequant_l2.py [--rows 34816] [--k 5120] [--m 520] [--chunks 1024,2048,4096]

The 27B prefill dequantizes each quantized matrix to fp16 (lb_dequant_f16), then multiplies on cuBLAS; the
dequantization writes ~49 GB of fp16 a prefill (21 ms of ~75). If the fp16 rows go to a scratch small enough to stay
in L2 and the GEMM reads them from there, the writes may never reach HBM. This times, on the GPU (CUDA events,
median of repetitions after a warm-up), with random Q4_K_T blocks (fp16 scales set to small normal values):
  - lb_dequant_f16 of the whole matrix into one buffer (today's form), GB/s of bytes moved;
  - the same in row chunks of C rows into one reused C-row buffer (the L2 form), for each C;
  - torch's fp16 GEMM [m, k] x [k, C] per chunk width (how efficient the narrower GEMMs are);
  - dequantize + GEMM chunk by chunk on one stream, against the whole-matrix dequantize + one GEMM.
Needs torch with CUDA and the built library (LUCEBOX_LIB or build/<profile>/liblucebox.so).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Q4_K_T = 268  # LB_QT_Q4_K_TILED
BLOCK_BYTES = 144


def timed(torch, fn, reps: int = 20) -> float:
    """Median ms of fn() over reps, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=34816)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--m", type=int, default=520)
    ap.add_argument("--chunks", default="1024,2048,4096")
    args = ap.parse_args()
    import torch

    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    rows, k, m = args.rows, args.k, args.m
    nb = rows * (k // 256)
    w = torch.randint(0, 256, (nb, BLOCK_BYTES), dtype=torch.uint8, device="cuda")
    w[:, 0:2] = torch.tensor([0x00, 0x20], dtype=torch.uint8, device="cuda")  # d = 2^-7 (fp16 0x2000)
    w[:, 2:4] = torch.tensor([0x00, 0x1C], dtype=torch.uint8, device="cuda")  # dmin = 2^-8
    x = torch.randn(m, k, dtype=torch.float16, device="cuda")
    full = torch.empty(rows, k, dtype=torch.float16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    L = _lib.load(resolve_profile(None, _lib.probe_gpus().gpus))

    def dq(row0: int, n: int, out) -> None:
        L.call("lb_dequant_f16", Q4_K_T, w.data_ptr(), rows, k, row0, n, out.data_ptr(), stream)

    q_bytes = nb * BLOCK_BYTES
    f_bytes = rows * k * 2
    t_full = timed(torch, lambda: dq(0, rows, full))
    print(f"matrix Q4_K_T {rows}x{k} ({q_bytes / 1e6:.1f} MB in, {f_bytes / 1e6:.1f} MB fp16 out), m = {m}")
    print(f"dequant whole matrix: {t_full * 1e3:8.1f} us  {(q_bytes + f_bytes) / t_full / 1e6:6.0f} GB/s moved")
    t_gemm_full = timed(torch, lambda: torch.matmul(x, full.t()))
    flop = 2.0 * m * rows * k
    print(f"GEMM whole matrix:    {t_gemm_full * 1e3:8.1f} us  {flop / t_gemm_full / 1e9:6.0f} TFLOP/s")
    print(f"whole: dequant + GEMM {1e3 * (t_full + t_gemm_full):8.1f} us")
    for c in (int(s) for s in args.chunks.split(",")):
        if rows % c or c % 16:
            continue
        buf = torch.empty(c, k, dtype=torch.float16, device="cuda")
        y = torch.empty(m, rows, dtype=torch.float16, device="cuda")

        def chunks_dq() -> None:
            for r0 in range(0, rows, c):
                dq(r0, c, buf)

        def chunks_both() -> None:
            for r0 in range(0, rows, c):
                dq(r0, c, buf)
                torch.matmul(x, buf.t(), out=y[:, r0 : r0 + c])

        t_dq = timed(torch, chunks_dq)
        t_g = timed(torch, lambda: torch.matmul(x, buf.t()))
        t_both = timed(torch, chunks_both)
        print(
            f"chunks of {c:5d} rows ({c * k * 2 / 1e6:5.1f} MB fp16): dequant {t_dq * 1e3:8.1f} us "
            f"({(q_bytes + f_bytes) / t_dq / 1e6:6.0f} GB/s as if moved); one GEMM {t_g * 1e3:7.1f} us "
            f"({2.0 * m * c * k / t_g / 1e9:4.0f} TFLOP/s); dequant + GEMM chunk by chunk {t_both * 1e3:8.1f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
