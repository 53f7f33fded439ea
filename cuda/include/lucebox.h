/* lucebox.h: the whole C ABI of liblucebox.so, declared once. engines/_lib.py mirrors it in one
 * ctypes table; tests/unit/test_lib.py parses this file and checks every LB_API prototype against it.
 *
 * Rules for additions (see the sections at the end):
 *   - every exported function is declared here as `LB_API <ret> lb_<name>(...);` on its own;
 *     the library is built with -fvisibility=hidden, so only LB_API functions are exported;
 *   - functions return lb_status (int) unless they are pure queries; details go to lb_last_error();
 *   - parameters are scalars, pointers and POD structs of fixed-width fields (no C++ types, no enums
 *     by value: pass int); device pointers are `void*` / `const void*`; streams are `void*`
 *     (a cudaStream_t, NULL = the default stream);
 *   - a change to an existing signature or struct bumps LB_ABI_VERSION (and _lib.ABI_VERSION).
 *   - state lives behind an opaque handle with lb_<thing>_create / lb_<thing>_free; no globals.
 */
#ifndef LUCEBOX_H
#define LUCEBOX_H

#include <stddef.h>
#include <stdint.h>

#define LB_ABI_VERSION 1

#if defined(_WIN32)
#define LB_API __declspec(dllexport)
#else
#define LB_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================================================
 * Status codes. lb_last_error() holds the message of the last failure on the calling thread.
 * ================================================================================================ */
typedef enum lb_status {
    LB_OK = 0,
    LB_ERR_INVALID_ARG = 1,  /* a bad pointer, size or shape */
    LB_ERR_NO_DRIVER = 2,    /* no NVIDIA driver, or one too old for this CUDA runtime */
    LB_ERR_NO_DEVICE = 3,    /* a driver but no usable GPU */
    LB_ERR_CUDA = 4,         /* any other CUDA runtime error */
    LB_ERR_OUT_OF_MEMORY = 5,
    LB_ERR_UNSUPPORTED = 6,  /* not built for this arch, or a shape/type this op does not handle */
    LB_ERR_INTERNAL = 7
} lb_status;

/* ================================================================================================
 * Core: ABI, build info, devices (cuda/core/build_info.cu)
 * ================================================================================================ */

/* Device facts for profile matching and doctor. Fixed-width fields only; mirrored in _lib.py. */
typedef struct lb_device_props {
    char name[256];
    int32_t cc_major;
    int32_t cc_minor;
    int32_t sm_count;
    int32_t max_threads_per_sm;
    uint64_t total_mem_bytes;
    int32_t smem_per_block_optin;  /* bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin */
    int32_t smem_per_sm;           /* bytes */
    int32_t l2_bytes;
    int32_t mem_clock_khz;         /* 0 when the driver does not report it */
    int32_t mem_bus_width_bits;    /* 0 when the driver does not report it */
    int32_t pci_bus_id;
} lb_device_props_t;

/* LB_ABI_VERSION as compiled into the library. */
LB_API int lb_abi_version(void);

/* JSON object: {"abi": 1, "archs": ["sm_86"], "arch_flag": "sm_86", "nvcc": "13.0.88",
 * "built": "...", "commit": "..."}. Static storage; never NULL. */
LB_API const char* lb_build_info(void);

/* Message of the last failed call on this thread ("" if none). Valid until the next failing call. */
LB_API const char* lb_last_error(void);

/* Number of usable GPUs. LB_OK, LB_ERR_NO_DRIVER or LB_ERR_NO_DEVICE (then *count = 0). Never crashes
 * on a machine without a GPU or driver. */
LB_API int lb_device_count(int* count);

/* Properties of device `dev`. */
LB_API int lb_device_props(int dev, lb_device_props_t* out);

/* CUDA driver and runtime versions as CUDA encodes them (13000 = 13.0); driver 0 = no driver. */
LB_API int lb_cuda_versions(int* driver_version, int* runtime_version);

/* ================================================================================================
 * Ops (cuda/ops/*.cu): one section per op, reachable from Python for tests.
 * ================================================================================================ */

/* ================================================================================================
 * Megakernel (cuda/megakernel/*.cu): persistent 0.8B decode kernel behind an opaque handle.
 * ================================================================================================ */

/* ================================================================================================
 * DFlash (cuda/dflash/*.cu): 27B target prefill / verify / commit, draft forward.
 * ================================================================================================ */

#ifdef __cplusplus
}
#endif

#endif /* LUCEBOX_H */
