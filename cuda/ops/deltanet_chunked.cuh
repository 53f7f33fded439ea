// Internal to the chunked DeltaNet (deltanet_chunked.cu: the fp32 prep and the host dispatch; deltanet_split.cu:
// the fp32 split scan; deltanet_tc.cu: the tensor-core path): sizes, the scratch layouts, the tensor-core path's
// input / output descriptions. gdn_chunked.cu (the 27B adapter) uses the tensor-core entry too.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "pf_ops.h"

namespace pf {
namespace dn {

constexpr int D = DN_D;       // 128 = dk = dv
constexpr int CH = DN_CHUNK;  // 64

__host__ __device__ inline int n_chunks(int T) { return (T + CH - 1) / CH; }

// ---- the fp32 path (LUCEBOX_DN_PREFILL=old) ----
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

// ---- the tensor-core path (deltanet_tc.cu) ----
// Inputs in any token / head strides (floats): the 0.8B's head-major [H, T, 128] (token stride 128, head stride
// T·128) or the 27B's token-major [T, H, 128]; value head h reads key head h % hk.
struct In {
    const float *q, *k, *v, *g, *beta;
    long long qk_t, qk_h;  // q and k: stride between tokens, between key heads
    long long v_t, v_h;
    long long gb_t, gb_h;  // g and beta
    int hk;
};

// The conv front end (tc_prep computes the causal conv, SiLU, q / k L2 norms, g and beta itself instead of reading
// q, k, v, g, beta): pre-conv rows pre [T, ld] with channels [q (hk·128) | k (hk·128) | v (H·128)]; the inputs of
// the 3 positions before row 0 at hist[0..2] (same channel index; null: zeros); conv_w [C, 4] (column 3 multiplies
// the current row); alpha / beta pre-activations of value head h at a / b [t·ab_t + h]; ssm_a, dt_bias [H]. The
// normed q (for the output kernel) and v (read back by prep itself) are written to q, v in In's strides; In's q and
// v must name the same buffers, its k, g, beta are not read. The caller advances the conv history afterwards.
struct ConvIn {
    const float* pre;
    long long ld;
    const float* hist[3];
    const float* conv_w;
    const float *a, *b;
    long long ab_t;
    const float *ssm_a, *dt_bias;
    float *q, *v;
};

enum { OUT_O = 0, OUT_Y = 1, OUT_XB = 2 };
// OUT_O: o [T, H·128] fp32. OUT_Y: y = RMSNorm(o) · norm · SiLU(z) per (token, head), fp32 [T, H·128] (gdn
// out_norm). OUT_XB: the same as a split bf16 pair xb [2][T, H·128] (dn_gated_norm). z row stride ldz.
struct Out {
    int mode;
    float* o;
    uint16_t* xb;
    const float* z;
    int ldz;
    const float* norm;
    float eps;
    // Optional (ring != null): the conv history's update, done by the output kernel (it runs after the prep kernel
    // has read the history; the same copy as dn_ring_write, one launch fewer): ring slot (ring_pos0 + t) & 3 of
    // ring_c channels <- ring_pre[t · ring_ld + 0 .. ring_c) for the last min(T, 4) rows.
    float* ring;
    const float* ring_pre;
    long long ring_ld;
    int ring_c, ring_pos0;
};

// Scratch per (head, chunk) unit, each region 256-byte aligned (deltanet_tc.cu has the fragment orders):
//   uv   fp32 [units][8192]   Uᵀ (βv solved) in accumulator order, then V_newᵀ as bf16-pair A fragments
//   wt   bf16 [units][2][128 dk][64]   −Wᵀ as a (hi, lo) pair
//   kt   bf16 [units][2][64][128 dk]   k e^(last − cum) as a pair
//   aqk  bf16 [units][2][64][64]       masked decayed q·kᵀ as a pair
//   hs   u32  [units][16384]   the chunk's start state Sᵀ as bf16-pair A fragments
//   cum  fp32 [units][64]
struct TcScratch {
    float* uv;
    uint16_t *wt, *kt, *aqk;
    uint32_t* hs;
    float* cum;
};
size_t tc_scratch_bytes(int T, int H);
// Whether the current device runs the tensor-core path (sm_80+, enough shared memory), and attributes set.
int tc_prepare(bool* ok);
// The rule over T tokens of H value heads; state [H, 128, 128] read and overwritten, [dv][dk] when state_t
// (the 0.8B megakernel's transposed layout) else [dk][dv] (cpu.py / the 27B ops).
// cv: the conv front end, or null for post-conv inputs.
int tc_run(const In& in, const ConvIn* cv, float* state, bool state_t, const Out& out, void* scratch, int T, int H,
           cudaStream_t s);

}  // namespace dn

// LUCEBOX_DN_PREFILL (read once per process): "old" runs the fp32 kernels (dn_chunk_prep + the split scan, and the
// separate norms), anything else the tensor-core path where the device has it.
bool dn_prefill_tc();

}  // namespace pf
