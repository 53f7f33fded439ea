// attn_prefill: the prompt's gated full attention for Qwen3.5 (head_dim 256, 4 query heads per kv head).
//  - attn_prep: per token, q/k RMSNorm1p, partial RoPE (dims [0, 64), i pairs with i + 32), K and V
//    rounded to bf16 into the decode megakernel's cache [n_kv, max_ctx, 256] at their positions.
//  - attn_tc (what the 0.8B prefill runs): causal attention over cache rows [0, pos], ⊙ sigmoid(gate),
//    written as split bf16 (hi, lo parts) for the o_proj GEMM, on the 27B's tensor-core kernel
//    (attn::run's causal tc::tree_kernel, cuda/ops/attn_decode.cu) rather than a second flash kernel:
//    one kernel to tune and test, and the 27B measured 4.7 -> ~1 ms for its 16 layers at pp520.
//  - attn_flash: the same contract in fp32 on CUDA cores (flash-style tiling, online softmax), kept as
//    the fallback under LUCEBOX_ATTN_PREFILL=fp32 (the A/B, and the reference the tc path is tested
//    against). It is as exact as the decode kernel, which reads the same bf16 cache with fp32 queries;
//    a block takes 4 tokens x the 4 query heads of one kv head (16 rows), so each K/V tile it loads
//    serves 4 heads; few tokens per block keep the causal critical path (the last block reads every
//    key) short.
#include "attn_ops.h"
#include "lb_check.cuh"
#include "lucebox.h"
#include "pf_common.cuh"
#include "pf_ops.h"

