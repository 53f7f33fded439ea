// gdn_decode_fused: one decode token (t = 1) of a Gated DeltaNet layer in ONE kernel — conv_prep
// (gdn_conv.cu), the delta rule (gdn_delta.cu) and the gated output norm (gdn_conv.cu out_norm) of
// lb_gdn_decode_step, which ran them as three dependent kernels (3.5 + 4.3 + 1.6 µs a 27B layer on the
// H200, ~1.6 µs of it state bytes; the rest latency, ramps and graph gaps).
//
// Math: the three kernels' formulas, fp32, AND their summation orders (so the outputs match the split
// path bit for bit unless the compiler contracts an expression differently):
//   x = SiLU(conv4(conv_state[0..2], pre) · conv_w);   q = x_q / |x_q| / sqrt(128),  k = x_k / |x_k|
//   α = e^g, g = ssm_a · softplus(a + dt_bias);   β = sigmoid(b)
//   u = β (v − α Sᵀk);  o = α Sᵀq + (k·q) u;  S ← α S + k uᵀ
//   y = o · rsqrt(mean(o²) + eps) · norm_w · SiLU(z)
//
// Shape: grid (8 slices, Hk), a thread-block CLUSTER of the 8 slices of one KEY head (sm_90). Block j
// owns dv columns 16j .. 16j+15 of all r = Hv/Hk value heads that read key head kh (p = kh + m·Hk,
// m < r): 2r warps, warp 2m + h holds columns 16j + 8h .. +7 of head p's [128, 8] state slice in
// registers exactly as delta_kernel's warps do (gdn.cuh). 27B: 16 clusters × 8 blocks × 6 warps = the
// same 768 state warps as delta_kernel's 384 blocks × 2.
//
// Why a cluster per key head: every cross-block dependency then stays inside one cluster, so the kernel
// needs no global tickets, no spinning and no persistent counters (nothing to zero at allocation, nothing
// a poisoned or prefill-reused scratch can break, nothing two streams could share).
//
// The conv state race, and its solution. The conv state [3, C] is advanced in place: channel c's window
// becomes [tap1, tap2, pre]. The q / k channels of key head kh are READ by all 8 blocks of its cluster
// (each block convolves all 256 q / k channels itself: 8 KB of loads and 256 dot products, cheaper than
// a second cluster barrier plus a DSMEM gather), and no order exists between blocks of a launch, so a
// block that advanced a window at once could make a peer read the new window instead of the old.
// Hence: every block reads the old taps into registers; each q / k channel has ONE writer in the grid
// (block j writes q and k channels 16j .. 16j+15, from the taps it already holds), and it writes only
// after cluster barrier (A), which every block of the cluster reaches only after its own reads of the
// taps completed (their values are consumed before the barrier; barrier.cluster.arrive releases, wait
// acquires). Blocks of other clusters never read key head kh's channels. The v channels of a block's 16
// columns are read by that block alone (one thread per channel), so that thread advances them at once:
// read-before-write is program order within the thread.
//
// The output norm needs mean(o²) over a head's 128 columns = the 8 blocks of the cluster. Two forms
// (decode_fused_kernel<kPush>, comment at the template), the same math and summation orders:
//  - push (the default): each block PUSHES its o columns into every peer's shared memory before cluster
//    barrier (A), and stores the state, conv state and y after it, so (A)'s release fence waits only for
//    the few DSMEM stores (not the 3 MB of state stores) and no end barrier is needed: after (A) every
//    block reads only its own shared memory.
//  - pull (LUCEBOX_GDN_DECODE=pull, the form shipped before it): each block publishes its o columns in its
//    own shared memory, stores the state before (A), then one warp per value head PULLS all 128 values
//    from the peers through distributed shared memory; barrier (B) at the end keeps every block's shared
//    memory alive until its peers' DSMEM reads are done (a block must not exit while another block of its
//    cluster may still read its smem). Kept for A/B: push takes 0.88-0.91 of its time a layer on the H200
//    (docs/perf.md "The decode DeltaNet kernel's barriers").
// Either way one warp per value head holds a float4 per lane (lane l <- columns 4l .. 4l+3, the out_norm
// kernel's layout), sums the squares in out_norm's order, and the 4 lanes holding this block's columns
// write y.
//
// Not fused (lb_gdn_decode_step keeps the three-kernel path): t > 1, Hv / Hk > 8 (2r warps > 16), a device
// or build without clusters (sm_86: the RTX 3090 profile), or LUCEBOX_GDN_DECODE=split (read once per
// process) for A/B.
//
// Launch: programmatic dependent launch where lb_pdl's switch is on (lb_pdl.cuh contract: weights
// before pdl_wait, everything a predecessor writes after it; every thread waits).
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>

