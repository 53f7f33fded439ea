// The chunked DeltaNet on the tensor cores (the default prefill path; LUCEBOX_DN_PREFILL=old keeps the fp32 kernels
// of deltanet_chunked.cu / deltanet_split.cu). The same chunk-64 WY / UT math as cpu.py `gated_delta_chunked`, every
// product on mma.sync m16n8k16 bf16 with both operands split into bf16 pairs (x ≈ hi + lo, ~16 significant bits) and
// three MMAs per product (lo·hi + hi·lo + hi·hi, fp32 accumulate): ~6e-6 relative error against float64 in a numpy
// emulation of this scheme at the op tests' shapes, where fp32 gives ~4e-7 and the tests allow 1e-4
// (docs/perf.md "v7: chunked DeltaNet prefill"). Three kernels:
//  1. prep_kernel (deltanet_tc_prep.cu), one block per (chunk, value head), all chunks at once, from post-conv q, k,
//     v, g, beta or (the prefills) from the pre-conv rows, doing the conv, SiLU, norms, g and beta for its own heads:
//     cum = cumsum(g); the Gram k·kᵀ and q·kᵀ
//     (lower triangle only, 5 tiles a warp); L = β k kᵀ e^(cum_i − cum_j); the UT system (I + L)[u | w] =
//     [βv | βk e^cum] solved blockwise: the four 16 x 16 diagonal blocks inverted by substitution (64 threads),
//     then 4 block rows X_b = (I + L_bb)⁻¹ (R_b − Σ_{a<b} L_ba X_a) as products, every warp owning 32 of the 256
//     right-hand columns in registers (the transposed products keep each step's result in accumulator layout,
//     which is the next step's A-fragment layout: no shared-memory round trip in the chain).
//  2. tc_state, one block per (NS-column dv slice, head), sequential over chunks: V_newᵀ = Uᵀ − Sᵀ Wᵀ, then
//     Sᵀ ← e^last Sᵀ + V_newᵀ K̃ (K̃ = k e^(last − cum)). The state is kept transposed so that both chain products
//     take their A operand from the previous product's accumulators (through a small bf16-pair exchange tile among
//     the warps sharing a 16-row m-tile); W and K̃ tiles stream in by cp.async a chunk ahead. It writes each
//     chunk's start state and V_new as ready-made A fragments for:
//  3. tc_output, one block per (chunk, head): oᵀ = Sᵀ (q e^cum)ᵀ + V_newᵀ Aqkᵀ for all 128 dv columns (causal
//     blocks only), then o, or the gated RMSNorm over dv fused in (y fp32, or the 0.8B's split bf16 pair); on the
//     0.8B's layer path (Out::ring) it also copies the last 4 pre-conv rows into the conv ring.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "deltanet_tc.cuh"

