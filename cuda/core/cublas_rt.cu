// cuBLAS at run time: dlopen() a libcublas the caller names (or the loader finds by soname) and resolve
// the few entry points the prefill GEMMs use (cuda/common/lb_cublas.h). The build has no cuBLAS, so
// nothing links against it: without one, everything else works and callers keep their own kernels.
//
// Process-wide state, on purpose: a shared library is loaded once per process whatever we do, so the
// resolved table is too. It is written once under a mutex and published through an atomic pointer;
// a loaded library is never closed (handles made from it may live anywhere).
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "lb_check.cuh"
#include "lb_cublas.h"

namespace {

struct Loaded {
    lb::CublasApi api{};
    char path[1024] = "";
    int version = 0;  // major * 10000 + minor * 100 + patch, 0 when the library does not say
};

std::mutex g_mutex;
Loaded g_loaded;  // filled once under g_mutex, then only read
std::atomic<const lb::CublasApi*> g_api{nullptr};

const char* const kSonames[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};

// Newer headers map the plain names onto the _v2 exports; try both so either spelling resolves.
void* sym(void* dl, const char* name, const char* alt) {
    void* p = dlsym(dl, name);
    return (p || !alt) ? p : dlsym(dl, alt);
}

// libcublas needs libcublasLt of the same release from its own folder. The Python wheels ship both side
// by side; opening Lt first by its full path makes that folder's copy the one libcublas binds to even
// when the folder is not on the loader's search path. A failure here is no error: libcublas may find it.
void* preload_lt(const char* path) {
    const char* slash = std::strrchr(path, '/');
    if (!slash || std::strncmp(slash + 1, "libcublas.so", 12) != 0) return nullptr;
    const std::string lt = std::string(path, slash + 1) + "libcublasLt.so" + (slash + 1 + 12);
    return dlopen(lt.c_str(), RTLD_NOW | RTLD_GLOBAL);
}

int library_version(void* dl) {
    // cublasGetProperty(libraryPropertyType, int*): MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
    auto get = reinterpret_cast<lb::cublasStatus_t (*)(libraryPropertyType, int*)>(dlsym(dl, "cublasGetProperty"));
    int v[3] = {0, 0, 0};
    if (!get || get(MAJOR_VERSION, &v[0]) || get(MINOR_VERSION, &v[1]) || get(PATCH_LEVEL, &v[2])) return 0;
    return v[0] * 10000 + v[1] * 100 + v[2];
}

// Open one candidate; on success fill g_loaded and return true, else append why to `why`.
bool try_open(const char* path, std::string& why) {
    void* lt = preload_lt(path);
    dlerror();
    void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char* e = dlerror();
        why += std::string(why.empty() ? "" : "; ") + (e ? e : path);
        if (lt) dlclose(lt);
        return false;
    }
    lb::CublasApi api{};
    api.create = reinterpret_cast<decltype(api.create)>(sym(dl, "cublasCreate_v2", "cublasCreate"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(sym(dl, "cublasDestroy_v2", "cublasDestroy"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(sym(dl, "cublasSetStream_v2", "cublasSetStream"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(sym(dl, "cublasSetMathMode", nullptr));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(sym(dl, "cublasGemmEx", nullptr));
    api.set_sm_count_target =
        reinterpret_cast<decltype(api.set_sm_count_target)>(sym(dl, "cublasSetSmCountTarget", nullptr));
    const char* missing = !api.create ? "cublasCreate_v2"
                          : !api.destroy ? "cublasDestroy_v2"
                          : !api.set_stream ? "cublasSetStream_v2"
                          : !api.gemm_ex ? "cublasGemmEx"
                                         : nullptr;
    if (missing) {
        why += std::string(why.empty() ? "" : "; ") + path + " has no " + missing;
        dlclose(dl);
        if (lt) dlclose(lt);
        return false;
    }
    g_loaded.api = api;
    g_loaded.version = library_version(dl);
    // the file the loader actually opened (a soname resolves to a path only here)
    Dl_info info{};
    const char* file = dladdr(reinterpret_cast<void*>(api.create), &info) && info.dli_fname ? info.dli_fname : path;
    std::snprintf(g_loaded.path, sizeof(g_loaded.path), "%s", file);
    g_api.store(&g_loaded.api, std::memory_order_release);
    return true;
}

}  // namespace

namespace lb {

const CublasApi* cublas_api() { return g_api.load(std::memory_order_acquire); }

const char* cublas_status_name(cublasStatus_t st) {
    switch (st) {
        case 0: return "CUBLAS_STATUS_SUCCESS";
        case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
        case 7: return "CUBLAS_STATUS_INVALID_VALUE";
        case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
        case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
        default: return "unknown cuBLAS status";
    }
}

int cublas_handle_create(cudaStream_t stream, cublasHandle_t* out) {
    *out = nullptr;
    const CublasApi* api = cublas_api();
    if (!api) return set_error(LB_ERR_NOT_FOUND, "cuBLAS is not loaded (lb_cublas_load)");
    cublasHandle_t h = nullptr;
    cublasStatus_t st = api->create(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return set_error(LB_ERR_CUDA, "cublasCreate failed: %s (%d)", cublas_status_name(st), st);
    st = api->set_stream(h, stream);
    if (st == CUBLAS_STATUS_SUCCESS && api->set_math_mode) st = api->set_math_mode(h, CUBLAS_DEFAULT_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) {
        api->destroy(h);
        return set_error(LB_ERR_CUDA, "cuBLAS handle setup failed: %s (%d)", cublas_status_name(st), st);
    }
    *out = h;
    return LB_OK;
}

}  // namespace lb

extern "C" LB_API int lb_cublas_load(const char* path) {
    if (lb::cublas_api()) return LB_OK;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (lb::cublas_api()) return LB_OK;
    std::string why;
    if (path && *path) {
        if (try_open(path, why)) return LB_OK;
    } else {
        for (const char* name : kSonames)
            if (try_open(name, why)) return LB_OK;
    }
    return lb::set_error(LB_ERR_NOT_FOUND, "cuBLAS not loaded: %s", why.c_str());
}

extern "C" LB_API int lb_cublas_loaded(char* path, int n, int* version) {
    const bool loaded = lb::cublas_api() != nullptr;
    if (path && n > 0) std::snprintf(path, (size_t)n, "%s", loaded ? g_loaded.path : "");
    if (version) *version = loaded ? g_loaded.version : 0;
    return loaded ? 1 : 0;
}
