// ABI version, build info and device queries: what _lib.py checks before using anything else.
#include <cstdio>
#include <cstring>

#include "lb_check.cuh"

// Set by the Makefile for this file only (so a new commit does not rebuild every object).
#ifndef LB_GIT_COMMIT
#define LB_GIT_COMMIT unknown
#endif
#ifndef LB_NVCC_ARCH
#define LB_NVCC_ARCH unknown
#endif
#define LB_STR_(x) #x
#define LB_STR(x) LB_STR_(x)

namespace {

// nvcc defines __CUDA_ARCH_LIST__ in the host pass too: the archs this object carries code for
// (860, 900, ...), the same -arch every object of the library is built with.
constexpr int kArchs[] = {__CUDA_ARCH_LIST__};

struct BuildInfo {
    char json[512];
    BuildInfo() {
        char archs[128] = "";
        size_t n = 0;
        for (size_t i = 0; i < sizeof(kArchs) / sizeof(kArchs[0]); ++i)
            n += snprintf(archs + n, sizeof(archs) - n, "%s\"sm_%d\"", i ? ", " : "", kArchs[i] / 10);
        snprintf(json, sizeof(json),
                 "{\"abi\": %d, \"archs\": [%s], \"arch_flag\": \"%s\", \"nvcc\": \"%d.%d.%d\", "
                 "\"built\": \"%s %s\", \"commit\": \"%s\"}",
                 LB_ABI_VERSION, archs, LB_STR(LB_NVCC_ARCH), __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__,
                 __CUDACC_VER_BUILD__, __DATE__, __TIME__, LB_STR(LB_GIT_COMMIT));
    }
};

int device_attr(cudaDeviceAttr attr, int dev) {
    int value = 0;
    // Optional facts: a driver that does not report one leaves 0 rather than failing the query.
    if (cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return value;
}

}  // namespace

extern "C" LB_API int lb_abi_version(void) { return LB_ABI_VERSION; }

extern "C" LB_API const char* lb_build_info(void) {
    // Built on first use (thread-safe static init), constant afterwards.
    static const BuildInfo info;
    return info.json;
}

extern "C" LB_API int lb_device_count(int* count) {
    LB_CHECK_ARG(count != nullptr, "count is NULL");
    *count = 0;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return lb::set_cuda_error(err, "cudaGetDeviceCount", __FILE__, __LINE__);
    }
    if (n == 0) return lb::set_error(LB_ERR_NO_DEVICE, "cudaGetDeviceCount: no CUDA device");
    *count = n;
    return LB_OK;
}

extern "C" LB_API int lb_device_props(int dev, lb_device_props_t* out) {
    LB_CHECK_ARG(out != nullptr, "out is NULL");
    int n = 0;
    int status = lb_device_count(&n);
    if (status != LB_OK) return status;
    if (dev < 0 || dev >= n) return lb::set_error(LB_ERR_INVALID_ARG, "lb_device_props: no device %d (%d present)", dev, n);
    memset(out, 0, sizeof(*out));
    cudaDeviceProp prop;
    LB_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
    snprintf(out->name, sizeof(out->name), "%s", prop.name);
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    out->max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
    out->total_mem_bytes = prop.totalGlobalMem;
    out->smem_per_block_optin = (int32_t)prop.sharedMemPerBlockOptin;
    out->smem_per_sm = (int32_t)prop.sharedMemPerMultiprocessor;
    out->l2_bytes = prop.l2CacheSize;
    out->mem_clock_khz = device_attr(cudaDevAttrMemoryClockRate, dev);
    out->mem_bus_width_bits = device_attr(cudaDevAttrGlobalMemoryBusWidth, dev);
    out->pci_bus_id = prop.pciBusID;
    return LB_OK;
}

extern "C" LB_API int lb_cuda_versions(int* driver_version, int* runtime_version) {
    LB_CHECK_ARG(driver_version != nullptr && runtime_version != nullptr, "NULL output pointer");
    *driver_version = 0;
    *runtime_version = 0;
    // With no driver installed cudaDriverGetVersion reports 0 and succeeds; keep going either way.
    if (cudaDriverGetVersion(driver_version) != cudaSuccess) cudaGetLastError();
    LB_CUDA_TRY(cudaRuntimeGetVersion(runtime_version));
    return LB_OK;
}
