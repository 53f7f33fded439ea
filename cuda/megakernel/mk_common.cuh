// Shared pieces of the 0.8B decode megakernel: fixed model dims, kernel parameters, small device
// helpers (bf16 unpack, block reductions, the grid barrier, cp.async + mbarrier primitives).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "lb_arch.cuh"
#include "lb_async.cuh"

namespace mk {

// The kernel is specialised for the Qwen3.5-0.8B widths (only the layer count and vocab vary);
// the host refuses other shapes before launching.
constexpr int THREADS = 512;  // DeltaNet mapping: one warp per value column, 16 columns per item
constexpr int WARPS = THREADS / 32;
constexpr int HID = 1024;
constexpr int FFN = 3584;
constexpr int DN_H = 16;                        // Hk = Hv
constexpr int DN_D = 128;                       // dk = dv
constexpr int DN_QKV = 3 * DN_H * DN_D;         // 6144 conv channels
constexpr int DN_Z = DN_H * DN_D;               // 2048
constexpr int DN_IN = DN_QKV + DN_Z + 2 * DN_H;  // 8224 rows: [qkv | z | beta | alpha]
constexpr int DN_COLS = WARPS;                  // value columns per recurrence item
constexpr int DN_ITEMS = DN_H * DN_D / DN_COLS;  // 128
constexpr int AT_HQ = 8, AT_HKV = 2, AT_D = 256;
constexpr int AT_Q = AT_HQ * 2 * AT_D;          // 4096 rows: per head [q_h | gate_h]
constexpr int AT_IN = AT_Q + 2 * AT_HKV * AT_D;  // 5120 rows: [q/gate | k | v]
constexpr int AT_O = AT_HQ * AT_D;              // 2048
constexpr int AT_PART = AT_D + 2;               // one split's partial: m, l, acc[256]
constexpr int AT_MAX_SPLITS = 64;  // context splits per head (the combine keeps 2 floats per split past AT_O in xs)
constexpr int ROPE_HALF = 32;                   // rotated dims [0, 64): i pairs with i + 32
constexpr int SEG = 256;                        // a warp pass: 32 lanes x 8 bf16 weights (512 bytes)
constexpr int MAX_WSLOTS = 8;                   // weight-ring slots per warp (mbarrier area is fixed)
constexpr int MAX_LAYERS = 24;                  // the per-block phase table lives in shared memory
constexpr int MAX_PHASES = 4 * MAX_LAYERS + 1;
constexpr int XS_FLOATS = FFN;                  // GEMV input vector (the widest K)

// Per-layer device pointers; the host fills an array of these once at create time.
struct Layer {
    const uint16_t* w_in;    // bf16 [DN_IN or AT_IN, HID]
    const uint16_t* w_out;   // bf16 [HID, 2048]
    const uint16_t* w_gu;    // bf16 [2*FFN, HID]: gate rows then up rows
    const uint16_t* w_down;  // bf16 [HID, FFN]
    const float* norm1;      // [HID] attn_norm (+1 included)
    const float* norm2;      // [HID] post_attention_norm
    const float* conv_w;     // [DN_QKV, 4]
    const float* ssm_a;      // [DN_H] = -exp(A_log)
    const float* dt_bias;    // [DN_H]
    const float* ssm_norm;   // [DN_D] plain weight
    const float* q_norm;     // [AT_D]
    const float* k_norm;     // [AT_D]
    float* conv_state;       // [3, DN_QKV]: inputs t-3, t-2, t-1
    float* S;                // [DN_H, dv, dk] fp32: the transposed state, so a column is contiguous
    uint16_t* kc;            // bf16 [AT_HKV, max_ctx, AT_D]
    uint16_t* vc;            // bf16 [AT_HKV, max_ctx, AT_D]
    int is_attn;
    int m_in;
};

struct Params {
    const Layer* layers;
    int n_layers;
    int vocab;
    const uint16_t* embed;  // bf16 [vocab, HID], also the tied LM head
    const float* out_norm;  // [HID]
    float* h;               // [HID] residual stream
    float* y_in;            // [DN_IN] in-projection outputs
    float* o_buf;           // [DN_Z] DeltaNet head outputs (before the gated norm)
    float* gu;              // [2*FFN]
    float* attn_part;       // [AT_HQ, max_splits, AT_PART]
    float* am_val;          // [gridDim] block-local argmax
    int* am_idx;
    unsigned* bar;          // grid-barrier counter, zeroed before each launch
    unsigned* attn_cnt;     // [AT_HQ] attention splits finished per head (the last one combines; self-resetting)
    float* attn_out;        // [AT_O] combined, gated attention output (the o_proj input)
    int* host_tokens;       // mapped pinned [n_steps]: out[s] = argmax after step s
    int* last_token;        // device: the pending token after the launch
    const int* forced;      // [n_forced] input tokens of the first steps (prompt)
    int n_forced;
    int n_steps;
    int pos0;
    int max_ctx;
    int max_splits;
    int wslots;      // weight-ring slots per warp
    int slot_bytes;  // bytes per slot, a multiple of SEG * 2
    float* logits;  // [vocab] of the last step, or null
    float eps;
    float rope_theta;
};

// Dynamic shared memory: ring slots, then the GEMV input vector (reused as phase scratch), then small
// arrays. The host computes wslots and slot_bytes from the device's opt-in limit.
// One GEMV phase as this block sees it: matrix, row range, width (computed once per launch).
struct __align__(16) PhaseDesc {
    const uint16_t* w;
    int r0, r1, K, pad[3];  // 32 bytes: keeps what follows 16-byte aligned
};

struct Smem {
    PhaseDesc* ph;  // [MAX_PHASES]
    uint8_t* slots;
    uint64_t* mbar;
    float* xs;    // [XS_FLOATS] GEMV input, stored in xperm order
    float* red;   // [2 * WARPS] reduction scratch
    int* misc;    // [8]
};

__host__ __device__ constexpr inline size_t smem_bytes(int wslots, int slot_bytes) {
    return (size_t)WARPS * wslots * slot_bytes + WARPS * MAX_WSLOTS * 8 + XS_FLOATS * 4 + 2 * WARPS * 4 + 8 * 4 +
           MAX_PHASES * sizeof(PhaseDesc);
}

// Where element i of a GEMV input vector lives in xs. A lane multiplies weights [8 lane, 8 lane + 8) of each
// 256-wide segment; storing those 8 values as two runs of 4 at lane*4 and 128 + lane*4 lets a warp read
// its x with two conflict-free 16-byte loads (the natural order costs a 2-way bank conflict on each).
__device__ __forceinline__ int xperm(int i) {
    const int j = i & (SEG - 1);
    return (i & ~(SEG - 1)) | ((j & 4) << 5) | ((j >> 3) << 2) | (j & 3);
}

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f(uint16_t u) { return __uint_as_float((uint32_t)u << 16); }
// Round to nearest even, as the host converter does (no NaN inputs here).
__device__ __forceinline__ uint16_t f_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Activations written by other blocks in this launch: read through L2 (never a stale L1 line).
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }

// Sum over the whole block; every thread gets the result. `red` holds WARPS floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = lb::warp_sum(v);
    __syncthreads();
    if (lb::lane_id() == 0) red[lb::warp_id()] = v;
    __syncthreads();
    float t = lb::lane_id() < WARPS ? red[lb::lane_id()] : 0.0f;
    return lb::warp_sum(t);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Phase timing for development builds (make build EXTRA_FLAGS=-DMK_PROFILE): thread 0 of every block stamps
// the global timer at each phase boundary of step 1; block 0 prints its own deltas and every block's raw
// stamps (MKPB lines, for scripts/mk_profile_blocks.py: who arrives last at each barrier, and how long the
// release takes after the last arrival). Compiled out otherwise.
#ifdef MK_PROFILE
constexpr int MK_PROF_MAX = 16 * MAX_LAYERS + 16;
constexpr int MK_PROF_BLOCKS = 512;
__device__ unsigned long long g_mk_prof[MK_PROF_BLOCKS][MK_PROF_MAX];
__device__ __forceinline__ void mk_mark(int step, int i) {
    if (threadIdx.x == 0 && step == 1 && i < MK_PROF_MAX && blockIdx.x < MK_PROF_BLOCKS) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
        g_mk_prof[blockIdx.x][i] = t;
    }
}
#else
__device__ __forceinline__ void mk_mark(int, int) {}
#endif

// Grid-wide barrier over a monotonically increasing counter (zeroed by the host before the launch);
// `target` is this block's running count of arrivals it expects. Co-residency of all blocks is
// guaranteed by the cooperative launch. The block's writes are ordered before thread 0's arrival by
// __syncthreads and published by the release add; the acquire load orders what follows (the pattern of
// CUTLASS's generic barrier). Two full __threadfence()s cost ~0.3 us more per barrier (v3 profile).
// With MK_PROFILE, `mark` (when >= 0) is stamped once the whole block has arrived (after the first __syncthreads):
// a stamp before the call would only say when warp 0 was done.
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned& target, int step = 0, int mark = -1) {
    __syncthreads();
    if (mark >= 0) mk_mark(step, mark);
    target += gridDim.x;
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        while ((int)(ld_acquire(bar) - target) < 0) {
        }
    }
    __syncthreads();
}


// The async-copy primitives live in lb_async.cuh (shared with the quantized GEMV's bulk-copy ring).
using lb::cp_async16;
using lb::mbar_arrive_cp_async;
using lb::mbar_init;
using lb::mbar_wait;
using lb::smem_addr;
#if LB_DEVICE_ARCH >= 900
using lb::bulk_copy;
#endif

}  // namespace mk
