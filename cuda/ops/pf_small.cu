// Small prefill kernels: embedding gather, RMSNorm into split-bf16 GEMM inputs, and the LM head of the last
// position (a GEMV over the tied embedding with block argmax partials) plus the final argmax.
#include "lb_check.cuh"
#include "lucebox.h"
#include "pf_common.cuh"
#include "pf_ops.h"

namespace pf {
namespace {

constexpr int HID = 1024;
constexpr int LM_WARPS = 8;
constexpr int LM_ROWS_PER_WARP = 32;  // 256 rows a block: the norm each block recomputes stays cheap
constexpr int LM_ROWS = LM_WARPS * LM_ROWS_PER_WARP;
constexpr int LM_BATCH = 4;           // rows a lane keeps in flight (4 x 4 uint4 loads)

__global__ void embed_gather_kernel(const uint16_t* __restrict__ E, const int32_t* __restrict__ tok,
                                    float* __restrict__ h) {
    const int t = blockIdx.x, i = threadIdx.x * 8;
    const uint4 w = *reinterpret_cast<const uint4*>(E + (size_t)tok[t] * HID + i);
    float4* dst = reinterpret_cast<float4*>(h + (size_t)t * HID + i);
    dst[0] = make_float4(bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y));
    dst[1] = make_float4(bf_lo(w.z), bf_hi(w.z), bf_lo(w.w), bf_hi(w.w));
}

// split bf16: the hi part, then the lo part gridDim.x (= T) rows later
__global__ void __launch_bounds__(256) rmsnorm_bf16_kernel(const float* __restrict__ h, const float* __restrict__ w,
                                                           uint16_t* __restrict__ xb, float eps) {
    __shared__ float red[8];
    const int t = blockIdx.x, i = threadIdx.x * 4;
    const float4 x = *reinterpret_cast<const float4*>(h + (size_t)t * HID + i);
    rmsnorm_row_split(x, w, xb, t, (int)gridDim.x, eps, red);
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Every block normalises the row itself (4 KB from L2) and streams LM_ROWS rows of E; lane l of a warp
// holds x[(l + 32 s) * 8 .. + 8) for s < 4 in registers, matching its 16-byte weight loads.
__global__ void __launch_bounds__(256) lm_head_kernel(const float* __restrict__ hrow, const float* __restrict__ w,
                                                      const uint16_t* __restrict__ E, float* __restrict__ logits,
                                                      float* __restrict__ part_val, int* __restrict__ part_idx,
                                                      int vocab, float eps) {
    __shared__ float xs[HID];
    __shared__ float red[8];
    __shared__ float bvs[LM_WARPS];
    __shared__ int bis[LM_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    {
        const float4 x = *reinterpret_cast<const float4*>(hrow + tid * 4);
        const float ss = lb::block_sum<256>(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w, red);
        const float r = rsqrtf(ss / HID + eps);
        const float4 g = *reinterpret_cast<const float4*>(w + tid * 4);
        *reinterpret_cast<float4*>(xs + tid * 4) = make_float4(x.x * r * g.x, x.y * r * g.y, x.z * r * g.z, x.w * r * g.w);
    }
    __syncthreads();
    float xr[4][8];
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 8; ++e) xr[s][e] = xs[(lane + 32 * s) * 8 + e];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    const int row0 = blockIdx.x * LM_ROWS + warp * LM_ROWS_PER_WARP;
    for (int rb = 0; rb < LM_ROWS_PER_WARP; rb += LM_BATCH) {
        uint4 wv[LM_BATCH][4];
#pragma unroll
        for (int b = 0; b < LM_BATCH; ++b) {
            const int row = min(row0 + rb + b, vocab - 1);
            const uint4* src = reinterpret_cast<const uint4*>(E + (size_t)row * HID);
#pragma unroll
            for (int s = 0; s < 4; ++s) wv[b][s] = __ldcs(src + lane + 32 * s);  // streamed once
        }
#pragma unroll
        for (int b = 0; b < LM_BATCH; ++b) {
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const uint32_t u[4] = {wv[b][s].x, wv[b][s].y, wv[b][s].z, wv[b][s].w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    acc = fmaf(bf_lo(u[q]), xr[s][2 * q], acc);
                    acc = fmaf(bf_hi(u[q]), xr[s][2 * q + 1], acc);
                }
            }
            acc = lb::warp_sum(acc);
            const int row = row0 + rb + b;
            if (row < vocab) {
                if (lane == 0) logits[row] = acc;
                if (better(acc, row, bv, bi)) {
                    bv = acc;
                    bi = row;
                }
            }
        }
    }
    if (lane == 0) {
        bvs[warp] = bv;
        bis[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
        float b0 = bvs[0];
        int i0 = bis[0];
        for (int k = 1; k < LM_WARPS; ++k)
            if (better(bvs[k], bis[k], b0, i0)) {
                b0 = bvs[k];
                i0 = bis[k];
            }
        part_val[blockIdx.x] = b0;
        part_idx[blockIdx.x] = i0 == 0x7fffffff ? 0 : i0;
    }
}

__global__ void __launch_bounds__(1024) argmax_reduce_kernel(const float* __restrict__ pv, const int* __restrict__ pi,
                                                             int n, int* out, int* out2) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        if (better(pv[k], pi[k], bv, bi)) {
            bv = pv[k];
            bi = pi[k];
        }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(LB_FULL_MASK, bv, off);
        const int i = __shfl_xor_sync(LB_FULL_MASK, bi, off);
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        // every logit NaN: still a valid token id
        const int r = bi == 0x7fffffff ? 0 : bi;
        *out = r;
        if (out2) *out2 = r;
    }
}

}  // namespace

