// gdn_decode_fused: one decode token (t = 1) of a Gated DeltaNet layer in ONE kernel — conv_prep
// (gdn_conv.cu), the delta rule (gdn_delta.cu) and the gated output norm (gdn_conv.cu out_norm) of
// lb_gdn_decode_step, which ran them as three dependent kernels (3.5 + 4.3 + 1.6 µs a 27B layer on the
// H200, ~1.6 µs of it state bytes; the rest latency, ramps and graph gaps).
//
// Math (the same formulas and fp32 as the three kernels, qwen35.md / cpu.py):
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
// Why a cluster per key head — it makes every cross-block dependency local to one cluster, so the
// kernel needs no global tickets, no spinning and no persistent counters (nothing to zero, nothing a
// poisoned or prefill-reused scratch can break, nothing two streams could share):
//  - The conv state race. q / k channels of key head kh feed all r value heads; with delta_kernel's
//    (slice, value head) grid 8r blocks would read those channels' old window while one of them
//    advances it, and no order exists between blocks of a launch. Here each of the 256 q / k channels
//    (and each v channel) is convolved by exactly ONE thread of the whole grid: block j takes q and k
//    channels 16j .. 16j+15 and the v channels of its own 16 columns. That thread reads the channel's 3
//    old taps into registers, then writes the advanced window [tap1, tap2, pre] — the only reader and
//    the only writer of those 3 words, so read-before-write is program order within one thread. The
//    other blocks never touch that conv state: they receive the SiLU outputs through distributed
//    shared memory (DSMEM) after a cluster barrier.
//  - The q / k L2 norms: each block publishes its 16 q and 16 k values and their two partial sums of
//    squares in shared memory; after cluster.sync() every block reads the 256 values and the 8 + 8
//    partials from its 7 peers and sums the partials in the same order (so all 8 blocks agree bit for
//    bit). Reduction order differs from conv_prep's (4 warp sums of 32 squares there; 8 half-warp sums
//    of 16 here): the norms can differ by an fp32 rounding, ~1e-7 relative.
//  - The output norm needs mean(o²) over a head's 128 columns = the 8 blocks of the cluster: each block
//    puts its r partial sums (16 columns each) in shared memory, cluster.sync(), every block sums the 8
//    partials (ranks 0..7 in order) and writes y for its own columns. Order again differs from
//    out_norm_kernel's (a warp butterfly over 4-column lane partials).
//  - A last cluster.sync() keeps every block's shared memory alive until its peers' DSMEM reads are
//    done (a block must not exit while another block of its cluster may still read its smem).
// The conv over q / k is NOT computed redundantly (each channel once in the grid); only α, β and the
// gathers are per block.
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

constexpr int FUSED_RMAX = 8;                           // value heads per key head the fused kernel takes
constexpr int FUSED_MAX_THREADS = FUSED_RMAX * DELTA_THREADS;  // 2r warps of 32

