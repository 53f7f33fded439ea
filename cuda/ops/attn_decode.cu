// attn_decode: gated full attention over one layer's KV cache for decode (1 query), tree verify (N
// slots under an ancestor mask) and causal prefill — one flash-style kernel, split along the keys
// (flash-decoding) when the queries alone cannot fill the GPU, plus a combine kernel for the splits.
//
// A block takes R query rows = up to R / group tokens x the `group` query heads of one kv head, so each
// K/V tile it loads serves every query head of that kv head (GQA). fp32 on CUDA cores with fp32 queries
// and an fp32 online softmax (the 0.8B attn_prefill's scheme, generalised in group, cache type and
// visibility rule): decode is bound by the KV bytes, not the math. R = 8 for one query (group <= 8 rows,
// little idle math), R = 32 otherwise. Grid (query tiles, kv heads, splits) with the query tile
// fastest, so the blocks that share a K/V range run together and the re-reads hit L2.
#include <algorithm>

#include "attn.cuh"
#include "attn_ops.h"
#include "lb_check.cuh"
#include "lucebox.h"

namespace attn {
namespace {

constexpr int THREADS = 256;
constexpr int KW = HD / 2 + 1;  // padded K/V smem row in 32-bit words: conflict-free in both phases
constexpr int PP = BKV + 1;     // padded score row

template <int R>
constexpr size_t smem_bytes() {
    return (size_t)R * HD * 4 + (size_t)2 * BKV * KW * 4 + (size_t)R * PP * 4 + (size_t)3 * R * 4 + (size_t)R * 4 +
           (size_t)R * 8;
}

template <int R, int KVT>
__global__ void __launch_bounds__(THREADS) attn_kernel(const Params P) {
    extern __shared__ __align__(16) float sm[];
    unsigned long long* rmask = reinterpret_cast<unsigned long long*>(sm);  // [R] tree mask of each row
    float* Qs = sm + 2 * R;                                                // [R][HD], scaled by 1/sqrt(HD)
    uint32_t* Ks = reinterpret_cast<uint32_t*>(Qs + R * HD);               // [BKV][KW]
    uint32_t* Vs = Ks + BKV * KW;                                          // [BKV][KW]
    float* Ps = reinterpret_cast<float*>(Vs + BKV * KW);                   // [R][PP]
    float* mrow = Ps + R * PP;
    float* lrow = mrow + R;
    float* arow = lrow + R;
    int* rlim = reinterpret_cast<int*>(arow + R);  // causal: last visible key; -1: inactive row
    const int G = P.group, QT = R / G;
    const int t0 = blockIdx.x * QT, g = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nt = min(QT, P.Tq - t0);
    const bool tree = P.mask != nullptr;
    const int kv_end = tree ? P.pos0 + P.Tq : P.pos0 + t0 + nt;
    const int kb0 = split * P.split_len, kb1 = min(kb0 + P.split_len, kv_end);

    // row r: token t0 + r / G, query head g*G + r % G
    for (int idx = tid; idx < R * HD; idx += THREADS) {
        const int r = idx / HD, d = idx % HD, tt = r / G;
        const bool on = tt < nt;
        Qs[idx] = on ? P.qf[((size_t)(t0 + tt) * P.nh + g * G + r % G) * HD + d] * 0.0625f : 0.0f;
    }
    if (tid < R) {
        const int tt = tid / G;
        const bool on = tt < nt;
        rlim[tid] = on ? P.pos0 + t0 + tt : -1;
        rmask[tid] = on && tree ? P.mask[t0 + tt] : 0ull;
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    const int dp = tid & (HD / 2 - 1);  // PV: this thread's dim pair
    const int rb = tid / (HD / 2);      // PV: rows rb + 2a
    float acc[R / 2][2];
#pragma unroll
    for (int a = 0; a < R / 2; ++a) acc[a][0] = acc[a][1] = 0.0f;

    const uint16_t* kbase = P.kc + (size_t)g * P.max_ctx * HD;
    const uint16_t* vbase = P.vc + (size_t)g * P.max_ctx * HD;
    for (int kb = kb0; kb < kb1; kb += BKV) {
        __syncthreads();
        for (int idx = tid; idx < BKV * (HD / 8); idx += THREADS) {
            const int j = idx / (HD / 8), c = idx % (HD / 8);
            uint4 k4 = make_uint4(0, 0, 0, 0), v4 = make_uint4(0, 0, 0, 0);
            if (kb + j < kb1) {
                k4 = *reinterpret_cast<const uint4*>(kbase + (size_t)(kb + j) * HD + c * 8);
                v4 = *reinterpret_cast<const uint4*>(vbase + (size_t)(kb + j) * HD + c * 8);
            }
            uint32_t* kd = Ks + j * KW + c * 4;
            uint32_t* vd = Vs + j * KW + c * 4;
            kd[0] = k4.x, kd[1] = k4.y, kd[2] = k4.z, kd[3] = k4.w;
            vd[0] = v4.x, vd[1] = v4.y, vd[2] = v4.z, vd[3] = v4.w;
        }
        __syncthreads();
        {
            // scores: key kb + lane, rows warp + 8a
            float s[R / 8];
#pragma unroll
            for (int a = 0; a < R / 8; ++a) s[a] = 0.0f;
            for (int w2 = 0; w2 < HD / 2; ++w2) {
                const float2 kf = kv2f<KVT>(Ks[lane * KW + w2]);
#pragma unroll
                for (int a = 0; a < R / 8; ++a) {
                    const float2 q2 = *reinterpret_cast<const float2*>(Qs + (warp + 8 * a) * HD + 2 * w2);
                    s[a] = fmaf(q2.x, kf.x, fmaf(q2.y, kf.y, s[a]));
                }
            }
            const int key = kb + lane;
#pragma unroll
            for (int a = 0; a < R / 8; ++a) {
                const int r = warp + 8 * a;
                bool vis = rlim[r] >= 0 && key < kb1;
                if (tree) {
                    const int j = key - P.pos0;
                    vis = vis && (j < 0 || ((rmask[r] >> j) & 1ull));
                } else {
                    vis = vis && key <= rlim[r];
                }
                Ps[r * PP + lane] = vis ? s[a] : -INFINITY;
            }
        }
        __syncthreads();
        // online softmax: warp w owns rows w*R/8 .. w*R/8 + R/8 - 1
#pragma unroll
        for (int a = 0; a < R / 8; ++a) {
            const int r = warp * (R / 8) + a;
            const float val = Ps[r * PP + lane];
            const float m_old = mrow[r];
            const float m_new = fmaxf(m_old, lb::warp_max(val));
            const float pexp = val == -INFINITY ? 0.0f : expf(val - m_new);
            const float sum = lb::warp_sum(pexp);
            Ps[r * PP + lane] = pexp;
            __syncwarp();
            if (lane == 0) {
                const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                arow[r] = alpha;
                lrow[r] = lrow[r] * alpha + sum;
                mrow[r] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < R / 2; ++a) {
            const float al = arow[rb + 2 * a];
            acc[a][0] *= al;
            acc[a][1] *= al;
        }
        for (int j = 0; j < BKV; ++j) {
            const float2 vf = kv2f<KVT>(Vs[j * KW + dp]);
#pragma unroll
            for (int a = 0; a < R / 2; ++a) {
                const float pr = Ps[(rb + 2 * a) * PP + j];
                acc[a][0] = fmaf(pr, vf.x, acc[a][0]);
                acc[a][1] = fmaf(pr, vf.y, acc[a][1]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < R / 2; ++a) {
        const int r = rb + 2 * a, tt = r / G;
        if (tt >= nt) continue;
        const int t = t0 + tt, h = g * G + r % G;
        if (P.n_splits == 1) {
            const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
            const float* gt = P.gate + (size_t)t * P.gate_ld + (size_t)h * P.gate_hs + 2 * dp;
            *reinterpret_cast<float2*>(P.out + ((size_t)t * P.nh + h) * HD + 2 * dp) =
                make_float2(acc[a][0] * inv * sigmoidf_(gt[0]), acc[a][1] * inv * sigmoidf_(gt[1]));
        } else {
            const size_t row = ((size_t)split * P.Tq + t) * P.nh + h;
            *reinterpret_cast<float2*>(P.part_acc + row * HD + 2 * dp) = make_float2(acc[a][0], acc[a][1]);
            if (dp == 0) *reinterpret_cast<float2*>(P.part_ml + row * 2) = make_float2(mrow[r], lrow[r]);
        }
    }
}

// One block per (query, head), one thread per dim: merge the splits' partial softmaxes, apply the gate.
__global__ void __launch_bounds__(HD) combine_kernel(const Params P) {
    const int th = blockIdx.x, t = th / P.nh, h = th % P.nh, d = threadIdx.x;
    const size_t stride = (size_t)P.Tq * P.nh;
    float M = -INFINITY;
    for (int s = 0; s < P.n_splits; ++s) M = fmaxf(M, P.part_ml[(s * stride + th) * 2]);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < P.n_splits; ++s) {
        const float m = P.part_ml[(s * stride + th) * 2];
        if (m == -INFINITY) continue;  // a split with no visible key
        const float w = expf(m - M);
        L = fmaf(P.part_ml[(s * stride + th) * 2 + 1], w, L);
        o = fmaf(P.part_acc[(s * stride + th) * HD + d], w, o);
    }
    const float gt = P.gate[(size_t)t * P.gate_ld + (size_t)h * P.gate_hs + d];
    P.out[(size_t)th * HD + d] = L > 0.0f ? o / L * sigmoidf_(gt) : 0.0f;
}

template <int R, int KVT>
cudaError_t launch(const Params& P, cudaStream_t s) {
    const size_t smem = smem_bytes<R>();
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<R, KVT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int qt = R / P.group;
    const dim3 grid((unsigned)((P.Tq + qt - 1) / qt), (unsigned)P.nkv, (unsigned)P.n_splits);
    attn_kernel<R, KVT><<<grid, THREADS, smem, s>>>(P);
    return cudaGetLastError();
}

}  // namespace

size_t partials_bytes(int tq, int nh, int max_splits) {
    return max_splits > 1 ? (size_t)max_splits * tq * nh * (HD + 2) * 4 : 0;
}

int run(Params P, int kv_dtype, void* partials, int max_splits, cudaStream_t s) {
    const int R = P.Tq == 1 ? 8 : 32;
    const int qtiles = (P.Tq + R / P.group - 1) / (R / P.group);
    // Keys the widest query tile reads: all committed rows plus the new ones.
    const int kv_rows = P.pos0 + P.Tq;
    int splits = 1;
    if (partials && max_splits > 1) {
        int dev = 0, sms = 1;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return (int)e;
        // about two blocks per SM, never a split shorter than one tile
        const int want = (2 * sms + qtiles * P.nkv - 1) / (qtiles * P.nkv);
        splits = std::max(1, std::min({want, max_splits, (kv_rows + BKV - 1) / BKV}));
    }
    P.split_len = (kv_rows + splits - 1) / splits;
    P.split_len = (P.split_len + BKV - 1) / BKV * BKV;
    P.n_splits = (kv_rows + P.split_len - 1) / P.split_len;
    if (P.n_splits > 1) {
        P.part_acc = static_cast<float*>(partials);
        P.part_ml = P.part_acc + (size_t)P.n_splits * P.Tq * P.nh * HD;
    }
    cudaError_t e;
    if (R == 8)
        e = kv_dtype == KV_BF16 ? launch<8, KV_BF16>(P, s) : launch<8, KV_F16>(P, s);
    else
        e = kv_dtype == KV_BF16 ? launch<32, KV_BF16>(P, s) : launch<32, KV_F16>(P, s);
    if (e != cudaSuccess || P.n_splits == 1) return (int)e;
    combine_kernel<<<P.Tq * P.nh, HD, 0, s>>>(P);
    return (int)cudaGetLastError();
}

}  // namespace attn

extern "C" LB_API uint64_t lb_attn_partials_bytes(int tq, int n_heads, int max_splits) {
    return tq >= 1 && n_heads >= 1 ? (uint64_t)attn::partials_bytes(tq, n_heads, max_splits) : 0;
}

extern "C" LB_API int lb_attn_decode(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype,
                                     const void* gate, int gate_ld, int gate_hs, void* out, void* partials,
                                     int max_splits, int n_ctx, int n_heads, int n_kv_heads, int max_ctx,
                                     void* stream) {
    LB_CHECK_ARG(n_ctx >= 1, "n_ctx (rows including this token's) must be positive");
    return lb_attn_causal(qf, k_cache, v_cache, kv_dtype, gate, gate_ld, gate_hs, out, partials, max_splits, 1,
                          n_ctx - 1, n_heads, n_kv_heads, max_ctx, stream);
}