namespace pf {
namespace dn {
namespace tc {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// 2. the state pass: block (dv slice of NS columns, head); warp (mt, part): dv m-tile mt of the slice, and of the
// chain products' columns the part-th of P equal shares (phase A: 64 time columns, NA n-tiles; phase B: 128 dk
// columns, NB n-tiles).
constexpr size_t WT_TILE = (size_t)2 * D * LB64;   // bf16 of one −Wᵀ pair tile [2][128][72]
constexpr size_t KT_TILE = (size_t)2 * CH * LB128; // bf16 of one K̃ pair tile [2][64][136]
constexpr size_t state_smem(int ns, bool dbl) {
    return ((dbl ? 2 : 1) * (WT_TILE + KT_TILE) + (size_t)2 * ns * LB128 + (size_t)2 * ns * LB64) * 2;
}

template <int NS, bool DBL>
__global__ void __launch_bounds__(NT, 1) tc_state(const TcScratch sc, float* __restrict__ state, int state_t,
                                                   int nch) {
    constexpr int MT = NS / 16, P = 8 / MT, NA = 8 / P, NB = 16 / P;
    static_assert(NS == 32 || NS == 64, "NA and NB must be even");
    extern __shared__ __align__(16) uint16_t smb[];
    uint16_t* Wt = smb;                                // [stages][2][128 dk][72]
    uint16_t* Kt = Wt + (DBL ? 2 : 1) * WT_TILE;       // [stages][2][64][136]
    uint16_t* Xs = Kt + (DBL ? 2 : 1) * KT_TILE;       // [2][NS dv][136] Sᵀ of the slice, the next chain's A
    uint16_t* Vx = Xs + 2 * NS * LB128;                // [2][NS dv][72] V_newᵀ of the slice
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int h = blockIdx.y, j0 = blockIdx.x * NS;
    const int mt = warp / P, part = warp % P, mg = j0 / 16 + mt;  // mg: the m-tile in the head's 8

    auto load_w = [&](int st, int cc) {
        const uint16_t* src = sc.wt + ((size_t)h * nch + cc) * WT_N;
        uint16_t* dst = Wt + st * WT_TILE;
        // a fixed count a thread (the row advances by NT / 8 each step: immediate offsets, one basic block)
        static_assert(2 * D * (CH / 8) % NT == 0, "whole rounds");
#pragma unroll
        for (int i = 0; i < 2 * D * (CH / 8) / NT; ++i) {
            const int idx = tid + i * NT, row = idx >> 3, c8 = (idx & 7) * 8;
            cp_async16_zfill(dst + row * LB64 + c8, src + row * CH + c8, true);
        }
    };
    auto load_k = [&](int st, int cc) {
        const uint16_t* src = sc.kt + ((size_t)h * nch + cc) * KT_N;
        uint16_t* dst = Kt + st * KT_TILE;
        static_assert(2 * CH * (D / 8) % NT == 0, "whole rounds");
#pragma unroll
        for (int i = 0; i < 2 * CH * (D / 8) / NT; ++i) {
            const int idx = tid + i * NT, row = idx >> 4, c8 = (idx & 15) * 8;
            cp_async16_zfill(dst + row * LB128 + c8, src + row * D + c8, true);
        }
    };
    auto load_u = [&](int cc, float (&u)[NA][4]) {
        const float* src = sc.uv + ((size_t)h * nch + cc) * UV_N + (size_t)mg * 8 * 128;
#pragma unroll
        for (int na = 0; na < NA; ++na) {
            const float4 x = *reinterpret_cast<const float4*>(src + ((part * NA + na) * 32 + lane) * 4);
            u[na][0] = x.x, u[na][1] = x.y, u[na][2] = x.z, u[na][3] = x.w;
        }
    };

    // Sᵀ of the slice in accumulator layout: rows dv = j0 + 16mt + g (+8), columns dk = dk0 + 8nb + 2t (+1)
    const int dk0 = part * 8 * NB, row0 = 16 * mt + gq;
    float s[NB][4];
    float* Sg = state + (size_t)h * D * D;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int dv = j0 + row0 + 8 * half, dk = dk0 + 8 * nb + 2 * tq;
            if (state_t) {
                const float2 x = *reinterpret_cast<const float2*>(Sg + (size_t)dv * D + dk);
                s[nb][2 * half] = x.x, s[nb][2 * half + 1] = x.y;
            } else {
                s[nb][2 * half] = Sg[(size_t)dk * D + dv];
                s[nb][2 * half + 1] = Sg[(size_t)(dk + 1) * D + dv];
            }
        }
    auto store_xs = [&]() {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                uint32_t hi, lo;
                split_bf2(s[nb][2 * half], s[nb][2 * half + 1], hi, lo);
                const int o = (row0 + 8 * half) * LB128 + dk0 + 8 * nb + 2 * tq;
                *reinterpret_cast<uint32_t*>(Xs + o) = hi;
                *reinterpret_cast<uint32_t*>(Xs + NS * LB128 + o) = lo;
            }
    };
    store_xs();
    float u[NA][4];
    load_u(0, u);
    load_w(0, 0);
    if (!DBL) cp_async_commit();
    load_k(0, 0);
    cp_async_commit();