__global__ void __launch_bounds__(FUSED_MAX_THREADS)
    decode_fused_kernel(const float* __restrict__ pre, const float* __restrict__ a, const float* __restrict__ b,
                        const float* __restrict__ z, const float* __restrict__ conv_w,
                        const float* __restrict__ ssm_a, const float* __restrict__ dt_bias,
                        const float* __restrict__ norm_w, float* __restrict__ conv_state,
                        float* __restrict__ state, float* __restrict__ y, int hk, int hv, float eps) {
#if LB_HAS_SM90
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();

    __shared__ __align__(16) float xs[2 * DVS];    // this block's SiLU outputs: q channels [0, 16), k [16, 32)
    __shared__ float pss[2];                       // their partial sums of squares (q, k)
    __shared__ __align__(16) float qk[2 * D];      // the gathered head: q [0, 128), k [128, 256), before the norm
    __shared__ float nrm[2];                       // rsqrt(|x_q|² + 1e-6), rsqrt(|x_k|² + 1e-6)
    __shared__ __align__(16) float vs[FUSED_RMAX][DVS];  // v of this block's 16 columns, per value head
    __shared__ float ab[FUSED_RMAX][2];            // α, β per value head
    __shared__ __align__(16) float os[FUSED_RMAX][DVS];  // o of this block's columns
    __shared__ float oss[FUSED_RMAX];              // Σ o² over this block's 16 columns, per value head

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r = hv / hk, nthreads = blockDim.x;  // blockDim.x == 64 r
    const int kh = blockIdx.y;
    const int j = (int)cluster.block_rank();       // == blockIdx.x: cluster dims (8, 1, 1)
    const int c0 = j * DVS;
    const int C = (2 * hk + hv) * D;

    // Conv role: threads [0, 16) q channels, [16, 32) k channels, [32, 32 + 16 r) v channels of value head
    // (tid - 32) / 16; [32 + 16 r, 32 + 17 r) α / β of value head tid - 32 - 16 r. 64 r >= 32 + 17 r for r >= 1.
    int ch = -1;
    if (tid < DVS) ch = kh * D + c0 + tid;
    else if (tid < 2 * DVS) ch = (hk + kh) * D + c0 + tid - DVS;
    else if (tid < 2 * DVS + DVS * r) {
        const int m = (tid - 2 * DVS) / DVS, e = (tid - 2 * DVS) % DVS;
        ch = (2 * hk + kh + m * hk) * D + c0 + e;
    }
    const int ab_m = tid - 2 * DVS - DVS * r;  // α / β role when 0 <= ab_m < r
    // Output role: threads [0, 16 r): value head m = tid / 16, column c0 + tid % 16.
    const bool out_role = tid < DVS * r;
    const int om = tid / DVS, oe = tid % DVS, op = kh + om * hk;

    lb::pdl_trigger();
    // weights: no wait
    float4 w = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ch >= 0) w = *reinterpret_cast<const float4*>(conv_w + (size_t)ch * KCONV);
    float sa = 0.f, db = 0.f;
    if (ab_m >= 0 && ab_m < r) sa = ssm_a[kh + ab_m * hk], db = dt_bias[kh + ab_m * hk];
    const float nw = out_role ? norm_w[c0 + oe] : 0.f;
    lb::pdl_wait();

    // The state slice first: the longest latency, in flight while the conv runs and the cluster syncs.
    const int cq = lane & 1, rg = lane >> 1;
    const int sm_m = warp >> 1, p = kh + sm_m * hk;  // this warp's value head
    const int wc = (warp & 1) * DELTA_WCOLS + 4 * cq, col = c0 + wc;
    const int r0 = ROWS_PER_THREAD * rg;
    float* st = state + (size_t)p * D * D;
    float S[ROWS_PER_THREAD][4];
