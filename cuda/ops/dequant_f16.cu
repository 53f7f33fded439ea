// lb_dequant_f16: rows [row0, row0 + rows) of a quantized matrix in the device layout
// (cuda/common/quant_blocks.cuh, the tiled Q4_K_T and Q6_K_T included) to fp16 [rows, k] row-major, the first half of the cuBLAS prefill GEMM
// (cuda/ops/gemm_q_cublas.cu: dequantize a row chunk, then one tensor-core GEMM over it).
//
// Values: ggml's dequantize_row_* (and the gguf package's numpy twin, which the CPU engine uses) computed in
// fp32 with the same operations in the same order, each rounded (the __f*_rn intrinsics: nvcc would otherwise
// contract d1 * q - m1 into one FMA, one rounding fewer than the reference), then rounded to fp16 (RN):
//   Q4_K / Q5_K  (d * sc) * q - (dmin * m)      Q6_K  (d * sc) * (q - 32)      Q8_0  q * d
// so each output equals float16(reference float32) bit for bit.
//
// Layout of the work: one warp per 256-weight block at a time, lane l owning weights 8l .. 8l + 7, so every
// store instruction of a warp writes one block's 512 contiguous bytes (16 B per lane, fully coalesced). A warp
// does kBlocksPerWarp consecutive blocks (32 weights per thread), loading all of them before converting any,
// so that a lane has that many independent loads in flight. A lane's 8 weights sit in 8 contiguous quant bytes
// (and 8 contiguous Q5_K / Q6_K high-bit bytes) for every type: 8-byte loads; lanes that share bytes (the low
// and high nibbles of Q4_K / Q5_K) read them in the same instruction, so HBM sees each byte once.
//
// LUCEBOX_DEQUANT=<name> picks a variant of this kernel (the table below: faster integer conversion, streaming stores,
// a cp.async tile ring for Q6_K_T), each with the same output bit for bit; unset, the table's first entry
// ("fast_cs6", the fastest measured); "base" is the kernel described here. docs/perf.md "27B prefill: dequantization
// variants".
#include <cuda_fp16.h>
#include <stdint.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lb_async.cuh"
#include "lb_check.cuh"
#include "quant_blocks.cuh"

namespace {

using namespace lb::q;

constexpr int kThreads = 256;
constexpr int kBlocksPerWarp = 4;
constexpr int kBlocksPerCta = kThreads / 32 * kBlocksPerWarp;

__device__ __forceinline__ float half_bits(uint32_t bits16) {
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFF)));
}

__device__ __forceinline__ uint8_t byte_of(uint2 v, int i) {
    return (uint8_t)((i < 4 ? v.x >> (8 * i) : v.y >> (8 * (i - 4))) & 0xFF);
}

// One lane's raw bytes of one 256-weight block: the header / scales (16 B, or Q8_0's unused), 8 quant bytes,
// 8 high-bit bytes (Q5_K, Q6_K), the fp16 d of the trailing array (Q6_K, Q8_0).
struct Raw {
    uint4 hdr;
    uint2 q, h;
    uint32_t d16;
};

