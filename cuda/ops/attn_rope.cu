// attn_rope: the per-token front of a gated attention layer (cpu.py CPUEngine._attention up to the
// cache write): RMSNorm1p of each q head (from the [q | gate] interleave) and k head, rotate-half RoPE
// on the first rope_dims dims (i pairs with i + rope_dims/2), qf fp32 out, K and V into the cache at
// their rows. Angles are computed in double and rounded once, as the CPU's cos/sin table is: at a
// position of 4096 an fp32 angle would already be off by ~2e-4 rad. One block per token, one warp
// per head for the norms (the whole token's heads sit in shared memory).
// Launched with programmatic dependent launch (lb_pdl.cuh): without a positions array (decode, prefill)
// the RoPE table depends only on the arguments and is computed before pdl_wait(), while the previous
// kernel drains; everything else (q, k, v, positions, the cache rows) after it.
#include "attn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace attn {
namespace {

template <int KVT>
__global__ void __launch_bounds__(256) prep_kernel(const float* __restrict__ qg, int ld_q, const float* __restrict__ k,
                                                   int ld_k, const float* __restrict__ v, int ld_v,
                                                   const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                                   const int32_t* __restrict__ positions, int pos0,
                                                   const int32_t* __restrict__ pos_dev,
                                                   float* __restrict__ qf, uint16_t* __restrict__ kc,
                                                   uint16_t* __restrict__ vc, int nh, int nkv, int max_ctx,
                                                   int rope_dims, float eps, float theta) {
    extern __shared__ float buf[];  // [nh + nkv][HD] normed heads, then cos [half], sin [half]
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nu = nh + nkv, half = rope_dims / 2;
    float* cs = buf + nu * HD;
    float* sn = cs + half;
    auto rope_table = [&](int pos) {
        if (tid < half) {
            const double inv_freq = pow((double)theta, -2.0 * tid / rope_dims);
            double s, c;
            sincos((double)pos * inv_freq, &s, &c);
            cs[tid] = (float)c;
            sn[tid] = (float)s;
        }
    };
    lb::pdl_trigger();
    // pos_dev (graph replays): the position is data, read after the wait like the activations
    if (!positions && !pos_dev) rope_table(pos0 + t);
    lb::pdl_wait();
    const int row = (pos_dev ? *pos_dev : pos0) + t;
    if (positions) rope_table(positions[t]);
    else if (pos_dev) rope_table(row);
    for (int u = warp; u < nu; u += 8) {
        const float* src = u < nh ? qg + (size_t)t * ld_q + u * 2 * HD : k + (size_t)t * ld_k + (u - nh) * HD;
        const float* w = u < nh ? q_norm : k_norm;
        float x[HD / 32], ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) {
            x[e] = src[e * 32 + lane];
            ss = fmaf(x[e], x[e], ss);
        }
        ss = lb::warp_sum(ss);
        const float r = rsqrtf(ss / HD + eps);
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) buf[u * HD + e * 32 + lane] = x[e] * r * w[e * 32 + lane];
    }
    __syncthreads();
    for (int idx = tid; idx < nu * half; idx += 256) {
        const int u = idx / half, i = idx % half;
        float* hv = buf + u * HD;
        const float a = hv[i], b = hv[i + half];
        hv[i] = a * cs[i] - b * sn[i];
        hv[i + half] = b * cs[i] + a * sn[i];
    }
    __syncthreads();
    for (int idx = tid; idx < nu * HD; idx += 256) {
        const int u = idx / HD, d = idx % HD;
        if (u < nh) {
            qf[((size_t)t * nh + u) * HD + d] = buf[idx];
        } else {
            const int g = u - nh;
            const size_t off = ((size_t)g * max_ctx + row) * HD + d;
            kc[off] = f2kv<KVT>(buf[idx]);
            vc[off] = f2kv<KVT>(v[(size_t)t * ld_v + g * HD + d]);
        }
    }
}

}  // namespace

int prep(const float* qg, int ld_q, const float* k, int ld_k, const float* v, int ld_v, const float* q_norm,
         const float* k_norm, const int32_t* positions, int pos0, float* qf, uint16_t* kc, uint16_t* vc, int kv_dtype,
         int T, int nh, int nkv, int max_ctx, int rope_dims, float eps, float theta, cudaStream_t s,
         const int32_t* pos_dev) {
    const size_t smem = ((size_t)(nh + nkv) * HD + rope_dims) * 4;
    auto kern = kv_dtype == KV_BF16 ? prep_kernel<KV_BF16> : prep_kernel<KV_F16>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    return (int)lb::launch_pdl(kern, dim3(T), dim3(256), smem, s, qg, ld_q, k, ld_k, v, ld_v, q_norm, k_norm, positions, pos0,
                               pos_dev, qf, kc, vc, nh, nkv, max_ctx, rope_dims, eps, theta);
}

}  // namespace attn

