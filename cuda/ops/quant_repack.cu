// Load-time conversion of GGUF quantized tensors to the device layout of cuda/common/quant_blocks.cuh
// (Q6_K and Q8_0 move their fp16 d out of the blocks; Q4_K and Q5_K are copied unchanged; the tiled Q4_K_T
// reorders whole blocks into 16-row tiles; the tiled Q6_K_T places each block's bytes in its 16-row tile), and a random-weight generator that writes the device layout
// directly (benchmarks, engine smoke tests).
#include "lb_check.cuh"
#include "quant_blocks.cuh"

namespace {

using namespace lb::q;

// GGUF blocks are only 2-byte aligned (210 and 34 bytes), so the copy moves 16-bit units.
__global__ void repack_q6k(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t n_blocks) {
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t* s = src + b * (210 / 2);
    uint16_t* d = dst + b * (kQ6Packed / 2);
#pragma unroll 8
    for (int i = 0; i < kQ6Packed / 2; ++i) d[i] = s[i];
    dst[n_blocks * (kQ6Packed / 2) + b] = s[kQ6Packed / 2];  // d after all packed blocks
}

__global__ void repack_q80(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t n_blocks) {
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t* s = src + b * (34 / 2);
    uint16_t* d = dst + b * 16;
#pragma unroll
    for (int i = 0; i < 16; ++i) d[i] = s[1 + i];
    dst[n_blocks * 16 + b] = s[0];
}

// GGUF Q4_K → Q4_K_T: one thread per 16-byte chunk of the destination, which is destination block db = d / 9,
// piece d % 9; db = (tile row · nb + kb) · 16 + r is block (16 · tile row + r, kb) of the source.
__global__ void tile_q4k(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n_chunks, int nb) {
    const int64_t d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (d >= n_chunks) return;
    constexpr int kPieces = 144 / 16;
    const int64_t db = d / kPieces, q = db / kTileRows;
    const int64_t row = (q / nb) * kTileRows + (db % kTileRows), kb = q % nb;
    dst[d] = src[(row * nb + kb) * kPieces + d % kPieces];
}

// GGUF Q6_K → Q6_K_T: one thread per 16-bit unit of the destination (GGUF blocks are 2-byte aligned); unit u is
// byte 2 (u % 1680) of tile u / 1680 = (tile row · nb + kb), which q6t_source maps back to a GGUF block byte.
__global__ void tile_q6k(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t n_units, int nb) {
    const int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (u >= n_units) return;
    constexpr int kUnits = Q6T::kBytes / 2;
    const int64_t item = u / kUnits;
    int r16 = 0, o = 0;
    q6t_source(2 * (int)(u - item * kUnits), r16, o);
    const int64_t row = (item / nb) * kTileRows + r16, kb = item % nb;
    dst[u] = src[((row * nb + kb) * 210 + o) / 2];
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
    // splitmix64 finaliser: independent bytes from (seed, index)
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(x ^ (x >> 31));
}

__global__ void fill_bytes(uint8_t* dst, int64_t nbytes, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nbytes; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = (uint8_t)hash32(seed * 0x100000001B3ull + i);
}

// Overwrite every fp16 scale with a small positive value, like a real checkpoint's (random bits would
// give NaN and Inf): d in [lo, 2 lo).
__global__ void fix_scales(uint8_t* dst, int qtype, int64_t n_blocks, int64_t d_offset, uint64_t seed) {
    const int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const float u = (hash32(seed ^ (0xD1B54A32D192ED03ull * (b + 1))) & 0xFFFF) / 65536.0f;
    const float v = (hash32(seed ^ (0x8CB92BA72F3D8DD7ull * (b + 1))) & 0xFFFF) / 65536.0f;
    if (qtype == Q4_K || qtype == Q5_K || qtype == Q4_K_T) {  // (tiled: every 144-byte unit is still a block)
        __half* h = reinterpret_cast<__half*>(dst + b * (qtype == Q5_K ? 176 : 144));
        h[0] = __float2half(1e-3f * (1.0f + u));
        h[1] = __float2half(1e-3f * (1.0f + v));
    } else if (qtype == Q6_K_T) {  // b in the tiled order: d of row b % 16 of tile b / 16
        *reinterpret_cast<__half*>(dst + (b >> 4) * Q6T::kBytes + q6t_offset((int)(b & 15), 208)) =
            __float2half(5e-4f * (1.0f + u));
    } else {
        __half* h = reinterpret_cast<__half*>(dst + d_offset);
        h[b] = __float2half((qtype == Q6_K ? 5e-4f : 4e-3f) * (1.0f + u));
    }
}

int check_shape(const char* fn, int qtype, const void* p, int n_rows, int k) {
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q6_K && qtype != Q8_0 && qtype != Q4_K_T && qtype != Q6_K_T)
        return lb::set_error(LB_ERR_UNSUPPORTED,
                             "%s: qtype %d is not Q8_0, Q4_K, Q5_K, Q6_K, tiled Q4_K (268) or tiled Q6_K (270)", fn,
                             qtype);
    if (!p) return lb::set_error(LB_ERR_INVALID_ARG, "%s: NULL pointer", fn);
    if (n_rows <= 0 || k <= 0 || k % QK)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256", fn);
    if (!rows_fit_layout(qtype, n_rows))
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: tiled types need n_rows a multiple of 16 (got %d)", fn, n_rows);
    return LB_OK;
}

}  // namespace