// gb: where the block is stored, in blocks: its index in the row-major block stream (row * nb + block column), or
// for Q4_K_T / Q6_K_T its place in the tiled order (the kernel maps it: quant_blocks.cuh block_index; Q6_K_T: tile
// gb / 16, row gb % 16 of it, the bytes at q6t_offset).
template <int QT>
__device__ __forceinline__ Raw load_raw(const uint8_t* __restrict__ w, int64_t n_blocks_all, int64_t gb, int lane) {
    Raw r{};
    if constexpr (QT == Q4_K || QT == Q5_K || QT == Q4_K_T) {
        constexpr int kBytes = QT == Q5_K ? 176 : 144, kQs = QT == Q5_K ? 48 : 16;
        const uint8_t* b = w + gb * kBytes;
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b));  // d, dmin, scales[12]: the same 16 B for every lane
        // weights 8 lane .. +7: qs group lane / 8, bytes 8 (lane % 4) .. +7 (low nibbles for lane % 8 < 4)
        r.q = ldg_stream8(b + kQs + 32 * (lane >> 3) + 8 * (lane & 3));
        if constexpr (QT == Q5_K) r.h = ldg_stream8(b + 16 + 8 * (lane & 3));  // qh[(8 lane) % 32 ..]
    } else if constexpr (QT == Q6_K) {
        // body [ql 128 | qh 64 | scales 16]; weights 8 lane: half n = lane / 16, quarter qq = (lane % 16) / 4
        const uint8_t* b = w + gb * kQ6Packed;
        const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
        r.q = ldg_stream8(b + 64 * n + 32 * (qq & 1) + l);
        r.h = ldg_stream8(b + 128 + 32 * n + l);
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b + 192));  // the 16 int8 scales
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(w + n_blocks_all * kQ6Packed) + gb);
    } else if constexpr (QT == Q6_K_T) {
        // Q6_K's bytes (same lanes) at their places in the tile: every 8-byte run stays inside one 16-byte piece
        const uint8_t* b = w + (gb >> 4) * Q6T::kBytes;
        const int r16 = (int)(gb & 15);
        const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
        r.q = ldg_stream8(b + q6t_offset(r16, 64 * n + 32 * (qq & 1) + l));
        r.h = ldg_stream8(b + q6t_offset(r16, 128 + 32 * n + l));
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b + q6t_offset(r16, 192)));
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(b + q6t_offset(r16, 208)));
    } else {  // Q8_0: qs int8 [rows, k] (256 bytes per block), then fp16 d per 32 weights
        r.q = ldg_stream8(w + gb * QK + 8 * lane);
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(w + n_blocks_all * QK) + gb * 8 + (lane >> 2));
    }
    return r;
}

// The variants (LUCEBOX_DEQUANT, read once per process; docs/perf.md "27B prefill: dequantization variants"), all
// bit-identical to "base" (the kernel described at the top): the same fp32 operations in the same order, only how the
// integers reach fp32, how the fp16 leave, and how Q6_K_T's tiles reach the SM differ.
//   kStore    the 16-byte stores: plain, or st.global.cs (streaming: evict-first in L2)
//   kFast     integers to fp32 by the 2^23 trick, (0x4B000000 | u) as a float is exactly 2^23 + u (u < 2^23),
//             one exact FADD removing 2^23 (+ the Q6_K / Q8_0 offsets), instead of I2F, which runs at a quarter
//             of the FP32 rate; and two fp32 to one f16x2 per cvt.rn.f16x2.f32 (each half RN, as __float2half_rn)
//   kRingQ6   Q6_K_T in tile order through a persistent kernel whose warps copy whole 3,360-byte tiles into a
//             shared-memory ring with cp.async (the tile interleaves its 16 rows, so a warp's four rows are not one
//             contiguous run there, and the register-held loads of the default leave the SM short of bytes in flight)
// Measured and removed (session 12, perf.md): 8 blocks per warp, an L2 evict_first store policy, a persistent grid for
// every type, a register cap for 6 CTAs per SM, and a cp.async ring for Q4_K / Q4_K_T (none faster than fast_cs).
enum { kStPlain = 0, kStCs = 1 };
template <int ST, bool FAST, bool RING_Q6>
struct Var {
    static constexpr int kStore = ST;
    static constexpr bool kFast = FAST, kRingQ6 = RING_Q6;
};

__device__ __forceinline__ float magic_int(uint32_t u, float bias) {
    return __fsub_rn(__uint_as_float(0x4B000000u | u), bias);  // exact: both are integers in [2^23, 2^24)
}