// lb_attn_prep with k and v rows of their own strides: a prefill's q | k | v from one GEMM of back-to-back tensors
// (rows of [q+gate | k | v], stride the sum) or q | k from one and v from another.
extern "C" LB_API int lb_attn_prep_ld(const void* qg, int ld_q, const void* k, int ld_k, const void* v, int ld_v,
                                      const void* q_norm, const void* k_norm, const void* positions, int pos0,
                                      void* qf, void* k_cache, void* v_cache, int kv_dtype, int t, int n_heads,
                                      int n_kv_heads, int max_ctx, int rope_dims, float eps, float theta,
                                      void* stream) {
    LB_CHECK_ARG(qg && k && v && q_norm && k_norm && qf && k_cache && v_cache, "null pointer");
    LB_CHECK_ARG(kv_dtype == LB_KV_F16 || kv_dtype == LB_KV_BF16, "kv_dtype must be LB_KV_F16 or LB_KV_BF16");
    LB_CHECK_ARG(t >= 1 && n_heads >= 1 && n_kv_heads >= 1 && pos0 >= 0 && pos0 + t <= max_ctx,
                 "bad sizes, or rows outside the cache");
    LB_CHECK_ARG(rope_dims >= 2 && rope_dims % 2 == 0 && rope_dims <= attn::HD, "rope_dims must be even, <= 256");
    LB_CHECK_ARG(ld_q >= n_heads * 2 * attn::HD && ld_k >= n_kv_heads * attn::HD && ld_v >= n_kv_heads * attn::HD,
                 "row strides too small");
    LB_CHECK_ARG(((size_t)(n_heads + n_kv_heads) * attn::HD + rope_dims) * 4 <= 96 * 1024, "too many heads for one block's shared memory");
    LB_CUDA_TRY((cudaError_t)attn::prep(
        static_cast<const float*>(qg), ld_q, static_cast<const float*>(k), ld_k, static_cast<const float*>(v), ld_v,
        static_cast<const float*>(q_norm), static_cast<const float*>(k_norm), static_cast<const int32_t*>(positions),
        pos0, static_cast<float*>(qf), static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), kv_dtype, t,
        n_heads, n_kv_heads, max_ctx, rope_dims, eps, theta, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_attn_prep(const void* qg, int ld_q, const void* k, const void* v, int ld_kv,
                                   const void* q_norm, const void* k_norm, const void* positions, int pos0, void* qf,
                                   void* k_cache, void* v_cache, int kv_dtype, int t, int n_heads, int n_kv_heads,
                                   int max_ctx, int rope_dims, float eps, float theta, void* stream) {
    return lb_attn_prep_ld(qg, ld_q, k, ld_kv, v, ld_kv, q_norm, k_norm, positions, pos0, qf, k_cache, v_cache,
                           kv_dtype, t, n_heads, n_kv_heads, max_ctx, rope_dims, eps, theta, stream);
}

// lb_attn_prep with pos0 read on the device (*pos0_dev), for CUDA graphs replayed at every n_past. The
// host can not check the cache rows: the caller keeps *pos0_dev + t <= max_ctx.
extern "C" LB_API int lb_attn_prep_at(const void* qg, int ld_q, const void* k, const void* v, int ld_kv,
                                      const void* q_norm, const void* k_norm, const void* positions,
                                      const void* pos0_dev, void* qf, void* k_cache, void* v_cache, int kv_dtype, int t,
                                      int n_heads, int n_kv_heads, int max_ctx, int rope_dims, float eps, float theta,
                                      void* stream) {
    LB_CHECK_ARG(qg && k && v && q_norm && k_norm && qf && k_cache && v_cache && pos0_dev, "null pointer");
    LB_CHECK_ARG(kv_dtype == LB_KV_F16 || kv_dtype == LB_KV_BF16, "kv_dtype must be LB_KV_F16 or LB_KV_BF16");
    LB_CHECK_ARG(t >= 1 && n_heads >= 1 && n_kv_heads >= 1 && t <= max_ctx, "bad sizes");
    LB_CHECK_ARG(rope_dims >= 2 && rope_dims % 2 == 0 && rope_dims <= attn::HD, "rope_dims must be even, <= 256");
    LB_CHECK_ARG(ld_q >= n_heads * 2 * attn::HD && ld_kv >= n_kv_heads * attn::HD, "row strides too small");
    LB_CHECK_ARG(((size_t)(n_heads + n_kv_heads) * attn::HD + rope_dims) * 4 <= 96 * 1024, "too many heads for one block's shared memory");
    LB_CUDA_TRY((cudaError_t)attn::prep(
        static_cast<const float*>(qg), ld_q, static_cast<const float*>(k), ld_kv, static_cast<const float*>(v), ld_kv,
        static_cast<const float*>(q_norm), static_cast<const float*>(k_norm), static_cast<const int32_t*>(positions),
        0, static_cast<float*>(qf), static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), kv_dtype, t,
        n_heads, n_kv_heads, max_ctx, rope_dims, eps, theta, static_cast<cudaStream_t>(stream),
        static_cast<const int32_t*>(pos0_dev)));
    return LB_OK;
}
