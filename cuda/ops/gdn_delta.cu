// gdn_delta: the gated delta rule step by step, for decode (one or a few tokens), tree verify and the
// replay that commits an accepted path — one kernel, three ways of walking the steps (cpu.py
// gated_delta_recurrent / gated_delta_tree; the one-pass form of qwen35.md):
//   u = β (v − α Sᵀk);  o = α Sᵀq + (k·q) u;  S ← α S + k uᵀ   (α = e^g)
// Grid (dv / 16 slices, Hv), two warps per block, 8 columns per warp (gdn.cuh): a 27B layer (48 heads)
// runs 384 blocks, about three per SM, and every SM streams state. Each warp keeps its [128, 8] slice
// in registers for all steps: the state is read once and written at most once per call.
//
// Why this shape: a verify is 23 dependent steps per layer, so the step latency is the cost, not the
// bytes. (1) Every step's inputs (k, q, the block's 16 v columns, α = e^g, β) are prefetched into
// shared memory in one burst before the walk (up to 64 steps per burst), so no step waits on a global
// load. (2) A warp's column sums reduce with shuffles only, so the walk has no block barrier: the two
// warps of a block, and all blocks, step independently. (3) Tree branch points are saved in shared
// memory (8 KiB per save per block, as many as fit while keeping ~3 blocks per SM), so re-entering a
// branch is a shared-memory read; saves beyond that go to `saves` in global memory.
//
// Tree verify (parents given, n <= 64): slot i continues from slot i-1's registers when parents[i] ==
// i-1 (the spine); otherwise it reloads the state saved after its parent. A slot's state is saved only
// if some child other than i+1 branches from it (the plan, computed per block in shared memory;
// gdn::tree_plan is its host twin for sizing). Saves are written and re-read by the same thread
// (identical element mapping), so no barrier is needed; global saves are reused by every layer.
// The committed state is never written by verify: lb_gdn_commit replays the accepted slots' saved
// inputs (k, v, g, β) onto it and advances the conv state.
// Launched with programmatic dependent launch (lb_pdl.cuh). The kernel reads nothing constant (the state
// itself is written by the previous step's or commit's launch, parents may one day come from a device
// draft), so it waits first thing: what PDL buys here is the launch and block set-up (384 blocks with up
// to ~60 KiB of shared memory) under the predecessor's tail.
#include <algorithm>
#include <vector>

