// Weight streaming for the megakernel: every matrix-vector phase of a token (4 per layer, then the LM
// head) reads its rows through shared-memory rings filled by the bulk-copy engine (sm_90) or cp.async.
//
// Why a ring: the weights do not depend on activations, so the producer cursor runs ahead of the
// consumer across phase boundaries and grid barriers. While a block waits at a barrier or works on a
// serial phase (recurrence, attention), its next weights are already in flight.
//
// Why one ring PER WARP (v3): v1/v2 consumed 16 KB chunks block-wide (mbarrier wait -> items -> smem
// atomics -> __syncthreads -> epilogue -> refill), a serial chain of ~2,500 cycles per chunk that held
// each SM near 13 GB/s. Here each of the 16 warps owns a contiguous run of the block's rows of every
// matrix and its own wslots slots: it waits only for its own chunks, refills the slot it just read, and
// never synchronises with the other warps inside a phase, so 16 independent streams keep the SM busy.
//
// Rows of a warp are contiguous in memory, so its stream is one byte range per phase, cut into chunks of
// slot_bytes; a chunk is a whole number of 512-byte segments (256 weights, one 16-byte load per lane) and
// rows (K = 1024, 2048 or 3584 = 4, 8 or 14 segments) may straddle chunks: the lane partial sums carry over.
#pragma once

#include "mk_common.cuh"

