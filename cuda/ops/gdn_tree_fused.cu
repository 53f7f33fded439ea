// gdn_tree_fused: the tree verify of a Gated DeltaNet layer in ONE kernel — conv_prep along the parents
// (gdn_conv.cu), the tree walk of the delta rule (gdn_delta.cu delta_kernel<true>) and the gated output norm
// (gdn_conv.cu out_norm) that lb_gdn_tree_verify ran as three dependent kernels (9.1 + 19.1 + 1.9 µs a 27B layer
// at N = 23 on the H200, docs/perf.md "One kernel per DeltaNet tree-verify layer").
//
// Math: the three kernels' formulas AND their summation orders, so every output is bit-identical to the split
// path (same expressions, so nvcc contracts them into the same FMAs):
//   window = the slot's last 4 inputs along its ancestry, falling back into the conv state's rows 2, 1, 0
//   x = SiLU(((x0 w0 + x1 w1) + x2 w2) + x3 w3);   Σx² per 32-channel chunk by warp_sum, ((c0 + c1) + c2) + c3
//   q = x · rsqrt(Σ + 1e-6) · rsqrt(128),  k = x · rsqrt(Σ + 1e-6) · 1;  g = ssm_a · softplus(a + dt_bias),
//   α = e^g, β = sigmoid(b);  per step (delta_kernel's lane layout, fma chains and xor-shuffle trees):
//   u = β (v − α Sᵀk);  o = α Sᵀq + (k·q) u;  S ← α S + k uᵀ;   y = o · rsqrt(mean(o²) + eps) · norm_w · SiLU(z)
// The per-step reductions are the split kernel's 16-lane xor butterflies (offsets 2, 4, 8, 16). Two of them are
// reorganised without changing a bit: (1) k·q does not depend on the state, so it is computed once per slot in the
// prologue by the walk's own lane layout and shuffle tree; (2) Sᵀq is only needed by the lanes that write o, so it
// is reduce-scattered: at each butterfly level a lane keeps half of its values and receives its partner's copy of
// exactly those, so every add is the butterfly's own add (own + partner) and the 16 shuffles + adds become 5.
//
// Shape: grid (8 slices, Hk), a thread-block CLUSTER of the 8 dv slices of one KEY head (sm_90), as the fused
// decode kernel (gdn_decode_fused.cu): block j holds columns 16j .. 16j+15 of the r = Hv / Hk value heads reading
// key head kh; warp 2m + h keeps columns 16j + 8h .. +7 of head kh + m·Hk in registers, delta_kernel's layout.
// 27B: 16 clusters × 8 blocks × 6 warps, the 768 state warps of the split walk, one block an SM.
//
// Prologue (everything a block needs, on chip; no cross-block traffic): all inputs are copied to shared memory with
// cp.async in one burst (the parents, the q | k channels of the key head and the block's v channels for the conv
// state's 3 rows and all N pre rows, z, a, b) while the state slice loads into registers from HBM. Windows come from
// the parents in shared memory (no dependent global loads). Each of the 8 blocks convolves the key head's 256 q / k
// channels for all N slots itself: ~1 µs of arithmetic that runs while the state is in flight, against a cluster
// barrier (a release, i.e. MEMBAR.ALL.GPU, with the state loads outstanding) plus a DSMEM gather; the fused decode
// kernel measured that trade (7.50 µs with the gather, 6.70 without). v, α, β of the block's heads and columns
// only. The block writes its share of the kept inputs (q / k chunk j, its v columns; block 0 g and β).
//
// Walk: the split walk's (state on chip along the spine; a slot whose parent is not the previous slot reloads the
// state saved after its parent, from shared memory, or from `saves` when the shared budget is spent, or the
// committed state when its parent is -1; a slot is saved iff a later slot other than the next branches from it),
// with the inputs already in shared memory: a slot's operands (k, q, v, α, β, k·q, its plan) sit in one record,
// fetched one step ahead into the other of two register sets (loop unrolled by two). o goes to shared memory only,
// so no global store is outstanding at the cluster barrier that follows.
//
// Output norm over a head's 128 columns = the 8 blocks: each block publishes, per (slot, head), the 4 partial sums
// out_norm's lanes 4j .. 4j+3 would hold (x.x² + x.y² + x.z² + x.w² of 4 columns); cluster barrier (A, release);
// one warp per (slot, head) reads lane l's partial from block l / 4 through distributed shared memory and sums with
// out_norm's warp_sum; each block writes y of its columns. Barrier (B, relaxed: only "my reads of your shared memory
// are done") keeps every block alive until its peers have read it. o is copied to global memory under barrier A's
// latency, SiLU(z) too.
//
// Not fused (lb_gdn_tree_verify keeps the three kernels): Hv / Hk > 4, pre / conv_state / z not 16-byte aligned, a
// device or build without clusters (sm_86: the RTX 3090 profile), or LUCEBOX_GDN_TREE=split (read once per process).
// lb_gdn_tree_path tells which runs. Launch: programmatic dependent launch where lb_pdl's switch is on (weights
// before pdl_wait, everything a predecessor writes after it; every thread waits).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_async.cuh"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace gdn {
namespace {

constexpr int TREE_RMAX = 4;                                 // value heads per key head the kernel takes
constexpr int TREE_MAX_THREADS = TREE_RMAX * DELTA_THREADS;  // 2r warps of 32
constexpr int QKC = 2 * D;                                   // q | k channels of one key head
constexpr int CHUNKS = QKC / 32;                             // conv_prep's 32-channel warp chunks: 4 of q, 4 of k
constexpr int HROWS = KCONV - 1;                             // conv-state rows ahead of the pre rows
static_assert(NSLICE == 8, "a cluster is the 8 dv slices of a key head");

__host__ __device__ constexpr int round4(int x) { return (x + 3) & ~3; }

// Shared memory, in floats from the dynamic base (host and device use the same map). Every region starts on a
// float4; `sv` (the on-chip saves, nsm × [8][threads] float4) is last, so the map's `sv` is the base size.
// The walk's operands of slot s sit together in one record (k, q, v, α / β, k·q, the plan), so a step addresses
// them from one base that moves by `stride` (per-region bases cost ~45 address instructions a step).
struct Layout {
    int ints;    // int4 sel[64] (window rows × 256: offsets into hist), int par[64], int flag[64]
    int hist;    // [(n+3)][256] q | k channels: rows 0..2 the conv state, 3 + s slot s's pre row.
                 // After the conv: o [n][r][16] of the block's columns, then the output norm's partials [n][r][4]
    int histv;   // [(n+3)][r][16] the block's v channels, same rows
    int wqk;     // [256] float4 conv weights of the q | k channels
    int red;     // [n][8] Σx² per chunk
    int zs;      // [n][r][16] z, then SiLU(z)
    int rr;      // [n][r] the output norm's rsqrt
    int rec;     // [n][stride] per-slot records, see rec_* below
    int stride;  // floats per record
    int sv;      // the saves kept on chip
};
// offsets within a record: k [128] (SiLU, then normalised in place), q [128], v [r][16], α β [r][2] (a and b until
// converted), k·q, pad, plan int2 (state source, save index)
constexpr int REC_V = 2 * D;  // k at 0, q at D
__host__ __device__ constexpr int rec_ab(int r) { return REC_V + r * DVS; }
__host__ __device__ constexpr int rec_kq(int r) { return rec_ab(r) + 2 * r; }
__host__ __device__ constexpr int rec_plan(int r) { return rec_kq(r) + 2; }

__host__ __device__ inline Layout layout(int n, int r) {
    Layout L;
    int at = 0;
    L.ints = at, at += 4 * MAX_TREE + 2 * MAX_TREE;
    L.hist = at, at += round4((n + HROWS) * QKC);
    L.histv = at, at += round4((n + HROWS) * r * DVS);
    L.wqk = at, at += QKC * KCONV;
    L.red = at, at += round4(n * CHUNKS);
    L.zs = at, at += n * r * DVS;
    L.rr = at, at += round4(n * r);
    L.stride = round4(rec_plan(r) + 2);
    L.rec = at, at += n * L.stride;
    L.sv = at;
    return L;
}

#if LB_HAS_SM90
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(lb::smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#endif

__global__ void __launch_bounds__(TREE_MAX_THREADS, 1)
    tree_fused_kernel(const float* pre, const float* a, const float* b, const float* z,
                      const float* __restrict__ conv_w, const float* __restrict__ ssm_a,
                      const float* __restrict__ dt_bias, const float* __restrict__ norm_w, const float* conv_state,
                      const float* state, const int32_t* parents, float* q_out, float* k_out, float* v_out,
                      float* g_out, float* beta_out, float* o_out, float* saves, int max_saves, float* y, int n,
                      int hk, int hv, float eps, int nsm, const Layout L) {
#if LB_HAS_SM90
    namespace cg = cooperative_groups;
    constexpr int TASKS_IN_FLIGHT = 4;   // conv chunk tasks (and norm rows) a warp interleaves
    constexpr int REC_K = 0, REC_Q = D;  // a record's k and q: chunk c of q | k at 32 (c ^ 4)
    cg::cluster_group cluster = cg::this_cluster();
    extern __shared__ __align__(16) float sm[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nthr = blockDim.x, nwarps = nthr >> 5;  // 64 r threads
    const int r = hv / hk, kh = blockIdx.y;
    const int j = (int)cluster.block_rank();  // == blockIdx.x: cluster dims (8, 1, 1)
    const int c0 = j * DVS;
    const int C = (2 * hk + hv) * D;
    // L = layout(n, r), a kernel parameter: its offsets are read from the constant bank where used
    const int RS = L.stride, RAB = rec_ab(r), RKQ = rec_kq(r), RPLAN = rec_plan(r);
    int4* sel = reinterpret_cast<int4*>(sm + L.ints);
    int* par_s = reinterpret_cast<int*>(sel + MAX_TREE);
    int* flag_s = par_s + MAX_TREE;
    float* hist = sm + L.hist;
    float* histv = sm + L.histv;
    float* wqk = sm + L.wqk;
    float* red = sm + L.red;
    float* zs = sm + L.zs;
    float* rrs = sm + L.rr;
    float* rec = sm + L.rec;
    float4* sv = reinterpret_cast<float4*>(sm + L.sv);
    float* os = hist;                          // after the conv
    float* pss = hist + round4(n * r * DVS);  // after the conv

    // Roles. v conv, z and y: value head kh + vm·Hk, column c0 + ve, slots tid / (16 r) + 4 i (nthr = 64 r, so the
    // head and column of a thread are the same for all its slots). α / β: value head kh + am·Hk.
    const int vm = (tid % (DVS * r)) / DVS, ve = tid % DVS, vp = kh + vm * hk;
    const int vstride = nthr / (DVS * r);
    const int am = tid % r, ap = kh + am * hk;

    lb::pdl_trigger();
    // weights: no wait
    for (int i = tid; i < QKC; i += nthr) {
        const int ch = i < D ? kh * D + i : (hk + kh) * D + (i - D);
        lb::cp_async16(wqk + KCONV * i, conv_w + (size_t)ch * KCONV);
    }
    const float4 wv = *reinterpret_cast<const float4*>(conv_w + (size_t)((2 * hk + vp) * D + c0 + ve) * KCONV);
    const float sa = ssm_a[ap], db = dt_bias[ap];
    const float nw = norm_w[c0 + ve];
    if (tid < MAX_TREE) flag_s[tid] = 0;
    lb::pdl_wait();

    // The state slice first: the longest latency (HBM), in flight through the whole prologue.
    const int cq = lane & 1, rg = lane >> 1;
    const int sm_m = warp >> 1, p = kh + sm_m * hk;  // this warp's value head
    const int wc = (warp & 1) * DELTA_WCOLS + 4 * cq, col = c0 + wc;
    const int r0 = ROWS_PER_THREAD * rg;
    const size_t head_off = (size_t)p * D * D;
    float S[ROWS_PER_THREAD][4];
    auto load = [&](const float* src) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            const float4 x = *reinterpret_cast<const float4*>(src + (size_t)(r0 + m) * D + col);
            S[m][0] = x.x, S[m][1] = x.y, S[m][2] = x.z, S[m][3] = x.w;
        }
    };
    auto store = [&](float* dst) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
            *reinterpret_cast<float4*>(dst + (size_t)(r0 + m) * D + col) = make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    };
    // on-chip saves: thread-private layout (float4 m of thread t at [m][t]), conflict-free
    auto load_sm = [&](int slot) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            const float4 x = sv[((size_t)slot * ROWS_PER_THREAD + m) * nthr + tid];
            S[m][0] = x.x, S[m][1] = x.y, S[m][2] = x.z, S[m][3] = x.w;
        }
    };
    auto store_sm = [&](int slot) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
            sv[((size_t)slot * ROWS_PER_THREAD + m) * nthr + tid] = make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    };
    load(state + head_off);

    // Every other input in one burst of asynchronous copies.
    for (int i = tid; i < n; i += nthr) cp_async4(par_s + i, parents + i);
    for (int i = tid; i < (n + HROWS) * (QKC / 4); i += nthr) {
        const int h = i / (QKC / 4), f = i % (QKC / 4);
        const int ch = f < D / 4 ? kh * D + 4 * f : (hk + kh) * D + 4 * f - D;
        const float* src = h < HROWS ? conv_state + (size_t)h * C + ch : pre + (size_t)(h - HROWS) * C + ch;
        lb::cp_async16(hist + h * QKC + 4 * f, src);
    }
    for (int i = tid; i < (n + HROWS) * r * (DVS / 4); i += nthr) {
        const int h = i / (r * (DVS / 4)), m = (i / (DVS / 4)) % r, f = i % (DVS / 4);
        const int ch = (2 * hk + kh + m * hk) * D + c0 + 4 * f;
        const float* src = h < HROWS ? conv_state + (size_t)h * C + ch : pre + (size_t)(h - HROWS) * C + ch;
        lb::cp_async16(histv + (h * r + m) * DVS + 4 * f, src);
    }
    for (int i = tid; i < n * r; i += nthr) {
        const int t = i / r, m = i % r;
        const size_t hrow = (size_t)t * hv + kh + m * hk;
        cp_async4(rec + t * RS + RAB + 2 * m, a + hrow);
        cp_async4(rec + t * RS + RAB + 2 * m + 1, b + hrow);
    }
    for (int i = tid; i < n * r * (DVS / 4); i += nthr) {
        const int t = i / (r * (DVS / 4)), m = (i / (DVS / 4)) % r, f = i % (DVS / 4);
        lb::cp_async16(zs + (t * r + m) * DVS + 4 * f, z + (size_t)t * hv * D + (size_t)(kh + m * hk) * D + c0 + 4 * f);
    }
    cp_async_wait_all();
    __syncthreads();

    // Windows (conv_prep's walk up the ancestry, from shared memory) and the branch points: slot c marks its
    // parent when it is not the parent's next slot (gdn::tree_plan's rule).
    if (tid < n) {
        int w[KCONV];
        int cur = tid, back = 0;
#pragma unroll
        for (int jj = KCONV - 1; jj >= 0; --jj) {
            if (cur >= 0) {
                w[jj] = HROWS + cur;
                cur = par_s[cur];
            } else {
                w[jj] = KCONV - 2 - back;
                ++back;
            }
        }
        sel[tid] = make_int4(w[0] * QKC, w[1] * QKC, w[2] * QKC, w[3] * QKC);  // element offsets into hist
        const int pp = par_s[tid];
        if (pp >= 0 && pp < tid - 1) flag_s[pp] = 1;
    }
    __syncthreads();

    // The save plan (warp 0): save index = rank among the saved slots; source of a step's state = -1 the previous
    // step's registers, -2 the committed state, else the save index of its parent.
    if (warp == 0) {
        const unsigned lo = __ballot_sync(LB_FULL_MASK, lane < n && flag_s[lane] != 0);
        const unsigned hi = __ballot_sync(LB_FULL_MASK, lane + 32 < n && flag_s[lane + 32] != 0);
        auto rank = [&](int i) {
            return i < 32 ? __popc(lo & ((1u << i) - 1u)) : __popc(lo) + __popc(hi & ((1u << (i - 32)) - 1u));
        };
        for (int i = lane; i < n; i += 32) {
            const int pp = par_s[i];
            *reinterpret_cast<int2*>(rec + i * RS + RPLAN) =
                make_int2((i == 0 || pp == i - 1) ? -1 : (pp < 0 ? -2 : rank(pp)), flag_s[i] ? rank(i) : -1);
        }
    }
    // The q | k conv, all 256 channels of the key head for every slot, lane = channel within a 32-channel chunk
    // (conv_prep's warp layout, so warp_sum adds the squares in its order); raw SiLU values into the records' q
    // (chunks 0..3) and k (4..7), i.e. at 32 (chunk ^ 4). Work unit = (chunk, 4 consecutive slots), chunk-major; a
    // warp takes a contiguous range of units, its share inverse to the number of warps on its scheduler (warp % 4:
    // with 6 warps, 1 1 2 2 1 1), so that the four schedulers issue about the same. The unit is warp-uniform (a slot
    // past n is recomputed as slot n - 1, not stored).
    {
        const float4* w4 = reinterpret_cast<const float4*>(wqk);
        const int ng = (n + TASKS_IN_FLIGHT - 1) / TASKS_IN_FLIGHT, units = CHUNKS * ng;
        int before = 0, mine = 0, total = 0;
        for (int w = 0; w < nwarps; ++w) {
            const int share = (nwarps - (w & 3) + 3) / 4 == 1 ? 2 : 1;  // 2 / (warps on scheduler w % 4), nwarps <= 8
            before += w < warp ? share : 0;
            mine = w == warp ? share : mine;
            total += share;
        }
        const int ub = units * before / total, ue = units * (before + mine) / total;
        int ci = ub / ng, grp = ub - (ub / ng) * ng;
        for (int unit = ub; unit < ue; ++unit) {
            const int cl = ci * 32 + lane, t0 = grp * TASKS_IN_FLIGHT;
            const float4 w = w4[cl];
            float s[TASKS_IN_FLIGHT];
#pragma unroll
            for (int u = 0; u < TASKS_IN_FLIGHT; ++u) {
                const int4 wi = sel[min(t0 + u, n - 1)];  // window rows × 256
                const float x0 = hist[wi.x + cl], x1 = hist[wi.y + cl], x2 = hist[wi.z + cl], x3 = hist[wi.w + cl];
                // the CPU's summation order: ((x0 w0 + x1 w1) + x2 w2) + x3 w3
                s[u] = siluf_(x0 * w.x + x1 * w.y + x2 * w.z + x3 * w.w);
            }
#pragma unroll
            for (int u = 0; u < TASKS_IN_FLIGHT; ++u) {
                const float ss = lb::warp_sum(s[u] * s[u]);
                if (t0 + u < n) {
                    rec[(t0 + u) * RS + 32 * (ci ^ 4) + lane] = s[u];
                    if (lane == 0) red[(t0 + u) * CHUNKS + ci] = ss;
                }
            }
            if (++grp == ng) grp = 0, ++ci;
        }
    }
    // v of the block's columns (also the kept v), α / β of its heads (block 0 keeps g and β)
    for (int t = tid / (DVS * r); t < n; t += vstride) {
        const int4 wi = sel[t];  // rows × 256 (QKC)
        const int e = vm * DVS + ve, rv = r * DVS;
        const float x0 = histv[(wi.x / QKC) * rv + e], x1 = histv[(wi.y / QKC) * rv + e];
        const float x2 = histv[(wi.z / QKC) * rv + e], x3 = histv[(wi.w / QKC) * rv + e];
        const float s = siluf_(x0 * wv.x + x1 * wv.y + x2 * wv.z + x3 * wv.w);
        rec[t * RS + REC_V + e] = s;
        v_out[((size_t)t * hv + vp) * D + c0 + ve] = s;
    }
    for (int i = tid; i < n * r; i += nthr) {  // value head kh + am·Hk: i % r == tid % r
        const int t = i / r;
        float* abp = rec + t * RS + RAB + 2 * am;
        const float g = sa * softplusf_(abp[0] + db);
        const float bt = sigmoidf_(abp[1]);
        // conv_prep stores g, delta_kernel takes expf(g): the same two roundings
        abp[0] = expf(g);
        abp[1] = bt;
        if (j == 0) g_out[(size_t)t * hv + ap] = g, beta_out[(size_t)t * hv + ap] = bt;
    }
    __syncthreads();

    // q, k normalised in place, conv_prep's expression; block j writes chunk j of the kept q | k.
    {
        const float scale = rsqrtf((float)D);
        for (int i = tid; i < n * (QKC / 4); i += nthr) {
            const int t = i / (QKC / 4), f = i % (QKC / 4);
            const bool isq = f < D / 4;
            const float* rd = red + t * CHUNKS + (isq ? 0 : CHUNKS / 2);
            const float ss = rd[0] + rd[1] + rd[2] + rd[3];
            const float sc = isq ? scale : 1.0f;
            const int d4 = f % (D / 4);
            float4* px = reinterpret_cast<float4*>(rec + t * RS + (isq ? REC_Q : REC_K)) + d4;
            float4 x = *px;
            x.x = x.x * rsqrtf(ss + 1e-6f) * sc;
            x.y = x.y * rsqrtf(ss + 1e-6f) * sc;
            x.z = x.z * rsqrtf(ss + 1e-6f) * sc;
            x.w = x.w * rsqrtf(ss + 1e-6f) * sc;
            *px = x;
            if (f / 8 == j)
                *reinterpret_cast<float4*>((isq ? q_out : k_out) + ((size_t)t * hk + kh) * D + 4 * d4) = x;
        }
    }
    __syncthreads();
    // k·q per slot: the walk's lane layout (rows 8 rg .. +7), fma chain and shuffle tree
    for (int t = warp; t < n; t += nwarps) {
        const float* rt = rec + t * RS;
        float kq = 0.0f;
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) kq = fmaf(rt[REC_K + r0 + m], rt[REC_Q + r0 + m], kq);
        kq += __shfl_xor_sync(LB_FULL_MASK, kq, 2);
        kq += __shfl_xor_sync(LB_FULL_MASK, kq, 4);
        kq += __shfl_xor_sync(LB_FULL_MASK, kq, 8);
        kq += __shfl_xor_sync(LB_FULL_MASK, kq, 16);
        if (lane == 0) rec[t * RS + RKQ] = kq;
    }
    __syncthreads();

    // ---- the walk ----
    // Sᵀq reduce-scatter: after level 1 (xor 2) a lane keeps columns 2 h1, 2 h1 + 1; after level 2 (xor 4) column
    // oc = 2 h1 + h2. Lanes with rg < 4 (rg = 0..3 -> oc = 0, 2, 1, 3) write o of column oc.
    const int h1 = rg & 1, h2 = (rg >> 1) & 1, oc = 2 * h1 + h2;
    const bool o_role = rg < 4;
    // A step's operands, fetched one step ahead into the other of two register sets (the loop is unrolled by two,
    // so the sets alternate without copies).
    struct Ops {
        float k[ROWS_PER_THREAD], q[ROWS_PER_THREAD], al, bt, kq;
        float4 v;
        int2 plan;
    };
    // this lane's operands in the next record to fetch: pointers advanced by one record a fetch (loop-carried, so
    // the compiler keeps them in registers instead of recomputing the record layout every step)
    const float* kp = rec + REC_K + r0;
    const float* vop = rec + REC_V + sm_m * DVS + wc;
    const float* abp = rec + RAB + 2 * sm_m;
    const float* kqp = rec + RKQ;
    auto fetch = [&](Ops& x) {
        const float4 a0 = *reinterpret_cast<const float4*>(kp);
        const float4 a1 = *reinterpret_cast<const float4*>(kp + 4);
        const float4 b0 = *reinterpret_cast<const float4*>(kp + REC_Q);
        const float4 b1 = *reinterpret_cast<const float4*>(kp + REC_Q + 4);
        x.k[0] = a0.x, x.k[1] = a0.y, x.k[2] = a0.z, x.k[3] = a0.w, x.k[4] = a1.x, x.k[5] = a1.y, x.k[6] = a1.z;
        x.k[7] = a1.w;
        x.q[0] = b0.x, x.q[1] = b0.y, x.q[2] = b0.z, x.q[3] = b0.w, x.q[4] = b1.x, x.q[5] = b1.y, x.q[6] = b1.z;
        x.q[7] = b1.w;
        x.v = *reinterpret_cast<const float4*>(vop);
        const float2 abv = *reinterpret_cast<const float2*>(abp);
        x.al = abv.x, x.bt = abv.y;
        x.kq = kqp[0];
        x.plan = *reinterpret_cast<const int2*>(kqp + (RPLAN - RKQ));
        kp += RS, vop += RS, abp += RS, kqp += RS;
    };
    float* op = os + sm_m * DVS + wc + oc;  // this lane's o of the current step (o_role lanes), r·16 floats a slot
    auto step_fn = [&](const Ops& x, Ops& next, int step) {
        if (step + 1 < n) fetch(next);
        const int src = x.plan.x, sav = x.plan.y;
        if (src != -1) {
            if (src == -2) {
                load(state + head_off);
            } else if (src < nsm) {
                load_sm(src);
            } else if (src < max_saves) {
                load(saves + (size_t)src * hv * D * D + head_off);
            } else {
                // scratch too small for the plan: poison so the caller's checks see it (as delta_kernel)
#pragma unroll
                for (int m = 0; m < ROWS_PER_THREAD; ++m)
                    S[m][0] = S[m][1] = S[m][2] = S[m][3] = __int_as_float(0x7fc00000);
            }
        }
        // Sᵀk and Sᵀq over this lane's 8 rows (delta_kernel's fma chains)
        float xk[4], yq[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float e = 0.0f, w = 0.0f;
#pragma unroll
            for (int m = 0; m < ROWS_PER_THREAD; ++m) {
                e = fmaf(S[m][c], x.k[m], e);
                w = fmaf(S[m][c], x.q[m], w);
            }
            xk[c] = e;
            yq[c] = w;
        }
        // Sᵀk: the 16 lanes sharing cq hold the other rows (the split's butterfly; every lane gets all 4 columns)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float e = xk[c];
            e += __shfl_xor_sync(LB_FULL_MASK, e, 2);
            e += __shfl_xor_sync(LB_FULL_MASK, e, 4);
            e += __shfl_xor_sync(LB_FULL_MASK, e, 8);
            e += __shfl_xor_sync(LB_FULL_MASK, e, 16);
            xk[c] = e;
        }
        // Sᵀq reduce-scattered: the butterfly's adds, each on the lanes that keep its column
        float q1 = h1 ? yq[2] : yq[0], q2 = h1 ? yq[3] : yq[1];
        q1 += __shfl_xor_sync(LB_FULL_MASK, h1 ? yq[0] : yq[2], 2);
        q2 += __shfl_xor_sync(LB_FULL_MASK, h1 ? yq[1] : yq[3], 2);
        float qv = h2 ? q2 : q1;
        qv += __shfl_xor_sync(LB_FULL_MASK, h2 ? q1 : q2, 4);
        qv += __shfl_xor_sync(LB_FULL_MASK, qv, 8);
        qv += __shfl_xor_sync(LB_FULL_MASK, qv, 16);
        const float alpha = x.al, bt = x.bt;
        const float vc[4] = {x.v.x, x.v.y, x.v.z, x.v.w};
        float u[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) u[c] = bt * (vc[c] - alpha * xk[c]);
        if (o_role) {
            const float uo = h1 ? (h2 ? u[3] : u[2]) : (h2 ? u[1] : u[0]);
            *op = fmaf(alpha, qv, x.kq * uo);
        }
        op += r * DVS;
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
#pragma unroll
            for (int c = 0; c < 4; ++c) S[m][c] = fmaf(alpha, S[m][c], x.k[m] * u[c]);
        if (sav >= 0 && sav < nsm)
            store_sm(sav);
        else if (sav >= 0 && sav < max_saves)
            store(saves + (size_t)sav * hv * D * D + head_off);
    };
    Ops opa, opb;
    fetch(opa);
    for (int step = 0; step < n; step += 2) {
        step_fn(opa, opb, step);
        if (step + 1 < n) step_fn(opb, opa, step + 1);
    }
    __syncthreads();

    // ---- the gated output norm ----
    // partial Σo² per (slot, head, 4 columns): out_norm's per-lane expression, lane 4j + c4 <- columns 16j + 4 c4
    const int nq4 = n * r * (DVS / 4);
    for (int i = tid; i < nq4; i += nthr) {
        const float4 x = reinterpret_cast<const float4*>(os)[i];
        pss[i] = x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    cluster.barrier_arrive();  // (A) release: the partials are published
    for (int i = tid; i < nq4; i += nthr) {
        const int t = i / (r * (DVS / 4)), m = (i / (DVS / 4)) % r, f = i % (DVS / 4);
        *reinterpret_cast<float4*>(o_out + ((size_t)t * hv + kh + m * hk) * D + c0 + 4 * f) =
            reinterpret_cast<const float4*>(os)[i];
    }
    for (int t = tid / (DVS * r); t < n; t += vstride) {
        float* zz = zs + (t * r + vm) * DVS + ve;  // this thread's own element, read back by it for y
        *zz = siluf_(*zz);
    }
    cluster.barrier_wait();
    // one warp per (slot, head): lane l <- block l / 4's partial of columns 4l .. 4l+3, out_norm's warp_sum
    for (int rho0 = warp; rho0 < n * r; rho0 += TASKS_IN_FLIGHT * nwarps) {
        float pv[TASKS_IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < TASKS_IN_FLIGHT; ++u) {
            const int rho = rho0 + u * nwarps;
            pv[u] = rho < n * r ? *cluster.map_shared_rank(pss + rho * (DVS / 4) + (lane & 3), lane >> 2) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < TASKS_IN_FLIGHT; ++u) {
            const int rho = rho0 + u * nwarps;
            if (rho < n * r) {
                const float ss = lb::warp_sum(pv[u]);
                if (lane == 0) rrs[rho] = rsqrtf(ss / D + eps);
            }
        }
    }
    // (B) relaxed: this block's reads of its peers' shared memory are done (their values are consumed above)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    __syncthreads();
    for (int t = tid / (DVS * r); t < n; t += vstride) {
        const int e = (t * r + vm) * DVS + ve;
        y[(size_t)t * hv * D + (size_t)vp * D + c0 + ve] = os[e] * rrs[t * r + vm] * nw * zs[e];
    }
    cluster.barrier_wait();  // (B) no block leaves while a peer may still read its shared memory
#endif
}