#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace gdn {
namespace {

constexpr int CH = MAX_TREE;                             // steps prefetched per burst
constexpr int PB = 8;                                    // k / q float4 loads in flight per thread
constexpr int SAVE_FLOATS = DELTA_THREADS * ROWS_PER_THREAD * 4;  // one block's slice of one save (8 KiB)

// Shared floats of one burst of `ch` steps: k [ch][128], q [ch][128] (HQ), v [ch][16], α [ch], β [ch],
// rounded up to a float4 so the saves that follow stay aligned.
__host__ __device__ constexpr int burst_floats(int ch, bool hq) {
    return (ch * (D * (hq ? 2 : 1) + DVS + 2) + 3) / 4 * 4;
}

template <bool HQ>
__global__ void __launch_bounds__(DELTA_THREADS) delta_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* state, float* __restrict__ o,
    const int32_t* __restrict__ parents, const int32_t* __restrict__ rows, float* saves, int max_saves, int n,
    int hk, int hv, int write_state, int ch, int nsm) {
    extern __shared__ __align__(16) float sm[];
    __shared__ int par_s[MAX_TREE];
    __shared__ int save_s[MAX_TREE];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cq = lane & 1, rg = lane >> 1;
    const int p = blockIdx.y, kh = p % hk;  // value head p reads key head p % Hk (tiled order)
    const int c0 = blockIdx.x * DVS;        // the block's first column
    const int wc = warp * DELTA_WCOLS + 4 * cq;  // this lane's column quad within the block's 16
    const int col = c0 + wc;
    const int r0 = ROWS_PER_THREAD * rg;
    const size_t head_off = (size_t)p * D * D;

    float* ks = sm;
    float* qs = ks + ch * D;
    float* vs = qs + (HQ ? ch * D : 0);
    float* as = vs + ch * DVS;
    float* bs = as + ch;
    float4* sv = reinterpret_cast<float4*>(sm + burst_floats(ch, HQ));  // [nsm][8][64] float4

    float S[ROWS_PER_THREAD][4];
    auto load = [&](const float* src) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            const float4 x = *reinterpret_cast<const float4*>(src + (size_t)(r0 + m) * D + col);
            S[m][0] = x.x, S[m][1] = x.y, S[m][2] = x.z, S[m][3] = x.w;
        }
    };
    auto store = [&](float* dst) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
            *reinterpret_cast<float4*>(dst + (size_t)(r0 + m) * D + col) = make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    };
    // smem saves: thread-private layout (float4 m of thread t at [m][t]), conflict-free
    auto load_sm = [&](int slot) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            const float4 x = sv[((size_t)slot * ROWS_PER_THREAD + m) * DELTA_THREADS + tid];
            S[m][0] = x.x, S[m][1] = x.y, S[m][2] = x.z, S[m][3] = x.w;
        }
    };
    auto store_sm = [&](int slot) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
            sv[((size_t)slot * ROWS_PER_THREAD + m) * DELTA_THREADS + tid] = make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    };
    lb::pdl_trigger();
    lb::pdl_wait();
    load(state + head_off);  // in flight while the plan and the first burst are fetched

    if (parents) {
        for (int i = tid; i < n; i += DELTA_THREADS) par_s[i] = parents[i];
        __syncthreads();
        for (int i = tid; i < n; i += DELTA_THREADS) {
            bool need = false;
            for (int c = i + 2; c < n; ++c) need |= par_s[c] == i;
            save_s[i] = need ? 1 : -1;
        }
        __syncthreads();
        if (tid == 0) {
            int cnt = 0;
            for (int i = 0; i < n; ++i)
                if (save_s[i] > 0) save_s[i] = cnt++;
        }
        // the first burst's barrier publishes save_s
    }

    for (int base = 0; base < n; base += ch) {
        const int cn = min(ch, n - base);
        __syncthreads();  // the previous burst is consumed by both warps
        // k and q in batches of PB float4 per thread, all loads of a batch issued before any store
        // (a plain copy loop waits one L2 round trip per element)
        for (int i0 = tid; i0 < cn * (D / 4); i0 += PB * DELTA_THREADS) {
            float4 tk[PB], tq[PB];
#pragma unroll
            for (int u = 0; u < PB; ++u) {
                const int idx = i0 + u * DELTA_THREADS;
                if (idx < cn * (D / 4)) {
                    const int st = idx / (D / 4), d4 = idx % (D / 4);
                    const int row = rows ? rows[base + st] : base + st;
                    const size_t off = ((size_t)row * hk + kh) * D + 4 * d4;
                    tk[u] = *reinterpret_cast<const float4*>(k + off);
                    if constexpr (HQ) tq[u] = *reinterpret_cast<const float4*>(q + off);
                }
            }
#pragma unroll
            for (int u = 0; u < PB; ++u) {
                const int idx = i0 + u * DELTA_THREADS;
                if (idx < cn * (D / 4)) {
                    reinterpret_cast<float4*>(ks)[idx] = tk[u];
                    if constexpr (HQ) reinterpret_cast<float4*>(qs)[idx] = tq[u];
                }
            }
        }
        for (int idx = tid; idx < cn * (DVS / 4); idx += DELTA_THREADS) {
            const int s = idx / (DVS / 4), c4 = idx % (DVS / 4);
            const int row = rows ? rows[base + s] : base + s;
            reinterpret_cast<float4*>(vs)[idx] =
                *reinterpret_cast<const float4*>(v + ((size_t)row * hv + p) * D + c0 + 4 * c4);
        }
        for (int s = tid; s < cn; s += DELTA_THREADS) {
            const int row = rows ? rows[base + s] : base + s;
            const size_t hrow = (size_t)row * hv + p;
            as[s] = expf(g[hrow]);
            bs[s] = beta[hrow];
        }
        __syncthreads();

        for (int s = 0; s < cn; ++s) {
            const int step = base + s;
            if (parents && step > 0 && par_s[step] != step - 1) {
                const int par = par_s[step];
                const int idx = par >= 0 ? save_s[par] : -1;
                if (par < 0) {
                    load(state + head_off);
                } else if (idx >= 0 && idx < nsm) {
                    load_sm(idx);
                } else if (idx >= 0 && idx < max_saves) {
                    load(saves + (size_t)idx * hv * D * D + head_off);
                } else {
                    // scratch too small for the plan: poison so the caller's checks see it
#pragma unroll
                    for (int m = 0; m < ROWS_PER_THREAD; ++m)
                        S[m][0] = S[m][1] = S[m][2] = S[m][3] = __int_as_float(0x7fc00000);
                }
            }
            float kk[ROWS_PER_THREAD], qq[ROWS_PER_THREAD];
            {
                const float4* k4 = reinterpret_cast<const float4*>(ks + s * D + r0);
                const float4 a0 = k4[0], a1 = k4[1];
                kk[0] = a0.x, kk[1] = a0.y, kk[2] = a0.z, kk[3] = a0.w;
                kk[4] = a1.x, kk[5] = a1.y, kk[6] = a1.z, kk[7] = a1.w;
                if constexpr (HQ) {
                    const float4* q4 = reinterpret_cast<const float4*>(qs + s * D + r0);
                    const float4 b0 = q4[0], b1 = q4[1];
                    qq[0] = b0.x, qq[1] = b0.y, qq[2] = b0.z, qq[3] = b0.w;
                    qq[4] = b1.x, qq[5] = b1.y, qq[6] = b1.z, qq[7] = b1.w;
                }
            }
            // part: Sᵀk (4 columns), Sᵀq (4), k·q over this lane's 8 rows
            constexpr int NR = HQ ? 9 : 4;
            float part[NR];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float a = 0.0f, b = 0.0f;
#pragma unroll
                for (int m = 0; m < ROWS_PER_THREAD; ++m) {
                    a = fmaf(S[m][c], kk[m], a);
                    if constexpr (HQ) b = fmaf(S[m][c], qq[m], b);
                }
                part[c] = a;
                if constexpr (HQ) part[4 + c] = b;
            }
            if constexpr (HQ) {
                float kq = 0.0f;
#pragma unroll
                for (int m = 0; m < ROWS_PER_THREAD; ++m) kq = fmaf(kk[m], qq[m], kq);
                part[NR - 1] = kq;
            }
            // the 16 lanes sharing cq (lane & 1) hold the other rows of the same columns
#pragma unroll
            for (int e = 0; e < NR; ++e) {
                float x = part[e];
                x += __shfl_xor_sync(LB_FULL_MASK, x, 2);
                x += __shfl_xor_sync(LB_FULL_MASK, x, 4);
                x += __shfl_xor_sync(LB_FULL_MASK, x, 8);
                x += __shfl_xor_sync(LB_FULL_MASK, x, 16);
                part[e] = x;
            }
            const float alpha = as[s], bt = bs[s];
            const float4 vv = reinterpret_cast<const float4*>(vs + s * DVS + wc)[0];
            const float vc[4] = {vv.x, vv.y, vv.z, vv.w};
            float u[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) u[c] = bt * (vc[c] - alpha * part[c]);
            if constexpr (HQ) {
                if (rg == 0) {
                    float oc[4];
#pragma unroll
                    for (int c = 0; c < 4; ++c) oc[c] = fmaf(alpha, part[4 + c], part[NR - 1] * u[c]);
                    *reinterpret_cast<float4*>(o + ((size_t)step * hv + p) * D + col) =
                        make_float4(oc[0], oc[1], oc[2], oc[3]);
                }
            }
#pragma unroll
            for (int m = 0; m < ROWS_PER_THREAD; ++m)
#pragma unroll
                for (int c = 0; c < 4; ++c) S[m][c] = fmaf(alpha, S[m][c], kk[m] * u[c]);
            if (parents) {
                const int idx = save_s[step];
                if (idx >= 0 && idx < nsm)
                    store_sm(idx);
                else if (idx >= 0 && idx < max_saves)
                    store(saves + (size_t)idx * hv * D * D + head_off);
            }
        }
    }
    if (write_state) store(state + head_off);
}