namespace pf {
namespace {

constexpr int D = AT_D;          // 256
constexpr int GROUP = 4;         // query heads per kv head
constexpr int BQ = 4;            // tokens per block: short blocks, 260 of them at pp520
constexpr int R = GROUP * BQ;    // 16 query rows per block
constexpr int RW = R / 8;        // rows per warp in the score and softmax phases
constexpr int BKV = 32;          // keys per tile
constexpr int KW = D / 2 + 1;    // padded K/V smem row in 32-bit words (2 bf16 each): conflict-free
constexpr int PP = BKV + 1;      // padded score row
constexpr int ROPE_HALF = 32;
constexpr int MAX_UNITS = 20;    // query + kv heads normed per token in attn_prep

constexpr size_t FLASH_SMEM = (size_t)R * D * 4 + (size_t)2 * BKV * KW * 4 + (size_t)R * PP * 4 + 3 * R * 4;

__global__ void __launch_bounds__(256) attn_prep_kernel(const float* __restrict__ y, int ldy,
                                                        const float* __restrict__ q_norm,
                                                        const float* __restrict__ k_norm, float* __restrict__ qf,
                                                        uint16_t* __restrict__ kc, uint16_t* __restrict__ vc,
                                                        int pos0, int nh, int nkv, int max_ctx, float eps,
                                                        float theta) {
    __shared__ float buf[MAX_UNITS * D];
    const int t = blockIdx.x, p = pos0 + t, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* yr = y + (size_t)t * ldy;
    const int nu = nh + nkv;
    // RMSNorm1p per head (weights include the +1), one warp per head
    for (int u = warp; u < nu; u += 8) {
        const float* src = u < nh ? yr + u * 2 * D : yr + nh * 2 * D + (u - nh) * D;
        const float* w = u < nh ? q_norm : k_norm;
        float x[8], ss = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            x[e] = src[lane * 8 + e];
            ss += x[e] * x[e];
        }
        ss = lb::warp_sum(ss);
        const float r = rsqrtf(ss / D + eps);
#pragma unroll
        for (int e = 0; e < 8; ++e) buf[u * D + lane * 8 + e] = x[e] * r * w[lane * 8 + e];
    }
    __syncthreads();
    // RoPE as the decode kernel computes it (fp32 powf / sincosf), so both paths rotate identically
    for (int idx = tid; idx < nu * ROPE_HALF; idx += 256) {
        const int u = idx / ROPE_HALF, i = idx % ROPE_HALF;
        const float inv_freq = powf(theta, -(float)(2 * i) / (float)(2 * ROPE_HALF));
        float sn, cs;
        sincosf((float)p * inv_freq, &sn, &cs);
        float* v = buf + u * D;
        const float a = v[i], b = v[i + ROPE_HALF];
        v[i] = a * cs - b * sn;
        v[i + ROPE_HALF] = b * cs + a * sn;
    }
    __syncthreads();
    for (int idx = tid; idx < nu * D; idx += 256) {
        const int u = idx / D, d = idx % D;
        if (u < nh) {
            qf[((size_t)t * nh + u) * D + d] = buf[idx];
        } else {
            const int g = u - nh;
            const size_t off = ((size_t)g * max_ctx + p) * D + d;
            kc[off] = f2bf(buf[idx]);
            vc[off] = f2bf(yr[nh * 2 * D + nkv * D + g * D + d]);
        }
    }
}

__global__ void __launch_bounds__(256) attn_flash_kernel(const float* __restrict__ qf, const uint16_t* __restrict__ kc,
                                                         const uint16_t* __restrict__ vc,
                                                         const float* __restrict__ gate, int gate_ld, int gate_hs,
                                                         uint16_t* __restrict__ out, int T, int pos0, int nh,
                                                         int max_ctx) {
    extern __shared__ float sm[];
    float* Qs = sm;                                              // [R][D], pre-scaled by 1/sqrt(D)
    uint32_t* Ks = reinterpret_cast<uint32_t*>(Qs + R * D);      // [BKV][KW] bf16 pairs
    uint32_t* Vs = Ks + BKV * KW;                                // [BKV][KW]
    float* Ps = reinterpret_cast<float*>(Vs + BKV * KW);         // [R][PP] scores, then probabilities
    float* mrow = Ps + R * PP;                                   // [R] running max
    float* lrow = mrow + R;                                      // [R] running sum
    float* arow = lrow + R;                                      // [R] rescale of this tile
    // the last tokens read the most keys: start them first so they do not form the tail
    const int t0 = (gridDim.x - 1 - blockIdx.x) * BQ, g = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int last_t = min(t0 + BQ, T) - 1;
    const int kv_end = pos0 + last_t + 1;  // keys [0, kv_end) are visible to some row of the block

    // row r: head g*GROUP + r/BQ, token t0 + r%BQ (rows past the prompt repeat the last token)
    for (int idx = tid; idx < R * D; idx += 256) {
        const int r = idx / D, d = idx % D;
        const int t = min(t0 + r % BQ, T - 1), h = g * GROUP + r / BQ;
        Qs[idx] = qf[((size_t)t * nh + h) * D + d] * 0.0625f;
    }
    if (tid < R) {
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    const int dp = tid & (D / 2 - 1);  // PV: this thread's bf16 pair (dims 2dp, 2dp+1)
    const int rb = tid / (D / 2);      // PV: rows rb + 2a
    float acc[R / 2][2];
#pragma unroll
    for (int a = 0; a < R / 2; ++a) acc[a][0] = acc[a][1] = 0.0f;

    const uint16_t* kbase = kc + (size_t)g * max_ctx * D;
    const uint16_t* vbase = vc + (size_t)g * max_ctx * D;
    for (int kb = 0; kb < kv_end; kb += BKV) {
        __syncthreads();
        for (int idx = tid; idx < BKV * (D / 8); idx += 256) {
            const int j = idx / (D / 8), c = idx % (D / 8);
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (kb + j < kv_end) {
                kv4 = *reinterpret_cast<const uint4*>(kbase + (size_t)(kb + j) * D + c * 8);
                vv4 = *reinterpret_cast<const uint4*>(vbase + (size_t)(kb + j) * D + c * 8);
            }
            uint32_t* kd = Ks + j * KW + c * 4;
            uint32_t* vd = Vs + j * KW + c * 4;
            kd[0] = kv4.x; kd[1] = kv4.y; kd[2] = kv4.z; kd[3] = kv4.w;
            vd[0] = vv4.x; vd[1] = vv4.y; vd[2] = vv4.z; vd[3] = vv4.w;
        }
        __syncthreads();
        // scores: key j = lane, rows warp + 8a
        {
            float s[RW] = {};
            for (int w2 = 0; w2 < D / 2; ++w2) {
                const uint32_t kw = Ks[lane * KW + w2];
                const float k0 = bf_lo(kw), k1 = bf_hi(kw);
#pragma unroll
                for (int a = 0; a < RW; ++a) {
                    const float2 q2 = *reinterpret_cast<const float2*>(Qs + (warp + 8 * a) * D + 2 * w2);
                    s[a] = fmaf(q2.x, k0, fmaf(q2.y, k1, s[a]));
                }
            }
#pragma unroll
            for (int a = 0; a < RW; ++a) {
                const int r = warp + 8 * a;
                const int qpos = pos0 + min(t0 + r % BQ, T - 1);
                Ps[r * PP + lane] = kb + lane <= qpos ? s[a] : -INFINITY;
            }
        }
        __syncthreads();
        // online softmax: warp w owns rows RW w .. RW w + RW-1
#pragma unroll
        for (int a = 0; a < RW; ++a) {
            const int r = warp * RW + a;
            attn::online_softmax_row(&Ps[r * PP + lane], mrow[r], lrow[r], arow[r], lane);
        }
        __syncthreads();
        // acc = alpha acc + P V
#pragma unroll
        for (int a = 0; a < R / 2; ++a) {
            const float al = arow[rb + 2 * a];
            acc[a][0] *= al;
            acc[a][1] *= al;
        }
        for (int j = 0; j < BKV; ++j) {
            const uint32_t vw = Vs[j * KW + dp];
            const float v0 = bf_lo(vw), v1 = bf_hi(vw);
#pragma unroll
            for (int a = 0; a < R / 2; ++a) {
                const float pr = Ps[(rb + 2 * a) * PP + j];
                acc[a][0] = fmaf(pr, v0, acc[a][0]);
                acc[a][1] = fmaf(pr, v1, acc[a][1]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < R / 2; ++a) {
        const int r = rb + 2 * a, t = t0 + r % BQ, h = g * GROUP + r / BQ;
        if (t >= T) continue;
        const float inv = 1.0f / lrow[r];
        const float* gt = gate + (size_t)t * gate_ld + (size_t)h * gate_hs + 2 * dp;
        const float o0 = acc[a][0] * inv * sigmoidf_(gt[0]);
        const float o1 = acc[a][1] * inv * sigmoidf_(gt[1]);
        uint32_t hi, lo;
        split_bf2(o0, o1, hi, lo);
        *reinterpret_cast<uint32_t*>(out + ((size_t)t * nh + h) * D + 2 * dp) = hi;
        *reinterpret_cast<uint32_t*>(out + ((size_t)(T + t) * nh + h) * D + 2 * dp) = lo;
    }
}

}  // namespace

int attn_prepare() {
    return (int)cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FLASH_SMEM);
}

int attn_prep(const float* y, int ldy, const float* q_norm, const float* k_norm, float* qf, uint16_t* kc,
              uint16_t* vc, int T, int pos0, int n_heads, int n_kv, int max_ctx, float eps, float theta,
              cudaStream_t s) {
    if (n_heads + n_kv > MAX_UNITS) return (int)cudaErrorInvalidValue;
    attn_prep_kernel<<<T, 256, 0, s>>>(y, ldy, q_norm, k_norm, qf, kc, vc, pos0, n_heads, n_kv, max_ctx, eps, theta);
    return (int)cudaGetLastError();
}

int attn_flash(const float* qf, const uint16_t* kc, const uint16_t* vc, const float* gate, int gate_ld, int gate_hs,
               uint16_t* out, int T, int pos0, int n_heads, int n_kv, int max_ctx, cudaStream_t s) {
    if (n_heads != n_kv * GROUP) return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)((T + BQ - 1) / BQ), (unsigned)n_kv);
    attn_flash_kernel<<<grid, 256, FLASH_SMEM, s>>>(qf, kc, vc, gate, gate_ld, gate_hs, out, T, pos0, n_heads, max_ctx);
    return (int)cudaGetLastError();
}

int attn_tc(const float* qf, const uint16_t* kc, const uint16_t* vc, const float* gate, int gate_ld, int gate_hs,
            uint16_t* out, void* partials, int max_splits, int T, int pos0, int n_heads, int n_kv, int max_ctx,
            cudaStream_t s) {
    if (n_kv < 1 || n_heads % n_kv != 0 || n_heads / n_kv > attn::MAX_GROUP) return (int)cudaErrorInvalidValue;
    attn::Params P{};
    P.qf = qf;
    P.kc = kc;
    P.vc = vc;
    P.gate = gate;
    P.gate_ld = gate_ld;
    P.gate_hs = gate_hs;
    P.out_split = out;
    P.Tq = T;
    P.pos0 = pos0;
    P.nh = n_heads;
    P.nkv = n_kv;
    P.group = n_heads / n_kv;
    P.max_ctx = max_ctx;
    return attn::run(P, attn::KV_BF16, partials, max_splits, s);
}

}  // namespace pf

