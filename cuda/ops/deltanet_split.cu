// The split scan of the chunked DeltaNet (the default; deltanet_chunked.cu has the algorithm and the
// fused scan it replaces). Of the scan's per-chunk work only v_new = u - w S and the state update
// S' = e^last S + (k e^(last - cum))ᵀ v_new form the sequential chain; the output
// o = e^cum (q S) + Aqk v_new needs the chunk's start state and v_new but nothing later. So:
//  1. dn_state_pass, one block per (16-column dv slice, head), sequential over chunks: the two chain
//     matmuls only, writing v_new over u and each chunk's start state to hs. Half the fused scan's
//     FLOPs on the chain and half its smem: 48.5 KB single-buffered (4 blocks/SM on sm_90: the 27B's
//     384 blocks in one wave instead of 1.45) or 84.5 KB with the next tile's cp.async in flight
//     during each matmul (grids that fit 2/SM anyway, the 0.8B's 128 blocks).
//  2. dn_chunk_output, one block per (64-column dv slice, head, chunk), all chunks in parallel.
// Extra traffic: hs, H·nch·64 KB written once and read once.
#include <atomic>
#include <cuda_runtime.h>

#include "deltanet_chunked.cuh"
#include "pf_common.cuh"

namespace pf {
namespace dn {
namespace {

constexpr int HVS = 16;        // dv columns per state-pass block
constexpr int WTP = CH + 8;    // 72: padded row of the transposed w tile [128 dk][64] (conflict-free, see phase A)
constexpr int KSP = D + 4;     // 132: padded row of a row-major [64][128] tile
constexpr int TILE = D * WTP;  // floats of one state-pass tile (the k tile [64][KSP] fits too)
static_assert(CH * KSP <= TILE, "k tile fits a w tile");
constexpr size_t state_smem(bool dbl) { return (size_t)((dbl ? 2 : 1) * TILE + D * HVS + CH * HVS + CH) * 4; }

constexpr int OVS = 64;        // dv columns per output block
constexpr int OAP = CH + 4;    // 68: padded row of the output block's Aqk tile
constexpr size_t OUT_SMEM = (size_t)(CH * KSP + D * OVS + CH * OAP + CH * OVS + CH) * 4;  // 98.25 KB (sm_86: 99 max)

// Block-wide 16-byte copies of a [rows][128] row-major chunk (rows >= L zero-filled) into a [rows][KSP] tile.
__device__ __forceinline__ void load_rows(float* dst, const float* src, int L, int tid) {
    for (int idx = tid; idx < CH * (D / 4); idx += 256) {
        const int i = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const bool ok = i < L;
        cp_async16_zfill(dst + i * KSP + d, src + (size_t)(ok ? i : 0) * D + d, ok);
    }
}

// Transposed w of chunk c ([128][64] contiguous, rows past the prompt already zero) into [128][WTP].
__device__ __forceinline__ void load_wt(float* dst, const float* src, int tid) {
    for (int idx = tid; idx < D * (CH / 4); idx += 256) {
        const int d = idx / (CH / 4), i = (idx % (CH / 4)) * 4;
        cp_async16_zfill(dst + d * WTP + i, src + (size_t)d * CH + i, true);
    }
}

// State S (the [128 dk][16 dv] slice j0.. of head h) lives in registers, thread (rg, cg) holding dk rows
// 4rg..4rg+3 and dv columns 2cg, 2cg+1, with a copy in smem for phase A, which reads all of it.
__global__ void __launch_bounds__(256, 3) dn_state_pass(const float* __restrict__ k, Scratch sc,
                                                        float* __restrict__ state, int T, int dbl) {
    extern __shared__ __align__(16) float sm[];
    float* Wt = sm;                        // [128 dk][WTP]: w of the chunk, transposed
    float* Kt = dbl ? sm + TILE : sm;      // [64][KSP]: k of the chunk (single-buffered: reuses Wt)
    float* S = sm + (dbl ? 2 : 1) * TILE;  // [128 dk][16 dv]
    float* vs = S + D * HVS;               // [64][16] v_new e^(last - cum)
    float* cs = vs + CH * HVS;             // [64] cum
    const int j0 = blockIdx.x * HVS, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nch = n_chunks(T);
    const float* wt_h = sc.w + (size_t)h * nch * D * CH;
    const float* k_h = k + (size_t)h * T * D;

    // phase B / state tile: dk rows 4rg.., dv columns 2cg..
    const int rg = tid >> 3, cg = tid & 7;
    float sr[4][2];
    float* Sg = state + (size_t)h * D * D;  // [dv][dk]
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const float4 x = *reinterpret_cast<const float4*>(Sg + (size_t)(j0 + 2 * cg + c) * D + 4 * rg);
        sr[0][c] = x.x, sr[1][c] = x.y, sr[2][c] = x.z, sr[3][c] = x.w;
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) *reinterpret_cast<float2*>(S + (4 * rg + r) * HVS + 2 * cg) = make_float2(sr[r][0], sr[r][1]);
    // phase A tile: rows 4ig..4ig+3 of w, dv columns 4jg.., dk rows d ≡ kq (mod 4); the four kq lanes of
    // an output reduce by shuffles. Wt row stride 72 ≡ 8 (mod 32): a warp's 4 rows x 8 floats hit 32 banks.
    const int jg = lane & 3, kq = (lane >> 2) & 3, ig = (lane >> 4) + 2 * warp;

