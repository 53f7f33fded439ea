// Programmatic dependent launch (PDL, sm_90+): the next kernel in a stream is scheduled while the current
// one drains, so its blocks are resident and can start the work that does not depend on the current
// kernel (a GEMV's first weight loads) before the current kernel ends. What it saves, per kernel boundary:
// the ~1.1 µs launch gap the H200 showed between back-to-back kernels (scripts/profile_27b_step.py: 1,255
// GPU ops and 1.4 ms of gaps per 27B decode step) and the ramp of the next kernel's first loads.
//
// The contract, for every kernel launched with launch_pdl():
//   1. every thread of every block calls pdl_wait() before it reads anything an earlier kernel in the
//      stream wrote, before it writes anything an earlier kernel reads or writes, and before it exits
//      (a block that exited without waiting would let the grid "finish" before its predecessor, and a
//      kernel after it would then wait on the wrong thing);
//   2. pdl_trigger() may be called anywhere (we call it at the top): it only lets the next kernel be
//      scheduled; that kernel's pdl_wait() still waits for this whole grid to complete and its writes to
//      be visible.
// Kernels launched the classic way (<<<>>>) and memsets/copies keep full stream order, before and after.
// On sm_86 (no griddepcontrol) both calls compile to nothing and launch_pdl() launches without the
// attribute.
//
// STATUS (session 10): on for the 27B decode-step CUDA graph only (DFlashTargetEngine.step_pdl: +8.5% tg128,
// docs/perf.md "PDL, third try"); LUCEBOX_PDL=0 never, =1 every launch of the process. The verify graph, the
// prefill and un-graphed calls launch classic (no gain measured). Rule 1 is literal: in session 10 a decode
// DeltaNet kernel that loaded its recurrent state before pdl_wait (state written only by that layer's kernel of
// the previous step) broke the decode step under PDL (docs/perf.md "A decode step under PDL"): only constants
// (weights) before the wait. Earlier history: sessions 3-4 measured PDL without graphs slower (dependents parked
// on the SMs while their predecessors drained), and its on/off check's "wrong results" were the engine's own
// run-to-run noise (stream-K atomics), shown in session 9.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace lb {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device carry the PDL attribute: compute capability >= 9.0 and not
// turned off (lb_set_pdl / LUCEBOX_PDL=0). Cached per device; cheap after the first call.
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where pdl_enabled().
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace lb