struct DevLimits {
    int optin = 48 * 1024, per_sm = 96 * 1024;
};

// Shared-memory limits of the current device, queried once per device.
cudaError_t dev_limits(DevLimits* out) {
    static DevLimits cache[16];
    static bool known[16] = {};
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 16 && known[dev]) {
        *out = cache[dev];
        return cudaSuccess;
    }
    DevLimits L;
    e = cudaDeviceGetAttribute(&L.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&L.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 16) cache[dev] = L, known[dev] = true;
    *out = L;
    return cudaSuccess;
}

}  // namespace

int delta(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state, float* o,
          const int32_t* parents, const int32_t* rows, float* saves, int max_saves, int n, int hk, int hv,
          bool write_state, cudaStream_t s) {
    DevLimits L;
    cudaError_t e = dev_limits(&L);
    if (e != cudaSuccess) return (int)e;
    const bool hq = o != nullptr;
    // the burst: all steps up to 64, fewer only if the device's per-block limit demands it
    int ch = std::min(n, CH);
    while (ch > 1 && (size_t)burst_floats(ch, hq) * 4 > (size_t)L.optin) ch /= 2;
    const size_t burst = (size_t)burst_floats(ch, hq) * 4;
    // saves kept on chip: as many as fit in a third of the SM's shared memory (three blocks per SM
    // cover the 384 blocks of a 27B layer on a 132-SM H200), never more than the plan can use
    int nsm = 0;
    if (parents && max_saves > 0) {
        const long budget = std::min<long>(L.optin, L.per_sm / 3 - 1024) - (long)burst;
        nsm = (int)std::max<long>(0, std::min<long>(budget / (SAVE_FLOATS * 4), std::min(max_saves, MAX_TREE)));
    }
    const size_t smem = burst + (size_t)nsm * SAVE_FLOATS * 4;
    const dim3 grid(NSLICE, hv);
    const int ws = write_state ? 1 : 0;
    if (hq) {
        e = cudaFuncSetAttribute(delta_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        e = lb::launch_pdl(delta_kernel<true>, grid, dim3(DELTA_THREADS), smem, s, q, k, v, g, beta, state, o,
                           parents, rows, saves, max_saves, n, hk, hv, ws, ch, nsm);
    } else {
        e = cudaFuncSetAttribute(delta_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        e = lb::launch_pdl(delta_kernel<false>, grid, dim3(DELTA_THREADS), smem, s, q, k, v, g, beta, state, o,
                           parents, rows, saves, max_saves, n, hk, hv, ws, ch, nsm);
    }
    return (int)e;
}

int tree_plan(const int32_t* parents, int n, int32_t* save_idx) {
    int cnt = 0;
    for (int i = 0; i < n; ++i) {
        bool need = false;
        for (int c = i + 2; c < n; ++c) need |= parents[c] == i;
        save_idx[i] = need ? cnt++ : -1;
    }
    return cnt;
}

}  // namespace gdn

namespace {

bool heads_ok(int hk, int hv) { return hk >= 1 && hv >= hk && hv % hk == 0; }

template <typename T>
T* F(void* p) { return static_cast<T*>(p); }
template <typename T>
const T* F(const void* p) { return static_cast<const T*>(p); }

}  // namespace

extern "C" LB_API int lb_gdn_tree_plan(const int32_t* parents, int n, int32_t* save_idx, int* n_saves) {
    LB_CHECK_ARG(parents && save_idx && n_saves, "null pointer");
    LB_CHECK_ARG(n >= 1 && n <= gdn::MAX_TREE, "1 <= n <= 64");
    LB_CHECK_ARG(parents[0] == -1, "parents[0] must be -1");
    for (int i = 1; i < n; ++i) LB_CHECK_ARG(parents[i] >= 0 && parents[i] < i, "need 0 <= parents[i] < i");
    *n_saves = gdn::tree_plan(parents, n, save_idx);
    return LB_OK;
}

extern "C" LB_API int lb_gdn_delta(const void* q, const void* k, const void* v, const void* g, const void* beta,
                                   void* state, void* o, const void* parents, void* saves, int max_saves, int n, int hk,
                                   int hv, int write_state, void* stream) {
    LB_CHECK_ARG(q && k && v && g && beta && state && o, "null pointer");
    LB_CHECK_ARG(heads_ok(hk, hv) && n >= 1, "need n >= 1, 1 <= hk, hv a multiple of hk");
    LB_CHECK_ARG(!parents || (n <= gdn::MAX_TREE && (saves || max_saves == 0)), "a tree has <= 64 slots");
    LB_CUDA_TRY((cudaError_t)gdn::delta(F<float>(q), F<float>(k), F<float>(v), F<float>(g), F<float>(beta),
                                        F<float>(state), F<float>(o), F<int32_t>(parents), nullptr, F<float>(saves),
                                        max_saves, n, hk, hv, write_state != 0, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_gdn_commit(const void* k, const void* v, const void* g, const void* beta, const void* pre,
                                    int ld_pre, void* state, void* conv_state, const void* path, int n, int hk, int hv,
                                    void* stream) {
    LB_CHECK_ARG(k && v && g && beta && pre && state && conv_state && path, "null pointer");
    LB_CHECK_ARG(heads_ok(hk, hv) && n >= 1 && ld_pre >= (2 * hk + hv) * gdn::D, "bad n, heads or ld_pre");
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    LB_CUDA_TRY((cudaError_t)gdn::delta(nullptr, F<float>(k), F<float>(v), F<float>(g), F<float>(beta),
                                        F<float>(state), nullptr, nullptr, F<int32_t>(path), nullptr, 0, n, hk, hv,
                                        true, s));
    LB_CUDA_TRY((cudaError_t)gdn::conv_commit(F<float>(pre), ld_pre, F<float>(conv_state), F<int32_t>(path), n,
                                              (2 * hk + hv) * gdn::D, s));
    return LB_OK;
}

extern "C" LB_API uint64_t lb_gdn_step_scratch_bytes(int t, int hk, int hv) {
    if (t < 1 || !heads_ok(hk, hv)) return 0;
    // q, k [t, hk, 128]; v, o [t, hv, 128]; g, beta [t, hv]
    return (uint64_t)t * (2 * hk * gdn::D + 2 * hv * gdn::D + 2 * hv) * 4;
}

extern "C" LB_API int lb_gdn_decode_step(const void* pre, const void* a, const void* b, const void* z,
                                         const void* conv_w, const void* ssm_a, const void* dt_bias,
                                         const void* norm_w, void* conv_state, void* state, void* y, void* scratch,
                                         int t, int hk, int hv, float eps, void* stream) {
    LB_CHECK_ARG(pre && a && b && z && conv_w && ssm_a && dt_bias && norm_w && conv_state && state && y && scratch,
                 "null pointer");
    LB_CHECK_ARG(heads_ok(hk, hv) && t >= 1, "need t >= 1, 1 <= hk, hv a multiple of hk");
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    // t = 1: one kernel for the layer (gdn_decode_fused.cu; LUCEBOX_GDN_DECODE=split keeps the three below)
    if (gdn::decode_fused_ok(t, hk, hv)) {
        LB_CUDA_TRY((cudaError_t)gdn::decode_fused(F<float>(pre), F<float>(a), F<float>(b), F<float>(z),
                                                   F<float>(conv_w), F<float>(ssm_a), F<float>(dt_bias),
                                                   F<float>(norm_w), F<float>(conv_state), F<float>(state),
                                                   F<float>(y), hk, hv, eps, s));
        return LB_OK;
    }
    const int D = gdn::D, C = (2 * hk + hv) * D;
    float* q = static_cast<float*>(scratch);
    float* kk = q + (size_t)t * hk * D;
    float* v = kk + (size_t)t * hk * D;
    float* o = v + (size_t)t * hv * D;
    float* g = o + (size_t)t * hv * D;
    float* bt = g + (size_t)t * hv;
    LB_CUDA_TRY((cudaError_t)gdn::conv_prep(F<float>(pre), C, F<float>(a), F<float>(b), F<float>(conv_w),
                                            F<float>(ssm_a), F<float>(dt_bias), F<float>(conv_state), nullptr, q, kk,
                                            v, g, bt, t, hk, hv, true, s));
    LB_CUDA_TRY((cudaError_t)gdn::delta(q, kk, v, g, bt, F<float>(state), o, nullptr, nullptr, nullptr, 0, t, hk, hv,
                                        true, s));
    LB_CUDA_TRY((cudaError_t)gdn::out_norm(o, F<float>(z), hv * D, F<float>(norm_w), F<float>(y), t, hv, eps, s));
    return LB_OK;
}

extern "C" LB_API int lb_gdn_tree_verify(const void* pre, const void* a, const void* b, const void* z,
                                         const void* conv_w, const void* ssm_a, const void* dt_bias,
                                         const void* norm_w, const void* conv_state, const void* state,
                                         const void* parents, void* q, void* k, void* v, void* g, void* beta, void* o,
                                         void* saves, int max_saves, void* y, int n, int hk, int hv, float eps,
                                         void* stream) {
    LB_CHECK_ARG(pre && a && b && z && conv_w && ssm_a && dt_bias && norm_w && conv_state && state && parents && q &&
                     k && v && g && beta && o && y && (saves || max_saves == 0),
                 "null pointer");
    LB_CHECK_ARG(heads_ok(hk, hv) && n >= 1 && n <= gdn::MAX_TREE, "need 1 <= n <= 64, hv a multiple of hk");
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int D = gdn::D, C = (2 * hk + hv) * D;
    // conv_state and state are read only here (const in the API): commit advances them.
    float* cs = const_cast<float*>(F<float>(conv_state));
    float* st = const_cast<float*>(F<float>(state));
    LB_CUDA_TRY((cudaError_t)gdn::conv_prep(F<float>(pre), C, F<float>(a), F<float>(b), F<float>(conv_w),
                                            F<float>(ssm_a), F<float>(dt_bias), cs, F<int32_t>(parents), F<float>(q),
                                            F<float>(k), F<float>(v), F<float>(g), F<float>(beta), n, hk, hv, false,
                                            s));
    LB_CUDA_TRY((cudaError_t)gdn::delta(F<float>(q), F<float>(k), F<float>(v), F<float>(g), F<float>(beta), st,
                                        F<float>(o), F<int32_t>(parents), nullptr, F<float>(saves), max_saves, n, hk,
                                        hv, false, s));
    LB_CUDA_TRY((cudaError_t)gdn::out_norm(F<float>(o), F<float>(z), hv * D, F<float>(norm_w), F<float>(y), n, hv,
                                           eps, s));
    return LB_OK;
}
