// attn_decode: gated full attention over one layer's KV cache for decode (1 query), tree verify (N
// slots under an ancestor mask) and causal prefill — flash-style kernels split along the keys
// (flash-decoding) when the queries alone cannot fill the GPU, plus a combine kernel for the splits.
// Decode runs attn_kernel below (fp32 CUDA cores); tree verify and causal prefill (T > 1 queries) run
// tc::tree_kernel (tensor cores, split-precision Q and P; see its comment), the prefill in its causal
// form. LUCEBOX_ATTN_PREFILL=fp32 (read once per process, in attn::run) puts causal prefill back on
// attn_kernel; unset or "tc": tensor cores. The 0.8B prefill (pf::attn_tc) runs the same causal kernel
// but feeds an o_proj GEMM that takes split bf16 (hi, lo) inputs: Params::out_split makes the epilogue
// (and the split combine) write that pair directly, a template flag so the 27B's instantiations compile
// to the same code, and the 0.8B saves an fp32 round trip and a conversion kernel per layer.
//
// A block takes R query rows = up to R / group tokens x the `group` query heads of one kv head, so each
// K/V tile it loads serves every query head of that kv head (GQA). fp32 on CUDA cores with fp32 queries
// and an fp32 online softmax (the 0.8B attn_prefill's scheme, generalised in group, cache type and
// visibility rule): decode is bound by the KV bytes, not the math. R = 8 for one query (group <= 8 rows,
// little idle math), R = 32 otherwise. Grid (query tiles, kv heads, splits) with the query tile
// fastest, so the blocks that share a K/V range run together and the re-reads hit L2.
//
// All three kernels launch with programmatic dependent launch (lb_pdl.cuh). Nothing they read is
// constant (queries, gates, the cache rows lb_attn_prep just wrote, the tree masks, the partials), so
// each waits first thing; the overlap is the launch and block set-up under the predecessor's tail.
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
constexpr int KW = HD / 2 + 1;  // padded K/V smem row in 32-bit words: conflict-free in both phases
constexpr int PF = BKV * (HD / 8) / THREADS;  // 16-byte K (and V) chunks each thread prefetches per tile

// Keys per split when the position is read on the device (pos_dev): the host's formula for kv_rows keys
// over n_splits blocks, a multiple of BKV; splits past the last key come out empty.
__device__ __forceinline__ int device_split_len(int kv_rows, int n_splits) {
    const int len = (kv_rows + n_splits - 1) / n_splits;
    return (len + BKV - 1) / BKV * BKV;
}

// Probabilities are kept transposed, Ps[key][row] with rows padded to R + 4: the PV phase then reads 4
// rows of one key with one 16-byte broadcast load (the scores' writes take a 4-way bank conflict, once
// per tile, instead of 16 scalar loads per key).
template <int R>
__host__ __device__ constexpr int prow() { return R + 4; }

template <int R>
constexpr size_t smem_bytes() {
    return ((size_t)2 * R + (size_t)R * HD + (size_t)2 * BKV * KW + (size_t)BKV * prow<R>() + (size_t)4 * R) * 4;
}

