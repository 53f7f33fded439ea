// attn_decode_fused: one gated-attention decode step (T = 1) of one layer in ONE kernel: what
// lb_attn_prep (attn_rope.cu: q / k RMSNorm1p, RoPE, the new K/V row into the cache), attn_kernel<8>
// (attn_decode.cu: split-KV flash decoding) and combine_kernel do in three.
//
// Why: at the 27B's decode depths a layer's KV is ~2.4 MB (< 1 µs of HBM), but the three dependent
// kernels took ~22 µs per layer on the H200 (6.9 + 7.4 + 7.5 µs; docs/perf.md, "Round 4: decode attention
// in one kernel"): each one pays its launch, its ramp and a round trip through global memory.
//
// Grid (n_kv, splits), 256 threads, ~2 blocks per SM as attn_kernel (same split count and split
// length, so both paths see the same key ranges):
//   1. every block computes its kv head's `group` queries itself (RMSNorm1p, RoPE at the position, x 1/16)
//      straight into shared memory: 6 x 256 values, cheaper than waiting on a prep kernel;
//   2. the block whose split holds the last key (the token's own row) also makes the new K (RMSNorm1p +
//      RoPE) and V rows, rounds them to the cache type, writes them to the cache and uses the rounded
//      values for that key from shared memory (no other split reads the row, and the cache's copy is
//      fetched before it is written);
//   3. the tile loop is attn_kernel<8>'s, operation for operation (so a split's partial softmax is the
//      same fp32 math); splits past the last key exit at once (a CUDA graph fixes the split count for
//      every n_past, so at short contexts most blocks are empty);
//   4. one active split: the block writes the gated output itself. Otherwise each split posts its partial
//      (acc, m, l), then a __threadfence() and a ticket (atomicInc on a per-kv-head counter): the last
//      block to arrive merges every split of its kv head in split order like combine_kernel, applies the
//      gate and writes the output. atomicInc wraps the counter back to 0 at the last arrival, so it is 0
//      again for the next launch or graph replay (the caller zeroes it once).
// Every thread waits on the predecessor (PDL) first: nothing here is constant across launches.
//
// LUCEBOX_ATTN_DECODE=split (read once per process) makes the same entry points run the three kernels
// instead (attn::prep + attn::run), for A/B; unset or anything else: this kernel.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "attn.cuh"
#include "attn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace attn {
namespace {

constexpr int THREADS = 256;
constexpr int R = 8;            // query rows of a block: the group (<= MAX_GROUP), rows past it idle
constexpr int PR = R + 4;       // Ps row pitch, as attn_kernel<8>
constexpr int KW = HD / 2 + 1;  // padded K/V smem row in 32-bit words, as attn_kernel
constexpr int PF = BKV * (HD / 8) / THREADS;
// splits whose merge weights fit the combine's tables ([splits][R] floats each, in the K and V tile buffers)
constexpr int MAX_SPLITS = BKV * KW / R;

struct Fused {
    const float* qg;      // [nh * 512]: head h = [q (256) | gate (256)]
    const float* k;       // [nkv * 256] this token's k and v (before the norm)
    const float* v;
    const float* q_norm;  // [256] RMSNorm1p weights (with the +1)
    const float* k_norm;
    uint16_t* kc;         // [nkv, max_ctx, 256]
    uint16_t* vc;
    float* out;           // [nh * 256]
    float* part_acc;      // [n_splits, nh, 256]
    float* part_ml;       // [n_splits, nh, 2]
    unsigned* tickets;    // [nkv], 0 between launches
    int pos0, nh, nkv, group, max_ctx, n_splits, rope_dims;
    float eps, theta;
};

// attn_decode.cu's device_split_len (the host's formula too): kv_rows keys over n_splits blocks, a multiple
// of BKV. Kept equal so that both paths split the keys alike.
__device__ __forceinline__ int split_len_of(int kv_rows, int n_splits) {
    const int len = (kv_rows + n_splits - 1) / n_splits;
    return (len + BKV - 1) / BKV * BKV;
}

constexpr size_t smem_bytes() {
    // Qs, Ks, Vs, Ps, m / l / alpha, cos / sin, the new K (fp32), the new K and V rows (cache type), a flag
    return ((size_t)R * HD + (size_t)2 * BKV * KW + (size_t)BKV * PR + 3 * R + HD + HD + HD + 4) * 4;
}

template <int KVT>
__global__ void __launch_bounds__(THREADS) fused_kernel(const Fused P, const int32_t* __restrict__ pos_dev) {
    extern __shared__ __align__(16) float sm[];
    float* Qs = sm;                                           // [R][HD] normed, RoPE'd, x 1/16
    uint32_t* Ks = reinterpret_cast<uint32_t*>(Qs + R * HD);  // [BKV][KW]
    uint32_t* Vs = Ks + BKV * KW;                             // [BKV][KW]
    float* Ps = reinterpret_cast<float*>(Vs + BKV * KW);      // [BKV][PR]
    float* mrow = Ps + BKV * PR;
    float* lrow = mrow + R;
    float* arow = lrow + R;
    float* cs = arow + R;                                     // [HD / 2] RoPE table
    float* sn = cs + HD / 2;
    float* knew = sn + HD / 2;                                // [HD] the new K, fp32
    uint32_t* krow = reinterpret_cast<uint32_t*>(knew + HD);  // [HD / 2] the new K in the cache type
    uint32_t* vrow = krow + HD / 2;                           // [HD / 2] the new V
    int* flag = reinterpret_cast<int*>(vrow + HD / 2);
    lb::pdl_trigger();
    lb::pdl_wait();
    const int g = blockIdx.x, split = blockIdx.y, G = P.group;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // this token's row; it sees rows [0, pos]
    const int pos = pos_dev ? *pos_dev : P.pos0;
    const int kv_rows = pos + 1;
    const int split_len = split_len_of(kv_rows, P.n_splits);
    const int n_active = (kv_rows + split_len - 1) / split_len;
    if (split >= n_active) return;  // past the last key (block-uniform): nothing to read or write
    const int kb0 = split * split_len, kb1 = min(kb0 + split_len, kv_rows);
    const bool last = split == n_active - 1;  // holds row pos: makes the new K/V row

    const uint16_t* kbase = P.kc + (size_t)g * P.max_ctx * HD;
    const uint16_t* vbase = P.vc + (size_t)g * P.max_ctx * HD;
    // The RoPE table (lb_attn_prep's: double angles, rounded once) on the last threads, before their first
    // tile loads: sincos may call its slow path, and registers live across a call spill on sm_86. The
    // other warps' loads are already in flight meanwhile.
    const int half = P.rope_dims / 2;
    if (tid >= THREADS - half) {
        const int i = tid - (THREADS - half);
        const double inv_freq = pow((double)P.theta, -2.0 * i / P.rope_dims);
        double s, c;
        sincos((double)pos * inv_freq, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    uint4 pk[PF], pv[PF];
    auto fetch = [&](int kb) { fetch_kv_tile<PF, THREADS>(pk, pv, kbase, vbase, kb, kb1, tid); };
    // the first tile's loads fly while the queries are made (row pos, if in it, is replaced below)
    fetch(kb0);

    // ---- the prep, in-block: lb_attn_prep's math (attn_rope.cu), one warp per head ----
    const int nu = G + (last ? 1 : 0);  // q heads, then the new K
    for (int u = warp; u < nu; u += THREADS / 32) {
        const bool isq = u < G;
        const float* src = isq ? P.qg + (size_t)(g * G + u) * 2 * HD : P.k + (size_t)g * HD;
        const float* w = isq ? P.q_norm : P.k_norm;
        float* dst = isq ? Qs + u * HD : knew;
        // 1/16 = 1/sqrt(HD), attn_kernel's scale on the queries: a power of two, so scaling before the
        // RoPE gives the same bits as scaling after it
        const float scale = isq ? 0.0625f : 1.0f;
        float x[HD / 32], ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) {
            x[e] = src[e * 32 + lane];
            ss = fmaf(x[e], x[e], ss);
        }
        ss = lb::warp_sum(ss);
        const float r = rsqrtf(ss / HD + P.eps);
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) dst[e * 32 + lane] = x[e] * r * w[e * 32 + lane] * scale;
    }
    // idle query rows (group < R) are zeros, as attn_kernel loads them
    for (int idx = G * HD + tid; idx < R * HD; idx += THREADS) Qs[idx] = 0.0f;
    if (last && tid < HD / 2) {
        const float2 v2 = *reinterpret_cast<const float2*>(P.v + (size_t)g * HD + 2 * tid);
        vrow[tid] = (uint32_t)f2kv<KVT>(v2.x) | ((uint32_t)f2kv<KVT>(v2.y) << 16);
    }
    if (tid < R) {
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    __syncthreads();
    for (int idx = tid; idx < nu * half; idx += THREADS) {
        const int u = idx / half, i = idx % half;
        float* hv = u < G ? Qs + u * HD : knew;
        const float a = hv[i], b = hv[i + half];
        hv[i] = a * cs[i] - b * sn[i];
        hv[i + half] = b * cs[i] + a * sn[i];
    }
    __syncthreads();
    if (last && tid < HD / 2) {
        const uint32_t kw = (uint32_t)f2kv<KVT>(knew[2 * tid]) | ((uint32_t)f2kv<KVT>(knew[2 * tid + 1]) << 16);
        krow[tid] = kw;
        const size_t off = ((size_t)g * P.max_ctx + pos) * HD + 2 * tid;
        *reinterpret_cast<uint32_t*>(P.kc + off) = kw;
        *reinterpret_cast<uint32_t*>(P.vc + off) = vrow[tid];
    }
    // (krow / vrow are read after the tile loop's first barrier)

    // ---- attn_kernel<8>'s tile loop for one query: rows r < G are query heads g*G + r ----
    const int dp = tid & (HD / 2 - 1);
    const int rb = tid / (HD / 2);
    float acc[R / 2][2];
#pragma unroll
    for (int a = 0; a < R / 2; ++a) acc[a][0] = acc[a][1] = 0.0f;

    for (int kb = kb0; kb < kb1; kb += BKV) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < PF; ++i) {
            const int idx = tid + i * THREADS, j = idx / (HD / 8), c = idx % (HD / 8);
            uint4 kq = pk[i], vq = pv[i];
            // the token's own row: the values just made (the same thread stores either, so no race)
            if (kb + j == pos) {
                kq = reinterpret_cast<const uint4*>(krow)[c];
                vq = reinterpret_cast<const uint4*>(vrow)[c];
            }
            uint32_t* kd = Ks + j * KW + c * 4;
            uint32_t* vd = Vs + j * KW + c * 4;
            kd[0] = kq.x, kd[1] = kq.y, kd[2] = kq.z, kd[3] = kq.w;
            vd[0] = vq.x, vd[1] = vq.y, vd[2] = vq.z, vd[3] = vq.w;
        }
        __syncthreads();
        if (kb + BKV < kb1) fetch(kb + BKV);
        {
            float s = 0.0f;  // key kb + lane, row warp
#pragma unroll 4
            for (int w4 = 0; w4 < HD / 4; ++w4) {
                const float2 k01 = kv2f<KVT>(Ks[lane * KW + 2 * w4]);
                const float2 k23 = kv2f<KVT>(Ks[lane * KW + 2 * w4 + 1]);
                const float4 q4 = *reinterpret_cast<const float4*>(Qs + warp * HD + 4 * w4);
                s = fmaf(q4.x, k01.x, fmaf(q4.y, k01.y, fmaf(q4.z, k23.x, fmaf(q4.w, k23.y, s))));
            }
            // every key of the split is visible to the token (kb1 <= pos + 1)
            Ps[lane * PR + warp] = warp < G && kb + lane < kb1 ? s : -INFINITY;
        }
        __syncthreads();
        {
            const int r = warp;
            online_softmax_row(&Ps[lane * PR + r], mrow[r], lrow[r], arow[r], lane);
        }
        __syncthreads();
        rescale_accumulate_pv<R, KVT, PR, KW>(acc, arow, Ps, Vs, rb, dp);
    }
    __syncthreads();

