// gdn_delta: the gated delta rule step by step, for decode (one or a few tokens), tree verify and the
// replay that commits an accepted path — one kernel, three ways of walking the steps (cpu.py
// gated_delta_recurrent / gated_delta_tree; the one-pass form of qwen35.md):
//   u = β (v − α Sᵀk);  o = α Sᵀq + (k·q) u;  S ← α S + k uᵀ   (α = e^g)
// Grid (dv / 16 slices, Hv): a head's [128, 128] state is split along dv (columns are independent given
// k and q), so a 27B layer (48 heads) runs 384 blocks and every SM streams state. Each block keeps its
// [128, 16] slice in registers for all steps: the state is read once and written at most once per call.
//
// Tree verify (parents given, n <= 64): slot i continues from slot i-1's registers when parents[i] ==
// i-1 (the spine); otherwise it reloads the state saved after its parent. A slot's state is written to
// `saves` only if some child other than i+1 branches from it (the plan, computed per block in shared
// memory; gdn::tree_plan is its host twin for sizing). Saves are written and re-read by the same
// thread (identical element mapping), so no barrier is needed, and they are reused by every layer.
// The committed state is never written by verify: lb_gdn_commit replays the accepted slots' saved
// inputs (k, v, g, β) onto it and advances the conv state.
#include <vector>

#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lucebox.h"

namespace gdn {
namespace {

constexpr int NW = DELTA_THREADS / 32;  // warps per block
constexpr int NRED = 9;                 // reduced per column quad: Sᵀk (4), Sᵀq (4), k·q

__global__ void __launch_bounds__(DELTA_THREADS) delta_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* state, float* __restrict__ o,
    const int32_t* __restrict__ parents, const int32_t* __restrict__ rows, float* saves, int max_saves, int n,
    int hk, int hv, int write_state) {
    __shared__ float red[2][NW][4][NRED];  // double-buffered: one barrier per step
    __shared__ int par_s[MAX_TREE];
    __shared__ int save_s[MAX_TREE];
    const int tid = threadIdx.x, jq = tid & 3, rg = tid >> 2, lane = tid & 31, warp = tid >> 5;
    const int p = blockIdx.y, kh = p % hk;  // value head p reads key head p % Hk (tiled order)
    const int col = blockIdx.x * DVS + 4 * jq;
    const size_t head_off = (size_t)p * D * D;

    if (parents) {
        if (tid < n) par_s[tid] = parents[tid];
        __syncthreads();
        if (tid < n) {
            bool need = false;
            for (int c = tid + 2; c < n; ++c) need |= par_s[c] == tid;
            save_s[tid] = need ? 1 : -1;
        }
        __syncthreads();
        if (tid == 0) {
            int cnt = 0;
            for (int i = 0; i < n; ++i)
                if (save_s[i] > 0) save_s[i] = cnt++;
        }
        __syncthreads();
    }

    float S[ROWS_PER_THREAD][4];
    auto load = [&](const float* src) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            const float4 x = *reinterpret_cast<const float4*>(src + (size_t)(rg + 32 * m) * D + col);
            S[m][0] = x.x, S[m][1] = x.y, S[m][2] = x.z, S[m][3] = x.w;
        }
    };
    auto store = [&](float* dst) {
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
            *reinterpret_cast<float4*>(dst + (size_t)(rg + 32 * m) * D + col) =
                make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    };
    load(state + head_off);

    int buf = 0;
    for (int s = 0; s < n; ++s) {
        if (parents && s > 0 && par_s[s] != s - 1) {
            const int par = par_s[s];
            const int idx = par >= 0 ? save_s[par] : -1;
            if (par < 0) {
                load(state + head_off);
            } else if (idx >= 0 && idx < max_saves) {
                load(saves + (size_t)idx * hv * D * D + head_off);
            } else {
                // scratch too small for the plan: poison so the caller's checks see it
#pragma unroll
                for (int m = 0; m < ROWS_PER_THREAD; ++m) S[m][0] = S[m][1] = S[m][2] = S[m][3] = __int_as_float(0x7fc00000);
            }
        }
        const int row = rows ? rows[s] : s;
        float kk[ROWS_PER_THREAD], qq[ROWS_PER_THREAD];
        const float* kr = k + ((size_t)row * hk + kh) * D + rg;
        const float* qr = o ? q + ((size_t)row * hk + kh) * D + rg : nullptr;
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) {
            kk[m] = kr[32 * m];
            qq[m] = o ? qr[32 * m] : 0.0f;
        }
        float part[NRED];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float a = 0.0f, b = 0.0f;
#pragma unroll
            for (int m = 0; m < ROWS_PER_THREAD; ++m) {
                a = fmaf(S[m][c], kk[m], a);
                b = fmaf(S[m][c], qq[m], b);
            }
            part[c] = a;
            part[4 + c] = b;
        }
        float kq = 0.0f;
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m) kq = fmaf(kk[m], qq[m], kq);
        part[8] = kq;
        // lanes sharing jq (lane & 3) hold the other rows of the same columns
#pragma unroll
        for (int e = 0; e < NRED; ++e) {
            float x = part[e];
            x += __shfl_xor_sync(LB_FULL_MASK, x, 4);
            x += __shfl_xor_sync(LB_FULL_MASK, x, 8);
            x += __shfl_xor_sync(LB_FULL_MASK, x, 16);
            part[e] = x;
        }
        if (lane < 4) {
#pragma unroll
            for (int e = 0; e < NRED; ++e) red[buf][warp][lane][e] = part[e];
        }
        __syncthreads();
        float tot[NRED];
#pragma unroll
        for (int e = 0; e < NRED; ++e) {
            float x = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; ++w) x += red[buf][w][jq][e];
            tot[e] = x;
        }
        buf ^= 1;
        const size_t hrow = (size_t)row * hv + p;
        const float alpha = expf(g[hrow]), bt = beta[hrow];
        const float4 vv = *reinterpret_cast<const float4*>(v + hrow * D + col);
        const float vc[4] = {vv.x, vv.y, vv.z, vv.w};
        float u[4], oc[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            u[c] = bt * (vc[c] - alpha * tot[c]);
            oc[c] = fmaf(alpha, tot[4 + c], tot[8] * u[c]);
        }
#pragma unroll
        for (int m = 0; m < ROWS_PER_THREAD; ++m)
#pragma unroll
            for (int c = 0; c < 4; ++c) S[m][c] = fmaf(alpha, S[m][c], kk[m] * u[c]);
        if (o && rg == 0)
            *reinterpret_cast<float4*>(o + ((size_t)s * hv + p) * D + col) = make_float4(oc[0], oc[1], oc[2], oc[3]);
        if (parents && save_s[s] >= 0 && save_s[s] < max_saves)
            store(saves + (size_t)save_s[s] * hv * D * D + head_off);
    }
    if (write_state) store(state + head_off);
}

}  // namespace

int delta(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state, float* o,
          const int32_t* parents, const int32_t* rows, float* saves, int max_saves, int n, int hk, int hv,
          bool write_state, cudaStream_t s) {
    delta_kernel<<<dim3(NSLICE, hv), DELTA_THREADS, 0, s>>>(q, k, v, g, beta, state, o, parents, rows, saves,
                                                           max_saves, n, hk, hv, write_state ? 1 : 0);
    return (int)cudaGetLastError();
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