extern "C" LB_API int lb_attn_prefill_tc(const void* qf, const void* k_cache, const void* v_cache, const void* gate,
                                         int gate_ld, int gate_hs, void* out, void* partials, int max_splits, int t,
                                         int pos0, int n_heads, int n_kv_heads, int max_ctx, void* stream) {
    LB_CHECK_ARG(qf && k_cache && v_cache && gate && out, "null pointer");
    LB_CHECK_ARG(t >= 1 && pos0 >= 0 && pos0 + t <= max_ctx, "positions outside the cache");
    LB_CHECK_ARG(n_kv_heads >= 1 && n_heads % n_kv_heads == 0 && n_heads / n_kv_heads <= attn::MAX_GROUP,
                 "n_heads must be a multiple of n_kv_heads, at most 8 per kv head");
    LB_CUDA_TRY((cudaError_t)pf::attn_tc(static_cast<const float*>(qf), static_cast<const uint16_t*>(k_cache),
                                          static_cast<const uint16_t*>(v_cache), static_cast<const float*>(gate),
                                          gate_ld, gate_hs, static_cast<uint16_t*>(out), partials, max_splits, t,
                                          pos0, n_heads, n_kv_heads, max_ctx, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_attn_prefill(const void* qf, const void* k_cache, const void* v_cache, const void* gate,
                                      int gate_ld, int gate_hs, void* out, int t, int pos0, int n_heads,
                                      int n_kv_heads, int max_ctx, void* stream) {
    LB_CHECK_ARG(qf && k_cache && v_cache && gate && out, "null pointer");
    LB_CHECK_ARG(t >= 1 && pos0 >= 0 && pos0 + t <= max_ctx, "positions outside the cache");
    LB_CHECK_ARG(n_kv_heads >= 1 && n_heads == 4 * n_kv_heads, "built for 4 query heads per kv head");
    LB_CUDA_TRY((cudaError_t)pf::attn_prepare());
    LB_CUDA_TRY((cudaError_t)pf::attn_flash(static_cast<const float*>(qf), static_cast<const uint16_t*>(k_cache),
                                             static_cast<const uint16_t*>(v_cache), static_cast<const float*>(gate),
                                             gate_ld, gate_hs, static_cast<uint16_t*>(out), t, pos0, n_heads,
                                             n_kv_heads, max_ctx, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