// The lane's 8 weights as fp16, exactly as the reference rounds them.
template <int QT, bool FAST>
__device__ __forceinline__ uint4 convert(const Raw& r, int lane) {
    float v[8];
    if constexpr (QT == Q4_K || QT == Q5_K || QT == Q4_K_T) {
        const int is = lane >> 2;  // sub-block of 32 weights
        int sc, mn;
        if (is < 4) {
            sc = (r.hdr.y >> (8 * is)) & 63;
            mn = (r.hdr.z >> (8 * is)) & 63;
        } else {  // ggml get_scale_min_k4, j >= 4
            const int sh = 8 * (is - 4);
            const uint32_t b8 = (r.hdr.w >> sh) & 0xFF;
            sc = (b8 & 0xF) | ((((r.hdr.y >> sh) & 0xFF) >> 6) << 4);
            mn = (b8 >> 4) | ((((r.hdr.z >> sh) & 0xFF) >> 6) << 4);
        }
        const float d1 = __fmul_rn(half_bits(r.hdr.x), (float)sc);
        const float m1 = __fmul_rn(half_bits(r.hdr.x >> 16), (float)mn);
        const bool hi = (lane & 7) >= 4;
        if constexpr (FAST) {
            const uint32_t w0 = hi ? r.q.x >> 4 : r.q.x, w1 = hi ? r.q.y >> 4 : r.q.y;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t q = ((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xF;
                if constexpr (QT == Q5_K) q |= (uint32_t)((byte_of(r.h, i) >> is) & 1) << 4;
                v[i] = __fsub_rn(__fmul_rn(d1, magic_int(q, 8388608.0f)), m1);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int b = byte_of(r.q, i);
                int q = hi ? b >> 4 : b & 0xF;
                if constexpr (QT == Q5_K) q |= ((byte_of(r.h, i) >> is) & 1) << 4;
                v[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
            }
        }
    } else if constexpr (QT == Q6_K || QT == Q6_K_T) {
        const int n = lane >> 4, qq = (lane & 15) >> 2;
        const int is = 8 * n + ((lane & 3) >> 1) + 2 * qq;  // scale of these 16 weights
        const int wi = is >> 2;  // scale word, chosen by selects (indexing would put hdr in local memory)
        const uint32_t sw = wi == 0 ? r.hdr.x : wi == 1 ? r.hdr.y : wi == 2 ? r.hdr.z : r.hdr.w;
        const int8_t sc = (int8_t)((sw >> (8 * (is & 3))) & 0xFF);
        const float d1 = __fmul_rn(half_bits(r.d16), (float)sc);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int b = byte_of(r.q, i);
            const int q = ((qq & 2) ? b >> 4 : b & 0xF) | (((byte_of(r.h, i) >> (2 * qq)) & 3) << 4);
            if constexpr (FAST) v[i] = __fmul_rn(d1, magic_int((uint32_t)q, 8388640.0f));  // q - 32
            else v[i] = __fmul_rn(d1, (float)(q - 32));
        }
    } else {
        const float d = half_bits(r.d16);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if constexpr (FAST) v[i] = __fmul_rn(magic_int(byte_of(r.q, i) ^ 0x80u, 8388736.0f), d);  // int8
            else v[i] = __fmul_rn((float)(int8_t)byte_of(r.q, i), d);
        }
    }
    uint4 o;
    uint32_t* p = &o.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (FAST) {
            const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
            p[i] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
            p[i] = (uint32_t)__half_as_ushort(__float2half_rn(v[2 * i])) |
                   ((uint32_t)__half_as_ushort(__float2half_rn(v[2 * i + 1])) << 16);
        }
    }
    return o;
}

template <int ST>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
    if constexpr (ST == kStPlain) {
        *p = v;
    } else {
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    }
}