#pragma unroll
    for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
        const float4 x = *reinterpret_cast<const float4*>(st + (size_t)(r0 + mm) * D + col);
        S[mm][0] = x.x, S[mm][1] = x.y, S[mm][2] = x.z, S[mm][3] = x.w;
    }
    const float zz = out_role ? z[(size_t)op * D + c0 + oe] : 0.f;  // z: ld Hv·128, t = 1

    // The conv: this thread is its channel's only reader and only writer (see the header).
    if (ch >= 0) {
        const float x0 = conv_state[ch], x1 = conv_state[(size_t)C + ch], x2 = conv_state[(size_t)2 * C + ch];
        const float x3 = pre[ch];
        // conv_prep_kernel's expression and order: ((x0 w0 + x1 w1) + x2 w2) + x3 w3
        const float s = siluf_(x0 * w.x + x1 * w.y + x2 * w.z + x3 * w.w);
        conv_state[ch] = x1;
        conv_state[(size_t)C + ch] = x2;
        conv_state[(size_t)2 * C + ch] = x3;
        if (tid < 2 * DVS) xs[tid] = s;
        else vs[(tid - 2 * DVS) / DVS][(tid - 2 * DVS) % DVS] = s;
        if (warp == 0) {
            // warp 0 is exactly the q / k threads: half-warp sums (lanes 0-15 q, 16-31 k)
            float ss = s * s;
            ss += __shfl_xor_sync(LB_FULL_MASK, ss, 8);
            ss += __shfl_xor_sync(LB_FULL_MASK, ss, 4);
            ss += __shfl_xor_sync(LB_FULL_MASK, ss, 2);
            ss += __shfl_xor_sync(LB_FULL_MASK, ss, 1);
            if ((lane & 15) == 0) pss[lane >> 4] = ss;
        }
    } else if (ab_m >= 0 && ab_m < r) {
        const int hp = kh + ab_m * hk;
        // conv_prep stores g, delta_kernel takes expf(g): the same two roundings
        const float g = sa * softplusf_(a[hp] + db);
        ab[ab_m][0] = expf(g);
        ab[ab_m][1] = sigmoidf_(b[hp]);
    }
    cluster.sync();  // (1) xs, pss of every block of the cluster are written; also a block barrier

    // Gather the key head's 256 SiLU outputs from the 8 blocks (DSMEM) and the norms' partials.
    for (int i = tid; i < 2 * D; i += nthreads) {
        const int which = i / D, e = i % D;  // q / k, channel within the head
        const float* src = cluster.map_shared_rank(xs, e / DVS);
        qk[i] = src[which * DVS + e % DVS];
    }
    if (warp == 0) {
        // lanes 0-7: q partials of ranks 0..7, lanes 8-15: k partials; a fixed butterfly, so every block
        // of the cluster gets the same sums
        float ss = 0.f;
        if (lane < 16) ss = cluster.map_shared_rank(pss, lane & 7)[lane >> 3];
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 1);
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 2);
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 4);
        if (lane == 0 || lane == 8) nrm[lane >> 3] = rsqrtf(ss + 1e-6f);
    }
    __syncthreads();

    // The delta rule, one step (delta_kernel<true> with n = 1).
    {
        const float qn = nrm[0], kn = nrm[1], scale = rsqrtf((float)D);
        float kk[ROWS_PER_THREAD], qq[ROWS_PER_THREAD];
#pragma unroll
        for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
            // conv_prep's q / k: vals · rsqrt(ss + 1e-6) · scale (scale 1 for k)
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
        if (rg == 0) {
            float oc[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) oc[c] = fmaf(alpha, part[4 + c], part[8] * u[c]);
            *reinterpret_cast<float4*>(&os[sm_m][wc]) = make_float4(oc[0], oc[1], oc[2], oc[3]);
        }
#pragma unroll
        for (int mm = 0; mm < ROWS_PER_THREAD; ++mm) {
#pragma unroll
            for (int c = 0; c < 4; ++c) S[mm][c] = fmaf(alpha, S[mm][c], kk[mm] * u[c]);
            *reinterpret_cast<float4*>(st + (size_t)(r0 + mm) * D + col) =
                make_float4(S[mm][0], S[mm][1], S[mm][2], S[mm][3]);
        }
    }
    __syncthreads();  // os complete

    // The gated RMSNorm: partial Σ o² over this block's 16 columns per value head (half-warp sums: the
    // 16 threads of head m are lanes 0-15 or 16-31 of one warp), then the 8 blocks' partials.
    float ox = 0.f;
    if (warp < (DVS * r + 31) / 32) {  // whole warps, so the shuffles see every lane
        ox = out_role ? os[om][oe] : 0.f;
        float ss = ox * ox;
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 8);
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 4);
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 2);
        ss += __shfl_xor_sync(LB_FULL_MASK, ss, 1);
        if (out_role && oe == 0) oss[om] = ss;
    }
    cluster.sync();  // (2) every block's oss is written
    if (out_role) {
        float ss = 0.f;
#pragma unroll
        for (int rk = 0; rk < NSLICE; ++rk) ss += cluster.map_shared_rank(oss, rk)[om];
        const float rr = rsqrtf(ss / D + eps);
        y[(size_t)op * D + c0 + oe] = ox * rr * nw * siluf_(zz);
    }
    cluster.sync();  // (3) no block leaves while a peer may still read its shared memory
#endif
}

// LUCEBOX_GDN_DECODE: "split" keeps lb_gdn_decode_step on conv_prep + delta + out_norm; unset or anything
// else: the fused kernel where it applies. Read once per process.
bool fused_wanted() {
    static const bool on = [] {
        const char* v = std::getenv("LUCEBOX_GDN_DECODE");
        return !(v && std::strcmp(v, "split") == 0);
    }();
    return on;
}

// Whether the current device can run the kernel: thread-block clusters (sm_90+) AND a kernel image built
// for them (the sm_86 profile's PTX JIT-compiled on an H200 would be the empty body above). Per device.
bool device_ok() {
    static int cache[16];
    static bool known[16] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (dev >= 0 && dev < 16 && known[dev]) return cache[dev] != 0;
    int cl = 0;
    cudaFuncAttributes fa = {};
    const bool ok = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) == cudaSuccess && cl &&
                    cudaFuncGetAttributes(&fa, decode_fused_kernel) == cudaSuccess && fa.ptxVersion >= 90 &&
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
    return (int)cudaLaunchKernelEx(&cfg, decode_fused_kernel, pre, a, b, z, conv_w, ssm_a, dt_bias, norm_w,
                                   conv_state, state, y, hk, hv, eps);
}

}  // namespace gdn

// 1: lb_gdn_decode_step(t, hk, hv) runs the fused kernel on the current device; 0: the three-kernel
// path (LUCEBOX_GDN_DECODE=split, t > 1, Hv / Hk > 8, no clusters). For tests and benches.
extern "C" LB_API int lb_gdn_decode_path(int t, int hk, int hv) { return gdn::decode_fused_ok(t, hk, hv) ? 1 : 0; }