    load_wt(Wt, wt_h, tid);
    cp_async_commit();
    if (dbl) load_rows(Kt, k_h, min(CH, T), tid);
    if (dbl) cp_async_commit();
    for (int c = 0; c < nch; ++c) {
        const int t0 = c * CH, L = min(CH, T - t0);
        const size_t hrow = (size_t)h * T + t0;
        if (tid < CH) cs[tid] = sc.cum[(size_t)h * nch * CH + t0 + tid];
        // this chunk's start state, for the output kernel
        float* hs = sc.hs + (((size_t)h * nch + c) * D + 4 * rg) * D + j0 + 2 * cg;
#pragma unroll
        for (int r = 0; r < 4; ++r) *reinterpret_cast<float2*>(hs + (size_t)r * D) = make_float2(sr[r][0], sr[r][1]);
        const int iv = 4 * ig + kq;  // the v_new row this thread finishes
        float* up = sc.u + (hrow + iv) * D + j0 + 4 * jg;
        const float4 u4 = iv < L ? *reinterpret_cast<const float4*>(up) : make_float4(0, 0, 0, 0);
        if (dbl) cp_async_wait<1>(); else cp_async_wait<0>();  // w of chunk c has landed
        __syncthreads();
        // phase A: v_new = u - w S
        {
            float a[4][4] = {};
#pragma unroll 8
            for (int dd = 0; dd < D / 4; ++dd) {
                const int d = 4 * dd + kq;
                const float4 x = *reinterpret_cast<const float4*>(Wt + d * WTP + 4 * ig);
                const float4 s = *reinterpret_cast<const float4*>(S + d * HVS + 4 * jg);
                const float xv[4] = {x.x, x.y, x.z, x.w}, sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int q = 0; q < 4; ++q) a[r][q] = fmaf(xv[r], sv[q], a[r][q]);
            }
            // reduce-scatter over the kq lanes: after lane bit 3, rows 2·b1.. stay; after bit 2, row kq
            const bool b1 = kq & 2, b0 = kq & 1;
            float p[2][4];
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float send = b1 ? a[r][q] : a[r + 2][q];
                    p[r][q] = (b1 ? a[r + 2][q] : a[r][q]) + __shfl_xor_sync(0xffffffffu, send, 8);
                }
            float f[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float send = b0 ? p[0][q] : p[1][q];
                f[q] = (b0 ? p[1][q] : p[0][q]) + __shfl_xor_sync(0xffffffffu, send, 4);
            }
            const float4 vn = make_float4(u4.x - f[0], u4.y - f[1], u4.z - f[2], u4.w - f[3]);
            if (iv < L) *reinterpret_cast<float4*>(up) = vn;  // v_new over u, for the output kernel
            // rows past the prompt: u = 0 and w = 0, so v_new = 0 there
            const float el = expf(cs[CH - 1] - cs[iv]);
            *reinterpret_cast<float4*>(vs + iv * HVS + 4 * jg) = make_float4(vn.x * el, vn.y * el, vn.z * el, vn.w * el);
        }
        __syncthreads();  // Wt free, vs complete
        if (dbl) {
            if (c + 1 < nch) load_wt(Wt, wt_h + (size_t)(c + 1) * D * CH, tid);
            cp_async_commit();
            cp_async_wait<1>();  // k of chunk c has landed
        } else {
            load_rows(Kt, k_h + (size_t)t0 * D, L, tid);
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncthreads();
        // phase B: S = e^last S + (k e^(last - cum))ᵀ v_new; cum is flat past the prompt, so cs[63] is the last
        {
            float b[4][2] = {};
#pragma unroll 8
            for (int i = 0; i < CH; ++i) {
                const float4 x = *reinterpret_cast<const float4*>(Kt + i * KSP + 4 * rg);
                const float2 v2 = *reinterpret_cast<const float2*>(vs + i * HVS + 2 * cg);
                const float xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    b[r][0] = fmaf(xv[r], v2.x, b[r][0]);
                    b[r][1] = fmaf(xv[r], v2.y, b[r][1]);
                }
            }
            const float elast = expf(cs[CH - 1]);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                sr[r][0] = fmaf(elast, sr[r][0], b[r][0]);
                sr[r][1] = fmaf(elast, sr[r][1], b[r][1]);
                *reinterpret_cast<float2*>(S + (4 * rg + r) * HVS + 2 * cg) = make_float2(sr[r][0], sr[r][1]);
            }
        }
        __syncthreads();  // Kt free, S updated, cs and vs read
        if (c + 1 < nch) {
            const int L1 = min(CH, T - t0 - CH);
            if (dbl) load_rows(Kt, k_h + (size_t)(t0 + CH) * D, L1, tid);
            else load_wt(Wt, wt_h + (size_t)(c + 1) * D * CH, tid);
        }
        cp_async_commit();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int c = 0; c < 2; ++c)
        *reinterpret_cast<float4*>(Sg + (size_t)(j0 + 2 * cg + c) * D + 4 * rg) =
            make_float4(sr[0][c], sr[1][c], sr[2][c], sr[3][c]);
}

