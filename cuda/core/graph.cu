// CUDA graphs, events and mapped pinned host memory for the engines' replayed passes (engines/dflash.py).
//
// A pass whose kernels take the same arguments at every call (what varies is data the kernels read from
// device memory: the position, the token, a tree's parents and masks) is captured once from the
// engine's stream and replayed with one launch: the ~890 kernels of a 27B decode step then go out
// back to back from the GPU's own queue, with no host issue in between.
//
// Capture safety is the caller's: between lb_graph_begin and lb_graph_end only stream-ordered work on
// the captured stream (kernel launches, cudaMemcpyAsync / cudaMemsetAsync on it). A synchronous copy,
// an allocation or any work on the legacy stream from the capturing thread invalidates the capture,
// which lb_graph_end then reports (and the stream leaves capture mode either way).
#include "lb_check.cuh"

extern "C" LB_API int lb_graph_begin(void* stream) {
    LB_CHECK_ARG(stream, "the legacy default stream can not be captured: pass an lb_stream_create stream");
    // thread-local: other threads' unrelated CUDA calls do not break this capture (nor it them)
    LB_CUDA_TRY(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
    return LB_OK;
}

extern "C" LB_API int lb_graph_end(void* stream, void** exec) {
    LB_CHECK_ARG(stream && exec, "null stream or exec");
    *exec = nullptr;
    cudaGraph_t graph = nullptr;
    // ends capture mode even when the capture was invalidated (then graph is NULL and the error says why)
    const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
    if (e != cudaSuccess || !graph) {
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError();  // the capture error is reported here, not left for the next launch
        return lb::set_error(LB_ERR_CUDA, "lb_graph_end: the capture failed (%s): an unsafe call (sync, "
                             "allocation, legacy-stream work) or a failed launch inside it",
                             cudaGetErrorString(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated));
    }
    cudaGraphExec_t ge = nullptr;
    const cudaError_t ei = cudaGraphInstantiate(&ge, graph, 0);
    cudaGraphDestroy(graph);  // the executable keeps what it needs
    if (ei != cudaSuccess) return lb::set_cuda_error(ei, "cudaGraphInstantiate", __FILE__, __LINE__);
    *exec = ge;
    return LB_OK;
}

extern "C" LB_API int lb_graph_launch(void* exec, void* stream) {
    LB_CHECK_ARG(exec, "null graph");
    LB_CUDA_TRY(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_graph_destroy(void* exec) {
    if (exec) LB_CUDA_TRY(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)));
    return LB_OK;
}

extern "C" LB_API int lb_event_create(void** out) {
    LB_CHECK_ARG(out, "out is NULL");
    *out = nullptr;
    cudaEvent_t ev = nullptr;
    LB_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = ev;
    return LB_OK;
}

extern "C" LB_API int lb_event_record(void* event, void* stream) {
    LB_CHECK_ARG(event, "null event");
    LB_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_event_query(void* event, int* done) {
    LB_CHECK_ARG(event && done, "null event or done");
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return LB_OK;
    }
    LB_CUDA_TRY(e);
    *done = 1;
    return LB_OK;
}

extern "C" LB_API int lb_event_sync(void* event) {
    LB_CHECK_ARG(event, "null event");
    LB_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    return LB_OK;
}

extern "C" LB_API int lb_event_destroy(void* event) {
    if (event) LB_CUDA_TRY(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    return LB_OK;
}

extern "C" LB_API int lb_host_alloc(uint64_t nbytes, void** out) {
    LB_CHECK_ARG(out, "out is NULL");
    *out = nullptr;
    LB_CHECK_ARG(nbytes > 0, "nbytes is 0");
    // mapped: kernels write it directly (with unified addressing the host pointer is the device pointer)
    LB_CUDA_TRY(cudaHostAlloc(out, nbytes, cudaHostAllocMapped | cudaHostAllocPortable));
    void* dev = nullptr;
    const cudaError_t e = cudaHostGetDevicePointer(&dev, *out, 0);
    if (e != cudaSuccess || dev != *out) {
        cudaFreeHost(*out);
        *out = nullptr;
        return lb::set_error(LB_ERR_UNSUPPORTED, "lb_host_alloc: mapped host memory without unified addressing");
    }
    return LB_OK;
}

extern "C" LB_API int lb_host_free(void* ptr) {
    if (ptr) LB_CUDA_TRY(cudaFreeHost(ptr));
    return LB_OK;
}