// LUCEBOX_GDN_TREE: "split" keeps lb_gdn_tree_verify on conv_prep + delta + out_norm; unset or anything else: the
// fused kernel where it applies. Read once per process.
bool fused_wanted() {
    static const bool on = [] {
        const char* v = std::getenv("LUCEBOX_GDN_TREE");
        return !(v && std::strcmp(v, "split") == 0);
    }();
    return on;
}

// Per device, queried once: whether the kernel can run (thread-block clusters AND a kernel image built for sm_90;
// the sm_86 profile's PTX JIT-compiled on an H200 would be the empty body above), the shared-memory limits, and
// how many clusters of r = 1..4 value heads fit at one block an SM.
struct DevInfo {
    bool ok = false;
    int optin = 0, per_sm = 0;
    int clusters_one_per_sm[TREE_RMAX + 1] = {};
};

const DevInfo* dev_info() {
    static DevInfo cache[16];
    static bool known[16] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return nullptr;
    if (known[dev]) return &cache[dev];
    DevInfo d;
    int cl = 0;
    cudaFuncAttributes fa = {};
    d.ok = cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) == cudaSuccess && cl &&
           cudaFuncGetAttributes(&fa, tree_fused_kernel) == cudaSuccess && fa.ptxVersion >= 90 &&
           fa.binaryVersion >= 90 &&
           cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&d.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
           cudaFuncSetAttribute(tree_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                d.optin - (int)fa.sharedSizeBytes) == cudaSuccess;
    if (d.ok) d.optin -= (int)fa.sharedSizeBytes;
    for (int r = 1; d.ok && r <= TREE_RMAX; ++r) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(NSLICE, 1);
        cfg.blockDim = dim3(DELTA_THREADS * r);
        cfg.dynamicSmemBytes = (size_t)d.optin;  // more than half an SM: one block an SM
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = NSLICE;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int nc = 0;
        if (cudaOccupancyMaxActiveClusters(&nc, tree_fused_kernel, &cfg) != cudaSuccess) nc = 0;
        d.clusters_one_per_sm[r] = nc;
    }
    (void)cudaGetLastError();  // a failed query leaves no sticky error for the caller
    cache[dev] = d, known[dev] = true;
    return &cache[dev];
}

