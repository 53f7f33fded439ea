#!/usr/bin/env python3
"""Can the 27B prefill's dequantization hide under its GEMMs? (a measurement for the next design)

    python3 scripts/bench_prefill_overlap.py [--layers 6] [--m 520] [--sm-targets 0,124,116,108,100] [--reps 5]

The 27B pp520 spends ~19 ms dequantizing weights to fp16 and ~40 ms in cuBLAS GEMMs over them, one after the other
(lb_gemm_q_cublas: dequantize a matrix into scratch, multiply). The GEMMs are compute-bound and fill every SM, so a
side-stream dequantization found little room beside them (docs/perf.md: 3.6 ms overlapped, session 5). cuBLAS can
be told to size its grids for fewer SMs (cublasSetSmCountTarget, lb_cublas_set_sm_target); then the next matrix's
dequantization can run on the SMs left over. This times, per value of that target, a DeltaNet layer's five prefill
products of the random 27B Q4_K_M (attn_qkv Q6_K_T 10240x5120, attn_gate + ssm_beta + ssm_alpha Q4_K_T 6240x5120,
ssm_out Q4_K_T 5120x6144, ffn_gate + ffn_up Q4_K_T 34816x5120, ffn_down Q6_K_T 5120x17408) over --layers layers of
distinct weights (past L2), at m columns:
  serial    lb_gemm_q_cublas_x16 per matrix (today's prefill GEMM);
  overlap   matrix i + 1 dequantized (lb_dequant_f16) on a side stream into the other of two fp16 buffers while
            cuBLAS multiplies matrix i on the main stream (lb_gemm_f16w_cublas); events order each buffer's reuse;
and, for reference, the dequantizations alone and the GEMMs alone (from a dequantized buffer). CUDA events, median of
--reps after a warm-up. Needs torch with CUDA and the built library with a loadable cuBLAS.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Q4_K_T, Q6_K_T = 268, 270
BLOCK_BYTES = {Q4_K_T: 144, Q6_K_T: 210}
LAYER = [("attn_qkv", Q6_K_T, 10240, 5120), ("z/beta/alpha", Q4_K_T, 6240, 5120), ("ssm_out", Q4_K_T, 5120, 6144),
         ("ffn_gate+up", Q4_K_T, 34816, 5120), ("ffn_down", Q6_K_T, 5120, 17408)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--m", type=int, default=520)
    ap.add_argument("--sm-targets", default="0,124,116,108,100")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gemm-priority", type=int, default=0,
                    help="the GEMM stream's priority (negative = higher: its CTAs are dispatched first when SMs free "
                         "up, so the side stream's thousands of short dequantization CTAs cannot hold it off)")
    args = ap.parse_args()

    import torch

    from lucebox_cli.config import resolve_profile
    from lucebox_cli.engines import _lib

    L = _lib.load(resolve_profile(None, _lib.probe_gpus().gpus))
    if not _lib.cublas_ready(L):
        print("no cuBLAS could be loaded")
        return 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    main_s, side_s = torch.cuda.Stream(priority=args.gemm_priority), torch.cuda.Stream()
    ms, ss = main_s.cuda_stream, side_s.cuda_stream
    m = args.m
    mats = []  # (name, qt, rows, k, weight tensor)
    for layer in range(args.layers):
        for j, (name, qt, rows, k) in enumerate(LAYER):
            w = torch.empty(rows * (k // 256) * BLOCK_BYTES[qt], dtype=torch.uint8, device="cuda")
            L.call("lb_quant_fill_random", qt, w.data_ptr(), rows, k, 100 * layer + j, ms)
            mats.append((name, qt, rows, k, w))
    x16 = {k: (0.1 * torch.randn(m, k, device="cuda")).half() for k in {k for _, _, _, k in LAYER}}
    y = {rows: torch.empty(m, rows, device="cuda") for rows in {r for _, _, r, _ in LAYER}}
    big = max(rows * k for _, _, rows, k in LAYER) * 2
    bufs = [torch.empty(big, dtype=torch.uint8, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()

    def gemm(i: int, buf, stream: int) -> None:
        _, _, rows, k, _ = mats[i]
        L.call("lb_gemm_f16w_cublas", buf.data_ptr(), rows, k, x16[k].data_ptr(), m, y[rows].data_ptr(), 0, stream)

    def deq(i: int, buf, stream: int) -> None:
        _, qt, rows, k, w = mats[i]
        L.call("lb_dequant_f16", qt, w.data_ptr(), rows, k, 0, rows, buf.data_ptr(), stream)

    def serial() -> None:
        for _, qt, rows, k, w in mats:
            L.call("lb_gemm_q_cublas_x16", qt, w.data_ptr(), rows, k, x16[k].data_ptr(), m, y[rows].data_ptr(), 0,
                   bufs[0].data_ptr(), big, ms)

    def deq_only() -> None:
        for i in range(len(mats)):
            deq(i, bufs[0], ms)

    def gemm_only() -> None:
        for i in range(len(mats)):
            gemm(i, bufs[0], ms)

    def overlap() -> None:
        n = len(mats)
        start = torch.cuda.Event()
        start.record(main_s)
        side_s.wait_event(start)
        ev_deq = [torch.cuda.Event() for _ in range(n)]
        ev_gemm = [torch.cuda.Event() for _ in range(n)]
        deq(0, bufs[0], ss)
        ev_deq[0].record(side_s)
        for i in range(n):
            if i + 1 < n:
                if i >= 1:
                    side_s.wait_event(ev_gemm[i - 1])  # buffer (i + 1) % 2 was matrix i - 1's
                deq(i + 1, bufs[(i + 1) % 2], ss)
                ev_deq[i + 1].record(side_s)
            main_s.wait_event(ev_deq[i])
            gemm(i, bufs[i % 2], ms)
            ev_gemm[i].record(main_s)

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(main_s)
            fn()
            b.record(main_s)
            b.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out)

    flop = sum(2 * m * rows * k for _, _, rows, k, _ in mats)
    print(f"device: {torch.cuda.get_device_name(0)} ({sms} SMs); {args.layers} layers x {len(LAYER)} products, "
          f"m = {m}: {flop / 1e12:.2f} TFLOP; GEMM stream priority {args.gemm_priority}; median of {args.reps}; "
          "ms per layer in brackets")
    print(f"{'SM target':>10} {'serial':>16} {'overlap':>16} {'dequant only':>16} {'GEMM only':>22}")
    for t in [int(v) for v in args.sm_targets.split(",")]:
        st = L.fn.lb_cublas_set_sm_target(t)
        if st != 0:
            print(f"{t:>10} lb_cublas_set_sm_target failed: {L.last_error()}")
            break
        r = {name: timed(fn) for name, fn in (("serial", serial), ("overlap", overlap), ("deq", deq_only),
                                               ("gemm", gemm_only))}
        per = {k: v / args.layers for k, v in r.items()}
        print(f"{t or sms:>10} {r['serial']:8.2f} ({per['serial']:5.2f}) {r['overlap']:8.2f} ({per['overlap']:5.2f}) "
              f"{r['deq']:8.2f} ({per['deq']:5.2f}) {r['gemm']:8.2f} ({per['gemm']:5.2f}) "
              f"{flop / r['gemm'] / 1e9:5.0f} TFLOP/s")
    L.fn.lb_cublas_set_sm_target(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