template <int R, int KVT>
__global__ void __launch_bounds__(THREADS) attn_kernel(const Params P, const int32_t* __restrict__ pos_dev) {
    constexpr int PR = prow<R>();
    extern __shared__ __align__(16) float sm[];
    unsigned long long* rmask = reinterpret_cast<unsigned long long*>(sm);  // [R] tree mask of each row
    float* Qs = sm + 2 * R;                                                // [R][HD], scaled by 1/sqrt(HD)
    uint32_t* Ks = reinterpret_cast<uint32_t*>(Qs + R * HD);               // [BKV][KW]
    uint32_t* Vs = Ks + BKV * KW;                                          // [BKV][KW]
    float* Ps = reinterpret_cast<float*>(Vs + BKV * KW);                   // [BKV][PR]
    float* mrow = Ps + BKV * PR;
    float* lrow = mrow + R;
    float* arow = lrow + R;
    int* rlim = reinterpret_cast<int*>(arow + R);  // causal: last visible key; -1: inactive row
    lb::pdl_trigger();
    lb::pdl_wait();
    const int G = P.group, QT = R / G;
    const int t0 = blockIdx.x * QT, g = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nt = min(QT, P.Tq - t0);
    const bool tree = P.mask != nullptr;
    const int pos0 = pos_dev ? *pos_dev : P.pos0;
    const int split_len = pos_dev ? device_split_len(pos0 + P.Tq, P.n_splits) : P.split_len;
    const int kv_end = tree ? pos0 + P.Tq : pos0 + t0 + nt;
    const int kb0 = split * split_len, kb1 = min(kb0 + split_len, kv_end);

    const uint16_t* kbase = P.kc + (size_t)g * P.max_ctx * HD;
    const uint16_t* vbase = P.vc + (size_t)g * P.max_ctx * HD;
    // The next tile's K / V are loaded into registers while the current one is computed on, so the
    // HBM latency is paid once per block rather than once per tile.
    uint4 pk[PF], pv[PF];
    auto fetch = [&](int kb) { fetch_kv_tile<PF, THREADS>(pk, pv, kbase, vbase, kb, kb1, tid); };
    if (kb0 < kb1) fetch(kb0);

    // row r: token t0 + r / G, query head g*G + r % G; every load issued before any store (a copy loop
    // would wait one L2 round trip per element)
    {
        constexpr int NQ = R * HD / 4 / THREADS;
        float4 xq[NQ];
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
            const int idx = tid + i * THREADS, r = idx / (HD / 4), d = 4 * (idx % (HD / 4)), tt = r / G;
            xq[i] = tt < nt ? *reinterpret_cast<const float4*>(P.qf + ((size_t)(t0 + tt) * P.nh + g * G + r % G) * HD + d)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
            const int idx = tid + i * THREADS;
            reinterpret_cast<float4*>(Qs)[idx] =
                make_float4(xq[i].x * 0.0625f, xq[i].y * 0.0625f, xq[i].z * 0.0625f, xq[i].w * 0.0625f);
        }
    }
    if (tid < R) {
        const int tt = tid / G;
        const bool on = tt < nt;
        rlim[tid] = on ? pos0 + t0 + tt : -1;
        rmask[tid] = on && tree ? P.mask[t0 + tt] : 0ull;
        mrow[tid] = -INFINITY;
        lrow[tid] = 0.0f;
    }
    const int dp = tid & (HD / 2 - 1);  // PV: this thread's dim pair
    const int rb = tid / (HD / 2);      // PV: rows rb·R/2 .. rb·R/2 + R/2 - 1
    float acc[R / 2][2];
#pragma unroll
    for (int a = 0; a < R / 2; ++a) acc[a][0] = acc[a][1] = 0.0f;

    for (int kb = kb0; kb < kb1; kb += BKV) {
        __syncthreads();  // the previous tile's K / V / P are consumed
#pragma unroll
        for (int i = 0; i < PF; ++i) {
            const int idx = tid + i * THREADS, j = idx / (HD / 8), c = idx % (HD / 8);
            uint32_t* kd = Ks + j * KW + c * 4;
            uint32_t* vd = Vs + j * KW + c * 4;
            kd[0] = pk[i].x, kd[1] = pk[i].y, kd[2] = pk[i].z, kd[3] = pk[i].w;
            vd[0] = pv[i].x, vd[1] = pv[i].y, vd[2] = pv[i].z, vd[3] = pv[i].w;
        }
        __syncthreads();
        if (kb + BKV < kb1) fetch(kb + BKV);
        {
            // scores: key kb + lane, rows warp + 8a; 4 dims per iteration (one 16-byte Q broadcast per row)
            float s[R / 8];
#pragma unroll
            for (int a = 0; a < R / 8; ++a) s[a] = 0.0f;
#pragma unroll 4
            for (int w4 = 0; w4 < HD / 4; ++w4) {
                const float2 k01 = kv2f<KVT>(Ks[lane * KW + 2 * w4]);
                const float2 k23 = kv2f<KVT>(Ks[lane * KW + 2 * w4 + 1]);
#pragma unroll
                for (int a = 0; a < R / 8; ++a) {
                    const float4 q4 = *reinterpret_cast<const float4*>(Qs + (warp + 8 * a) * HD + 4 * w4);
                    s[a] = fmaf(q4.x, k01.x, fmaf(q4.y, k01.y, fmaf(q4.z, k23.x, fmaf(q4.w, k23.y, s[a]))));
                }
            }
            const int key = kb + lane;
#pragma unroll
            for (int a = 0; a < R / 8; ++a) {
                const int r = warp + 8 * a;
                bool vis = rlim[r] >= 0 && key < kb1;
                if (tree) {
                    const int j = key - pos0;
                    vis = vis && (j < 0 || ((rmask[r] >> j) & 1ull));
                } else {
                    vis = vis && key <= rlim[r];
                }
                Ps[lane * PR + r] = vis ? s[a] : -INFINITY;
            }
        }
        __syncthreads();
        // online softmax: warp w owns rows w*R/8 .. w*R/8 + R/8 - 1
#pragma unroll
        for (int a = 0; a < R / 8; ++a) {
            const int r = warp * (R / 8) + a;
            online_softmax_row(&Ps[lane * PR + r], mrow[r], lrow[r], arow[r], lane);
        }
        __syncthreads();
        rescale_accumulate_pv<R, KVT, PR, KW>(acc, arow, Ps, Vs, rb, dp);
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < R / 2; ++a) {
        const int r = rb * (R / 2) + a, tt = r / G;
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

// x -> (hi, lo) in the cache type, hi + lo = x to ~16 (bf16) / ~22 (f16) bits: the tensor cores' Q and P
// operands, and (bf16) the SPLIT_OUT output, the 0.8B's o_proj input.
template <int KVT>
__device__ __forceinline__ void split(float x, uint16_t& hi, uint16_t& lo) {
    hi = f2kv<KVT>(x);
    const float h = KVT == KV_BF16 ? __uint_as_float((uint32_t)hi << 16) : __half2float(__ushort_as_half(hi));
    lo = f2kv<KVT>(x - h);
}

// Two floats (lower column first) -> packed hi and lo words.
template <int KVT>
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    uint16_t h0, l0, h1, l1;
    split<KVT>(x0, h0, l0);
    split<KVT>(x1, h1, l1);
    hi = (uint32_t)h0 | ((uint32_t)h1 << 16);
    lo = (uint32_t)l0 | ((uint32_t)l1 << 16);
}

