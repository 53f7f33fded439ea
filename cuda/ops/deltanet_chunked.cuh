// Internal to the chunked DeltaNet (deltanet_chunked.cu: prep and the host dispatch;
// deltanet_split.cu: the split scan): sizes and the scratch layout both sides read.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "pf_ops.h"

namespace pf {
namespace dn {

constexpr int D = DN_D;       // 128 = dk = dv
constexpr int CH = DN_CHUNK;  // 64

__host__ __device__ inline int n_chunks(int T) { return (T + CH - 1) / CH; }

// One scratch allocation, fp32 regions in this order (each a multiple of 256 bytes, so float4-aligned):
//   u    [H, T, 128]          βv solved by prep; the split scan's state pass overwrites it with v_new
//   w    [H, Tp, 128]         chunk-transposed: [H, nch, 128 dk, 64 rows]
//   aqk  [H, Tp, 64]          masked decayed q·kᵀ per chunk
//   cum  [H, Tp]              cumsum(g) per chunk (flat past the prompt)
//   hs   [H, nch, 128, 128]   the split scan's state at each chunk's start, [dk][dv]
// Tp = nch * 64.
struct Scratch {
    float *u, *w, *aqk, *cum, *hs;
};

inline size_t scratch_floats(int T, int H) {
    const size_t nch = (size_t)n_chunks(T), tp = nch * CH;
    return (size_t)H * T * D + (size_t)H * tp * D + (size_t)H * tp * CH + (size_t)H * tp + (size_t)H * nch * D * D;
}

inline Scratch carve(void* base, int T, int H) {
    const size_t nch = (size_t)n_chunks(T), tp = nch * CH;
    float* p = static_cast<float*>(base);
    Scratch s;
    s.u = p; p += (size_t)H * T * D;
    s.w = p; p += (size_t)H * tp * D;
    s.aqk = p; p += (size_t)H * tp * CH;
    s.cum = p; p += (size_t)H * tp;
    s.hs = p;
    return s;
}

// deltanet_split.cu. mode: 0 = pick by occupancy, 1 = single-buffered state pass, 2 = double-buffered.
int split_prepare();
int split_scan(const float* q, const float* k, Scratch sc, float* state, float* o, int T, int H, int mode,
               cudaStream_t s);

}  // namespace dn
}  // namespace pf
