// A minimal device-buffer API so Python (tests, engines without another CUDA binding) can place data
// for the ops on the GPU: allocate, free, copy both ways, fill bytes, synchronise.
#include "lb_check.cuh"

extern "C" LB_API int lb_dev_alloc(uint64_t nbytes, void** out) {
    LB_CHECK_ARG(out, "out is NULL");
    *out = nullptr;
    LB_CHECK_ARG(nbytes > 0, "nbytes is 0");
    LB_CUDA_TRY(cudaMalloc(out, nbytes));
    return LB_OK;
}

extern "C" LB_API int lb_dev_free(void* ptr) {
    if (ptr) LB_CUDA_TRY(cudaFree(ptr));
    return LB_OK;
}

extern "C" LB_API int lb_dev_h2d(void* dst, const void* src, uint64_t nbytes) {
    LB_CHECK_ARG(dst && src, "NULL pointer");
    LB_CUDA_TRY(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
    return LB_OK;
}

extern "C" LB_API int lb_dev_d2h(void* dst, const void* src, uint64_t nbytes) {
    LB_CHECK_ARG(dst && src, "NULL pointer");
    LB_CUDA_TRY(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
    return LB_OK;
}

extern "C" LB_API int lb_dev_memset(void* dst, int byte, uint64_t nbytes) {
    LB_CHECK_ARG(dst, "NULL pointer");
    LB_CUDA_TRY(cudaMemset(dst, byte, nbytes));
    return LB_OK;
}

// Wait for all work on the device; execution errors of earlier launches surface here.
extern "C" LB_API int lb_dev_sync(void) {
    LB_CUDA_TRY(cudaDeviceSynchronize());
    return LB_OK;
}

// A stream for one engine's launches. Default flags on purpose: such a stream synchronises with the
// legacy default stream, so the synchronous lb_dev_h2d / d2h / memset above still order themselves
// against its kernels (a copy waits for the kernels before it, the kernels after it wait for the copy).
// Why not the legacy stream itself: programmatic dependent launch (lb_pdl.cuh) is a relation between
// kernels of one ordinary stream; the legacy stream's implicit barriers are not that (docs/perf.md,
// "27B launch overhead", measures both).
extern "C" LB_API int lb_stream_create(void** out) {
    LB_CHECK_ARG(out, "out is NULL");
    *out = nullptr;
    cudaStream_t s = nullptr;
    LB_CUDA_TRY(cudaStreamCreate(&s));
    *out = s;
    return LB_OK;
}

// Destroys a stream of lb_stream_create (NULL: nothing). Work already queued on it still completes.
extern "C" LB_API int lb_stream_destroy(void* stream) {
    if (stream) LB_CUDA_TRY(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