    for (int c = 0; c < nch; ++c) {
        const size_t unit = (size_t)h * nch + c;
        const int st = DBL ? (c & 1) : 0;
        if (DBL) {
            cp_async_wait<0>();
            __syncthreads();  // chunk c's tiles and Sᵀ in place; every warp is done with the other stage
            if (c + 1 < nch) {
                load_w(st ^ 1, c + 1);
                load_k(st ^ 1, c + 1);
            }
            cp_async_commit();
        } else {
            cp_async_wait<1>();  // −Wᵀ of chunk c (K̃ may still be in flight)
            __syncthreads();
        }
        const float elast = expf(sc.cum[unit * CH + CH - 1]);
        float acc[NA][4];
#pragma unroll
        for (int na = 0; na < NA; ++na)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[na][r] = u[na][r];
        if (c + 1 < nch) load_u(c + 1, u);

        // phase A: V_newᵀ = Uᵀ + Sᵀ (−Wᵀ); this chunk's start state goes out as the output kernel's A fragments
        {
            const uint16_t* ws = Wt + st * WT_TILE;
            uint32_t* hs = sc.hs + ((unit * 8 + mg) * 8) * 2 * 128 + lane * 4;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ah[4], al[4];
                const int ao = lda_off(LB128, 16 * mt, 16 * kk);
                ldmatrix_x4(ah, Xs + ao);
                ldmatrix_x4(al, Xs + NS * LB128 + ao);
                if (kk % P == part) {
                    *reinterpret_cast<uint4*>(hs + (kk * 2) * 128) = make_uint4(ah[0], ah[1], ah[2], ah[3]);
                    *reinterpret_cast<uint4*>(hs + (kk * 2 + 1) * 128) = make_uint4(al[0], al[1], al[2], al[3]);
                }
#pragma unroll
                for (int np = 0; np < NA / 2; ++np) {
                    uint32_t bh[4], bl[4];
                    const int bo = ldb_kn_off(LB64, 16 * kk, part * 8 * NA + 16 * np);
                    ldmatrix_x4_trans(bh, ws + bo);
                    ldmatrix_x4_trans(bl, ws + D * LB64 + bo);
                    mma3(acc[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                    mma3(acc[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                }
            }
#pragma unroll
            for (int na = 0; na < NA; ++na)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    uint32_t hi, lo;
                    split_bf2(acc[na][2 * half], acc[na][2 * half + 1], hi, lo);
                    const int o = (row0 + 8 * half) * LB64 + part * 8 * NA + 8 * na + 2 * tq;
                    *reinterpret_cast<uint32_t*>(Vx + o) = hi;
                    *reinterpret_cast<uint32_t*>(Vx + NS * LB64 + o) = lo;
                }
        }
        if (!DBL) cp_async_wait<0>();  // K̃ of chunk c
        __syncthreads();  // V_newᵀ complete; every warp is done reading Sᵀ and the −Wᵀ tile
        if (!DBL) {
            if (c + 1 < nch) load_w(0, c + 1);
            cp_async_commit();
        }

        // phase B: Sᵀ ← e^last Sᵀ + V_newᵀ K̃; V_newᵀ goes out as the output kernel's A fragments (over Uᵀ)
        {
            const uint16_t* ks = Kt + st * KT_TILE;
            uint32_t* vn = reinterpret_cast<uint32_t*>(sc.uv + unit * UV_N) + (mg * 4) * 2 * 128 + lane * 4;
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                for (int r = 0; r < 4; ++r) s[nb][r] *= elast;
#pragma unroll
            for (int kk = 0; kk < CH / 16; ++kk) {
                uint32_t ah[4], al[4];
                const int ao = lda_off(LB64, 16 * mt, 16 * kk);
                ldmatrix_x4(ah, Vx + ao);
                ldmatrix_x4(al, Vx + NS * LB64 + ao);
                if (kk % P == part) {
                    *reinterpret_cast<uint4*>(vn + (kk * 2) * 128) = make_uint4(ah[0], ah[1], ah[2], ah[3]);
                    *reinterpret_cast<uint4*>(vn + (kk * 2 + 1) * 128) = make_uint4(al[0], al[1], al[2], al[3]);
                }
#pragma unroll
                for (int np = 0; np < NB / 2; ++np) {
                    uint32_t bh[4], bl[4];
                    const int bo = ldb_kn_off(LB128, 16 * kk, dk0 + 16 * np);
                    ldmatrix_x4_trans(bh, ks + bo);
                    ldmatrix_x4_trans(bl, ks + CH * LB128 + bo);
                    mma3(s[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                    mma3(s[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                }
            }
        }
        if (!DBL) __syncthreads();  // every warp is done with the K̃ tile and V_newᵀ (DBL: the next top barrier)
        store_xs();
        if (!DBL) {
            if (c + 1 < nch) load_k(0, c + 1);
            cp_async_commit();
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int dv = j0 + row0 + 8 * half, dk = dk0 + 8 * nb + 2 * tq;
            if (state_t) {
                *reinterpret_cast<float2*>(Sg + (size_t)dv * D + dk) = make_float2(s[nb][2 * half], s[nb][2 * half + 1]);
            } else {
                Sg[(size_t)dk * D + dv] = s[nb][2 * half];
                Sg[(size_t)(dk + 1) * D + dv] = s[nb][2 * half + 1];
            }
        }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. the output: block (chunk, head); warp w owns dv m-tile w and all 64 time columns.
constexpr size_t OUT_SMEM = (size_t)(2 * CH * LB128 + 2 * CH * LB64) * 2;  // 53,248 B
static_assert((size_t)CH * LDO * 4 <= (size_t)2 * CH * LB128 * 2, "the output stage fits over the q tile");

template <int MODE>
__global__ void __launch_bounds__(NT, 2) tc_output(const In in, const TcScratch sc, const Out out, int T, int H) {
    extern __shared__ __align__(16) uint16_t smo[];
    uint16_t* Qe = smo;                  // [2][64 time][136] q e^cum as a pair
    uint16_t* Aq = Qe + 2 * CH * LB128;  // [2][64][72] Aqk
    float* stage = reinterpret_cast<float*>(smo);  // [64][LDO] o, over Qe once the products are done
    const int c = blockIdx.x, h = blockIdx.y, nch = gridDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int t0 = c * CH, L = min(CH, T - t0);
    const size_t unit = (size_t)h * nch + c;

    if (out.ring) {  // the conv ring's update (Out::ring), spread over the whole grid
        const int nr = min(T, 4), C = out.ring_c, nb = nch * gridDim.y;
        for (int idx = (h * nch + c) * NT + tid; idx < nr * C; idx += nb * NT) {
            const int t = T - nr + idx / C, ch = idx % C;
            out.ring[(size_t)((out.ring_pos0 + t) & 3) * C + ch] = out.ring_pre[(size_t)t * out.ring_ld + ch];
        }
    }
    {
        const uint16_t* src = sc.aqk + unit * AQ_N;
        static_assert(2 * CH * (CH / 8) % NT == 0, "whole rounds");
#pragma unroll
        for (int u = 0; u < 2 * CH * (CH / 8) / NT; ++u) {
            const int idx = tid + u * NT, row = idx >> 3, c8 = (idx & 7) * 8;
            cp_async16_zfill(Aq + row * LB64 + c8, src + row * CH + c8, true);
        }
        cp_async_commit();
    }
    {
        const long long q0 = (long long)t0 * in.qk_t + (long long)(h % in.hk) * in.qk_h;
        const float* cg = sc.cum + unit * CH;
        // a fixed count a thread, every load issued before the first use (one round of L2 latency, not one per
        // unrolled pair of items)
        constexpr int NU = CH * (D / 4) / NT;
        static_assert(CH * (D / 4) % NT == 0, "whole rounds");
        float4 xq[NU];
        float cq[NU];
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            const int idx = tid + u * NT, i = idx >> 5, d = (idx & 31) * 4;
            xq[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < L) xq[u] = *reinterpret_cast<const float4*>(in.q + q0 + (long long)i * in.qk_t + d);
            cq[u] = cg[i];
        }
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            const int idx = tid + u * NT, i = idx >> 5, d = (idx & 31) * 4;
            const float4 x = xq[u];
            const float e = expf(cq[u]);
            uint2 hi, lo;
            split_bf2(x.x * e, x.y * e, hi.x, lo.x);
            split_bf2(x.z * e, x.w * e, hi.y, lo.y);
            *reinterpret_cast<uint2*>(Qe + i * LB128 + d) = hi;
            *reinterpret_cast<uint2*>(Qe + CH * LB128 + i * LB128 + d) = lo;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[n][r] = 0.0f;
    // Sᵀ (q e^cum)ᵀ
    {
        const uint32_t* hs = sc.hs + ((unit * 8 + warp) * 8) * 2 * 128 + lane * 4;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint4 xh = *reinterpret_cast<const uint4*>(hs + (kk * 2) * 128);
            const uint4 xl = *reinterpret_cast<const uint4*>(hs + (kk * 2 + 1) * 128);
            const uint32_t ah[4] = {xh.x, xh.y, xh.z, xh.w}, al[4] = {xl.x, xl.y, xl.z, xl.w};
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t bh[4], bl[4];
                const int bo = ldb_nk_off(LB128, 16 * np, 16 * kk);
                ldmatrix_x4(bh, Qe + bo);
                ldmatrix_x4(bl, Qe + CH * LB128 + bo);
                mma3(acc[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                mma3(acc[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
            }
        }
    }
    // + V_newᵀ Aqkᵀ: time k-step kk (j) meets n-tile pair np (i) only where 16 kk <= i, i.e. np >= kk
    {
        const uint32_t* vn = reinterpret_cast<const uint32_t*>(sc.uv + unit * UV_N) + (warp * 4) * 2 * 128 + lane * 4;
#pragma unroll
        for (int kk = 0; kk < CH / 16; ++kk) {
            const uint4 xh = *reinterpret_cast<const uint4*>(vn + (kk * 2) * 128);
            const uint4 xl = *reinterpret_cast<const uint4*>(vn + (kk * 2 + 1) * 128);
            const uint32_t ah[4] = {xh.x, xh.y, xh.z, xh.w}, al[4] = {xl.x, xl.y, xl.z, xl.w};
#pragma unroll
            for (int np = kk; np < 4; ++np) {
                uint32_t bh[4], bl[4];
                const int bo = ldb_nk_off(LB64, 16 * np, 16 * kk);
                ldmatrix_x4(bh, Aq + bo);
                ldmatrix_x4(bl, Aq + CH * LB64 + bo);
                mma3(acc[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                mma3(acc[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
            }
        }
    }
    __syncthreads();  // every warp is done with Qe: the stage goes over it
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) stage[(8 * n + 2 * tq + (r & 1)) * LDO + 16 * warp + gq + 8 * (r >> 1)] = acc[n][r];
    __syncthreads();
    // one warp per token row: o, or the gated RMSNorm over the head's 128 dv (the arithmetic of dn_gated_norm_kernel
    // and gdn::out_norm_kernel)
    for (int i = warp; i < L; i += NT / 32) {
        const float4 a = *reinterpret_cast<const float4*>(stage + i * LDO + 4 * lane);
        const int t = t0 + i;
        const size_t at = (size_t)t * H * D + (size_t)h * D + 4 * lane;
        if (MODE == OUT_O) {
            *reinterpret_cast<float4*>(out.o + at) = a;
            continue;
        }
        const float ss = lb::warp_sum(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w);
        const float r = rsqrtf(ss / D + out.eps);
        const float4 w = *reinterpret_cast<const float4*>(out.norm + 4 * lane);
        const float4 z = *reinterpret_cast<const float4*>(out.z + (size_t)t * out.ldz + (size_t)h * D + 4 * lane);
        const float y0 = a.x * r * w.x * siluf_(z.x), y1 = a.y * r * w.y * siluf_(z.y);
        const float y2 = a.z * r * w.z * siluf_(z.z), y3 = a.w * r * w.w * siluf_(z.w);
        if (MODE == OUT_Y) {
            *reinterpret_cast<float4*>(out.o + at) = make_float4(y0, y1, y2, y3);
        } else {
            uint2 hi, lo;
            split_bf2(y0, y1, hi.x, lo.x);
            split_bf2(y2, y3, hi.y, lo.y);
            *reinterpret_cast<uint2*>(out.xb + at) = hi;
            *reinterpret_cast<uint2*>(out.xb + (size_t)T * H * D + at) = lo;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// host

// Test switches, read once per process: LUCEBOX_DN_SLICE (32 / 64 dv columns a state-pass block), LUCEBOX_DN_SCAN
// (split1: single-buffered tiles, split2: double-buffered; the fp32 path's switch, same meaning).
struct Force {
    int ns = 0, buffers = 0;
};
Force forced() {
    static const Force f = [] {
        Force r;
        const char* ns = std::getenv("LUCEBOX_DN_SLICE");
        if (ns && !std::strcmp(ns, "32")) r.ns = 32;
        if (ns && !std::strcmp(ns, "64")) r.ns = 64;
        const char* scan = std::getenv("LUCEBOX_DN_SCAN");
        if (scan && !std::strcmp(scan, "split1")) r.buffers = 1;
        if (scan && !std::strcmp(scan, "split2")) r.buffers = 2;
        return r;
    }();
    return f;
}

template <int NS, bool DBL>
cudaError_t set_state_smem(const Dev& d) {
    const size_t need = state_smem(NS, DBL);
    if ((size_t)d.optin < need) return cudaSuccess;  // never launched on this device
    return cudaFuncSetAttribute(tc_state<NS, DBL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need);
}

}  // namespace

cudaError_t device_info(Dev* out) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> sms[kMaxDevices], optin[kMaxDevices], major[kMaxDevices];  // 0: not asked yet
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < kMaxDevices && sms[dev].load(std::memory_order_relaxed) > 0) {
        out->sms = sms[dev].load(std::memory_order_relaxed);
        out->optin = optin[dev].load(std::memory_order_relaxed);
        out->major = major[dev].load(std::memory_order_relaxed);
        return cudaSuccess;
    }
    Dev d;
    e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    if (dev < kMaxDevices) {
        optin[dev].store(d.optin, std::memory_order_relaxed);
        major[dev].store(d.major, std::memory_order_relaxed);
        sms[dev].store(d.sms, std::memory_order_relaxed);
    }
    *out = d;
    return cudaSuccess;
}

}  // namespace tc

size_t tc_scratch_bytes(int T, int H) {
    size_t total = 0;
    tc::carve_tc(nullptr, T, H, &total);
    return total;
}

int tc_prepare(bool* ok) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> known[kMaxDevices];  // 0: not asked yet, 1: runs here (attributes set), 2: does not
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return (int)e;
    const int k = dev < kMaxDevices ? known[dev].load(std::memory_order_relaxed) : 0;
    if (k) {
        *ok = k == 1;
        return (int)cudaSuccess;
    }
    tc::Dev d;
    if ((e = tc::device_info(&d)) != cudaSuccess) return (int)e;
    // sm_80+ (bf16 mma.sync, cp.async) and room for the biggest fixed-size kernel (prep) and the smallest state pass
    *ok = d.major >= 8 && (size_t)d.optin >= tc::prep_smem() && (size_t)d.optin >= tc::state_smem(32, false);
    if (*ok) {
        using namespace tc;
        e = prep_prepare();
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(tc_output<OUT_O>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)OUT_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(tc_output<OUT_Y>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)OUT_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(tc_output<OUT_XB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)OUT_SMEM);
        if (e == cudaSuccess) e = set_state_smem<32, false>(d);
        if (e == cudaSuccess) e = set_state_smem<32, true>(d);
        if (e == cudaSuccess) e = set_state_smem<64, false>(d);
        if (e == cudaSuccess) e = set_state_smem<64, true>(d);
        if (e != cudaSuccess) return (int)e;
    }
    if (dev < kMaxDevices) known[dev].store(*ok ? 1 : 2, std::memory_order_relaxed);
    return (int)cudaSuccess;
}

int tc_run(const In& in, const ConvIn* cv, float* state, bool state_t, const Out& out, void* scratch, int T, int H,
           cudaStream_t s) {
    using namespace tc;
    Dev d;
    cudaError_t e = device_info(&d);
    if (e != cudaSuccess) return (int)e;
    const TcScratch sc = carve_tc(scratch, T, H, nullptr);
    const int nch = n_chunks(T);
    if ((e = prep_launch(in, cv, sc, T, H, s)) != cudaSuccess) return (int)e;
    // The state pass re-reads a head's −Wᵀ and K̃ tiles (64 KB a chunk) in every dv-slice block: 32-column slices
    // while they make no more blocks than SMs (the 0.8B: 64 blocks), else 64-column slices (the 27B: 96 blocks),
    // where the shared memory allows; tiles double-buffered where it allows that. LUCEBOX_DN_SLICE=32|64 and
    // LUCEBOX_DN_SCAN=split1|split2 (single / double-buffered) force a variant where it fits (tests).
    const Force f = forced();
    int ns = (H * (D / 32) <= d.sms || (size_t)d.optin < state_smem(64, false)) ? 32 : 64;
    if (f.ns && (size_t)d.optin >= state_smem(f.ns, false)) ns = f.ns;
    bool dbl = (size_t)d.optin >= state_smem(ns, true);
    if (f.buffers == 1) dbl = false;
    const dim3 sgrid(D / ns, H);
    const int st = state_t ? 1 : 0;
    if (ns == 32 && dbl)
        tc_state<32, true><<<sgrid, NT, state_smem(32, true), s>>>(sc, state, st, nch);
    else if (ns == 32)
        tc_state<32, false><<<sgrid, NT, state_smem(32, false), s>>>(sc, state, st, nch);
    else if (dbl)
        tc_state<64, true><<<sgrid, NT, state_smem(64, true), s>>>(sc, state, st, nch);
    else
        tc_state<64, false><<<sgrid, NT, state_smem(64, false), s>>>(sc, state, st, nch);
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
    const dim3 ogrid(nch, H);
    if (out.mode == OUT_Y)
        tc_output<OUT_Y><<<ogrid, NT, OUT_SMEM, s>>>(in, sc, out, T, H);
    else if (out.mode == OUT_XB)
        tc_output<OUT_XB><<<ogrid, NT, OUT_SMEM, s>>>(in, sc, out, T, H);
    else
        tc_output<OUT_O><<<ogrid, NT, OUT_SMEM, s>>>(in, sc, out, T, H);
    return (int)cudaGetLastError();
}

}  // namespace dn

bool dn_prefill_tc() {
    static const bool tc = [] {
        const char* e = std::getenv("LUCEBOX_DN_PREFILL");
        return !(e && !std::strcmp(e, "old"));
    }();
    return tc;
}

}  // namespace pf
