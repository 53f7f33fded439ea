// Gated full attention decode step inside the megakernel, split over (q head, context split) items
// (flash-decoding). Each item writes a partial (m, l, acc[256]); the o_proj prologue combines the
// splits of a head redundantly in every block, which saves a grid barrier.
//
// The current token's k/v are computed (norm + RoPE) by every item of the last split from the
// in-projection output and used from shared memory; one item per kv head also stores them into the
// cache at `pos`. Other items read only positions < pos, so no barrier orders the cache write.
#pragma once

#include "mk_common.cuh"

namespace mk {

// Splits per head for a context of pos + 1 tokens: ~64 positions each, at most max_splits.
__device__ __forceinline__ int attn_splits(const Params& P, int pos) {
    return max(1, min(P.max_splits, (pos + 1 + 63) / 64));
}

// RMSNorm1p over one 256-wide head held by 8 warps (threads [base, base+256)); returns x * r * w.
__device__ __forceinline__ float head_rmsnorm(float x, const float* w, int d, const Params& P, float* red, int group) {
    const float s = lb::warp_sum(x * x);
    if (lb::lane_id() == 0) red[lb::warp_id()] = s;
    __syncthreads();
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) ss += red[group * 8 + k];
    return x * rsqrtf(ss / AT_D + P.eps) * w[d];
}

__device__ __forceinline__ void rope_pair(float* v, int i, float c, float s) {
    const float a = v[i], b = v[i + ROPE_HALF];
    v[i] = a * c - b * s;
    v[i + ROPE_HALF] = b * c + a * s;
}

__device__ void attn_phase(const Params& P, const Smem& sm, const Layer& L, int pos) {
    float* qs = sm.xs;               // [AT_D]
    float* kcur = sm.xs + AT_D;      // [AT_D]
    float* vcur = sm.xs + 2 * AT_D;  // [AT_D]
    float* accs = sm.xs + 3 * AT_D;  // [AT_D]
    float* ml = sm.xs + 4 * AT_D;    // [2 * WARPS]
    const int t = threadIdx.x, lane = lb::lane_id(), warp = lb::warp_id();
    const int S = attn_splits(P, pos);
    const int chunk = (pos + S - 1) / S;
    for (int item = blockIdx.x; item < AT_HQ * S; item += gridDim.x) {
        const int h = item / S, s = item % S;
        const int kvh = h / (AT_HQ / AT_HKV);
        const bool last = s == S - 1;
        const int p0 = min(pos, s * chunk), p1 = min(pos, p0 + chunk);
        // q (threads 0..255) and the current k (256..511) normed; v copied
        const int d = t & (AT_D - 1);
        const float raw = t < AT_D ? ldcg(P.y_in + h * 2 * AT_D + d) : ldcg(P.y_in + AT_Q + kvh * AT_D + d);
        const float nv = head_rmsnorm(raw, t < AT_D ? L.q_norm : L.k_norm, d, P, sm.red, t / AT_D);
        if (t < AT_D) {
            qs[d] = nv;
            vcur[d] = ldcg(P.y_in + AT_Q + AT_HKV * AT_D + kvh * AT_D + d);
            accs[d] = 0.0f;
        } else {
            kcur[d] = nv;
        }
        __syncthreads();
        if (t < 2 * ROPE_HALF) {
            const int i = t & (ROPE_HALF - 1);
            const float inv_freq = powf(P.rope_theta, -(float)(2 * i) / (float)(2 * ROPE_HALF));
            float sn, cs;
            sincosf((float)pos * inv_freq, &sn, &cs);
            rope_pair(t < ROPE_HALF ? qs : kcur, i, cs, sn);
        }
        __syncthreads();
        // The cache stores bf16: the current token scores against the same rounded values later steps see.
        if (t < AT_D) {
            vcur[d] = bf16_to_f(f_to_bf16(vcur[d]));
        } else {
            kcur[d] = bf16_to_f(f_to_bf16(kcur[d]));
        }
        if (last && h % (AT_HQ / AT_HKV) == 0) {
            const size_t off = ((size_t)kvh * P.max_ctx + pos) * AT_D + d;
            if (t < AT_D) L.vc[off] = f_to_bf16(vcur[d]);
            else L.kc[off] = f_to_bf16(kcur[d]);
        }
        __syncthreads();

        float q8[8], acc[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            q8[k] = qs[lane * 8 + k] * 0.0625f;  // 1/sqrt(256)
            acc[k] = 0.0f;
        }
        float m = -INFINITY, l = 0.0f;
        const int pend = last ? p1 + 1 : p1;
        for (int p = p0 + warp; p < pend; p += WARPS) {
            float k8[8], v8[8];
            if (p == pos) {
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    k8[k] = kcur[lane * 8 + k];
                    v8[k] = vcur[lane * 8 + k];
                }
            } else {
                const size_t off = ((size_t)kvh * P.max_ctx + p) * AT_D + lane * 8;
                const uint4 kr = __ldcg(reinterpret_cast<const uint4*>(L.kc + off));
                const uint4 vr = __ldcg(reinterpret_cast<const uint4*>(L.vc + off));
                const uint32_t kw[4] = {kr.x, kr.y, kr.z, kr.w}, vw[4] = {vr.x, vr.y, vr.z, vr.w};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    k8[2 * k] = bf16_lo(kw[k]);
                    k8[2 * k + 1] = bf16_hi(kw[k]);
                    v8[2 * k] = bf16_lo(vw[k]);
                    v8[2 * k + 1] = bf16_hi(vw[k]);
                }
            }
            float sc = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) sc = fmaf(q8[k], k8[k], sc);
            sc = lb::warp_sum(sc);
            const float mn = fmaxf(m, sc);
            const float scale = expf(m - mn), pe = expf(sc - mn);
            l = l * scale + pe;
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] = fmaf(acc[k], scale, pe * v8[k]);
            m = mn;
        }
        if (lane == 0) {
            ml[warp] = m;
            ml[WARPS + warp] = l;
        }
        __syncthreads();
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, ml[w]);
        const float f = m == -INFINITY ? 0.0f : expf(m - M);