// o = e^cum (q S_c) + Aqk v_new for 64 rows x 64 dv columns. Thread (ig, jg): rows ig + 16r (r < 4),
// columns 4jg..4jg+3; a warp spans 8 ig (rows 132 / 68 floats apart: 8 distinct 4-bank groups) and 4 jg.
__global__ void __launch_bounds__(256, 2) dn_chunk_output(const float* __restrict__ q, Scratch sc,
                                                          float* __restrict__ o, int T, int H) {
    extern __shared__ __align__(16) float sm[];
    float* Qs = sm;               // [64][KSP]
    float* Ss = Qs + CH * KSP;    // [128 dk][64 dv] the chunk's start state, this slice
    float* As = Ss + D * OVS;     // [64][OAP] Aqk
    float* Vs = As + CH * OAP;    // [64][64] v_new, this slice
    float* ec = Vs + CH * OVS;    // [64] e^cum
    const int j0 = blockIdx.x * OVS, h = blockIdx.y, c = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, nch = gridDim.z;
    const int t0 = c * CH, L = min(CH, T - t0);
    const size_t hrow = (size_t)h * T + t0;

    load_rows(Qs, q + hrow * D, L, tid);
    const float* hs = sc.hs + ((size_t)h * nch + c) * D * D + j0;
    for (int idx = tid; idx < D * (OVS / 4); idx += 256) {
        const int d = idx / (OVS / 4), jj = (idx % (OVS / 4)) * 4;
        cp_async16_zfill(Ss + d * OVS + jj, hs + (size_t)d * D + jj, true);
    }
    const float* aqk = sc.aqk + ((size_t)h * nch + c) * CH * CH;
    for (int idx = tid; idx < CH * (CH / 4); idx += 256) {
        const int r = idx / (CH / 4), cc = (idx % (CH / 4)) * 4;
        cp_async16_zfill(As + r * OAP + cc, aqk + r * CH + cc, true);
    }
    for (int idx = tid; idx < CH * (OVS / 4); idx += 256) {
        const int i = idx / (OVS / 4), jj = (idx % (OVS / 4)) * 4;
        const bool ok = i < L;
        cp_async16_zfill(Vs + i * OVS + jj, sc.u + (hrow + (ok ? i : 0)) * D + j0 + jj, ok);
    }
    cp_async_commit();
    if (tid < CH) ec[tid] = expf(sc.cum[(size_t)h * nch * CH + t0 + tid]);
    cp_async_wait<0>();
    __syncthreads();

    const int ig = (lane >> 2) + 8 * (warp & 1), jg = (lane & 3) + 4 * (warp >> 1);
    float qs[4][4] = {}, av[4][4] = {};
#pragma unroll 2
    for (int d4 = 0; d4 < D / 4; ++d4) {
        float xv[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float4 x = *reinterpret_cast<const float4*>(Qs + (ig + 16 * r) * KSP + 4 * d4);
            xv[r][0] = x.x, xv[r][1] = x.y, xv[r][2] = x.z, xv[r][3] = x.w;
        }
#pragma unroll
        for (int dd = 0; dd < 4; ++dd) {
            const float4 s = *reinterpret_cast<const float4*>(Ss + (4 * d4 + dd) * OVS + 4 * jg);
            const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int qq = 0; qq < 4; ++qq) qs[r][qq] = fmaf(xv[r][dd], sv[qq], qs[r][qq]);
        }
    }
    // Aqk is zero above the diagonal (prep), so the full 64-term sum is the causal one
