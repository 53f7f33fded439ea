// Weight streaming for the megakernel: every matrix-vector phase of a token (4 per layer, then the LM
// head) reads its rows through one shared-memory ring of 16 KB chunks filled by cp.async.
//
// Why a ring: the weights do not depend on activations, so the producer cursor runs ahead of the
// consumer across phase boundaries and grid barriers. While a block waits at a barrier or works on a
// serial phase (recurrence, attention), up to nslots chunks of its next weights are already in flight,
// which keeps HBM busy through the ~120 barriers of a token.
//
// Each block owns the contiguous row range [M*b/nb, M*(b+1)/nb) of every matrix; a chunk is a run of
// whole rows, so it is one contiguous byte range and a row's dot product completes inside one chunk.
#pragma once

#include "mk_common.cuh"

namespace mk {

struct Ring {
    int head;    // chunks issued (sequence number of the next one)
    int tail;    // chunks consumed
    int pp;      // producer: GEMV phase index within a step, [0, 4 * n_layers]
    int prow;    // producer: next row to issue in phase pp
    int psteps;  // producer: steps left to prefetch, the current one included
    int hslot;   // slot of the next issue (head % nslots)
    int tslot;   // slot of the next consume (tail % nslots)
    unsigned tpar;  // mbarrier phase parity expected at tslot
};

// mbarrier arrivals per phase: one bulk-copy arrival on sm_90, every thread's cp.async arrival before.
__device__ __forceinline__ unsigned mbar_count() {
#if LB_DEVICE_ARCH >= 900
    return 1;
#else
    return THREADS;
#endif
}

__device__ __forceinline__ int n_gemv_phases(const Params& P) { return 4 * P.n_layers + 1; }

// Matrix of GEMV phase pp: [in, out, gate|up, down] per layer, then the tied LM head.
__device__ __forceinline__ void gemv_desc(const Params& P, int pp, const uint16_t*& w, int& M, int& K) {
    if (pp == 4 * P.n_layers) {
        w = P.embed;
        M = P.vocab;
        K = HID;
        return;
    }
    const Layer& L = P.layers[pp >> 2];
    switch (pp & 3) {
        case 0: w = L.w_in; M = L.m_in; K = HID; break;
        case 1: w = L.w_out; M = HID; K = DN_Z; break;
        case 2: w = L.w_gu; M = 2 * FFN; K = HID; break;
        default: w = L.w_down; M = HID; K = FFN; break;
    }
}

__device__ __forceinline__ int row_begin(int M) { return (int)((long long)M * blockIdx.x / gridDim.x); }
__device__ __forceinline__ int row_end(int M) { return (int)((long long)M * (blockIdx.x + 1) / gridDim.x); }
__device__ __forceinline__ int rows_per_chunk(int K) { return SLOT_BYTES / (2 * K); }

// Per-block phase table, filled once per launch (avoids 64-bit divisions per chunk).
__device__ __forceinline__ void build_phase_table(const Params& P, const Smem& sm) {
    for (int pp = threadIdx.x; pp < n_gemv_phases(P); pp += THREADS) {
        const uint16_t* w;
        int M, K;
        gemv_desc(P, pp, w, M, K);
        sm.ph[pp] = PhaseDesc{w, row_begin(M), row_end(M), K, {0, 0, 0}};
    }
}

// Issue chunks until the ring is full or nothing is left to prefetch. Called by all threads with
// identical cursors. sm_90: thread 0 issues one bulk copy per chunk (the copy engine keeps far more
// bytes in flight than per-thread cp.async); older archs: each thread copies its 16-byte pieces.
__device__ __forceinline__ void ring_fill(const Params& P, const Smem& sm, Ring& R) {
    while (R.psteps > 0 && R.head - R.tail < P.nslots) {
        const PhaseDesc d = sm.ph[R.pp];
        const int n = min(rows_per_chunk(d.K), d.r1 - R.prow);
        if (n > 0) {
            const uint8_t* src = reinterpret_cast<const uint8_t*>(d.w + (size_t)R.prow * d.K);
            uint8_t* dst = sm.slots + (size_t)R.hslot * SLOT_BYTES;
            const int bytes = n * d.K * 2;
#if LB_DEVICE_ARCH >= 900
            if (threadIdx.x == 0) bulk_copy(dst, src, bytes, &sm.mbar[R.hslot]);
#else
            for (int off = threadIdx.x * 16; off < bytes; off += THREADS * 16) cp_async16(dst + off, src + off);
            mbar_arrive_cp_async(&sm.mbar[R.hslot]);
#endif
            R.head++;
            R.hslot = R.hslot + 1 == P.nslots ? 0 : R.hslot + 1;
            R.prow += n;
        }
        if (R.prow >= d.r1) {
            if (++R.pp == n_gemv_phases(P)) {
                R.pp = 0;
                R.psteps--;
            }
            R.prow = sm.ph[R.pp].r0;
        }
    }
}

// 8 bf16 weights (16 bytes) of one row against xs[e .. e+8).
__device__ __forceinline__ float dot8(const uint16_t* wrow, int e, const float* xs) {
    const uint4 wv = *reinterpret_cast<const uint4*>(wrow + e);
    const float4 xa = *reinterpret_cast<const float4*>(xs + e);
    const float4 xb = *reinterpret_cast<const float4*>(xs + e + 4);
    float s = bf16_lo(wv.x) * xa.x;
    s = fmaf(bf16_hi(wv.x), xa.y, s);
    s = fmaf(bf16_lo(wv.y), xa.z, s);
    s = fmaf(bf16_hi(wv.y), xa.w, s);
    s = fmaf(bf16_lo(wv.z), xb.x, s);
    s = fmaf(bf16_hi(wv.z), xb.y, s);
    s = fmaf(bf16_lo(wv.w), xb.z, s);
    return fmaf(bf16_hi(wv.w), xb.w, s);
}

// One GEMV phase: y[row] = W[row, :] · xs for this block's rows; epi(row, value) consumes each result
// (called by thread t < rows-in-chunk for row t of the chunk). xs must be ready in shared memory.
template <class Epi>
__device__ __forceinline__ void gemv_run(const Params& P, const Smem& sm, Ring& R, int pp, Epi epi) {
    const PhaseDesc d = sm.ph[pp];
    const int r0 = d.r0, r1 = d.r1, K = d.K;
    const int rpc = rows_per_chunk(K);
    const int segs = K >> 8;  // 256-element segments: one warp pass of 16-byte loads
    const int lane = lb::lane_id(), warp = lb::warp_id();
    for (int row = r0; row < r1; row += rpc) {
        const int n = min(rpc, r1 - row);
        const int slot = R.tslot;
        mbar_wait(&sm.mbar[slot], R.tpar);
        float* acc = sm.acc + (R.tail & 1) * MAX_RPC;
        const uint16_t* ws = reinterpret_cast<const uint16_t*>(sm.slots + (size_t)slot * SLOT_BYTES);
        // Two items per pass: their loads and shuffle reductions interleave (half the latency chain).
        const int items = n * segs;
        int it = warp;
        for (; it + WARPS < items; it += 2 * WARPS) {
            const int ra = it / segs, rb = (it + WARPS) / segs;
            float sa = dot8(ws + ra * K, (it - ra * segs) * 256 + lane * 8, sm.xs);
            float sb = dot8(ws + rb * K, (it + WARPS - rb * segs) * 256 + lane * 8, sm.xs);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                sa += __shfl_xor_sync(LB_FULL_MASK, sa, off);
                sb += __shfl_xor_sync(LB_FULL_MASK, sb, off);
            }
            if (lane == 0) {
                atomicAdd(&acc[ra], sa);
                atomicAdd(&acc[rb], sb);
            }
        }
        if (it < items) {
            const int r = it / segs;
            const float s = lb::warp_sum(dot8(ws + r * K, (it - r * segs) * 256 + lane * 8, sm.xs));
            if (lane == 0) atomicAdd(&acc[r], s);
        }
        // All reads of the slot and all partial sums are done: the slot may be refilled.
        __syncthreads();
        if (threadIdx.x < n) {
            const float v = acc[threadIdx.x];
            acc[threadIdx.x] = 0.0f;
            epi(row + (int)threadIdx.x, v);
        }
        R.tail++;
        if (++R.tslot == P.nslots) {
            R.tslot = 0;
            R.tpar ^= 1u;
        }
        ring_fill(P, sm, R);
    }
}