#pragma unroll
        for (int k = 0; k < 8; ++k) atomicAdd(&accs[lane * 8 + k], acc[k] * f);
        __syncthreads();
        float* part = P.attn_part + ((size_t)h * P.max_splits + s) * AT_PART;
        if (t == 0) {
            float Ls = 0.0f;
            for (int w = 0; w < WARPS; ++w) Ls += ml[w] == -INFINITY ? 0.0f : ml[WARPS + w] * expf(ml[w] - M);
            part[0] = M;
            part[1] = Ls;
        }
        if (t < AT_D) part[2 + t] = accs[t];
        __syncthreads();
    }
}

// xs[h*256 + d] = (combined attention output) * sigmoid(gate_h[d]) for the o_proj GEMV.
__device__ __forceinline__ void x_attn_combine(const Params& P, const Smem& sm, int pos) {
    const int S = attn_splits(P, pos);
    for (int i = threadIdx.x; i < AT_O; i += THREADS) {
        const int h = i / AT_D, d = i % AT_D;
        const float* part = P.attn_part + (size_t)h * P.max_splits * AT_PART;
        float M = -INFINITY;
        for (int s = 0; s < S; ++s) M = fmaxf(M, ldcg(part + s * AT_PART));
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < S; ++s) {
            const float ms = ldcg(part + s * AT_PART);
            if (ms == -INFINITY) continue;
            const float f = expf(ms - M);
            den = fmaf(ldcg(part + s * AT_PART + 1), f, den);
            num = fmaf(ldcg(part + s * AT_PART + 2 + d), f, num);
        }
        const float gate = ldcg(P.y_in + h * 2 * AT_D + AT_D + d);
        sm.xs[xperm(i)] = num / den * sigmoidf(gate);
    }
    __syncthreads();
}

}  // namespace mk