#pragma unroll 2
    for (int m4 = 0; m4 < CH / 4; ++m4) {
        float xv[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float4 x = *reinterpret_cast<const float4*>(As + (ig + 16 * r) * OAP + 4 * m4);
            xv[r][0] = x.x, xv[r][1] = x.y, xv[r][2] = x.z, xv[r][3] = x.w;
        }
#pragma unroll
        for (int mm = 0; mm < 4; ++mm) {
            const float4 v = *reinterpret_cast<const float4*>(Vs + (4 * m4 + mm) * OVS + 4 * jg);
            const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int qq = 0; qq < 4; ++qq) av[r][qq] = fmaf(xv[r][mm], vv[qq], av[r][qq]);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = ig + 16 * r;
        if (i < L) {
            const float e = ec[i];
            *reinterpret_cast<float4*>(o + (size_t)(t0 + i) * H * D + h * D + j0 + 4 * jg) =
                make_float4(fmaf(e, qs[r][0], av[r][0]), fmaf(e, qs[r][1], av[r][1]), fmaf(e, qs[r][2], av[r][2]),
                            fmaf(e, qs[r][3], av[r][3]));
        }
    }
}

}  // namespace

int split_prepare() {
    cudaError_t e = cudaFuncSetAttribute(dn_state_pass, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)state_smem(true));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(dn_chunk_output, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)OUT_SMEM);
    return (int)e;
}

// How many dn_state_pass blocks of the double-buffered size the current device holds at once. Asked of the runtime
// once per device: split_scan runs once per DeltaNet layer and prefill pass (48 times a 27B prefill).
static cudaError_t resident_double_buffered(int* out) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> known[kMaxDevices];  // 0: not asked yet
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < kMaxDevices && (*out = known[dev].load(std::memory_order_relaxed)) > 0) return cudaSuccess;
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dn_state_pass, 256, state_smem(true));
    if (e != cudaSuccess) return e;
    *out = per_sm * sms;
    if (dev < kMaxDevices && *out > 0) known[dev].store(*out, std::memory_order_relaxed);
    return cudaSuccess;
}

int split_scan(const float* q, const float* k, Scratch sc, float* state, float* o, int T, int H, int mode,
               cudaStream_t s) {
    const dim3 sgrid(D / HVS, H);
    bool dbl = mode == 2;
    if (mode == 0) {
        // double-buffer only when the whole grid is resident at the double-buffered size anyway
        int resident = 0;
        const cudaError_t e = resident_double_buffered(&resident);
        if (e != cudaSuccess) return (int)e;
        dbl = (int)(sgrid.x * sgrid.y) <= resident;
    }
    dn_state_pass<<<sgrid, 256, state_smem(dbl), s>>>(k, sc, state, T, dbl ? 1 : 0);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    dn_chunk_output<<<dim3(D / OVS, H, n_chunks(T)), 256, OUT_SMEM, s>>>(q, sc, o, T, H);
    return (int)cudaGetLastError();
}

}  // namespace dn
}  // namespace pf
