// n = 1, Q4_K and Q5_K, sm_90: the sub-block-column GEMV (K45Item, as gemv_k45_kernel) fed through a per-warp
// ring of shared-memory stages that the bulk copy engine fills, one copy per row and stage ("v7").
// Included by qmm.cuh after gemv_k45_kernel (it uses K45Cols, K45Item, k45_flush, QmmArgs); not standalone.
//
// Why: gemv_k45_kernel loads each lane's pieces with LDG.64/LDG.128 straight into registers, so every warp
// load instruction touches 8 rows = 8 cache lines for 128-256 bytes, one item (2.3 KB) in flight per warp.
// It streams at ~3 TB/s plus ~4.7 µs of ramp and tail per launch (docs/perf.md "27B quantized GEMV"), and
// everything that put more in flight through the same kind of requests measured slower: a second register
// buffer, a cp.async ring of the same pieces (v6), an L2 bulk prefetch ahead of the loads (session 5: the
// prefetch doubled the L2 lookups). Q8_0, whose lanes read 64 contiguous bytes per row, reaches 82% of HBM
// with the same kernel shape. Here a warp's 16 rows of R consecutive 256-blocks are R·144 (Q5_K: R·176)
// contiguous bytes per row: one bulk copy each (issued by 16 lanes), whole lines instead of per-lane sectors,
// and no registers held for bytes in flight; S stages per warp keep (S − 1)·R items in flight while one is
// computed from shared memory.
//
// Ring of warp w: S stages of 16 rows × kStride bytes (R blocks of a row, padded so that row strides are 32
// bytes apart modulo 128: the lanes' 8-byte reads of 8 rows hit distinct banks), one mbarrier per stage.
// A stage holds a run of consecutive items of one row group (kb .. kb + cnt − 1, cnt ≤ R, cut at the row
// group's end and at the block's range end); producer and consumer cut runs the same way, so the consumer
// recomputes each stage's count instead of storing it.
#pragma once

#include <cstdio>

#include "lb_async.cuh"