size_t base_bytes(int n, int r) { return (size_t)layout(n, r).sv * sizeof(float); }
size_t save_bytes(int r) { return (size_t)DELTA_THREADS * r * ROWS_PER_THREAD * sizeof(float4); }

}  // namespace

bool tree_fused_ok(int n, int hk, int hv) {
    if (n < 1 || n > MAX_TREE || hk < 1 || hv < hk || hv % hk != 0 || hv / hk > TREE_RMAX || !fused_wanted())
        return false;
    const DevInfo* d = dev_info();
    return d && d->ok && base_bytes(n, hv / hk) <= (size_t)d->optin;
}

int tree_fused(const float* pre, const float* a, const float* b, const float* z, const float* conv_w,
               const float* ssm_a, const float* dt_bias, const float* norm_w, const float* conv_state,
               const float* state, const int32_t* parents, float* q, float* k, float* v, float* g, float* beta,
               float* o, float* saves, int max_saves, float* y, int n, int hk, int hv, float eps, cudaStream_t s) {
    const DevInfo* d = dev_info();
    if (!d || !d->ok) return (int)cudaErrorNotSupported;
    const int r = hv / hk;
    const size_t base = base_bytes(n, r), slice = save_bytes(r);
    // One block an SM (the walk wants every SM's issue slots) when all Hk clusters fit that way at once; else at most
    // half an SM of shared memory, so that two blocks share an SM and the clusters still run in one wave. What is
    // left of the budget keeps saves on chip (as many as the caller's scratch holds).
    size_t limit = (size_t)d->optin;
    const size_t half = (size_t)d->per_sm / 2 - 1024;
    if (d->clusters_one_per_sm[r] < hk && base <= half) limit = half;
    const size_t room = limit > base ? limit - base : 0;
    const int nsm = (int)std::min<size_t>(room / slice, (size_t)std::max(0, std::min(max_saves, MAX_TREE)));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(NSLICE, hk);
    cfg.blockDim = dim3(DELTA_THREADS * r);
    cfg.dynamicSmemBytes = base + (size_t)nsm * slice;
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
    return (int)cudaLaunchKernelEx(&cfg, tree_fused_kernel, pre, a, b, z, conv_w, ssm_a, dt_bias, norm_w, conv_state,
                                   state, parents, q, k, v, g, beta, o, saves, max_saves, y, n, hk, hv, eps, nsm,
                                   layout(n, r));
}

}  // namespace gdn

// 1: lb_gdn_tree_verify(n = t, hk, hv) runs the fused kernel on the current device (given 16-byte aligned pre,
// conv_state and z); 0: the three-kernel path (LUCEBOX_GDN_TREE=split, Hv / Hk > 4, t outside 1..64, no clusters).
// For tests and benches.
extern "C" LB_API int lb_gdn_tree_path(int t, int hk, int hv) { return gdn::tree_fused_ok(t, hk, hv) ? 1 : 0; }
