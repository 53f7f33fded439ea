// The host side of cuda/common/lb_pdl.cuh: whether launches carry the PDL attribute.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "lb_check.cuh"
#include "lb_pdl.cuh"

namespace {

constexpr int kMaxDevices = 64;
// -1: not asked yet; 0/1: the device's answer (compute capability >= 9.0)
std::atomic<int> g_device_cc9[kMaxDevices];
// 1 on, 0 off; the first use reads LUCEBOX_PDL ("1": on; unset or anything else: off). Off by default
// since the H200 run of 32a4546: with every kernel triggering at its top, the 27B decode step was slower
// (63 vs 94 tok/s: dependents parked on the SMs while their predecessors drained) and the engine's
// verify gave wrong logits with the staged small-N kernel (docs/perf.md, "27B launch overhead").
std::atomic<int> g_mode{-1};

struct InitDevices {
    InitDevices() {
        for (auto& d : g_device_cc9) d.store(-1);
    }
} g_init_devices;

int mode() {
    int m = g_mode.load(std::memory_order_relaxed);
    if (m < 0) {
        const char* env = std::getenv("LUCEBOX_PDL");
        m = (env && std::strcmp(env, "1") == 0) ? 1 : 0;
        int expected = -1;
        g_mode.compare_exchange_strong(expected, m);
        m = g_mode.load();
    }
    return m;
}

}  // namespace

namespace lb {

bool pdl_enabled() {
    if (!mode()) return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    int v = g_device_cc9[dev].load(std::memory_order_relaxed);
    if (v < 0) {
        int major = 0;
        v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        g_device_cc9[dev].store(v);
    }
    return v == 1;
}

}  // namespace lb

// on = 1: launches carry the PDL attribute where the device has it; 0: classic launches everywhere.
// Returns the previous setting (1 or 0). Needs no GPU.
extern "C" LB_API int lb_set_pdl(int on) {
    const int prev = mode();
    g_mode.store(on ? 1 : 0);
    return prev;
}