#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace gdn {
namespace {

constexpr int FUSED_RMAX = 8;                                  // value heads per key head the kernel takes
constexpr int FUSED_MAX_THREADS = FUSED_RMAX * DELTA_THREADS;  // 2r warps of 32

#if LB_HAS_SM90  // (only the sm_90 kernel body uses them)
// Split cluster barrier halves (sm_90 PTX). cg's cluster.sync() is arrive.release + wait.acquire, and the
// release compiles to MEMBAR.ALL.GPU before UCGABAR_ARV: it waits until every store the thread issued so far
// is acknowledged. A relaxed arrive has no fence (used where nothing before it needs publishing).
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif

// kPush = true: the default ("push", or LUCEBOX_GDN_DECODE unset). kPush = false ("pull"): the form shipped
// before it, peers' o read through DSMEM after barrier A, state stored before A, end barrier B. Push has the same
// math and summation orders, with the memory operations moved off the cluster barriers' fences:
//  - each block PUSHES its o columns into every peer's shared memory (st to DSMEM, before barrier A) instead
//    of the peers pulling them after it, so after A every block reads only its own shared memory and barrier
//    (B) goes (a block may exit once A is passed: no peer touches its shared memory after A). The pushes need
//    the peers resident: a relaxed arrive at the top, its wait just before the first push (long satisfied).
//  - the new state (3 MB a layer), the conv state and y are stored AFTER barrier A, so A's release fence
//    (MEMBAR.ALL.GPU) waits only for the few DSMEM stores, not for 24 KB of state stores per block; the
//    kernel's completion waits for them anyway, but now in parallel with the output norm. State stores
//    are streaming (st.global.cs): nothing reads them before the next step's kernel for this layer.
//  - the weights are read with ld.global.cg, which ptxas keeps before griddepcontrol.wait (the pull form's
//    read-only loads are scheduled after it), so their DRAM latency overlaps the predecessor.
// (A third form, "pushpf", also prefetched the state slice and conv taps to L2 before pdl_wait; it measured
// slower than push and was removed: docs/perf.md, the same section.)
template <bool kPush>
__global__ void __launch_bounds__(FUSED_MAX_THREADS)
    decode_fused_kernel(const float* __restrict__ pre, const float* __restrict__ a, const float* __restrict__ b,
                        const float* __restrict__ z, const float* __restrict__ conv_w,
                        const float* __restrict__ ssm_a, const float* __restrict__ dt_bias,
                        const float* __restrict__ norm_w, float* __restrict__ conv_state,
                        float* __restrict__ state, float* __restrict__ y, int hk, int hv, float eps) {
#if LB_HAS_SM90
    constexpr int QK_CHUNKS = 2 * D / 32;       // q / k channels in warp-sized chunks: 4 q, 4 k
    constexpr int QK_PER_WARP = QK_CHUNKS / 2;  // chunks a warp takes at most (2 warps, r = 1)
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();

    __shared__ __align__(16) float qk[2 * D];            // SiLU outputs of the key head: q [0, 128), k [128, 256)
    __shared__ float red[QK_CHUNKS];                     // Σ x² per 32-channel chunk (conv_prep's warp sums)
    __shared__ __align__(16) float vs[FUSED_RMAX][DVS];  // v of this block's 16 columns, per value head
    __shared__ float ab[FUSED_RMAX][2];                  // α, β per value head
    // pull: o of this block's columns (read by the peers); push: o of all 128 columns (written by the peers)
    __shared__ __align__(16) float os[FUSED_RMAX][kPush ? D : DVS];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r = hv / hk, nwarps = blockDim.x >> 5;  // blockDim.x == 64 r
    const int kh = blockIdx.y;
    const int j = (int)cluster.block_rank();  // == blockIdx.x: cluster dims (8, 1, 1)
    const int c0 = j * DVS;
    const int C = (2 * hk + hv) * D;

    // Roles. q / k conv: chunk i (channels 32i .. 32i+31 of [q head kh | k head kh]) on warp i % nwarps,
    // u = i / nwarps; lane = channel within the chunk. v conv: threads [0, 16 r), value head tid / 16,
    // column c0 + tid % 16. α / β: threads [16 r, 17 r) (64 r >= 17 r). Output norm: warp m < r.
    auto qk_channel = [&](int i) { return (i < 4 ? kh * D : (hk + kh) * D) + (i & 3) * 32 + lane; };
    const bool v_role = tid < DVS * r;
    const int vm = tid / DVS, ve = tid % DVS;
    const int v_ch = (2 * hk + kh + vm * hk) * D + c0 + ve;
    const int ab_m = tid - DVS * r;  // α / β role when 0 <= ab_m < r
    const bool y_role = warp < r && (lane >> 2) == j;  // the 4 lanes holding this block's columns
    const int yp = kh + warp * hk;

    // This thread's state slice (used below the wait): see "The state slice first".
    const int cq = lane & 1, rg = lane >> 1;
    const int sm_m = warp >> 1, p = kh + sm_m * hk;  // this warp's value head
    const int wc = (warp & 1) * DELTA_WCOLS + 4 * cq, col = c0 + wc;
    const int r0 = ROWS_PER_THREAD * rg;
    float* st = state + (size_t)p * D * D;

    if (kPush) cluster_arrive_relaxed();  // phase 0: "this block is resident"; waited for before the pushes
    lb::pdl_trigger();
    // weights: no wait. The pull form reads them through the read-only path (ld.global.nc), which ptxas
    // schedules AFTER griddepcontrol.wait (SASS: the LDG.E.CONSTANTs follow ACQBULK), so their DRAM latency
    // runs after the wait. The push form reads them with ld.global.cg (coherent, L2), which stays before it.
    auto w4 = [](const float* q) {
        return kPush ? __ldcg(reinterpret_cast<const float4*>(q)) : *reinterpret_cast<const float4*>(q);
    };
    auto w1 = [](const float* q) { return kPush ? __ldcg(q) : *q; };
    float4 wq[QK_PER_WARP];
#pragma unroll
    for (int u = 0; u < QK_PER_WARP; ++u) {
        const int i = warp + u * nwarps;
        wq[u] = i < QK_CHUNKS ? w4(conv_w + (size_t)qk_channel(i) * KCONV) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float4 wv = v_role ? w4(conv_w + (size_t)v_ch * KCONV) : make_float4(0.f, 0.f, 0.f, 0.f);
    float sa = 0.f, db = 0.f;
    if (ab_m >= 0 && ab_m < r) sa = w1(ssm_a + (kh + ab_m * hk)), db = w1(dt_bias + (kh + ab_m * hk));
    const float4 nw = y_role ? w4(norm_w + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    lb::pdl_wait();

    // The state slice first: the longest latency, in flight while the conv runs.
    float S[ROWS_PER_THREAD][4];
#pragma unroll
    for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
        const float4 x = *reinterpret_cast<const float4*>(st + (size_t)(r0 + mm) * D + col);
        S[mm][0] = x.x, S[mm][1] = x.y, S[mm][2] = x.z, S[mm][3] = x.w;
    }
    // Old windows (taps 0..2 of the conv state, the new input) of this thread's q / k and v channels.
    float xq[QK_PER_WARP][KCONV];
#pragma unroll
    for (int u = 0; u < QK_PER_WARP; ++u) {
        const int i = warp + u * nwarps;
        if (i < QK_CHUNKS) {
            const int ch = qk_channel(i);
#pragma unroll
            for (int t = 0; t < KCONV - 1; ++t) xq[u][t] = conv_state[(size_t)t * C + ch];
            xq[u][KCONV - 1] = pre[ch];
        }
    }
    float xv[KCONV] = {0.f, 0.f, 0.f, 0.f};
    if (v_role) {
#pragma unroll
        for (int t = 0; t < KCONV - 1; ++t) xv[t] = conv_state[(size_t)t * C + v_ch];
        xv[KCONV - 1] = pre[v_ch];
    }
    float av = 0.f, bv = 0.f;
    if (ab_m >= 0 && ab_m < r) av = a[kh + ab_m * hk], bv = b[kh + ab_m * hk];
    const float4 zz = y_role ? *reinterpret_cast<const float4*>(z + (size_t)yp * D + 4 * lane)  // z: ld Hv·128
                             : make_float4(0.f, 0.f, 0.f, 0.f);

    // The conv, conv_prep_kernel's expression and order: ((x0 w0 + x1 w1) + x2 w2) + x3 w3
#pragma unroll
    for (int u = 0; u < QK_PER_WARP; ++u) {
        const int i = warp + u * nwarps;
        if (i < QK_CHUNKS) {  // uniform over the warp
            const float s = siluf_(xq[u][0] * wq[u].x + xq[u][1] * wq[u].y + xq[u][2] * wq[u].z + xq[u][3] * wq[u].w);
            qk[i * 32 + lane] = s;
            const float ss = lb::warp_sum(s * s);
            if (lane == 0) red[i] = ss;
        }
    }
    if (v_role) {
        vs[vm][ve] = siluf_(xv[0] * wv.x + xv[1] * wv.y + xv[2] * wv.z + xv[3] * wv.w);
        // this thread is the channel's only reader and only writer: advance it now (push: after barrier A)
        if (!kPush) {
            conv_state[v_ch] = xv[1];
            conv_state[(size_t)C + v_ch] = xv[2];
            conv_state[(size_t)2 * C + v_ch] = xv[3];
        }
    }
    if (ab_m >= 0 && ab_m < r) {
        // conv_prep stores g, delta_kernel takes expf(g): the same two roundings
        const float g = sa * softplusf_(av + db);
        ab[ab_m][0] = expf(g);
        ab[ab_m][1] = sigmoidf_(bv);
    }
    __syncthreads();

    // The delta rule, one step (delta_kernel<true> with n = 1), q / k normalised as conv_prep does.
    {
        const float qn = rsqrtf(red[0] + red[1] + red[2] + red[3] + 1e-6f);
        const float kn = rsqrtf(red[4] + red[5] + red[6] + red[7] + 1e-6f);
        const float scale = rsqrtf((float)D);
        float kk[ROWS_PER_THREAD], qq[ROWS_PER_THREAD];
#pragma unroll
        for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
            qq[mm] = qk[r0 + mm] * qn * scale;
            kk[mm] = qk[D + r0 + mm] * kn * 1.0f;
        }
        float part[9];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float x = 0.0f, yq = 0.0f;
#pragma unroll
            for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
                x = fmaf(S[mm][c], kk[mm], x);
                yq = fmaf(S[mm][c], qq[mm], yq);
            }
            part[c] = x;
            part[4 + c] = yq;
        }
        {
            float kq = 0.0f;
#pragma unroll
            for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) kq = fmaf(kk[mm], qq[mm], kq);
            part[8] = kq;
        }
