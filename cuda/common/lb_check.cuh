// Error handling shared by every .cu: status codes out, message into the thread-local lb_last_error().
// Exported functions never throw and never abort: they return an lb_status.
#pragma once

#include <cuda_runtime.h>

#include "lucebox.h"

namespace lb {

// Records a printf-style message for lb_last_error() and returns `status` (so `return set_error(...)`).
int set_error(int status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Maps a CUDA runtime error to an lb_status and records "<what> failed at file:line: <cuda message>".
int set_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// The lb_status a CUDA runtime error means (driver missing, no device, OOM, no kernel image, other).
int status_of(cudaError_t err);

// Clears the calling thread's last error (done at the start of calls that report success states).
void clear_error();

}  // namespace lb

// Evaluate a CUDA runtime call; on failure record it and return its lb_status from the caller.
#define LB_CUDA_TRY(expr)                                                      \
    do {                                                                       \
        cudaError_t lb_err_ = (expr);                                          \
        if (lb_err_ != cudaSuccess)                                            \
            return ::lb::set_cuda_error(lb_err_, #expr, __FILE__, __LINE__);   \
    } while (0)

// After a <<<launch>>>: launch-configuration errors surface here (not execution errors; those show
// at the next synchronising call).
#define LB_LAUNCH_TRY() LB_CUDA_TRY(cudaGetLastError())

// Argument check for exported functions: returns LB_ERR_INVALID_ARG with the function name.
#define LB_CHECK_ARG(cond, msg)                                                          \
    do {                                                                                 \
        if (!(cond)) return ::lb::set_error(LB_ERR_INVALID_ARG, "%s: %s", __func__, msg); \
    } while (0)

// Wrap the body of an exported function that uses C++ allocations: exceptions become a status.
#define LB_API_BEGIN try {
#define LB_API_END                                                                      \
    }                                                                                   \
    catch (const std::bad_alloc&) {                                                     \
        return ::lb::set_error(LB_ERR_OUT_OF_MEMORY, "%s: host allocation failed", __func__); \
    }                                                                                   \
    catch (const std::exception& e) {                                                   \
        return ::lb::set_error(LB_ERR_INTERNAL, "%s: %s", __func__, e.what());          \
    }                                                                                   \
    catch (...) {                                                                       \
        return ::lb::set_error(LB_ERR_INTERNAL, "%s: unknown exception", __func__);     \
    }