namespace mk {

// A position in this warp's chunk sequence (phases of a step in order, steps in order); every lane of a
// warp holds the same values.
struct Cursor {
    int pp;      // GEMV phase index within a step, [0, 4 * n_layers]
    int pbyte;   // next byte within this warp's range of phase pp
    int psteps;  // steps left, the current one included
};

// Per-warp ring state. (v3 also tried a second cursor that only prefetched into L2 further ahead, to keep
// HBM busy through barriers: 4-16 chunks per warp ahead cost 14-22% of tg128 (35-70 MB ahead thrashes the
// 50 MB L2 and delays the loads on the critical path), so it was removed; docs/perf.md has the numbers.)
struct Ring {
    int head;  // chunks issued into the ring (sequence number of the next one)
    int tail;  // chunks consumed
    Cursor prod;
};

// mbarrier arrivals per slot phase: one bulk-copy arrival on sm_90, the 32 lanes' cp.async arrivals before.
__device__ __forceinline__ unsigned mbar_count() {
#if LB_DEVICE_ARCH >= 900
    return 1;
#else
    return 32;
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

// Per-block phase table, filled once per launch (avoids 64-bit divisions per chunk).
__device__ __forceinline__ void build_phase_table(const Params& P, const Smem& sm) {
    for (int pp = threadIdx.x; pp < n_gemv_phases(P); pp += THREADS) {
        const uint16_t* w;
        int M, K;
        gemv_desc(P, pp, w, M, K);
        sm.ph[pp] = PhaseDesc{w, row_begin(M), row_end(M), K, {0, 0, 0}};
    }
}

// This warp's rows [r0, r1) of phase pp: the block's range split evenly over the warps.
struct WarpRange {
    const uint16_t* w;  // first weight of row r0
    int r0, r1, K;
    int bytes;  // (r1 - r0) * K * 2
};

__device__ __forceinline__ WarpRange warp_range(const Smem& sm, int pp, int warp) {
    const PhaseDesc d = sm.ph[pp];
    const int n = d.r1 - d.r0;
    WarpRange r;
    r.r0 = d.r0 + n * warp / WARPS;
    r.r1 = d.r0 + n * (warp + 1) / WARPS;
    r.K = d.K;
    r.w = d.w + (size_t)r.r0 * d.K;
    r.bytes = (r.r1 - r.r0) * d.K * 2;
    return r;
}

__device__ __forceinline__ uint8_t* warp_slot(const Params& P, const Smem& sm, int warp, int slot) {
    return sm.slots + ((size_t)warp * P.wslots + slot) * P.slot_bytes;
}

// The chunk at c (source and size), advancing c past it; false when the sequence is exhausted.
__device__ __forceinline__ bool cursor_next(const Params& P, const Smem& sm, Cursor& c, const uint8_t*& src, int& n) {
    const int warp = lb::warp_id();
    while (c.psteps > 0) {
        const WarpRange r = warp_range(sm, c.pp, warp);
        const bool has = c.pbyte < r.bytes;
        if (has) {
            src = reinterpret_cast<const uint8_t*>(r.w) + c.pbyte;
            n = min(P.slot_bytes, r.bytes - c.pbyte);
            c.pbyte += n;
        }
        if (c.pbyte >= r.bytes) {
            if (++c.pp == n_gemv_phases(P)) {
                c.pp = 0;
                c.psteps--;
            }
            c.pbyte = 0;
        }
        if (has) return true;
    }
    return false;
}

// Issue this warp's chunks until its ring is full or nothing is left to prefetch; with only_pp >= 0, only chunks
// of GEMV phase only_pp. All lanes call it with identical cursors. sm_90: lane 0 issues one bulk copy per chunk;
// older archs: 16-byte cp.async per lane.
__device__ __forceinline__ void ring_fill(const Params& P, const Smem& sm, Ring& R, int only_pp = -1) {
    const int warp = lb::warp_id(), lane = lb::lane_id();
    const uint8_t* src;
    int n;
    while (R.head - R.tail < P.wslots && (only_pp < 0 || R.prod.pp == only_pp) && cursor_next(P, sm, R.prod, src, n)) {
        const int slot = R.head % P.wslots;
        uint8_t* dst = warp_slot(P, sm, warp, slot);
        uint64_t* bar = &sm.mbar[warp * MAX_WSLOTS + slot];
#if LB_DEVICE_ARCH >= 900
        if (lane == 0) bulk_copy(dst, src, n, bar);
#else
        for (int off = lane * 16; off < n; off += 32 * 16) cp_async16(dst + off, src + off);
        mbar_arrive_cp_async(bar);
#endif
        R.head++;
    }
}

// One GEMV phase: y[row] = W[row, :] . x for this warp's rows; epi(row, value) consumes each result on
// lane 0 (rows in increasing order). x must be ready in shared memory (xperm order).
// kHold (lb_mk_config_t.ring_hold = 1; docs/perf.md "All-block timeline and ring_hold"): a grid barrier's release
// took 3-5 µs after a GEMV phase, 0.7 µs after the mixer, when no refills were in flight. With kHold a warp holds
// back the refill after the last chunk of a phase until it reads its next chunk (after the barrier and the
// prologue), so one slot of each warp's refills is not queued ahead of the barrier's round trip. A template
// parameter, and no more than that: at the persistent kernel's 128-register cap a runtime test, or a second
// refill site at the phase start (which could hold every refill for later phases), spilled on sm_90.
template <int kHold, class Epi>
__device__ __forceinline__ void gemv_run(const Params& P, const Smem& sm, Ring& R, int pp, Epi epi) {
    const int lane = lb::lane_id(), warp = lb::warp_id();
    const WarpRange r = warp_range(sm, pp, warp);
    int row = r.r0, col = 0;  // position of the next segment
    float acc = 0.0f;         // this lane's partial of the current row
    for (int byte = 0; byte < r.bytes; byte += P.slot_bytes) {
        const int slot = R.tail % P.wslots;
        mbar_wait(&sm.mbar[warp * MAX_WSLOTS + slot], (unsigned)(R.tail / P.wslots) & 1u);
        const uint8_t* ws = warp_slot(P, sm, warp, slot);
        const int nseg = min(P.slot_bytes, r.bytes - byte) / (2 * SEG);
        // Segments are independent dot products: compute them first (loads in flight together), then
        // fold them into rows in order.
        constexpr int UNROLL = LB_DEVICE_ARCH >= 900 ? 4 : 2;  // sm_86: the cp.async fill needs the registers
        for (int s0 = 0; s0 < nseg; s0 += UNROLL) {
            float part[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                part[u] = 0.0f;
                const int s = s0 + u;
                if (s < nseg) {
                    // column of segment s; col is segment s0's, and K >= 4 segments, so one wrap at most
                    int c = col + u * SEG;
                    if (c >= r.K) c -= r.K;
                    const uint4 wv = *reinterpret_cast<const uint4*>(ws + s * (2 * SEG) + lane * 16);
                    const float4 xa = *reinterpret_cast<const float4*>(sm.xs + c + lane * 4);
                    const float4 xb = *reinterpret_cast<const float4*>(sm.xs + c + 128 + lane * 4);
                    float d = bf16_lo(wv.x) * xa.x;
                    d = fmaf(bf16_hi(wv.x), xa.y, d);
                    d = fmaf(bf16_lo(wv.y), xa.z, d);
                    d = fmaf(bf16_hi(wv.y), xa.w, d);
                    d = fmaf(bf16_lo(wv.z), xb.x, d);
                    d = fmaf(bf16_hi(wv.z), xb.y, d);
                    d = fmaf(bf16_lo(wv.w), xb.z, d);
                    part[u] = fmaf(bf16_hi(wv.w), xb.w, d);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (s0 + u < nseg) {
                    acc += part[u];
                    col += SEG;
                    if (col == r.K) {
                        const float v = lb::warp_sum(acc);
                        if (lane == 0) epi(row, v);
                        acc = 0.0f;
                        col = 0;
                        ++row;
                    }
                }
            }
        }
        // Every lane's reads of the slot are done before it is refilled (generic -> async proxy).
        __syncwarp();
#if LB_DEVICE_ARCH >= 900
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
        R.tail++;
        // kHold: the refill after a phase's last chunk waits for the next chunk this warp reads, unless a slot
        // is already held (at most one: the ring never runs dry)
        if (!kHold || byte + P.slot_bytes < r.bytes || R.head - R.tail < P.wslots - 1) ring_fill(P, sm, R);
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
        sm.xs[xperm(i)] = v[k] * r * w[i];
    }
    __syncthreads();
}

// xs = SiLU(gate) * up, the SwiGLU input of ffn_down.
// All 14 L2 loads of a thread are issued before any is used: one L2 round trip instead of seven.
__device__ __forceinline__ void x_swiglu(const Params& P, const Smem& sm) {
    static_assert(FFN % THREADS == 0, "SwiGLU prologue: whole passes");
    constexpr int N = FFN / THREADS;
    float g[N], u[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        g[k] = ldcg(P.gu + threadIdx.x + k * THREADS);
        u[k] = ldcg(P.gu + FFN + threadIdx.x + k * THREADS);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) sm.xs[xperm(threadIdx.x + k * THREADS)] = silu(g[k]) * u[k];
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
        sm.xs[xperm(h * DN_D + d + k)] = o[k] * r * L.ssm_norm[d + k] * silu(z);
    }
    __syncthreads();
}

}  // namespace mk