// One block per (query, head), one thread per dim: merge the splits' partial softmaxes, apply the gate.
// The loops are unrolled so a thread has 8 splits' loads in flight at once: a decode step merges 64
// splits, and a loop that waits on each L2 load in turn cost more than the attention itself.
// SPLIT_OUT: out_split's bf16 (hi, lo) pair instead of fp32 out (Params).
template <bool SPLIT_OUT>
__global__ void __launch_bounds__(HD) combine_kernel(const Params P) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int th = blockIdx.x, t = th / P.nh, h = th % P.nh, d = threadIdx.x;
    const size_t stride = (size_t)P.Tq * P.nh;
    const float2* ml = reinterpret_cast<const float2*>(P.part_ml);
    float M = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < P.n_splits; ++s) M = fmaxf(M, ml[s * stride + th].x);
    float L = 0.0f, o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < P.n_splits; ++s) {
        const float2 m = ml[s * stride + th];
        const float a = P.part_acc[(s * stride + th) * HD + d];
        // a split with no visible key has m = -inf and l = 0 (its partial is all zeros)
        const float w = m.x == -INFINITY ? 0.0f : expf(m.x - M);
        L = fmaf(m.y, w, L);
        o = fmaf(a, w, o);
    }
    const float gt = P.gate[(size_t)t * P.gate_ld + (size_t)h * P.gate_hs + d];
    const float x = L > 0.0f ? o / L * sigmoidf_(gt) : 0.0f;
    if constexpr (SPLIT_OUT) {
        uint16_t hi, lo;
        split<KV_BF16>(x, hi, lo);
        P.out_split[(size_t)th * HD + d] = hi;
        P.out_split[(stride + th) * HD + d] = lo;
    } else {
        P.out[(size_t)th * HD + d] = x;
    }
}