#pragma unroll
        for (int e = 0; e < 9; ++e) {
            float x = part[e];
            x += __shfl_xor_sync(LB_FULL_MASK, x, 2);
            x += __shfl_xor_sync(LB_FULL_MASK, x, 4);
            x += __shfl_xor_sync(LB_FULL_MASK, x, 8);
            x += __shfl_xor_sync(LB_FULL_MASK, x, 16);
            part[e] = x;
        }
        const float alpha = ab[sm_m][0], bt = ab[sm_m][1];
        const float4 vv = *reinterpret_cast<const float4*>(&vs[sm_m][wc]);
        const float vc[4] = {vv.x, vv.y, vv.z, vv.w};
        float u[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) u[c] = bt * (vc[c] - alpha * part[c]);
        if (!kPush) {
            if (rg == 0) {
                float oc[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) oc[c] = fmaf(alpha, part[4 + c], part[8] * u[c]);
                *reinterpret_cast<float4*>(&os[sm_m][wc]) = make_float4(oc[0], oc[1], oc[2], oc[3]);
            }
        } else {
            // every lane holds the column sums (the xor butterfly leaves the same sum in all 16 lanes of a
            // column quad, bit for bit: a + b == b + a), so lane rg < 8 pushes the quad to cluster rank rg
            cluster_wait();  // phase 0: every peer is resident (its shared memory exists)
            if (rg < NSLICE) {
                float oc[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) oc[c] = fmaf(alpha, part[4 + c], part[8] * u[c]);
                *reinterpret_cast<float4*>(cluster.map_shared_rank(&os[sm_m][col], rg)) =
                    make_float4(oc[0], oc[1], oc[2], oc[3]);
            }
        }
