// gdn_conv: the per-token parts of a Gated DeltaNet layer around the delta rule, for any Hk, Hv
// (27B: 16 / 48) — the math of cpu.py CPUEngine._deltanet:
//  - conv_prep: causal depthwise conv (kernel 4) + SiLU over all C = 2·Hk·128 + Hv·128 channels, q / k
//    L2 norms, beta and g. Decode, prefill and tree verify share it: a token's window is its last 4
//    inputs along `parents` (tree) or along the sequence, falling back into the conv state [3, C].
//  - conv_commit: after a verify, the conv state becomes the last 3 inputs along the accepted path.
//  - out_norm: the gated RMSNorm (plain w over dv) times SiLU(z).
// One block = one 128-channel head group (a q, k or v head) x up to 64 tokens, one thread per channel:
// the thread owns its channel for every token of the block, so it can advance that channel's conv
// state in place after reading it (single-tile launches) without racing any other thread.
// Every kernel launches with programmatic dependent launch (lb_pdl.cuh): weights (conv_w, the output
// norm) are loaded before pdl_wait(), everything a kernel may have written (pre, a, b, parents, the conv
// state, o, z) after it.
#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"

namespace gdn {
namespace {

constexpr int TT = 64;  // tokens per conv block
constexpr int TB = 8;   // tokens whose window loads are in flight together

__global__ void __launch_bounds__(D) conv_prep_kernel(const float* __restrict__ pre, int ld_pre,
                                                      const float* __restrict__ a, const float* __restrict__ b,
                                                      const float* __restrict__ conv_w,
                                                      const float* __restrict__ ssm_a,
                                                      const float* __restrict__ dt_bias, float* conv_state,
                                                      const int32_t* __restrict__ parents, float* __restrict__ q,
                                                      float* __restrict__ k, float* __restrict__ v,
                                                      float* __restrict__ g, float* __restrict__ beta, int T, int hk,
                                                      int hv, int update_conv) {
    __shared__ int sel[TT][KCONV];  // window rows: >= 0 a row of pre, < 0 conv-state row (-1 - sel)
    __shared__ float vals[TT][D];   // q / k values before the norm
    __shared__ float red[TT][D / 32];
    const int gi = blockIdx.x, t0 = blockIdx.y * TT, nt = min(TT, T - t0), tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int C = (2 * hk + hv) * D;
    const int kind = gi < hk ? 0 : (gi < 2 * hk ? 1 : 2);  // q, k, v head group
    const int head = kind == 0 ? gi : (kind == 1 ? gi - hk : gi - 2 * hk);
    const int c = gi * D + tid;  // groups are contiguous: [q heads | k heads | v heads]
    lb::pdl_trigger();
    const float4 w = *reinterpret_cast<const float4*>(conv_w + (size_t)c * KCONV);  // a weight: no wait
    lb::pdl_wait();

    if (tid < nt) {
        // Walk the ancestry: window[3] is the token itself, older entries its ancestors; past the
        // root (or before token 0) they continue into the conv state's rows 2, 1, 0.
        int cur = t0 + tid, back = 0;
        for (int j = KCONV - 1; j >= 0; --j) {
            if (cur >= 0) {
                sel[tid][j] = cur;
                cur = parents ? parents[cur] : cur - 1;
            } else {
                sel[tid][j] = -1 - (KCONV - 2 - back);
                ++back;
            }
        }
    }
    __syncthreads();
    // Tokens in batches of TB: a batch's 4·TB window loads are issued together (a tree verify's 23
    // tokens were 23 dependent L2 round trips per block, ~10 µs per layer, when loaded one at a time).
    for (int tb = 0; tb < nt; tb += TB) {
        float x[TB][KCONV];
#pragma unroll
        for (int u = 0; u < TB; ++u) {
            const int tt = min(tb + u, nt - 1);  // past the end: a harmless re-read of the last token
#pragma unroll
            for (int j = 0; j < KCONV; ++j) {
                const int r = sel[tt][j];
                x[u][j] = r >= 0 ? pre[(size_t)r * ld_pre + c] : conv_state[(size_t)(-1 - r) * C + c];
            }
        }
#pragma unroll
        for (int u = 0; u < TB; ++u) {
            const int tt = tb + u;
            if (tt >= nt) break;  // nt is the same for the whole block
            // the CPU's summation order: ((x0 w0 + x1 w1) + x2 w2) + x3 w3
            const float s = siluf_(x[u][0] * w.x + x[u][1] * w.y + x[u][2] * w.z + x[u][3] * w.w);
            const int t = t0 + tt;
            if (kind == 2) {
                v[((size_t)t * hv + head) * D + tid] = s;
            } else {
                vals[tt][tid] = s;
                const float ss = lb::warp_sum(s * s);
                if (lane == 0) red[tt][warp] = ss;
            }
        }
    }
    if (kind == 2 && tid < nt) {
        const int t = t0 + tid;
        const size_t i = (size_t)t * hv + head;
        g[i] = ssm_a[head] * softplusf_(a[i] + dt_bias[head]);
        beta[i] = sigmoidf_(b[i]);
    }
    if (update_conv) {
        // single token tile: the new state is the last 3 rows of concat(conv_state, pre[0..T))
        float nx[KCONV - 1];
#pragma unroll
        for (int r = 0; r < KCONV - 1; ++r) {
            const int h = T + r;  // row in the history
            nx[r] = h >= KCONV - 1 ? pre[(size_t)(h - (KCONV - 1)) * ld_pre + c] : conv_state[(size_t)h * C + c];
        }
#pragma unroll
        for (int r = 0; r < KCONV - 1; ++r) conv_state[(size_t)r * C + c] = nx[r];
    }
    if (kind == 2) return;
    __syncthreads();
    const float scale = kind == 0 ? rsqrtf((float)D) : 1.0f;
    float* dst = kind == 0 ? q : k;
    for (int tt = 0; tt < nt; ++tt) {
        const float ss = red[tt][0] + red[tt][1] + red[tt][2] + red[tt][3];
        dst[((size_t)(t0 + tt) * hk + head) * D + tid] = vals[tt][tid] * rsqrtf(ss + 1e-6f) * scale;
    }
}

// Multi-tile launches (prefill) advance the conv state afterwards, in stream order.
__global__ void conv_advance_kernel(const float* __restrict__ pre, int ld_pre, float* conv_state, int T, int C) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float nx[KCONV - 1];
#pragma unroll
    for (int r = 0; r < KCONV - 1; ++r) {
        const int h = T + r;
        nx[r] = h >= KCONV - 1 ? pre[(size_t)(h - (KCONV - 1)) * ld_pre + c] : conv_state[(size_t)h * C + c];
    }
#pragma unroll
    for (int r = 0; r < KCONV - 1; ++r) conv_state[(size_t)r * C + c] = nx[r];
}

// One thread per channel reads its 3 new values before writing any (rows h < 3 are old state rows).
__global__ void conv_commit_kernel(const float* __restrict__ pre, int ld_pre, float* conv_state,
                                   const int32_t* __restrict__ path, int n, int C) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float nx[KCONV - 1];
#pragma unroll
    for (int r = 0; r < KCONV - 1; ++r) {
        const int h = n + r;
        nx[r] = h >= KCONV - 1 ? pre[(size_t)path[h - (KCONV - 1)] * ld_pre + c] : conv_state[(size_t)h * C + c];
    }
#pragma unroll
    for (int r = 0; r < KCONV - 1; ++r) conv_state[(size_t)r * C + c] = nx[r];
}

