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
        // This warp's first KV_ROWS cached K/V rows are loaded now, so they are in flight during the norms and
        // RoPE; later rows go KV_ROWS per round trip. (4 rows spilled registers: the kernel is at 128 per thread.)
        constexpr int KV_ROWS = LB_DEVICE_ARCH >= 900 ? 2 : 1;  // sm_86: 2 rows spill (128-register limit)
        uint4 kr[KV_ROWS], vr[KV_ROWS];
        auto load_rows = [&](int pb) {
#pragma unroll
            for (int j = 0; j < KV_ROWS; ++j) {
                const int p = pb + j * WARPS;
                kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
                if (p < p1) {  // rows < p1 <= pos are in the cache
                    const size_t off = ((size_t)kvh * P.max_ctx + p) * AT_D + lane * 8;
                    kr[j] = __ldcg(reinterpret_cast<const uint4*>(L.kc + off));
                    vr[j] = __ldcg(reinterpret_cast<const uint4*>(L.vc + off));
                }
            }
        };
        load_rows(p0 + warp);
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
        for (int pb = p0 + warp; pb < pend; pb += KV_ROWS * WARPS) {
            if (pb != p0 + warp) load_rows(pb);
#pragma unroll
            for (int j = 0; j < KV_ROWS; ++j) {
            const int p = pb + j * WARPS;
            if (p >= pend) break;
            float k8[8], v8[8];
            if (p == pos) {
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    k8[k] = kcur[lane * 8 + k];
                    v8[k] = vcur[lane * 8 + k];
                }
            } else {
                const uint32_t kw[4] = {kr[j].x, kr[j].y, kr[j].z, kr[j].w}, vw[4] = {vr[j].x, vr[j].y, vr[j].z, vr[j].w};
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
        // The last split of head h to finish combines the head (flash-decoding reduction) into attn_out, so
        // the o_proj prologue is one load per value instead of a walk over every split in every block.
        if (t == 0) {
            __threadfence();
            sm.misc[1] = atomicAdd(&P.attn_cnt[h], 1u) == (unsigned)(S - 1);
        }
        __syncthreads();
        if (sm.misc[1]) {
            __threadfence();
            float* ms = sm.xs + AT_O;  // [S] split maxima, then weights; past the scratch above
            float* ls = ms + S;        // [S]
            const float* hp = P.attn_part + (size_t)h * P.max_splits * AT_PART;
            for (int i = t; i < S; i += THREADS) {
                ms[i] = ldcg(hp + (size_t)i * AT_PART);
                ls[i] = ldcg(hp + (size_t)i * AT_PART + 1);
            }
            __syncthreads();
            if (t < AT_D) {
                float M = -INFINITY, den = 0.0f;
                for (int i = 0; i < S; ++i) M = fmaxf(M, ms[i]);
                for (int i = 0; i < S; ++i)
                    if (ms[i] != -INFINITY) den = fmaf(ls[i], expf(ms[i] - M), den);
                const float gate = ldcg(P.y_in + h * 2 * AT_D + AT_D + t);
                float o = 0.0f;
#pragma unroll 8
                for (int i = 0; i < S; ++i)
                    if (ms[i] != -INFINITY) o = fmaf(expf(ms[i] - M), ldcg(hp + (size_t)i * AT_PART + 2 + t), o);
                P.attn_out[h * AT_D + t] = o / den * sigmoidf(gate);
            }
            if (t == 0) P.attn_cnt[h] = 0;  // every split of h has arrived: ready for the next attention layer
        }
        __syncthreads();
    }
}

// xs = the combined, gated attention output (written by each head's last split) for the o_proj GEMV.
__device__ __forceinline__ void x_attn_out(const Params& P, const Smem& sm) {
    static_assert(AT_O % THREADS == 0, "o_proj prologue: whole passes");
    float v[AT_O / THREADS];
#pragma unroll
    for (int k = 0; k < AT_O / THREADS; ++k) v[k] = ldcg(P.attn_out + threadIdx.x + k * THREADS);
#pragma unroll
    for (int k = 0; k < AT_O / THREADS; ++k) sm.xs[xperm(threadIdx.x + k * THREADS)] = v[k];
    __syncthreads();
}

}  // namespace mk