extern "C" LB_API uint64_t lb_quant_bytes(int qtype, int n_rows, int k) {
    if (n_rows <= 0 || k <= 0 || k % QK || !rows_fit_layout(qtype, n_rows)) return 0;
    return (uint64_t)tensor_bytes(qtype, n_rows, k);
}

extern "C" LB_API int lb_quant_repack(int qtype, const void* src, void* dst, int n_rows, int k, void* stream) {
    int st = check_shape(__func__, qtype, dst, n_rows, k);
    if (st != LB_OK) return st;
    LB_CHECK_ARG(src && src != dst, "src must be a different device buffer");
    LB_CHECK_ARG(!((uintptr_t)src & 1) && !((uintptr_t)dst & 15), "src must be 2-byte and dst 16-byte aligned");
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const size_t bytes = (size_t)tensor_bytes(qtype, n_rows, k);
    if (qtype == Q4_K || qtype == Q5_K) {
        LB_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
        return LB_OK;
    }
    if (qtype == Q4_K_T) {
        LB_CHECK_ARG(!((uintptr_t)src & 15), "tiled Q4_K: src must be 16-byte aligned");
        const int64_t n_chunks = (int64_t)bytes / 16;
        tile_q4k<<<(unsigned)lb::ceil_div(n_chunks, 256), 256, 0, s>>>(static_cast<const uint4*>(src),
                                                                        static_cast<uint4*>(dst), n_chunks, k / QK);
        LB_LAUNCH_TRY();
        return LB_OK;
    }
    if (qtype == Q6_K_T) {
        const int64_t n_units = (int64_t)bytes / 2;
        tile_q6k<<<(unsigned)lb::ceil_div(n_units, 256), 256, 0, s>>>(static_cast<const uint16_t*>(src),
                                                                       static_cast<uint16_t*>(dst), n_units, k / QK);
        LB_LAUNCH_TRY();
        return LB_OK;
    }
    const int64_t n_blocks = (int64_t)n_rows * (k / (qtype == Q6_K ? QK : 32));
    const unsigned grid = (unsigned)lb::ceil_div(n_blocks, 256);
    if (qtype == Q6_K)
        repack_q6k<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n_blocks);
    else
        repack_q80<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n_blocks);
    LB_LAUNCH_TRY();
    return LB_OK;
}

extern "C" LB_API int lb_quant_fill_random(int qtype, void* dst, int n_rows, int k, uint64_t seed, void* stream) {
    int st = check_shape(__func__, qtype, dst, n_rows, k);
    if (st != LB_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int64_t bytes = tensor_bytes(qtype, n_rows, k);
    uint8_t* d = static_cast<uint8_t*>(dst);
    fill_bytes<<<1024, 256, 0, s>>>(d, bytes, seed);
    LB_LAUNCH_TRY();
    // (Q4_K_T, Q6_K_T: random bytes are as random in any order; fix_scales visits every block's d)
    const int64_t n_blocks = (int64_t)n_rows * (k / (qtype == Q8_0 ? 32 : QK));
    const int64_t d_offset = qtype == Q6_K ? n_blocks * kQ6Packed : (qtype == Q8_0 ? n_blocks * 32 : 0);
    fix_scales<<<(unsigned)lb::ceil_div(n_blocks, 256), 256, 0, s>>>(d, qtype, n_blocks, d_offset, seed);
    LB_LAUNCH_TRY();
    return LB_OK;
}
