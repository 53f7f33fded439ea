// Load-pattern probe for the 27B decode GEMV (docs/perf.md "Next", item 1): how fast can the H200 stream a
// Q4_K matrix's bytes with no arithmetic, in gemv_k45_kernel's access pattern against two coalesced ones?
// If the coalesced patterns stream much faster, a repacked Q4_K/Q5_K device layout is worth its cost; if all
// three stream alike, the GEMV's 57% of HBM comes from its compute/latency structure, not the pattern.
//
// Every pattern reads the same bytes of a [17408, 2880]-byte matrix (Q4_K 17408×5120) once per call, with the
// GEMV's work split (items = 64-row group × 256-block, equal contiguous shares, 128 threads a block, 6 blocks
// per SM) and one item in flight per warp (load everything of the item, then fold it, then the next):
//   k45   gemv_k45_kernel's lane pieces: lane (g, t) reads rows g and g + 8 of the warp's 16: the 16-byte header
//         and four 8-byte quant pieces each (8 rows = 8 lines per warp instruction)
//   rows  the warp's 16 rows × 144 bytes read as 144 16-byte chunks, consecutive lanes on consecutive chunks of
//         a row (5 instructions, each covering ~3.5 whole row pieces)
//   tile  the layout a repack would give: the warp's 2304 bytes contiguous, lane L at 16·L + 512·i
// plus "2x" forms with two items in flight. Copies rotate over 10 matrices (> 2× the L2) so each call reads
// HBM. Build: nvcc -O3 -std=c++17 -arch=sm_90 -Icuda/common -o probe scripts/probe_load_pattern.cu; run: ./probe (prints
// µs and GB/s).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "quant_blocks.cuh"

namespace {

constexpr int kRows = 17408, kNb = 20, kBlock = 144, kRowBytes = kNb * kBlock;  // Q4_K 17408×5120
constexpr int kGroupRows = 64, kThreads = 128;
constexpr int64_t kItems = (int64_t)(kRows / kGroupRows) * kNb;
constexpr int kCopies = 10;

// the GEMV's own weight loads (L1::no_allocate), so the probe measures what the kernels issue
using lb::q::ldg_stream;
using lb::q::ldg_stream8;

// The item (group, kb) of this warp: 16 rows starting at row0, block kb.
template <int kPattern>
__device__ __forceinline__ uint32_t read_item(const uint8_t* w, int64_t grp, int kb, int warp, int lane) {
    const int64_t row0 = grp * kGroupRows + warp * 16;
    uint32_t acc = 0;
    if constexpr (kPattern == 0) {  // k45
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint8_t* b = w + (row0 + g + 8 * h) * kRowBytes + kb * kBlock;
            const uint4 hd = ldg_stream(b);
            acc ^= hd.x ^ hd.y ^ hd.z ^ hd.w;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint2 q = ldg_stream8(b + 16 + 32 * j + 8 * t);
                acc ^= q.x ^ q.y;
            }
        }
    } else if constexpr (kPattern == 1) {  // rows: chunk c = row c / 9, piece c % 9
#pragma unroll
        for (int i = 0; i < 5; ++i) {
            const int c = lane + 32 * i;
            if (c < 144) {
                const uint4 v = ldg_stream(w + (row0 + c / 9) * kRowBytes + kb * kBlock + 16 * (c % 9));
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
        }
    } else {  // tile: the same 2304 bytes as if stored contiguously (the item's index picks the tile)
        const uint8_t* tile = w + ((grp * kNb + kb) * 4 + warp) * (16 * kBlock);
#pragma unroll
        for (int i = 0; i < 5; ++i) {
            const int c = lane + 32 * i;
            if (c < 144) {
                const uint4 v = ldg_stream(tile + 16 * c);
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
        }
    }
    return acc;
}

template <int kPattern, int kInFlight>
__global__ void __launch_bounds__(kThreads) probe_kernel(const uint8_t* w, uint32_t* sink) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t it = kItems * blockIdx.x / gridDim.x;
    const int64_t end = kItems * (blockIdx.x + 1) / gridDim.x;
    uint32_t acc = 0;
    for (; it + kInFlight <= end; it += kInFlight) {
        uint32_t v[kInFlight];
#pragma unroll
        for (int f = 0; f < kInFlight; ++f) v[f] = read_item<kPattern>(w, (it + f) / kNb, (int)((it + f) % kNb), warp, lane);
#pragma unroll
        for (int f = 0; f < kInFlight; ++f) acc = acc * 31u + v[f];  // fold: every load is used
    }
    for (; it < end; ++it) acc = acc * 31u + read_item<kPattern>(w, it / kNb, (int)(it % kNb), warp, lane);
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // never true in practice; keeps the loads
}

template <int kPattern, int kInFlight>
float time_us(const std::vector<uint8_t*>& mats, uint32_t* sink, int grid, int iters) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < kCopies; ++i) probe_kernel<kPattern, kInFlight><<<grid, kThreads>>>(mats[i], sink);
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) probe_kernel<kPattern, kInFlight><<<grid, kThreads>>>(mats[i % kCopies], sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1000.0f * ms / iters;
}

}  // namespace

int main() {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        std::printf("no GPU\n");
        return 1;
    }
    const size_t bytes = (size_t)kRows * kRowBytes;
    std::vector<uint8_t*> mats(kCopies);
    for (auto& m : mats) {
        if (cudaMalloc(&m, bytes) != cudaSuccess) return 1;
        cudaMemset(m, 0x5A, bytes);
    }
    uint32_t* sink = nullptr;
    cudaMalloc(&sink, 4096 * sizeof(uint32_t));
    const int grid = 6 * sms, iters = 200;
    struct Row {
        const char* name;
        float us;
    } rows[] = {
        {"k45 (gemv_k45 lane pieces)", time_us<0, 1>(mats, sink, grid, iters)},
        {"k45, 2 items in flight", time_us<0, 2>(mats, sink, grid, iters)},
        {"rows (row-coalesced 16 B chunks)", time_us<1, 1>(mats, sink, grid, iters)},
        {"rows, 2 items in flight", time_us<1, 2>(mats, sink, grid, iters)},
        {"tile (2304 contiguous bytes)", time_us<2, 1>(mats, sink, grid, iters)},
        {"tile, 2 items in flight", time_us<2, 2>(mats, sink, grid, iters)},
    };
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        std::printf("CUDA error: %s\n", cudaGetErrorString(e));
        return 1;
    }
    std::printf("| pattern (Q4_K 17408x5120 = %.1f MB, grid %d x %d) | us | GB/s |\n|---|---|---|\n", bytes / 1e6, grid,
                kThreads);
    for (const Row& r : rows) std::printf("| %s | %.1f | %.0f |\n", r.name, r.us, bytes / (r.us * 1e3));
    return 0;
}