// ---- Tree verify on tensor cores ----------------------------------------------------------------
// A verify is 23 slots x 6 heads = 138 query rows per kv head over ~4K keys: 2.3 GFLOP per layer, so
// fp32 FMAs cap it near 35 µs per layer on an H200 whatever the tiling. This kernel runs both products
// on mma.sync m16n8k16 (f16 or bf16 as the cache) with fp32 accumulators and the softmax in fp32.
// Precision: K and V enter exactly (they are cache values); Q (scaled by 1/16, exact) and P are split
// into hi + lo halves of the cache type and each product is two mmas, so the result matches the fp32
// math to ~1e-6 (f16) / ~4e-6 (bf16) relative RMS; with one rounding of Q and P it would be 3e-4 /
// 2e-3 (numpy model of the test data), past the 1e-4 the tests hold all attention forms to.
//
// Block: 6 warps, a pair per 16 query rows (48 rows = 8 tokens of a 6-head group), one kv head, one
// key split; tiles of 32 keys. The two warps of a pair each take half the head dims: half of q·k
// (the partial scores are summed through shared memory, in the same order by both, so both hold the
// same S and run the same softmax) and half of O (64 accumulators per lane: a warp owning all 256
// dims of O needs 128 and spills). K and V arrive by cp.async into single buffers, overlapped with compute:
// the next tile's K loads during this tile's softmax and PV, the next V during the next QK.
//
// Causal prefill (CAUSAL = true, mask unused) is the same kernel with the visibility rule of attn_kernel:
// row t sees keys [0, pos0 + t], and a block reads keys up to its last token's (kv_end). The work of a
// block grows with its query tile, so blocks are handed out heaviest first (rank 0 = the last tile of
// every kv head); when the grid is between one and two blocks per SM (`wave` = the SM count, else the
// block count), the second wave is taken lightest first, so the two blocks an SM usually holds at once
// add up to about the same number of key tiles (block b < wave: rank b; b >= wave: rank N-1-(b-wave)).
namespace tc {

constexpr int WARPS = 6;
constexpr int THREADS = WARPS * 32;
constexpr int MR = WARPS / 2 * 16;  // query rows per block
constexpr int HH = HD / 2;          // head dims per warp of a pair
constexpr int BK = 32;          // keys per tile
constexpr int LD = HD + 8;      // smem row in halves: 528 bytes, conflict-free fragment loads
constexpr int NCH = BK * HD / 8;  // 16-byte chunks per K (or V) tile

constexpr size_t smem_bytes() { return (size_t)(2 * MR + 2 * BK) * LD * 2 + (size_t)WARPS * 32 * (BK / 2) * 4; }

template <int KVT>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (KVT == KV_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

// Visibility of keys kb .. kb+31 to a row with tree mask mk, as 32 bits (bit i = key kb + i): committed
// keys (below pos0) always, tree keys by their mask bit, nothing at or past kb1 or for an idle row.
__device__ __forceinline__ uint32_t tile_bits(unsigned long long mk, bool on, int kb, int kb1, int pos0) {
    if (!on) return 0u;
    const int n = kb1 - kb;
    const uint32_t in = n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
    const int sh = kb - pos0;
    uint32_t vis;
    if (sh >= 0) {
        vis = sh < 64 ? (uint32_t)(mk >> sh) : 0u;
    } else {
        const int c = -sh;  // committed keys at the tile's start
        vis = c >= 32 ? 0xffffffffu : (((1u << c) - 1u) | (uint32_t)(mk << c));
    }
    return vis & in;
}

// Causal visibility of keys kb .. kb+31 to a row at position lim (keys <= lim), nothing at or past kb1.
__device__ __forceinline__ uint32_t causal_bits(int lim, bool on, int kb, int kb1) {
    if (!on) return 0u;
    const int n = min(lim + 1, kb1) - kb;
    return n <= 0 ? 0u : n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

template <int KVT, bool CAUSAL, bool SPLIT_OUT = false>
__global__ void __launch_bounds__(THREADS, 2) tree_kernel(const Params P, const int32_t* __restrict__ pos_dev, int wave) {
    extern __shared__ __align__(16) uint16_t hs[];
    uint16_t* Qh = hs;             // [MR][LD] hi halves of q / 16
    uint16_t* Ql = Qh + MR * LD;   // [MR][LD] lo halves
    uint16_t* Ks = Ql + MR * LD;   // [BK][LD]
    uint16_t* Vs = Ks + BK * LD;   // [BK][LD]
    float* Sx = reinterpret_cast<float*>(Vs + BK * LD);  // [WARPS][16][32] partial scores, lane-private
    lb::pdl_trigger();
    lb::pdl_wait();
    const int G = P.group, QT = MR / G;
    int qtile = blockIdx.x, gk = blockIdx.y;
    if constexpr (CAUSAL) {  // heaviest first, the second wave lightest first (see above)
        const int nq = gridDim.x, nb = nq * gridDim.y, b = blockIdx.x + nq * blockIdx.y;
        const int rank = b < wave ? b : nb - 1 - (b - wave);
        qtile = nq - 1 - rank / gridDim.y;
        gk = rank % gridDim.y;
    }
    const int t0 = qtile * QT, split_i = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, qd = lane & 3;
    const int hh = warp & 1;  // which half of the head dims
    const int nt = min(QT, P.Tq - t0);
    const int pos0 = pos_dev ? *pos_dev : P.pos0;
    const int split_len = pos_dev ? device_split_len(pos0 + P.Tq, P.n_splits) : P.split_len;
    const int kv_end = CAUSAL ? pos0 + t0 + nt : pos0 + P.Tq;
    const int kb0 = split_i * split_len, kb1 = min(kb0 + split_len, kv_end);
    const uint16_t* kbase = P.kc + (size_t)gk * P.max_ctx * HD;
    const uint16_t* vbase = P.vc + (size_t)gk * P.max_ctx * HD;

    // keys past kb1 are zero-filled (cache rows there may hold anything, NaN included)
    auto load_tile = [&](uint16_t* dst, const uint16_t* base, int kb) {
        for (int idx = tid; idx < NCH; idx += THREADS) {
            const int j = idx / (HD / 8), c = idx % (HD / 8);
            const bool ok = kb + j < kb1;
            cp_async16(dst + j * LD + c * 8, base + (size_t)(ok ? kb + j : kb0) * HD + c * 8, ok);
        }
    };
    if (kb0 < kb1) {
        load_tile(Ks, kbase, kb0);
        cp_commit();
        load_tile(Vs, vbase, kb0);
        cp_commit();
    }
    // row r: token t0 + r / G, query head gk*G + r % G; rows past the block's tokens stay zero
    // (in batches of QB float4 per thread, every load of a batch issued before any store)
    constexpr int QB = 8;
    static_assert(MR * HD / 4 % (QB * THREADS) == 0, "whole batches");
    for (int i0 = tid; i0 < MR * HD / 4; i0 += QB * THREADS) {
        float4 xq[QB];
#pragma unroll
        for (int u = 0; u < QB; ++u) {
            const int idx = i0 + u * THREADS, r = idx / (HD / 4), d = 4 * (idx % (HD / 4)), tt = r / G;
            xq[u] = tt < nt ? *reinterpret_cast<const float4*>(P.qf + ((size_t)(t0 + tt) * P.nh + gk * G + r % G) * HD + d)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < QB; ++u) {
            const int idx = i0 + u * THREADS, r = idx / (HD / 4), d = 4 * (idx % (HD / 4));
            uint32_t h0, l0, h1, l1;
            split2<KVT>(xq[u].x * 0.0625f, xq[u].y * 0.0625f, h0, l0);
            split2<KVT>(xq[u].z * 0.0625f, xq[u].w * 0.0625f, h1, l1);
            *reinterpret_cast<uint2*>(Qh + r * LD + d) = make_uint2(h0, h1);
            *reinterpret_cast<uint2*>(Ql + r * LD + d) = make_uint2(l0, l1);
        }
    }
    // this lane's two rows: A = (warp / 2)*16 + gq, B = A + 8
    const int rA = (warp >> 1) * 16 + gq, rB = rA + 8;
    const bool onA = rA / G < nt, onB = rB / G < nt;
    const unsigned long long mkA = !CAUSAL && onA ? P.mask[t0 + rA / G] : 0ull;
    const unsigned long long mkB = !CAUSAL && onB ? P.mask[t0 + rB / G] : 0ull;
    const int limA = pos0 + t0 + rA / G, limB = pos0 + t0 + rB / G;  // causal: the rows' last visible keys
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;
    float O[HH / 8][4];  // dims hh*128 + 8i + 2qd (+1), rows A (0, 1) and B (2, 3)
#pragma unroll
    for (int i = 0; i < HH / 8; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;

    for (int kb = kb0; kb < kb1; kb += BK) {
        cp_wait1();  // this tile's K (its V may still be in flight)
        __syncthreads();
        float S[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; ++i) S[i][0] = S[i][1] = S[i][2] = S[i][3] = 0.0f;
#pragma unroll 2
        for (int ks = 0; ks < HH / 16; ++ks) {
            const int c = hh * HH + ks * 16 + 2 * qd;
            uint32_t ah[4], al[4];
            ah[0] = *reinterpret_cast<const uint32_t*>(Qh + rA * LD + c);
            ah[1] = *reinterpret_cast<const uint32_t*>(Qh + rB * LD + c);
            ah[2] = *reinterpret_cast<const uint32_t*>(Qh + rA * LD + c + 8);
            ah[3] = *reinterpret_cast<const uint32_t*>(Qh + rB * LD + c + 8);
            al[0] = *reinterpret_cast<const uint32_t*>(Ql + rA * LD + c);
            al[1] = *reinterpret_cast<const uint32_t*>(Ql + rB * LD + c);
            al[2] = *reinterpret_cast<const uint32_t*>(Ql + rA * LD + c + 8);
            al[3] = *reinterpret_cast<const uint32_t*>(Ql + rB * LD + c + 8);
#pragma unroll
            for (int n8 = 0; n8 < BK / 8; ++n8) {
                const uint16_t* kr = Ks + (n8 * 8 + gq) * LD + c;
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
                mma<KVT>(S[n8], ah, b0, b1);
                mma<KVT>(S[n8], al, b0, b1);
            }
        }
#pragma unroll
        for (int i = 0; i < BK / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) Sx[(warp * (BK / 2) + 4 * i + e) * 32 + lane] = S[i][e];
        __syncthreads();  // every warp is done with K (the next tile's K may land); partials posted
        const bool more = kb + BK < kb1;
        if (more) load_tile(Ks, kbase, kb + BK);
        cp_commit();  // (an empty group on the last tile keeps the wait counts uniform)
        // own + partner's half: x + y == y + x, so both warps of the pair hold identical scores
#pragma unroll
        for (int i = 0; i < BK / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[i][e] += Sx[((warp ^ 1) * (BK / 2) + 4 * i + e) * 32 + lane];

        // visibility and the online softmax, rows A and B (a quad of lanes shares each row)
        float xA = -INFINITY, xB = -INFINITY;
        const uint32_t bA = CAUSAL ? causal_bits(limA, onA, kb, kb1) : tile_bits(mkA, onA, kb, kb1, pos0);
        const uint32_t bB = CAUSAL ? causal_bits(limB, onB, kb, kb1) : tile_bits(mkB, onB, kb, kb1, pos0);
#pragma unroll
        for (int n8 = 0; n8 < BK / 8; ++n8)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int bit = n8 * 8 + 2 * qd + e;
                const bool vA = (bA >> bit) & 1u, vB = (bB >> bit) & 1u;
                S[n8][e] = vA ? S[n8][e] : -INFINITY;
                S[n8][2 + e] = vB ? S[n8][2 + e] : -INFINITY;
                xA = fmaxf(xA, S[n8][e]);
                xB = fmaxf(xB, S[n8][2 + e]);
            }
        xA = fmaxf(xA, __shfl_xor_sync(LB_FULL_MASK, xA, 1));
        xA = fmaxf(xA, __shfl_xor_sync(LB_FULL_MASK, xA, 2));
        xB = fmaxf(xB, __shfl_xor_sync(LB_FULL_MASK, xB, 1));
        xB = fmaxf(xB, __shfl_xor_sync(LB_FULL_MASK, xB, 2));
        const float nA = fmaxf(mA, xA), nB = fmaxf(mB, xB);
        const float alA = mA == -INFINITY ? 0.0f : expf(mA - nA), alB = mB == -INFINITY ? 0.0f : expf(mB - nB);
        mA = nA, mB = nB;
        float sA = 0.0f, sB = 0.0f;
#pragma unroll
        for (int n8 = 0; n8 < BK / 8; ++n8)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                S[n8][e] = S[n8][e] == -INFINITY ? 0.0f : expf(S[n8][e] - nA);
                S[n8][2 + e] = S[n8][2 + e] == -INFINITY ? 0.0f : expf(S[n8][2 + e] - nB);
                sA += S[n8][e];
                sB += S[n8][2 + e];
            }
        lA = lA * alA + sA;  // this lane's share of the row sum (quad-reduced at the end)
        lB = lB * alB + sB;
#pragma unroll
        for (int i = 0; i < HH / 8; ++i) {
            O[i][0] *= alA, O[i][1] *= alA;
            O[i][2] *= alB, O[i][3] *= alB;
        }
        cp_wait1();  // this tile's V (the next K may still be in flight)
        __syncthreads();
        // O += P V; V's B fragments by ldmatrix.trans, two n-tiles (16 dims) per instruction:
        // lanes 8mi .. 8mi+7 address key rows (mi & 1)·8 + (lane & 7), dims (mi >> 1)·8
        const int mi = lane >> 3;
        // P as A fragments: keys 16kk .. 16kk+15 are the accumulators of n-tiles 2kk and 2kk+1
        uint32_t ph[BK / 16][4], pl[BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            split2<KVT>(S[2 * kk][0], S[2 * kk][1], ph[kk][0], pl[kk][0]);
            split2<KVT>(S[2 * kk][2], S[2 * kk][3], ph[kk][1], pl[kk][1]);
            split2<KVT>(S[2 * kk + 1][0], S[2 * kk + 1][1], ph[kk][2], pl[kk][2]);
            split2<KVT>(S[2 * kk + 1][2], S[2 * kk + 1][3], ph[kk][3], pl[kk][3]);
        }
        const uint32_t vrow =
            (uint32_t)__cvta_generic_to_shared(Vs + ((mi & 1) * 8 + (lane & 7)) * LD + hh * HH + (mi >> 1) * 8);
#pragma unroll
        for (int np = 0; np < HH / 16; ++np) {
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                             : "r"(vrow + (uint32_t)(kk * 16 * LD + np * 16) * 2));
                mma<KVT>(O[2 * np], ph[kk], b0, b1);
                mma<KVT>(O[2 * np], pl[kk], b0, b1);
                mma<KVT>(O[2 * np + 1], ph[kk], b2, b3);
                mma<KVT>(O[2 * np + 1], pl[kk], b2, b3);
            }
        }
        __syncthreads();  // every warp is done with V: the next tile's V may land
        if (more) load_tile(Vs, vbase, kb + BK);
        cp_commit();
    }
    lA += __shfl_xor_sync(LB_FULL_MASK, lA, 1);
    lA += __shfl_xor_sync(LB_FULL_MASK, lA, 2);
    lB += __shfl_xor_sync(LB_FULL_MASK, lB, 1);
    lB += __shfl_xor_sync(LB_FULL_MASK, lB, 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? rB : rA;
        if (!(half ? onB : onA)) continue;
        const float l = half ? lB : lA, m = half ? mB : mA;
        const int t = t0 + r / G, h = gk * G + r % G;
        if (P.n_splits == 1) {
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            const float* gt = P.gate + (size_t)t * P.gate_ld + (size_t)h * P.gate_hs;
            if constexpr (SPLIT_OUT) {
                // the 0.8B prefill's o_proj input: hi at row t, lo Tq rows further (as pf::attn_flash writes it)
                uint16_t* dhi = P.out_split + ((size_t)t * P.nh + h) * HD;
                uint16_t* dlo = dhi + (size_t)P.Tq * P.nh * HD;
#pragma unroll
                for (int i = 0; i < HH / 8; ++i) {
                    const int d = hh * HH + i * 8 + 2 * qd;
                    uint32_t whi, wlo;
                    split2<KV_BF16>(O[i][2 * half] * inv * sigmoidf_(gt[d]),
                                    O[i][2 * half + 1] * inv * sigmoidf_(gt[d + 1]), whi, wlo);
                    *reinterpret_cast<uint32_t*>(dhi + d) = whi;
                    *reinterpret_cast<uint32_t*>(dlo + d) = wlo;
                }
            } else {
                float* dst = P.out + ((size_t)t * P.nh + h) * HD;
#pragma unroll
                for (int i = 0; i < HH / 8; ++i) {
                    const int d = hh * HH + i * 8 + 2 * qd;
                    *reinterpret_cast<float2*>(dst + d) = make_float2(O[i][2 * half] * inv * sigmoidf_(gt[d]),
                                                                      O[i][2 * half + 1] * inv * sigmoidf_(gt[d + 1]));
                }
            }
        } else {
            const size_t row = ((size_t)split_i * P.Tq + t) * P.nh + h;
            float* dst = P.part_acc + row * HD;
#pragma unroll
            for (int i = 0; i < HH / 8; ++i)
                *reinterpret_cast<float2*>(dst + hh * HH + i * 8 + 2 * qd) =
                    make_float2(O[i][2 * half], O[i][2 * half + 1]);
            if (qd == 0 && hh == 0) *reinterpret_cast<float2*>(P.part_ml + row * 2) = make_float2(m, l);
        }
    }
}

// sms: the SM count (causal: the first wave of the heaviest-first order when the grid holds between one
// and two blocks per SM).
template <int KVT, bool CAUSAL, bool SPLIT_OUT = false>
cudaError_t launch(const Params& P, const int32_t* pos_dev, int sms, cudaStream_t s) {
    const size_t smem = smem_bytes();
    cudaError_t e = cudaFuncSetAttribute(tree_kernel<KVT, CAUSAL, SPLIT_OUT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int qt = MR / P.group;
    const dim3 grid((unsigned)((P.Tq + qt - 1) / qt), (unsigned)P.nkv, (unsigned)P.n_splits);
    const int nb = (int)(grid.x * grid.y);
    const int wave = CAUSAL && nb > sms && nb <= 2 * sms ? sms : nb;
    return lb::launch_pdl(tree_kernel<KVT, CAUSAL, SPLIT_OUT>, grid, dim3(THREADS), smem, s, P, pos_dev, wave);
}

}  // namespace tc

template <int R, int KVT>
cudaError_t launch(const Params& P, const int32_t* pos_dev, cudaStream_t s) {
    const size_t smem = smem_bytes<R>();
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<R, KVT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int qt = R / P.group;
    const dim3 grid((unsigned)((P.Tq + qt - 1) / qt), (unsigned)P.nkv, (unsigned)P.n_splits);
    return lb::launch_pdl(attn_kernel<R, KVT>, grid, dim3(THREADS), smem, s, P, pos_dev);
}

}  // namespace