// One warp per (token, value head), 4 values per lane.
__global__ void out_norm_kernel(const float* __restrict__ o, const float* __restrict__ z, int ld_z,
                                const float* __restrict__ w, float* __restrict__ y, int T, int hv, float eps) {
    const int gw = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    lb::pdl_trigger();
    const float4 ww = *reinterpret_cast<const float4*>(w + lane * 4);  // a weight: no wait
    lb::pdl_wait();
    if (gw >= T * hv) return;
    const int t = gw / hv, h = gw % hv;
    const float4 x = *reinterpret_cast<const float4*>(o + (size_t)gw * D + lane * 4);
    const float ss = lb::warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w);
    const float r = rsqrtf(ss / D + eps);
    const float* zr = z + (size_t)t * ld_z + h * D + lane * 4;
    float4 out;
    out.x = x.x * r * ww.x * siluf_(zr[0]);
    out.y = x.y * r * ww.y * siluf_(zr[1]);
    out.z = x.z * r * ww.z * siluf_(zr[2]);
    out.w = x.w * r * ww.w * siluf_(zr[3]);
    *reinterpret_cast<float4*>(y + (size_t)gw * D + lane * 4) = out;
}

}  // namespace

int conv_prep(const float* pre, int ld_pre, const float* a, const float* b, const float* conv_w, const float* ssm_a,
              const float* dt_bias, float* conv_state, const int32_t* parents, float* q, float* k, float* v, float* g,
              float* beta, int T, int hk, int hv, bool update_conv, cudaStream_t s) {
    const int tiles = (T + TT - 1) / TT;
    const bool in_place = update_conv && tiles == 1 && !parents;
    cudaError_t e = lb::launch_pdl(conv_prep_kernel, dim3(2 * hk + hv, tiles), dim3(D), 0, s, pre, ld_pre, a, b,
                                   conv_w, ssm_a, dt_bias, conv_state, parents, q, k, v, g, beta, T, hk, hv,
                                   in_place ? 1 : 0);
    if (e != cudaSuccess || !update_conv || in_place || parents) return (int)e;
    return conv_advance(pre, ld_pre, conv_state, T, (2 * hk + hv) * D, s);
}

