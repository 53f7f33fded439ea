// Device argmax / top-K (K <= 8) over rows of the 27B target engine's logits (engines/dflash.py), so a
// greedy step or verify copies back int32 ids instead of rows of 248,320 fp32 logits.
//
// Order (a strict total order, so the result does not depend on the reduction tree): NaN is above
// every number (np.argmax returns the first NaN), then larger value; equal values (and two NaNs) go to
// the lower column. k = 1 therefore equals np.argmax exactly; top-K is the k first entries of a stable
// descending sort under that order.
//
// Two launches: grid (column blocks, rows) keeps each thread's best KM entries in registers (the row is
// read once, coalesced) and reduces the block to k candidates in scratch; then one block per row merges
// the candidates of all column blocks. Both launch with programmatic dependent launch (lb_pdl.cuh): every
// input is an activation, so each waits for its predecessor first thing.
#include <stdint.h>

#include <climits>

#include "lb_arch.cuh"
#include "lb_check.cuh"
#include "lb_pdl.cuh"

namespace {

constexpr int TOPK_THREADS = 256;
constexpr int TOPK_COLS_PER_BLOCK = 2048;  // columns one first-stage block covers (8 per thread)
constexpr int TOPK_MAX_COL_BLOCKS = 128;
constexpr int TOPK_MAX_K = 8;

struct Cand {
    float v;
    int i;
};

__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
    const bool na = va != va, nb = vb != vb;
    if (na || nb) return na && (!nb || ia < ib);
    return va > vb || (va == vb && ia < ib);
}

// Insert (v, i) into the sorted (best first) register list; static indices only, so it stays in registers.
template <int KM>
__device__ __forceinline__ void insert(float (&tv)[KM], int (&ti)[KM], float v, int i) {
    if (!better(v, i, tv[KM - 1], ti[KM - 1])) return;
#pragma unroll
    for (int j = 0; j < KM; ++j) {
        if (better(v, i, tv[j], ti[j])) {
            const float fv = tv[j];
            const int fi = ti[j];
            tv[j] = v;
            ti[j] = i;
            v = fv;
            i = fi;
        }
    }
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// The block's k best entries, best first, to out[0..k) (written by thread 0). Each round takes the
// best list head; the thread that held it pops it. Column indices are unique across threads, so exactly
// one thread pops (or, when fewer than k real entries exist, only empty sentinel slots are popped).
template <int KM>
__device__ __forceinline__ void block_extract(float (&tv)[KM], int (&ti)[KM], int k, Cand* out) {
    constexpr int NW = TOPK_THREADS / 32;
    __shared__ float sv[NW];
    __shared__ int si[NW];
    __shared__ int win;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = 0; r < k; ++r) {
        float v = tv[0];
        int i = ti[0];
        warp_best(v, i);
        if (lane == 0) {
            sv[warp] = v;
            si[warp] = i;
        }
        __syncthreads();
        if (warp == 0) {
            v = lane < NW ? sv[lane] : -INFINITY;
            i = lane < NW ? si[lane] : INT_MAX;
            warp_best(v, i);
            if (lane == 0) {
                win = i;
                out[r] = Cand{v, i};
            }
        }
        __syncthreads();
        if (ti[0] == win) {
#pragma unroll
            for (int j = 0; j + 1 < KM; ++j) {
                tv[j] = tv[j + 1];
                ti[j] = ti[j + 1];
            }
            tv[KM - 1] = -INFINITY;
            ti[KM - 1] = INT_MAX;
        }
    }
}

template <int KM>
__device__ __forceinline__ void clear(float (&tv)[KM], int (&ti)[KM]) {
#pragma unroll
    for (int j = 0; j < KM; ++j) {
        tv[j] = -INFINITY;
        ti[j] = INT_MAX;
    }
}