// ---- prologues: build the GEMV input vector xs (all threads; ends with __syncthreads) ----------

// xs = RMSNorm(src) * w over HID; src is the fp32 residual or a bf16 embedding row.
__device__ __forceinline__ void x_rmsnorm(const Params& P, const Smem& sm, const float* src, const uint16_t* src_bf16,
                                          const float* w) {
    float v[HID / THREADS];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < HID / THREADS; ++k) {
        const int i = threadIdx.x + k * THREADS;
        v[k] = src_bf16 ? bf16_to_f(src_bf16[i]) : ldcg(src + i);
        ss += v[k] * v[k];
    }
    ss = block_sum(ss, sm.red);
    const float r = rsqrtf(ss / HID + P.eps);
#pragma unroll
    for (int k = 0; k < HID / THREADS; ++k) {
        const int i = threadIdx.x + k * THREADS;
        sm.xs[i] = v[k] * r * w[i];
    }
    __syncthreads();
}

// xs = SiLU(gate) * up, the SwiGLU input of ffn_down.
__device__ __forceinline__ void x_swiglu(const Params& P, const Smem& sm) {
    for (int i = threadIdx.x; i < FFN; i += THREADS) sm.xs[i] = silu(ldcg(P.gu + i)) * ldcg(P.gu + FFN + i);
    __syncthreads();
}

// xs = RMSNorm(o_head) * ssm_norm * SiLU(z_head) per DeltaNet value head (one warp per head).
__device__ __forceinline__ void x_dn_gated_norm(const Params& P, const Smem& sm, const Layer& L) {
    static_assert(WARPS == DN_H, "one warp per DeltaNet head");
    const int h = lb::warp_id(), d = lb::lane_id() * 4;
    float o[4], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        o[k] = ldcg(P.o_buf + h * DN_D + d + k);
        ss += o[k] * o[k];
    }
    ss = lb::warp_sum(ss);
    const float r = rsqrtf(ss / DN_D + P.eps);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float z = ldcg(P.y_in + DN_QKV + h * DN_D + d + k);
        sm.xs[h * DN_D + d + k] = o[k] * r * L.ssm_norm[d + k] * silu(z);
    }
    __syncthreads();
}

}  // namespace mk
