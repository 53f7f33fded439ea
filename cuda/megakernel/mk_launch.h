// Host-side entry points of mk_kernel.cu, used by the C API in mk_api.cu (kept apart so the API file
// stays plain host code). Each returns a cudaError_t as int.
#pragma once

#include <cuda_runtime.h>

#include "mk_common.cuh"

namespace mk {

int max_blocks_per_sm(size_t smem, int* out);
int prepare(size_t smem);
// ring_hold 0 or 1 picks the kernel instance (lb_mk_config_t.ring_hold).
int launch(const Params& P, int n_blocks, int ring_hold, cudaStream_t stream);

}  // namespace mk
