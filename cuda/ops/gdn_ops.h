// Host-side launchers of the 27B-capable Gated DeltaNet ops (cuda/ops/gdn_conv.cu, gdn_delta.cu,
// gdn_chunked.cu), for the C API entry points and for the DFlash engine (cuda/dflash/). Layouts: see
// cuda/common/gdn.cuh. Each returns a cudaError_t as int (launch errors; execution errors show at the
// next synchronising call). Pointers are device pointers; dk = dv = 128.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace gdn {

// Causal conv (kernel 4) + SiLU over the pre-conv inputs `pre` [T, ld_pre] (first C columns), then
// q, k L2 norms (q also / sqrt(dk)), beta = sigmoid(b), g = ssm_a · softplus(a + dt_bias).
// parents == nullptr: tokens follow each other (decode, prefill); with update_conv the conv state is
// advanced to the last 3 inputs. parents != nullptr: tree slots, each slot's window is its ancestry
// (parents[0] == -1, parents[i] < i) and the conv state is left alone (lb_gdn_commit advances it).
int conv_prep(const float* pre, int ld_pre, const float* a, const float* b, const float* conv_w, const float* ssm_a,
              const float* dt_bias, float* conv_state, const int32_t* parents, float* q, float* k, float* v, float* g,
              float* beta, int T, int hk, int hv, bool update_conv, cudaStream_t s);

// conv_state [3, C] <- last 3 rows of concat(conv_state, pre[0..T)) (a prompt segment's inputs).
int conv_advance(const float* pre, int ld_pre, float* conv_state, int T, int C, cudaStream_t s);
// conv_state [3, C] <- last 3 rows of concat(conv_state, pre[path[0..n)]) (the accepted slots' inputs).
int conv_commit(const float* pre, int ld_pre, float* conv_state, const int32_t* path, int n, int C, cudaStream_t s);

// y[t, h·128 + d] = o[t, h, d] · rsqrt(mean_d(o²) + eps) · w[d] · SiLU(z[t·ld_z + h·128 + d]).
int out_norm(const float* o, const float* z, int ld_z, const float* w, float* y, int T, int hv, float eps,
             cudaStream_t s);

// The delta rule along a sequence of steps, state split over dv slices (see gdn.cuh):
//  - parents == nullptr, rows == nullptr: steps 0..n-1 in order (decode / recurrent);
//  - parents != nullptr (n <= 64): tree slots, slot i starts from the state after parents[i] (the
//    state at entry for the root); states stay in registers along slot i -> i+1 and are written to
//    `saves` [n_saves, Hv, dk, dv] only for slots some later slot branches from;
//  - rows != nullptr: step m reads inputs row rows[m] (replay of an accepted path).
// o [n, Hv, dv] may be nullptr (replay). write_state = 0 leaves `state` untouched (verify).
int delta(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state, float* o,
          const int32_t* parents, const int32_t* rows, float* saves, int max_saves, int n, int hk, int hv,
          bool write_state, cudaStream_t s);

// One decode token of a whole layer in one kernel (gdn_decode_fused.cu): conv + SiLU + norms, the delta
// rule and the gated output norm, conv_state and state advanced in place, y [Hv·128]; pre [C], a, b [Hv],
// z [Hv·128]. decode_fused_ok: whether it applies (t == 1, Hv / Hk <= 8, a cluster-capable device and
// build, LUCEBOX_GDN_DECODE != "split"); lb_gdn_decode_step runs conv_prep + delta + out_norm otherwise.
bool decode_fused_ok(int t, int hk, int hv);
int decode_fused(const float* pre, const float* a, const float* b, const float* z, const float* conv_w,
                 const float* ssm_a, const float* dt_bias, const float* norm_w, float* conv_state, float* state,
                 float* y, int hk, int hv, float eps, cudaStream_t s);

// Slots whose state a later slot branches from (some child c != i + 1): save_idx[i] = compact index or
// -1. Returns the count. The device kernel applies the same rule; this host twin sizes `saves`.
int tree_plan(const int32_t* parents, int n, int32_t* save_idx);

// Chunked prefill of the rule (gdn_chunked.cu, over pf::dn_chunked): inputs as for delta, T tokens in
// order, state [Hv, dk, dv] read and overwritten; scratch of chunked_scratch_bytes(T, hv).
size_t chunked_scratch_bytes(int T, int hv);
int chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
            float* o, void* scratch, int T, int hk, int hv, cudaStream_t s);

}  // namespace gdn