int embed_gather(const uint16_t* embed, const int32_t* tok, float* h, int T, int hid, cudaStream_t s) {
    if (hid != HID) return (int)cudaErrorInvalidValue;
    embed_gather_kernel<<<T, HID / 8, 0, s>>>(embed, tok, h);
    return (int)cudaGetLastError();
}

int rmsnorm_bf16(const float* h, const float* w, uint16_t* xb, int T, int hid, float eps, cudaStream_t s) {
    if (hid != HID) return (int)cudaErrorInvalidValue;
    rmsnorm_bf16_kernel<<<T, 256, 0, s>>>(h, w, xb, eps);
    return (int)cudaGetLastError();
}

int lm_head_max_parts(int vocab) { return (vocab + LM_ROWS - 1) / LM_ROWS; }

int lm_head(const float* h_row, const float* w, const uint16_t* E, float* logits, float* part_val, int* part_idx,
            int vocab, int hid, float eps, int* n_part, cudaStream_t s) {
    if (hid != HID) return (int)cudaErrorInvalidValue;
    *n_part = lm_head_max_parts(vocab);
    lm_head_kernel<<<*n_part, 256, 0, s>>>(h_row, w, E, logits, part_val, part_idx, vocab, eps);
    return (int)cudaGetLastError();
}

int argmax_reduce(const float* part_val, const int* part_idx, int n_part, int* out, int* out2, cudaStream_t s) {
    argmax_reduce_kernel<<<1, 1024, 0, s>>>(part_val, part_idx, n_part, out, out2);
    return (int)cudaGetLastError();
}

}  // namespace pf

extern "C" LB_API int lb_pf_rmsnorm_bf16(const void* h, const void* w, void* xb, int t, float eps, void* stream) {
    LB_CHECK_ARG(h && w && xb, "null pointer");
    LB_CHECK_ARG(t >= 1, "t must be at least 1");
    LB_CUDA_TRY((cudaError_t)pf::rmsnorm_bf16(static_cast<const float*>(h), static_cast<const float*>(w),
                                              static_cast<uint16_t*>(xb), t, 1024, eps, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