size_t partials_bytes(int tq, int nh, int max_splits) {
    return max_splits > 1 ? (size_t)max_splits * tq * nh * (HD + 2) * 4 : 0;
}

// LUCEBOX_ATTN_PREFILL: "fp32" runs causal prefill (T > 1) on attn_kernel (and the 0.8B prefill on its own
// pf::attn_flash, which asks here); unset, "tc" or anything else on the tensor cores
// (tc::tree_kernel<.., true>). Read once per process.
bool prefill_on_tensor_cores() {
    static const bool tc = [] {
        const char* v = std::getenv("LUCEBOX_ATTN_PREFILL");
        return !(v && std::strcmp(v, "fp32") == 0);
    }();
    return tc;
}

int run(Params P, int kv_dtype, void* partials, int max_splits, cudaStream_t s, const int32_t* pos_dev) {
    // tree verify and causal prefill: tensor cores (tc::tree_kernel); decode (and prefill under
    // LUCEBOX_ATTN_PREFILL=fp32): the fp32 kernel. A split-bf16 output (out_split) exists only in the
    // causal tensor-core form, whatever T and the switch (its caller keeps its own fp32 path).
    const bool split_out = P.out_split != nullptr;
    if (split_out && (P.mask || kv_dtype != KV_BF16)) return (int)cudaErrorInvalidValue;
    const bool tc_tree = P.mask != nullptr;
    const bool tc_causal = !tc_tree && (split_out || (P.Tq > 1 && prefill_on_tensor_cores()));
    const int R = P.Tq == 1 ? 8 : 32;
    const int block_rows = tc_tree || tc_causal ? tc::MR : R;
    const int qtiles = (P.Tq + block_rows / P.group - 1) / (block_rows / P.group);
    // Keys the widest query tile reads: all committed rows plus the new ones.
    const int kv_rows = P.pos0 + P.Tq;
    int splits = 1, sms = 1;
    if ((partials && max_splits > 1) || tc_causal) {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return (int)e;
    }
    if (partials && max_splits > 1) {
        // about two blocks per SM, never a split shorter than one tile; causal on tensor cores: no split
        // once the query tiles alone give every SM a block (the heaviest-first order balances them, and
        // a split would add the partials' round trip and the combine)
        const int want = tc_causal && qtiles * P.nkv >= sms ? 1 : (2 * sms + qtiles * P.nkv - 1) / (qtiles * P.nkv);
        // with the position on the device (a CUDA graph replayed at every n_past) the split count can not
        // follow the context: it is fixed here and the kernels size the splits from *pos_dev (splits past
        // the last key come out empty, m = -inf and l = 0, which the combine weighs 0)
        splits = pos_dev ? std::max(1, std::min(want, max_splits))
                         : std::max(1, std::min({want, max_splits, (kv_rows + BKV - 1) / BKV}));
    }
    if (pos_dev) {
        P.n_splits = splits;
        P.split_len = 0;  // unused: the kernels take device_split_len(*pos_dev + Tq, n_splits)
    } else {
        P.split_len = (kv_rows + splits - 1) / splits;
        P.split_len = (P.split_len + BKV - 1) / BKV * BKV;
        P.n_splits = (kv_rows + P.split_len - 1) / P.split_len;
    }
    if (P.n_splits > 1) {
        P.part_acc = static_cast<float*>(partials);
        P.part_ml = P.part_acc + (size_t)P.n_splits * P.Tq * P.nh * HD;
    }
    cudaError_t e;
    if (tc_tree)
        e = kv_dtype == KV_BF16 ? tc::launch<KV_BF16, false>(P, pos_dev, sms, s)
                                : tc::launch<KV_F16, false>(P, pos_dev, sms, s);
    else if (tc_causal && split_out)
        e = tc::launch<KV_BF16, true, true>(P, pos_dev, sms, s);
    else if (tc_causal)
        e = kv_dtype == KV_BF16 ? tc::launch<KV_BF16, true>(P, pos_dev, sms, s)
                                : tc::launch<KV_F16, true>(P, pos_dev, sms, s);
    else if (R == 8)
        e = kv_dtype == KV_BF16 ? launch<8, KV_BF16>(P, pos_dev, s) : launch<8, KV_F16>(P, pos_dev, s);
    else
        e = kv_dtype == KV_BF16 ? launch<32, KV_BF16>(P, pos_dev, s) : launch<32, KV_F16>(P, pos_dev, s);
    if (e != cudaSuccess || P.n_splits == 1) return (int)e;
    return (int)(split_out ? lb::launch_pdl(combine_kernel<true>, dim3(P.Tq * P.nh), dim3(HD), 0, s, P)
                           : lb::launch_pdl(combine_kernel<false>, dim3(P.Tq * P.nh), dim3(HD), 0, s, P));
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