// grid (n_cb, rows): block b of row r covers columns [b * span, min((b + 1) * span, cols)).
template <int KM>
__global__ void __launch_bounds__(TOPK_THREADS) topk_partial_kernel(const float* __restrict__ x, int ld, int cols,
                                                                    int span, int k, Cand* __restrict__ part) {
    lb::pdl_trigger();
    lb::pdl_wait();
    float tv[KM];
    int ti[KM];
    clear(tv, ti);
    const float* row = x + (int64_t)blockIdx.y * ld;
    const int c0 = blockIdx.x * span, c1 = min(c0 + span, cols);
    for (int c = c0 + threadIdx.x; c < c1; c += TOPK_THREADS) insert(tv, ti, __ldg(row + c), c);
    block_extract(tv, ti, k, part + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * k);
}

// One block per row: merge the n_cb * k candidates; ids (int32 [rows, k]) and optional vals.
template <int KM>
__global__ void __launch_bounds__(TOPK_THREADS) topk_final_kernel(const Cand* __restrict__ part, int n_cand, int k,
                                                                  int32_t* __restrict__ ids, float* __restrict__ vals) {
    lb::pdl_trigger();
    lb::pdl_wait();
    __shared__ Cand best[TOPK_MAX_K];
    float tv[KM];
    int ti[KM];
    clear(tv, ti);
    const Cand* p = part + (int64_t)blockIdx.x * n_cand;
    for (int c = threadIdx.x; c < n_cand; c += TOPK_THREADS) {
        const int2 e = __ldg(reinterpret_cast<const int2*>(p) + c);
        if (e.y != INT_MAX) insert(tv, ti, __int_as_float(e.x), e.y);
    }
    block_extract(tv, ti, k, best);
    __syncthreads();
    if ((int)threadIdx.x < k) {
        const Cand e = best[threadIdx.x];
        ids[(int64_t)blockIdx.x * k + threadIdx.x] = e.i;
        if (vals) vals[(int64_t)blockIdx.x * k + threadIdx.x] = e.v;
    }
}

int col_blocks(int cols) {
    const int64_t n = lb::ceil_div(cols, TOPK_COLS_PER_BLOCK);
    return (int)(n < TOPK_MAX_COL_BLOCKS ? n : TOPK_MAX_COL_BLOCKS);
}

}  // namespace

extern "C" LB_API uint64_t lb_df_topk_scratch_bytes(int rows, int cols, int k) {
    if (rows < 1 || cols < 1 || k < 1) return 0;
    return (uint64_t)rows * col_blocks(cols) * k * sizeof(Cand);
}

extern "C" LB_API int lb_df_topk(const void* x, int rows, int cols, int ld, int k, void* scratch, void* ids,
                                 void* vals, void* stream) {
    LB_CHECK_ARG(x && scratch && ids, "null pointer");
    LB_CHECK_ARG(rows >= 1 && rows <= 65535 && cols >= 1 && ld >= cols, "need 1 <= rows <= 65535, cols >= 1, ld >= cols");
    LB_CHECK_ARG(k >= 1 && k <= TOPK_MAX_K && k <= cols, "need 1 <= k <= 8 and k <= cols");
    const int n_cb = col_blocks(cols);
    const int span = (int)lb::ceil_div(cols, n_cb);
    auto s = static_cast<cudaStream_t>(stream);
    auto* part = static_cast<Cand*>(scratch);
    const float* xf = static_cast<const float*>(x);
    auto* ids32 = static_cast<int32_t*>(ids);
    auto* vf = static_cast<float*>(vals);
    const dim3 g1(n_cb, rows), g2(rows), th(TOPK_THREADS);
    if (k == 1) {
        LB_CUDA_TRY(lb::launch_pdl(topk_partial_kernel<1>, g1, th, 0, s, xf, ld, cols, span, k, part));
        LB_CUDA_TRY(lb::launch_pdl(topk_final_kernel<1>, g2, th, 0, s, (const Cand*)part, n_cb * k, k, ids32, vf));
    } else {
        LB_CUDA_TRY(lb::launch_pdl(topk_partial_kernel<TOPK_MAX_K>, g1, th, 0, s, xf, ld, cols, span, k, part));
        LB_CUDA_TRY(lb::launch_pdl(topk_final_kernel<TOPK_MAX_K>, g2, th, 0, s, (const Cand*)part, n_cb * k, k, ids32,
                                   vf));
    }
    return LB_OK;
}