// One warp's unit: kBlocksPerWarp blocks from b0 (in the range's order). Blocks: consecutive in the row-major order,
// or with kTileOrder (tiled Q4_K / Q6_K over whole 16-row tiles: row0 and rows multiples of 16) consecutive in the
// stored order, i.e. rows r .. r + 3 of one tile and 256-block, so that its loads are one contiguous run (a row's
// blocks are 2304 bytes apart there) and its stores four whole 512-byte row pieces. The stored index of the range's
// first block is then gb0 = row0 * nb. Grid: one unit per warp, ceil(blocks / kBlocksPerCta) CTAs.
template <int QT, bool kTileOrder, class V>
__global__ void __launch_bounds__(kThreads) dequant_f16_kernel(const uint8_t* __restrict__ w, int64_t n_blocks_all,
                                                               int64_t gb0, int64_t blocks, int nb,
                                                               uint4* __restrict__ out) {
    static_assert(!kTileOrder || (is_tiled(QT) && kTileRows % kBlocksPerWarp == 0), "tile order: tiled types");
    const int lane = threadIdx.x & 31;
    const int64_t b0 = ((int64_t)blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5)) * kBlocksPerWarp;
    int64_t at[kBlocksPerWarp];  // where each of the warp's blocks is stored
    int64_t to[kBlocksPerWarp];  // and its block index in out (row-major from row0)
    if constexpr (kTileOrder) {
        const int64_t per_tile = (int64_t)kTileRows * nb;
        const int64_t tile = b0 / per_tile;
        const int rem = (int)(b0 - tile * per_tile), kb = rem / kTileRows, r = rem % kTileRows;
#pragma unroll
        for (int i = 0; i < kBlocksPerWarp; ++i) {
            at[i] = gb0 + b0 + i;
            to[i] = (tile * kTileRows + r + i) * nb + kb;
        }
    } else if constexpr (is_tiled(QT)) {
        // a row range not in whole tiles: row-major order, one division per thread for the first block, then
        // steps along the row
        const int64_t g = gb0 + b0;
        int64_t row = g / nb;
        int kb = (int)(g - row * nb);
#pragma unroll
        for (int i = 0; i < kBlocksPerWarp; ++i) {
            at[i] = block_index<true>(row, kb, nb);
            to[i] = b0 + i;
            if (++kb == nb) {
                kb = 0;
                ++row;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < kBlocksPerWarp; ++i) at[i] = gb0 + b0 + i, to[i] = b0 + i;
    }
    Raw r[kBlocksPerWarp];
#pragma unroll
    for (int i = 0; i < kBlocksPerWarp; ++i)
        if (b0 + i < blocks) r[i] = load_raw<QT>(w, n_blocks_all, at[i], lane);
#pragma unroll
    for (int i = 0; i < kBlocksPerWarp; ++i)
        if (b0 + i < blocks) {
            const uint4 v = convert<QT, V::kFast>(r[i], lane);  // (before the address: base keeps its old PTX)
            store16<V::kStore>(out + to[i] * 32 + lane, v);
        }
}

// kRingQ6 (Q6_K_T in tile order): a warp's unit is one whole tile (16 rows × one 256-block column, 3,360 contiguous
// bytes: the rows of a tile interleave, q6t_offset), 210 cp.async of 16 bytes; 4 warps per CTA, each a ring of 3
// tiles (40 KB per CTA), 2 in flight while it converts the third, 4 rows (Raw) at a time from shared memory.
constexpr int kQ6Stages = 3, kQ6Warps = 4;

template <class V>
__global__ void __launch_bounds__(kQ6Warps * 32) dequant_f16_q6t_async_kernel(const uint8_t* __restrict__ w,
                                                                              int64_t tile0, int64_t units, int nb,
                                                                              uint4* __restrict__ out) {
    __shared__ __align__(16) uint8_t ring_all[kQ6Warps][kQ6Stages][Q6T::kBytes];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    uint8_t(*ring)[Q6T::kBytes] = ring_all[wid];
    const int64_t stride = (int64_t)gridDim.x * kQ6Warps, first = (int64_t)blockIdx.x * kQ6Warps + wid;
    auto issue = [&](int64_t u, int slot) {
        if (u < units) {
            const uint8_t* src = w + (tile0 + u) * Q6T::kBytes;
            for (int c = lane; c < Q6T::kBytes / 16; c += 32) lb::cp_async16(ring[slot] + 16 * c, src + 16 * c);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int st = 0; st < kQ6Stages; ++st) issue(first + st * stride, st);
    const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
    int slot = 0;
    for (int64_t u = first; u < units; u += stride) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kQ6Stages - 1) : "memory");
        __syncwarp();
        const uint8_t* b = ring[slot];
        const int64_t trow = u / nb;  // the tile's row of tiles in the range, and its block column
        const int kb = (int)(u - trow * nb);
#pragma unroll 1
        for (int g = 0; g < kTileRows; g += 4) {
            Raw r[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // Q6_K_T's load_raw, from shared memory
                const int r16 = g + i;
                r[i].q = *reinterpret_cast<const uint2*>(b + q6t_offset(r16, 64 * n + 32 * (qq & 1) + l));
                r[i].h = *reinterpret_cast<const uint2*>(b + q6t_offset(r16, 128 + 32 * n + l));
                r[i].hdr = *reinterpret_cast<const uint4*>(b + q6t_offset(r16, 192));
                r[i].d16 = *reinterpret_cast<const unsigned short*>(b + q6t_offset(r16, 208));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = convert<Q6_K_T, V::kFast>(r[i], lane);
                store16<V::kStore>(out + ((trow * kTileRows + g + i) * nb + kb) * 32 + lane, v);
            }
        }
        __syncwarp();  // every lane has read the slot before any lane refills it
        issue(u + kQ6Stages * stride, slot);
        slot = slot + 1 == kQ6Stages ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// SMs of the current device, asked once per device; 0 when the query fails (the caller then does not cap its grid).