#pragma unroll
        for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
#pragma unroll
            for (int c = 0; c < 4; ++c) S[mm][c] = fmaf(alpha, S[mm][c], kk[mm] * u[c]);
            if (!kPush)
                *reinterpret_cast<float4*>(st + (size_t)(r0 + mm) * D + col) =
                    make_float4(S[mm][0], S[mm][1], S[mm][2], S[mm][3]);
        }
    }
    if (!kPush) {
        cluster.sync();  // (A) every block's os is written, and every block has read its q / k taps
    } else {
        cluster_arrive_release();  // (A) this block's pushes are in the peers' os, its q / k taps are read
        cluster_wait();
        // the new state: the bulk of the kernel's stores, issued first; no fence waits for them now
#pragma unroll
        for (int mm = 0; mm < ROWS_PER_THREAD; ++mm)
            __stcs(reinterpret_cast<float4*>(st + (size_t)(r0 + mm) * D + col),
                   make_float4(S[mm][0], S[mm][1], S[mm][2], S[mm][3]));
        if (v_role) {
            conv_state[v_ch] = xv[1];
            conv_state[(size_t)C + v_ch] = xv[2];
            conv_state[(size_t)2 * C + v_ch] = xv[3];
        }
    }

    // The q / k conv state: block j advances q and k channels 16j .. 16j+15 (chunks j / 2 and 4 + j / 2,
    // lanes 16 (j & 1) ..), from the taps it holds; no block of the cluster reads them after (A).
