// The thread-local last-error message behind lb_last_error(), and CUDA error → lb_status mapping.
#include <cstdarg>
#include <cstdio>

#include "lb_check.cuh"

namespace {
// One message per host thread: calls from different Python threads never see each other's errors.
thread_local char g_last_error[1024] = "";
}  // namespace

namespace lb {

int set_error(int status, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
    va_end(args);
    return status;
}

void clear_error() { g_last_error[0] = '\0'; }

int status_of(cudaError_t err) {
    switch (err) {
        case cudaSuccess:
            return LB_OK;
        case cudaErrorInsufficientDriver:
        case cudaErrorStubLibrary:
        case cudaErrorSystemDriverMismatch:
        case cudaErrorCompatNotSupportedOnDevice:
        case cudaErrorCallRequiresNewerDriver:
            return LB_ERR_NO_DRIVER;
        case cudaErrorNoDevice:
        case cudaErrorDevicesUnavailable:
            return LB_ERR_NO_DEVICE;
        case cudaErrorMemoryAllocation:
            return LB_ERR_OUT_OF_MEMORY;
        case cudaErrorNoKernelImageForDevice:
        case cudaErrorUnsupportedPtxVersion:
        case cudaErrorInvalidDeviceFunction:
            return LB_ERR_UNSUPPORTED;
        default:
            return LB_ERR_CUDA;
    }
}

int set_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
    return set_error(status_of(err), "%s failed at %s:%d: %s (%s)", what, file, line, cudaGetErrorString(err),
                     cudaGetErrorName(err));
}

}  // namespace lb

extern "C" LB_API const char* lb_last_error(void) { return g_last_error; }
