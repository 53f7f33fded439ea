// Gated DeltaNet device helpers shared by cuda/ops/gdn_*.cu (27B-capable: any Hk, Hv with Hv % Hk == 0,
// dk = dv = 128). Layouts follow lucebox_cli/engines/cpu.py, the oracle:
//   pre-conv inputs [T, C] with C = 2·Hk·dk + Hv·dv, channels [q | k | v]; conv weight [C, 4] (column 3
//   multiplies the current token); conv state [3, C] = the last 3 pre-conv inputs, oldest first;
//   q, k [T, Hk, dk] (after conv, SiLU, L2 norm; q also scaled by 1/sqrt(dk)); v [T, Hv, dv];
//   g (log decay) and beta [T, Hv]; recurrent state [Hv, dk, dv] fp32; value head p reads key head p % Hk.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "lb_arch.cuh"

namespace gdn {

constexpr int D = 128;        // dk = dv
constexpr int KCONV = 4;      // conv kernel width (state keeps KCONV - 1 inputs)
constexpr int MAX_TREE = 64;  // tree slots per verify (the attention mask is one uint64 per slot)

// The delta kernel splits a head's [dk, dv] state along dv: columns are independent given k, q, so
// each block streams a [128, DVS] slice, one warp per DELTA_WCOLS columns. A warp walks its steps
// alone (no block barrier inside the walk): lane l owns column quad cq = l & 1 of the warp's 8 columns
// and the 8 contiguous rows 8·(l >> 1) .. +7, 32 fp32 values in registers; two lanes read one 32-byte
// sector of a row. The Sᵀk / Sᵀq column sums reduce over the 16 lanes sharing cq (4 shuffle levels).
constexpr int DELTA_WARPS = 2;
constexpr int DELTA_WCOLS = 8;
constexpr int DVS = DELTA_WARPS * DELTA_WCOLS;  // 16 columns per block
constexpr int NSLICE = D / DVS;
constexpr int DELTA_THREADS = DELTA_WARPS * 32;
constexpr int ROWS_PER_THREAD = D / 16;  // 8 (16 row groups per warp)

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
// log(1 + e^x) without overflow; np.logaddexp(0, x) to fp32 rounding.
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

}  // namespace gdn