#pragma unroll
    for (int u = 0; u < QK_PER_WARP; ++u) {
        const int i = warp + u * nwarps;
        if (i < QK_CHUNKS && (i & 3) == (j >> 1) && (lane >> 4) == (j & 1)) {
            const int ch = qk_channel(i);
            conv_state[ch] = xq[u][1];
            conv_state[(size_t)C + ch] = xq[u][2];
            conv_state[(size_t)2 * C + ch] = xq[u][3];
        }
    }
    // The gated RMSNorm, out_norm_kernel's layout and order: warp m reads head p's 128 o values from the 8
    // blocks (lane l <- columns 4l .. 4l+3, block l / 4), sums their squares, and lanes 4j .. 4j+3 write y.
    if (warp < r) {
        const float4 x = kPush ? *reinterpret_cast<const float4*>(&os[warp][4 * lane])
                               : *reinterpret_cast<const float4*>(cluster.map_shared_rank(&os[warp][0], lane >> 2) +
                                                                  4 * (lane & 3));
        const float ss = lb::warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w);
        const float rr = rsqrtf(ss / D + eps);
        if (y_role) {
            float4 out;
            out.x = x.x * rr * nw.x * siluf_(zz.x);
            out.y = x.y * rr * nw.y * siluf_(zz.y);
            out.z = x.z * rr * nw.z * siluf_(zz.z);
            out.w = x.w * rr * nw.w * siluf_(zz.w);
            *reinterpret_cast<float4*>(y + (size_t)yp * D + 4 * lane) = out;
        }
    }
    if (!kPush) cluster.sync();  // (B) no block leaves while a peer may still read its shared memory