    // ---- one active split: the gated output straight away (attn_kernel's n_splits == 1 epilogue) ----
    if (n_active == 1) {
#pragma unroll
        for (int a = 0; a < R / 2; ++a) {
            const int r = rb * (R / 2) + a;
            if (r >= G) continue;
            const int h = g * G + r;
            const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
            const float* gt = P.qg + (size_t)h * 2 * HD + HD + 2 * dp;
            *reinterpret_cast<float2*>(P.out + (size_t)h * HD + 2 * dp) =
                make_float2(acc[a][0] * inv * sigmoidf_(gt[0]), acc[a][1] * inv * sigmoidf_(gt[1]));
        }
        return;
    }

    // ---- post the partial, take a ticket ----
#pragma unroll
    for (int a = 0; a < R / 2; ++a) {
        const int r = rb * (R / 2) + a;
        if (r >= G) continue;
        const size_t row = (size_t)split * P.nh + g * G + r;
        *reinterpret_cast<float2*>(P.part_acc + row * HD + 2 * dp) = make_float2(acc[a][0], acc[a][1]);
        if (dp == 0) *reinterpret_cast<float2*>(P.part_ml + row * 2) = make_float2(mrow[r], lrow[r]);
    }
    // every thread's partial is visible device-wide before thread 0's ticket says so
    __threadfence();
    __syncthreads();
    if (tid == 0) *flag = atomicInc(P.tickets + g, (unsigned)(n_active - 1)) == (unsigned)(n_active - 1);
    __syncthreads();
    if (!*flag) return;
    __threadfence();

