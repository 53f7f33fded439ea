// Host-side launchers of the 27B-capable attention ops (cuda/ops/attn_rope.cu, attn_decode.cu), for the
// C API entry points and the DFlash engine (cuda/dflash/). Layouts: cuda/common/attn.cuh. Each returns
// a cudaError_t as int.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.cuh"

namespace attn {

// Bytes of the split-KV partials for tq queries, nh heads and up to max_splits splits (0 when <= 1).
size_t partials_bytes(int tq, int nh, int max_splits);

// Attention of P (see Params; split_len / n_splits / part_* are chosen here): splits along the keys
// when partials != nullptr and max_splits > 1 (about two blocks per SM), then a combine kernel.
// pos_dev (device int32, or nullptr): the kernels read pos0 from it instead of P.pos0, and the split
// count no longer depends on the context (a CUDA graph captured once replays at every n_past).
// P.out_split (the 0.8B prefill's split-bf16 output, bf16 cache only) always runs the causal tensor-core
// kernel, at any Tq and whatever prefill_on_tensor_cores() says.
int run(Params P, int kv_dtype, void* partials, int max_splits, cudaStream_t s, const int32_t* pos_dev = nullptr);

// Causal prefill on the tensor cores: false only under LUCEBOX_ATTN_PREFILL=fp32 (read once per process).
bool prefill_on_tensor_cores();

// Per token t: q heads from qg [T, ld_q] (head h = [q (256) | gate (256)] at h*512), k [T, ld_k] and v [T, ld_v];
// RMSNorm1p (weights include the +1) of q and k, rotate-half RoPE of dims [0, rope_dims) at position
// positions[t] (or pos0 + t when positions == nullptr), computed in double like the CPU's table; qf fp32
// [T, nh, 256]; K, V rounded to the cache type at row pos0 + t of [nkv, max_ctx, 256].
// pos_dev (device int32, or nullptr): pos0 is read from it on the device instead.
int prep(const float* qg, int ld_q, const float* k, int ld_k, const float* v, int ld_v, const float* q_norm,
         const float* k_norm, const int32_t* positions, int pos0, float* qf, uint16_t* kc, uint16_t* vc, int kv_dtype,
         int T, int nh, int nkv, int max_ctx, int rope_dims, float eps, float theta, cudaStream_t s,
         const int32_t* pos_dev = nullptr);

}  // namespace attn