#endif
}

// LUCEBOX_GDN_DECODE: "split" keeps lb_gdn_decode_step on conv_prep + delta + out_norm; "pull" selects the
// fused kernel's pull form (decode_fused_kernel<false>: peers' o read through DSMEM, end barrier); unset,
// "push" or anything else: the push form (decode_fused_kernel<true>) where the fused kernel applies. Read once
// per process.
enum Variant { kSplit = 0, kPullV = 1, kPushV = 2 };
int variant() {
    static const int v = [] {
        const char* e = std::getenv("LUCEBOX_GDN_DECODE");
        if (e && std::strcmp(e, "split") == 0) return (int)kSplit;
        if (e && std::strcmp(e, "pull") == 0) return (int)kPullV;
        return (int)kPushV;
    }();
    return v;
}
bool fused_wanted() { return variant() != kSplit; }

bool device_ok() {
    static int cache[16];
    static bool known[16] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (dev >= 0 && dev < 16 && known[dev]) return cache[dev] != 0;
    int cl = 0;
    cudaFuncAttributes fa = {};
    const bool ok = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) == cudaSuccess && cl &&
                    cudaFuncGetAttributes(&fa, decode_fused_kernel<true>) == cudaSuccess && fa.ptxVersion >= 90 &&
                    fa.binaryVersion >= 90;
    if (!ok) (void)cudaGetLastError();  // a failed query leaves no sticky error for the caller
    if (dev >= 0 && dev < 16) cache[dev] = ok ? 1 : 0, known[dev] = true;
    return ok;
}

}  // namespace

bool decode_fused_ok(int t, int hk, int hv) {
    return t == 1 && hk >= 1 && hv >= hk && hv % hk == 0 && hv / hk <= FUSED_RMAX && fused_wanted() &&
           device_ok();
}

int decode_fused(const float* pre, const float* a, const float* b, const float* z, const float* conv_w,
                 const float* ssm_a, const float* dt_bias, const float* norm_w, float* conv_state, float* state,
                 float* y, int hk, int hv, float eps, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(NSLICE, hk);
    cfg.blockDim = dim3(DELTA_THREADS * (hv / hk));
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = NSLICE;  // the 8 slices of one key head
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = lb::pdl_enabled() ? 2 : 1;
    // the two forms share arguments, shape and launch; one build holds both (device_ok checks one image)
    void (*kernel)(const float*, const float*, const float*, const float*, const float*, const float*, const float*,
                   const float*, float*, float*, float*, int, int, float) =
        variant() == kPullV ? decode_fused_kernel<false> : decode_fused_kernel<true>;
    return (int)cudaLaunchKernelEx(&cfg, kernel, pre, a, b, z, conv_w, ssm_a, dt_bias, norm_w, conv_state, state, y,
                                   hk, hv, eps);
}

}  // namespace gdn

// 1: lb_gdn_decode_step(t, hk, hv) runs the fused kernel on the current device; 0: the three-kernel
// path (LUCEBOX_GDN_DECODE=split, t > 1, Hv / Hk > 8, no clusters). For tests and benches.
extern "C" LB_API int lb_gdn_decode_path(int t, int hk, int hv) { return gdn::decode_fused_ok(t, hk, hv) ? 1 : 0; }