int sm_count() {
    static std::atomic<int> cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
    std::atomic<int>* c = dev < 64 ? &cached[dev] : nullptr;
    int n = c ? c->load(std::memory_order_relaxed) : 0;
    if (n <= 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();  // no sticky error for the caller
            return 0;
        }
        if (c) c->store(n, std::memory_order_relaxed);
    }
    return n;
}

template <class V>
void launch_q6t_async(const uint8_t* w, int64_t tile0, int64_t units, int nb, uint4* out, cudaStream_t s) {
    static std::atomic<int> per_sm{0};
    int occ = per_sm.load(std::memory_order_relaxed);
    if (occ <= 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, dequant_f16_q6t_async_kernel<V>, kQ6Warps * 32, 0) !=
                cudaSuccess ||
            occ <= 0)
            occ = 1;
        per_sm.store(occ, std::memory_order_relaxed);
    }
    const int64_t need = (units + kQ6Warps - 1) / kQ6Warps, resident = (int64_t)occ * sm_count();
    const int64_t grid = resident > 0 && resident < need ? resident : need;  // the warps stride: any grid is right
    dequant_f16_q6t_async_kernel<V><<<(unsigned)grid, kQ6Warps * 32, 0, s>>>(w, tile0, units, nb, out);
}

template <int QT, class V>
int launch_v(const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out, cudaStream_t s) {
    const int64_t nb = k / QK, blocks = rows * nb;
    const int64_t grid = (blocks + kBlocksPerCta - 1) / kBlocksPerCta;
    const auto* wb = static_cast<const uint8_t*>(w);
    auto* o = static_cast<uint4*>(out);
    // (The 27B's pp520 measured 5,583 tok/s tiled with a 64-bit division per block, 5,735 with the row-major walk
    // below, against 5,851 untiled: docs/perf.md "Q4_K tiled layout".)
    if constexpr (is_tiled(QT)) {
        if (row0 % kTileRows == 0 && rows % kTileRows == 0) {
            if constexpr (V::kRingQ6 && QT == Q6_K_T)
                launch_q6t_async<V>(wb, row0 / kTileRows * nb, blocks / kTileRows, (int)nb, o, s);
            else
                dequant_f16_kernel<QT, true, V><<<(unsigned)grid, kThreads, 0, s>>>(wb, n_rows * nb, row0 * nb,
                                                                                    blocks, (int)nb, o);
            LB_LAUNCH_TRY();
            return LB_OK;
        }
    }
    dequant_f16_kernel<QT, false, V><<<(unsigned)grid, kThreads, 0, s>>>(wb, n_rows * nb, row0 * nb, blocks, (int)nb, o);
    LB_LAUNCH_TRY();
    return LB_OK;
}

// The variant table: name (LUCEBOX_DEQUANT) and its launch; the first entry is the default. What measured best per type
// (H200, session 12, scripts/bench_dequant.py --variants): fast + streaming stores for Q4_K_T (−6% on every Q4_K_T
// shape) and the tile ring for Q6_K_T (−20 to −25%), together "fast_cs6", the default; "base" is the kernel before it.
using VFastCs6 = Var<kStCs, true, true>;
using VBase = Var<kStPlain, false, false>;
using VFast = Var<kStPlain, true, false>;
using VFastCs = Var<kStCs, true, false>;
using VFast6 = Var<kStPlain, true, true>;
#define LB_DEQUANT_VARIANTS(X) \
    X("fast_cs6", VFastCs6) X("base", VBase) X("fast", VFast) X("fast_cs", VFastCs) X("fast6", VFast6)

#define LB_DQ_NAME(name, V) name,
constexpr const char* kVariantNames[] = {LB_DEQUANT_VARIANTS(LB_DQ_NAME)};
constexpr int kNumVariants = (int)(sizeof(kVariantNames) / sizeof(kVariantNames[0]));