    // ---- the last block of kv head g merges the n_active splits (combine_kernel's math, split order) ----
    // merge weights w[s][r] = exp(m_s - M) and the partial sums l[s][r], in the K / V tile buffers
    float* wts = reinterpret_cast<float*>(Ks);  // [n_active][R]
    float* lss = reinterpret_cast<float*>(Vs);  // [n_active][R]
    const float2* ml = reinterpret_cast<const float2*>(P.part_ml);
    if (warp < G) {
        const int h = g * G + warp;
        float M = -INFINITY;
        for (int s = lane; s < n_active; s += 32) M = fmaxf(M, __ldcg(ml + (size_t)s * P.nh + h).x);
        M = lb::warp_max(M);
        for (int s = lane; s < n_active; s += 32) {
            const float2 m = __ldcg(ml + (size_t)s * P.nh + h);
            wts[s * R + warp] = m.x == -INFINITY ? 0.0f : expf(m.x - M);
            lss[s * R + warp] = m.y;
        }
    }
    __syncthreads();
    // thread = dim d of every head: the loads of 4 splits x G heads are independent, up to 32 in flight (the
    // accumulation itself stays in split order, as combine_kernel's)
    const int d = tid;
    float o[MAX_GROUP], L[MAX_GROUP];
#pragma unroll
    for (int r = 0; r < MAX_GROUP; ++r) o[r] = L[r] = 0.0f;
    const float* pa = P.part_acc + (size_t)g * G * HD + d;
#pragma unroll 4
    for (int s = 0; s < n_active; ++s) {
#pragma unroll
        for (int r = 0; r < MAX_GROUP; ++r) {
            if (r < G) {
                const float a = __ldcg(pa + ((size_t)s * P.nh + r) * HD);
                const float w = wts[s * R + r];
                L[r] = fmaf(lss[s * R + r], w, L[r]);
                o[r] = fmaf(a, w, o[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MAX_GROUP; ++r) {
        if (r >= G) continue;
        const int h = g * G + r;
        const float gt = P.qg[(size_t)h * 2 * HD + HD + d];
        P.out[(size_t)h * HD + d] = L[r] > 0.0f ? o[r] / L[r] * sigmoidf_(gt) : 0.0f;
    }
}

// LUCEBOX_ATTN_DECODE: "split" runs the three-kernel path (attn::prep + attn::run); unset or anything else
// the fused kernel. Read once per process.
bool decode_split() {
    static const bool split = [] {
        const char* v = std::getenv("LUCEBOX_ATTN_DECODE");
        return v && std::strcmp(v, "split") == 0;
    }();
    return split;
}

struct Args {
    const float *qg, *k, *v, *q_norm, *k_norm;
    float* qf;
    uint16_t *kc, *vc;
    float* out;
    void* partials;
    int max_splits;
    unsigned* tickets;
    int nh, nkv, max_ctx, rope_dims;
    float eps, theta;
};

// LUCEBOX_ATTN_DECODE=split: the engine's former calls, lb_attn_prep(_at) with t = 1 then lb_attn_decode(_at)
// (prep_kernel, attn_kernel<8>, combine_kernel).
cudaError_t three_kernels(const Args& A, int kv_dtype, int pos0, const int32_t* pos_dev, cudaStream_t s) {
    cudaError_t e = (cudaError_t)prep(A.qg, A.nh * 2 * HD, A.k, A.nkv * HD, A.v, A.nkv * HD, A.q_norm, A.k_norm,
                                      nullptr, pos0, A.qf, A.kc, A.vc, kv_dtype, 1, A.nh, A.nkv, A.max_ctx,
                                      A.rope_dims, A.eps, A.theta, s, pos_dev);
    if (e != cudaSuccess) return e;
    Params P{};
    P.qf = A.qf;
    P.kc = A.kc;
    P.vc = A.vc;
    P.gate = A.qg + HD;
    P.gate_ld = A.nh * 2 * HD;
    P.gate_hs = 2 * HD;
    P.out = A.out;
    P.Tq = 1;
    P.pos0 = pos0;
    P.nh = A.nh;
    P.nkv = A.nkv;
    P.group = A.nh / A.nkv;
    P.max_ctx = A.max_ctx;
    return (cudaError_t)run(P, kv_dtype, A.partials, A.max_splits, s, pos_dev);
}

// One decode step at row pos0 (or *pos_dev): fused, or the three kernels under LUCEBOX_ATTN_DECODE=split.
cudaError_t decode_fused(const Args& A, int kv_dtype, int pos0, const int32_t* pos_dev, cudaStream_t s) {
    if (decode_split()) return three_kernels(A, kv_dtype, pos0, pos_dev, s);
    // attn::run's decode split count: about two blocks per SM, at most max_splits; with the position on the
    // device it can not follow the context (fixed for a graph), on the host never a split shorter than a tile
    int splits = 1;
    const bool can_split = A.partials && A.tickets && A.max_splits > 1;
    if (can_split) {
        int dev = 0, sms = 1;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return e;
        const int want = (2 * sms + A.nkv - 1) / A.nkv;
        splits = std::max(1, std::min({want, A.max_splits, MAX_SPLITS}));
        if (!pos_dev) splits = std::min(splits, (pos0 + 1 + BKV - 1) / BKV);
    }
    Fused P{};
    P.qg = A.qg;
    P.k = A.k;
    P.v = A.v;
    P.q_norm = A.q_norm;
    P.k_norm = A.k_norm;
    P.kc = A.kc;
    P.vc = A.vc;
    P.out = A.out;
    P.tickets = A.tickets;
    P.pos0 = pos0;
    P.nh = A.nh;
    P.nkv = A.nkv;
    P.group = A.nh / A.nkv;
    P.max_ctx = A.max_ctx;
    P.n_splits = splits;
    P.rope_dims = A.rope_dims;
    P.eps = A.eps;
    P.theta = A.theta;
    if (can_split) {
        P.part_acc = static_cast<float*>(A.partials);
        P.part_ml = P.part_acc + (size_t)splits * A.nh * HD;
    }
    // on the host the blocks past the last key need not launch at all
    int blocks = splits;
    if (!pos_dev) {
        const int len = ((pos0 + 1 + splits - 1) / splits + BKV - 1) / BKV * BKV;
        blocks = (pos0 + 1 + len - 1) / len;
    }
    const size_t smem = smem_bytes();
    auto kern = kv_dtype == KV_BF16 ? fused_kernel<KV_BF16> : fused_kernel<KV_F16>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return lb::launch_pdl(kern, dim3((unsigned)A.nkv, (unsigned)blocks), dim3(THREADS), smem, s, P, pos_dev);
}

int check(const void* qg, const void* k, const void* v, const void* q_norm, const void* k_norm, const void* qf,
          const void* kc, const void* vc, int kv_dtype, const void* out, const void* partials, int max_splits,
          const void* tickets, int nh, int nkv, int max_ctx, int rope_dims) {
    LB_CHECK_ARG(qg && k && v && q_norm && k_norm && qf && kc && vc && out, "null pointer");
    LB_CHECK_ARG(!(partials && max_splits > 1) || tickets, "split-KV (partials, max_splits > 1) needs the tickets");
    LB_CHECK_ARG(kv_dtype == LB_KV_F16 || kv_dtype == LB_KV_BF16, "kv_dtype must be LB_KV_F16 or LB_KV_BF16");
    LB_CHECK_ARG(nkv >= 1 && nh % nkv == 0 && nh / nkv <= MAX_GROUP,
                 "n_heads must be a multiple of n_kv_heads, at most 8 per kv head");
    LB_CHECK_ARG(max_ctx >= 1, "empty cache");
    LB_CHECK_ARG(rope_dims >= 2 && rope_dims % 2 == 0 && rope_dims <= HD, "rope_dims must be even, <= 256");
    // the split path's prep keeps every head of the token in one block's shared memory
    LB_CHECK_ARG(((size_t)(nh + nkv) * HD + rope_dims) * 4 <= 96 * 1024, "too many heads for one block's shared memory");
    return LB_OK;
}

Args args(const void* qg, const void* k, const void* v, const void* q_norm, const void* k_norm, void* qf, void* kc,
          void* vc, void* out, void* partials, int max_splits, void* tickets, int nh, int nkv, int max_ctx,
          int rope_dims, float eps, float theta) {
    return Args{static_cast<const float*>(qg), static_cast<const float*>(k), static_cast<const float*>(v),
                static_cast<const float*>(q_norm), static_cast<const float*>(k_norm), static_cast<float*>(qf),
                static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc), static_cast<float*>(out), partials,
                max_splits, static_cast<unsigned*>(tickets), nh, nkv, max_ctx, rope_dims, eps, theta};
}

}  // namespace
}  // namespace attn

extern "C" LB_API int lb_attn_decode_fused(const void* qg, const void* k, const void* v, const void* q_norm,
                                           const void* k_norm, int n_past, void* qf, void* k_cache, void* v_cache,
                                           int kv_dtype, void* out, void* partials, int max_splits, void* tickets,
                                           int n_heads, int n_kv_heads, int max_ctx, int rope_dims, float eps,
                                           float theta, void* stream) {
    if (int st = attn::check(qg, k, v, q_norm, k_norm, qf, k_cache, v_cache, kv_dtype, out, partials, max_splits,
                             tickets, n_heads, n_kv_heads, max_ctx, rope_dims))
        return st;
    LB_CHECK_ARG(n_past >= 0 && n_past < max_ctx, "the token's row is outside the cache");
    LB_CUDA_TRY(attn::decode_fused(attn::args(qg, k, v, q_norm, k_norm, qf, k_cache, v_cache, out, partials,
                                              max_splits, tickets, n_heads, n_kv_heads, max_ctx, rope_dims, eps, theta),
                                   kv_dtype, n_past, nullptr, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

// The graph form: n_past read on the device (*n_past_dev) when the kernel runs; the caller keeps
// *n_past_dev < max_ctx (the host can not check it).
extern "C" LB_API int lb_attn_decode_fused_at(const void* qg, const void* k, const void* v, const void* q_norm,
                                              const void* k_norm, const void* n_past_dev, void* qf, void* k_cache,
                                              void* v_cache, int kv_dtype, void* out, void* partials, int max_splits,
                                              void* tickets, int n_heads, int n_kv_heads, int max_ctx, int rope_dims,
                                              float eps, float theta, void* stream) {
    if (int st = attn::check(qg, k, v, q_norm, k_norm, qf, k_cache, v_cache, kv_dtype, out, partials, max_splits,
                             tickets, n_heads, n_kv_heads, max_ctx, rope_dims))
        return st;
    LB_CHECK_ARG(n_past_dev, "null n_past_dev");
    LB_CUDA_TRY(attn::decode_fused(attn::args(qg, k, v, q_norm, k_norm, qf, k_cache, v_cache, out, partials,
                                              max_splits, tickets, n_heads, n_kv_heads, max_ctx, rope_dims, eps, theta),
                                   kv_dtype, 0, static_cast<const int32_t*>(n_past_dev),
                                   static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
