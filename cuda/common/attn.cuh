// Gated full attention helpers shared by cuda/ops/attn_{rope,decode,tree}.cu (27B-capable: head_dim 256,
// any n_heads / n_kv with group = n_heads / n_kv <= 8, GQA kv head of query head h = h / group as in
// cpu.py _attend). KV cache per layer: [n_kv, max_ctx, 256] of f16 (LB_KV_F16) or bf16 (LB_KV_BF16),
// K after RMSNorm1p and RoPE; V as projected.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "lb_arch.cuh"

namespace attn {

constexpr int HD = 256;       // head_dim
constexpr int MAX_GROUP = 8;  // query heads per kv head
constexpr int BKV = 32;       // keys per tile (one per lane in the score phase)
constexpr int MAX_TREE = 64;  // tree slots (one uint64 ancestor mask per slot)

enum { KV_F16 = 0, KV_BF16 = 1 };

// Two 16-bit cache values packed in a 32-bit word -> floats.
template <int KVT>
__device__ __forceinline__ float2 kv2f(uint32_t w) {
    if constexpr (KVT == KV_BF16) {
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    } else {
        __half2 h;
        *reinterpret_cast<uint32_t*>(&h) = w;
        return __half22float2(h);
    }
}

template <int KVT>
__device__ __forceinline__ uint16_t f2kv(float x) {
    if constexpr (KVT == KV_BF16) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    } else {
        return __half_as_ushort(__float2half_rn(x));
    }
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// One thread's share of a K / V tile of BKV rows from kv row kb (rows at or past kb1 load as zeros) into registers,
// PF 16-byte pieces of each, issued before the current tile's compute so that the HBM latency is paid once per block.
// Shared by attn_kernel and the fused decode kernel.
template <int PF, int THREADS>
__device__ __forceinline__ void fetch_kv_tile(uint4 (&pk)[PF], uint4 (&pv)[PF], const uint16_t* kbase,
                                              const uint16_t* vbase, int kb, int kb1, int tid) {
#pragma unroll
    for (int i = 0; i < PF; ++i) {
        const int idx = tid + i * THREADS, j = idx / (HD / 8), c = idx % (HD / 8);
        pk[i] = pv[i] = make_uint4(0, 0, 0, 0);
        if (kb + j < kb1) {
            pk[i] = *reinterpret_cast<const uint4*>(kbase + (size_t)(kb + j) * HD + c * 8);
            pv[i] = *reinterpret_cast<const uint4*>(vbase + (size_t)(kb + j) * HD + c * 8);
        }
    }
}

// The split-KV tile's second half for one thread: rescale its R/2 rows of accumulators (dims 2dp, 2dp + 1) by the
// rows' alpha, then add P · V over the tile's BKV keys. P rows pitch PR floats in Ps, keyed [key][row]; V rows of
// KW 32-bit words (two dims each). R a multiple of 8. Shared by attn_kernel<R> and the fused decode kernel.
template <int R, int KVT, int PR, int KW>
__device__ __forceinline__ void rescale_accumulate_pv(float (&acc)[R / 2][2], const float* arow, const float* Ps,
                                                      const uint32_t* Vs, int rb, int dp) {
#pragma unroll
    for (int a = 0; a < R / 2; ++a) {
        const float al = arow[rb * (R / 2) + a];
        acc[a][0] *= al;
        acc[a][1] *= al;
    }
#pragma unroll 2
    for (int j = 0; j < BKV; ++j) {
        const float2 vf = kv2f<KVT>(Vs[j * KW + dp]);
        const float4* p4 = reinterpret_cast<const float4*>(Ps + j * PR + rb * (R / 2));
#pragma unroll
        for (int a4 = 0; a4 < R / 8; ++a4) {
            const float4 pr = p4[a4];
            acc[4 * a4 + 0][0] = fmaf(pr.x, vf.x, acc[4 * a4 + 0][0]);
            acc[4 * a4 + 0][1] = fmaf(pr.x, vf.y, acc[4 * a4 + 0][1]);
            acc[4 * a4 + 1][0] = fmaf(pr.y, vf.x, acc[4 * a4 + 1][0]);
            acc[4 * a4 + 1][1] = fmaf(pr.y, vf.y, acc[4 * a4 + 1][1]);
            acc[4 * a4 + 2][0] = fmaf(pr.z, vf.x, acc[4 * a4 + 2][0]);
            acc[4 * a4 + 2][1] = fmaf(pr.z, vf.y, acc[4 * a4 + 2][1]);
            acc[4 * a4 + 3][0] = fmaf(pr.w, vf.x, acc[4 * a4 + 3][0]);
            acc[4 * a4 + 3][1] = fmaf(pr.w, vf.y, acc[4 * a4 + 3][1]);
        }
    }
}

// One row of a flash-attention online softmax over a key tile, called by every lane of one warp for the same row:
// the lane's score *p (-inf: masked) becomes exp(score - new max) in place, and lane 0 moves the row's running max
// m and sum l and stores alpha, the factor the row's accumulators are rescaled by. Shared by the decode, causal
// prefill and fused decode kernels so that all three round the same way.
__device__ __forceinline__ void online_softmax_row(float* p, float& m, float& l, float& alpha, int lane) {
    const float val = *p;
    const float m_old = m;
    const float m_new = fmaxf(m_old, lb::warp_max(val));
    const float pexp = val == -INFINITY ? 0.0f : expf(val - m_new);
    const float sum = lb::warp_sum(pexp);
    *p = pexp;
    __syncwarp();
    if (lane == 0) {
        const float a = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        alpha = a;
        l = l * a + sum;
        m = m_new;
    }
}

// One attention launch: Tq queries over the cache of one layer, with either a causal rule (mask ==
// nullptr: query t sits at position pos0 + t and sees rows [0, pos0 + t]) or a tree rule (mask != nullptr:
// every query sees the committed rows [0, pos0) plus rows pos0 + j for each bit j of mask[t]; the tree
// slots' own K/V sit at rows pos0 + slot).
struct Params {
    const float* qf;      // [Tq, nh, 256] normed + RoPE'd, unscaled
    const uint16_t* kc;   // [nkv, max_ctx, 256]
    const uint16_t* vc;
    const float* gate;    // gate of query t, head h, dim d at gate[t*gate_ld + h*gate_hs + d]
    int gate_ld, gate_hs;
    float* out;           // [Tq, nh*256] = softmax(q·Kᵀ/16)·V ⊙ sigmoid(gate) (written when n_splits == 1)
    uint16_t* out_split;  // or nullptr; else instead of out: [2][Tq, nh*256] bf16 hi, lo = bf16(x - hi)
                          // (the 0.8B prefill's o_proj input; causal, bf16 cache, tensor cores only)
    float* part_acc;      // [n_splits, Tq, nh, 256] unnormalised partial outputs (n_splits > 1)
    float* part_ml;       // [n_splits, Tq, nh, 2] running max and sum of each partial
    const uint64_t* mask; // [Tq] tree ancestor masks, or nullptr (causal)
    int Tq, pos0, nh, nkv, group, max_ctx;
    int n_splits, split_len;  // keys per split, a multiple of BKV
};

}  // namespace attn