// LUCEBOX_DEQUANT, once per process: unset or empty = the table's first entry (fast_cs6, the default); an unknown name
// is reported once on stderr and runs the default.
int variant() {
    static const int v = [] {
        const char* e = std::getenv("LUCEBOX_DEQUANT");
        if (!e || !*e) return 0;
        for (int i = 0; i < kNumVariants; ++i)
            if (std::strcmp(e, kVariantNames[i]) == 0) return i;
        std::fprintf(stderr, "lucebox: LUCEBOX_DEQUANT=%s is not a dequantization variant; using %s\n", e,
                     kVariantNames[0]);
        return 0;
    }();
    return v;
}

template <int QT>
int launch(const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out, cudaStream_t s) {
    int i = 0;
    const int want = variant();
#define LB_DQ_CASE(name, V) \
    if (i++ == want) return launch_v<QT, V>(w, n_rows, k, row0, rows, out, s);
    LB_DEQUANT_VARIANTS(LB_DQ_CASE)
#undef LB_DQ_CASE
    return launch_v<QT, VFastCs6>(w, n_rows, k, row0, rows, out, s);
}

}  // namespace

namespace lb {

// The launch behind lb_dequant_f16 (arguments checked by the caller); gemm_q_cublas.cu calls it per row chunk.
int dequant_f16_launch(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out,
                       cudaStream_t s) {
    switch (qtype) {
        case Q4_K: return launch<Q4_K>(w, n_rows, k, row0, rows, out, s);
        case Q4_K_T: return launch<Q4_K_T>(w, n_rows, k, row0, rows, out, s);
        case Q5_K: return launch<Q5_K>(w, n_rows, k, row0, rows, out, s);
        case Q6_K: return launch<Q6_K>(w, n_rows, k, row0, rows, out, s);
        case Q6_K_T: return launch<Q6_K_T>(w, n_rows, k, row0, rows, out, s);
        case Q8_0: return launch<Q8_0>(w, n_rows, k, row0, rows, out, s);
        default: return set_error(LB_ERR_UNSUPPORTED, "dequant_f16: qtype %d is not Q8_0, Q4_K, Q5_K or Q6_K", qtype);
    }
}

// Shape checks shared with lb_gemm_q_cublas (host only: no CUDA call).
int dequant_f16_check(const char* fn, int qtype, const void* w, int64_t n_rows, int k) {
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q6_K && qtype != Q8_0 && qtype != Q4_K_T && qtype != Q6_K_T)
        return set_error(LB_ERR_UNSUPPORTED,
                         "%s: qtype %d is not Q8_0, Q4_K, Q5_K, Q6_K, tiled Q4_K (268) or tiled Q6_K (270)", fn, qtype);
    if (!w) return set_error(LB_ERR_INVALID_ARG, "%s: NULL weights", fn);
    if (!rows_fit_layout(qtype, n_rows))
        return set_error(LB_ERR_INVALID_ARG, "%s: tiled types need n_rows a multiple of 16", fn);
    if ((uintptr_t)w & 15) return set_error(LB_ERR_INVALID_ARG, "%s: weights must be 16-byte aligned", fn);
    if (n_rows <= 0 || k <= 0 || k % QK)
        return set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256", fn);
    // (blocks per launch) / kBlocksPerCta must fit a grid dimension
    if (n_rows * (k / QK) / kBlocksPerCta >= (int64_t)INT32_MAX)
        return set_error(LB_ERR_INVALID_ARG, "%s: %lld x %d is too large", fn, (long long)n_rows, k);
    return LB_OK;
}

}  // namespace lb

extern "C" LB_API int lb_dequant_f16(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows,
                                     void* out_f16, void* stream) {
    const int st = lb::dequant_f16_check(__func__, qtype, w, n_rows, k);
    if (st != LB_OK) return st;
    LB_CHECK_ARG(out_f16 && !((uintptr_t)out_f16 & 15), "out_f16 must be a 16-byte aligned device pointer");
    LB_CHECK_ARG(row0 >= 0 && rows >= 1 && row0 + rows <= n_rows, "need 0 <= row0 < row0 + rows <= n_rows");
    return lb::dequant_f16_launch(qtype, w, n_rows, k, row0, rows, out_f16, static_cast<cudaStream_t>(stream));
}