namespace lb {
namespace q {

// Geometry of one configuration (R blocks per stage run, S stages), host and device alike.
struct TmaRing {
    int run;     // R: 256-blocks per row per stage
    int stages;  // S
    int stride;  // bytes per row in a stage
    int stage;   // bytes per stage (16 rows)
    __host__ __device__ static constexpr int pad_stride(int bytes) { return bytes + (((32 - bytes % 128) % 128 + 128) % 128); }
    __host__ __device__ static TmaRing make(int block_bytes, int run, int stages) {
        TmaRing g{run, stages, pad_stride(run * block_bytes), 0};
        g.stage = 16 * g.stride;
        return g;
    }
    // dynamic shared memory of a block: every warp's stages, then every warp's barriers
    __host__ __device__ size_t smem_bytes() const { return (size_t)kWarps * stages * (stage + 8); }
};

template <int QT>
__global__ void __launch_bounds__(kThreads) gemv_k45_tma_kernel(QmmArgs a, TmaRing ring) {
#if LB_HAS_SM90
    using K = K45Cols<QT>;
    using Row = typename K::Row;
    constexpr int kGroupRows = kWarps * 16;
    extern __shared__ __align__(128) uint8_t tma_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    const int64_t it = a.items * blockIdx.x / gridDim.x;
    int left = (int)(a.items * (blockIdx.x + 1) / gridDim.x - it);
    if (left <= 0) {
        pdl_wait();  // lb_pdl.cuh: no block may finish before its predecessor
        return;
    }
    uint8_t* stages = tma_smem + (size_t)warp * ring.stages * ring.stage;
    uint64_t* bars = reinterpret_cast<uint64_t*>(tma_smem + (size_t)kWarps * ring.stages * ring.stage) +
                     warp * ring.stages;
    if (lane == 0)
        for (int s = 0; s < ring.stages; ++s) mbar_init(bars + s, 1);
    __syncwarp();

    const int64_t row_bytes = (int64_t)nb * K::kBlockBytes;
    // producer cursor: the next run to copy
    int64_t pgrp = it / nb;
    int pkb = (int)(it - pgrp * nb), pleft = left;
    auto issue = [&](int s) {
        const int cnt = min(min(ring.run, nb - pkb), pleft);
        if (lane == 0) mbar_arrive_expect_tx(bars + s, (unsigned)(16 * cnt * K::kBlockBytes));
        __syncwarp();
        if (lane < 16) {
            // rows past the end copy the last row (in bounds, never stored)
            const int64_t row = min(pgrp * kGroupRows + warp * 16 + lane, a.n_rows - 1);
            bulk_copy_nox(stages + (size_t)s * ring.stage + lane * ring.stride,
                          a.w + row * row_bytes + (int64_t)pkb * K::kBlockBytes, (unsigned)(cnt * K::kBlockBytes),
                          bars + s);
        }
        pleft -= cnt;
        if ((pkb += cnt) == nb) {
            pkb = 0;
            ++pgrp;
        }
    };
    // The weights are constant: the first stages go out before waiting for the previous kernel (PDL).
    for (int s = 0; s < ring.stages && pleft > 0; ++s) issue(s);
    pdl_wait();

    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    const float* xp = a.x + (int64_t)kb * QK + 32 * g + 8 * t;
    const K45Item<QT> item_math(g, t);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t phase = 0;  // bit s: the parity stage s waits for next
    for (int s = 0;;) {
        const int cnt = min(min(ring.run, nb - kb), left);
        mbar_wait(bars + s, (phase >> s) & 1u);
        phase ^= 1u << s;
        const bool live = grp * kGroupRows + warp * 16 < a.n_rows;  // warp-uniform
        const uint8_t* base = stages + (size_t)s * ring.stage;
        for (int i = 0; i < cnt; ++i) {
            if (live) {
                Row r[2];
                K::load_shared(r[0], base + g * ring.stride + i * K::kBlockBytes, t);
                K::load_shared(r[1], base + (g + 8) * ring.stride + i * K::kBlockBytes, t);
                item_math(r, xp, acc);
            }
            --left;
            if (kb + 1 == nb || left == 0) {
                if (live) k45_flush(acc, a.y, grp * kGroupRows + warp * 16, a.n_rows, g, t);
            }
            if (++kb == nb) {
                kb = 0;
                ++grp;
                xp -= (int64_t)(nb - 1) * QK;
            } else {
                xp += QK;
            }
        }
        if (left == 0) break;
        __syncwarp();  // every lane's reads of stage s are done before the copy engine overwrites it
        if (pleft > 0) issue(s);
        if (++s == ring.stages) s = 0;
    }
#else
    (void)a;
    (void)ring;
    __trap();  // launched only on sm_90 (gemv_tma_launch checks the device)
#endif
}

// ---- launch --------------------------------------------------------------------------------------

// The ring of the n = 1 Q4_K/Q5_K launches: LUCEBOX_GEMV_RING="R,S" (blocks per stage run, stages), read once
// per process; unset, "0" or anything unparsable: run 0, i.e. gemv_k45_kernel. For A/B runs until a
// configuration measured faster on the H200 becomes the default.
struct TmaChoice {
    int run = 0, stages = 0;
};
inline TmaChoice gemv_tma_ring() {
    static const TmaChoice c = [] {
        TmaChoice v;
        const char* e = std::getenv("LUCEBOX_GEMV_RING");
        int r = 0, st = 0;
        if (e && std::sscanf(e, "%d,%d", &r, &st) == 2 && r >= 1 && r <= 16 && st >= 2 && st <= 16) v = {r, st};
        return v;
    }();
    return c;
}

// Blocks per SM for this type and ring (per_sm; 0 where the device is older than sm_90 or one block's ring
// does not fit: the caller then runs gemv_k45_kernel) and the SM count, once per process and device.
template <int QT>
int gemv_tma_blocks_per_sm(const TmaRing& ring, int& per_sm, int& sms) {
    static std::mutex mu;
    static int cache[kMaxDevices][2];  // {blocks per SM + 1, SMs}; 0: not worked out yet
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "qmm: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev][0]) {
        int major = 0, optin = 0, blocks = 0;
        LB_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        LB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        LB_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        const size_t smem = ring.smem_bytes();
        if (major >= 9 && smem <= (size_t)optin) {
            LB_CUDA_TRY(cudaFuncSetAttribute(gemv_k45_tma_kernel<QT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
            LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemv_k45_tma_kernel<QT>, kThreads, smem));
        }
        cache[dev][0] = blocks + 1;
        cache[dev][1] = sms;
    }
    sms = cache[dev][1];
    per_sm = cache[dev][0] - 1;
    return LB_OK;
}

// gemv_tma_launch's answer when this device cannot run the ring (not an lb_status: those are >= 0).
constexpr int kTmaNotHere = -1;

// y already holds what the products add onto (qmm_launch cleared it when accumulate = 0).
template <int QT>
int gemv_tma_launch(const QmmArgs& a, cudaStream_t stream) {
    const TmaChoice c = gemv_tma_ring();
    const TmaRing ring = TmaRing::make(K45Cols<QT>::kBlockBytes, c.run, c.stages);
    int sms = 0, per_sm = 0;
    const int st = gemv_tma_blocks_per_sm<QT>(ring, per_sm, sms);
    if (st != LB_OK) return st;
    if (per_sm == 0) return kTmaNotHere;
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)per_sm * sms);
    LB_CUDA_TRY(launch_pdl(gemv_k45_tma_kernel<QT>, dim3((unsigned)grid), dim3(kThreads), ring.smem_bytes(), stream, a,
                           ring));
    return LB_OK;
}

}  // namespace q
}  // namespace lb