int conv_advance(const float* pre, int ld_pre, float* conv_state, int T, int C, cudaStream_t s) {
    return (int)lb::launch_pdl(conv_advance_kernel, dim3((C + 255) / 256), dim3(256), 0, s, pre, ld_pre, conv_state,
                               T, C);
}

int conv_commit(const float* pre, int ld_pre, float* conv_state, const int32_t* path, int n, int C, cudaStream_t s) {
    return (int)lb::launch_pdl(conv_commit_kernel, dim3((C + 255) / 256), dim3(256), 0, s, pre, ld_pre, conv_state,
                               path, n, C);
}

int out_norm(const float* o, const float* z, int ld_z, const float* w, float* y, int T, int hv, float eps,
             cudaStream_t s) {
    return (int)lb::launch_pdl(out_norm_kernel, dim3((T * hv + 7) / 8), dim3(256), 0, s, o, z, ld_z, w, y, T, hv,
                               eps);
}

}  // namespace gdn

static bool gdn_heads_ok(int hk, int hv) { return hk >= 1 && hv >= hk && hv % hk == 0; }

extern "C" LB_API int lb_gdn_conv_prep(const void* pre, int ld_pre, const void* a, const void* b, const void* conv_w,
                                       const void* ssm_a, const void* dt_bias, void* conv_state, const void* parents,
                                       void* q, void* k, void* v, void* g, void* beta, int t, int hk, int hv,
                                       int update_conv, void* stream) {
    LB_CHECK_ARG(pre && a && b && conv_w && ssm_a && dt_bias && conv_state && q && k && v && g && beta, "null pointer");
    LB_CHECK_ARG(gdn_heads_ok(hk, hv), "need 1 <= hk, hv a multiple of hk");
    LB_CHECK_ARG(t >= 1 && ld_pre >= (2 * hk + hv) * gdn::D, "t must be positive and ld_pre >= C");
    LB_CHECK_ARG(!parents || (t <= gdn::MAX_TREE && !update_conv), "a tree has <= 64 slots and leaves the conv state");
    LB_CUDA_TRY((cudaError_t)gdn::conv_prep(
        static_cast<const float*>(pre), ld_pre, static_cast<const float*>(a), static_cast<const float*>(b),
        static_cast<const float*>(conv_w), static_cast<const float*>(ssm_a), static_cast<const float*>(dt_bias),
        static_cast<float*>(conv_state), static_cast<const int32_t*>(parents), static_cast<float*>(q),
        static_cast<float*>(k), static_cast<float*>(v), static_cast<float*>(g), static_cast<float*>(beta), t, hk, hv,
        update_conv != 0, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_gdn_out_norm(const void* o, const void* z, int ld_z, const void* norm_w, void* y, int t,
                                      int hv, float eps, void* stream) {
    LB_CHECK_ARG(o && z && norm_w && y, "null pointer");
    LB_CHECK_ARG(t >= 1 && hv >= 1 && ld_z >= hv * gdn::D && ld_z % 4 == 0, "bad t, hv or ld_z");
    LB_CUDA_TRY((cudaError_t)gdn::out_norm(static_cast<const float*>(o), static_cast<const float*>(z), ld_z,
                                           static_cast<const float*>(norm_w), static_cast<float*>(y), t, hv, eps,
                                           static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
