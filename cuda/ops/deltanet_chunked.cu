// deltanet_chunked: the gated delta rule over a prompt in the chunked (WY / UT transform) form, fp32,
// chunk 64, dk = dv = 128 — the same math as lucebox_cli/engines/cpu.py `gated_delta_chunked` — plus
// the prompt's causal conv1d / SiLU / q,k L2 norms / beta, g (dn_conv_prep), the conv-ring update and
// the gated output norm. State layout is the decode megakernel's: S transposed, [H, dv, dk].
//
// The rule itself:
//  1. dn_chunk_prep, one block per (chunk, head), all chunks at once: cum = cumsum(g), the masked
//     decayed q·kᵀ (Aqk) and the unit lower-triangular system (I + L)[u | w] = [βv | βk e^cum],
//     L_ij = β_i k_i·k_j e^(cum_i - cum_j) (j < i), solved by forward substitution with one thread
//     per right-hand column (256 = 128 u + 128 w columns) holding its 64 unknowns in registers.
//  2. the scan, sequential over chunks: v_new = u - w S; o = e^cum (q S) + Aqk v_new;
//     S = e^last S + (k e^(last - cum))ᵀ v_new, in deltanet_split.cu: a sequential state pass with only
//     v_new and the state update on the chain, then every chunk's output in parallel. (The single fused
//     scan kernel it replaced, one block per 16-column dv slice and head, measured slower at both models'
//     shapes: docs/perf.md "v4: the chunked DeltaNet's scan split in two"; it is in the history.)
//     LUCEBOX_DN_SCAN=split1 / split2 (read once per process) force the state pass single / double-
//     buffered; by default the occupancy decides.
// fp32 on CUDA cores: ~1.4 GFLOP per layer at pp520 for 16 heads. This is the LUCEBOX_DN_PREFILL=old path; the
// default is the tensor-core form of the same math (deltanet_tc.cu), dn_chunked dispatches.
#include "lb_check.cuh"
#include "lucebox.h"
#include <cstdlib>
#include <cstring>

#include "deltanet_chunked.cuh"
#include "pf_common.cuh"
#include "pf_ops.h"

namespace pf {
namespace {

using dn::CH;
using dn::D;
using dn::n_chunks;
using dn::Scratch;
constexpr int KP = D + 1;      // padded smem row of a [64][128] tile
constexpr int LTP = CH + 4;    // padded, 16-byte aligned row of prep's transposed L
constexpr int NH = 16;         // Qwen3.5-0.8B DeltaNet heads (conv prep)
constexpr int C_QKV = 3 * NH * D;  // 6144 conv channels

constexpr size_t PREP_SMEM = (size_t)(2 * CH * KP + CH * LTP + 3 * CH) * 4;

// w is stored chunk-transposed for the state pass: [H, nch, 128 dk, 64 rows], rows past the prompt zero.
__global__ void __launch_bounds__(256, 2) dn_chunk_prep(const float* __restrict__ q, const float* __restrict__ k,
                                                        const float* __restrict__ v, const float* __restrict__ g,
                                                        const float* __restrict__ beta, Scratch sc, int T) {
    extern __shared__ __align__(16) float sm[];
    float* Ks = sm;                // [64][KP]
    float* Qs = Ks + CH * KP;      // [64][KP]
    float* Lt = Qs + CH * KP;      // [64][LTP] Lt[j][i] = L_ij (strictly lower L, transposed)
    float* cum = Lt + CH * LTP;    // [64]
    float* bet = cum + CH;         // [64]
    float* gl = bet + CH;          // [64]
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int nch = gridDim.x, t0 = c * CH, L = min(CH, T - t0);
    const size_t hrow = (size_t)h * T + t0;  // row of token t0 in the [H, T, 128] inputs

    for (int idx = tid; idx < CH * D; idx += 256) {
        const int i = idx / D, d = idx % D;
        const bool ok = i < L;
        Ks[i * KP + d] = ok ? k[(hrow + i) * D + d] : 0.0f;
        Qs[i * KP + d] = ok ? q[(hrow + i) * D + d] : 0.0f;
    }
    // Rows past the prompt get beta = 0 and g = 0: they solve to zero and leave cum flat.
    if (tid < CH) {
        bet[tid] = tid < L ? beta[hrow + tid] : 0.0f;
        gl[tid] = tid < L ? g[hrow + tid] : 0.0f;
    }
    __syncthreads();
    // Sequential fp32 prefix sum, the same order as np.cumsum.
    if (tid == 0) {
        float s = 0.0f;
        for (int i = 0; i < CH; ++i) {
            s += gl[i];
            cum[i] = s;
        }
    }
    __syncthreads();
    if (tid < CH) sc.cum[(size_t)h * nch * CH + t0 + tid] = cum[tid];

    // Gram matrices k·kᵀ and q·kᵀ; thread (ti, tj) owns rows ti + 16a, columns tj + 16b. Blocks a < b lie
    // wholly above the diagonal (i <= 15 + 16a < 16b <= j), where both are masked: not computed.
    {
        const int ti = tid / 16, tj = tid % 16;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) kk[a][b] = qk[a][b] = 0.0f;
        for (int d = 0; d < D; ++d) {
            float ki[4], qi[4], kj[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                ki[a] = Ks[(ti + 16 * a) * KP + d];
                qi[a] = Qs[(ti + 16 * a) * KP + d];
                kj[a] = Ks[(tj + 16 * a) * KP + d];
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b <= a; ++b) {
                    kk[a][b] = fmaf(ki[a], kj[b], kk[a][b]);
                    qk[a][b] = fmaf(qi[a], kj[b], qk[a][b]);
                }
        }
        float* aqk = sc.aqk + ((size_t)h * nch + c) * CH * CH;
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int i = ti + 16 * a, j = tj + 16 * b;
                // decay e^(cum_i - cum_j) only where j <= i: the exponent is never positive there
                const float dec = j <= i ? expf(cum[i] - cum[j]) : 0.0f;
                Lt[j * LTP + i] = j < i ? bet[i] * kk[a][b] * dec : 0.0f;
                aqk[i * CH + j] = j <= i ? qk[a][b] * dec : 0.0f;
            }
    }
    // Right-hand sides, one column per thread: columns 0..127 are u (rhs βv, 64 independent global loads
    // in flight together), 128..255 are w (rhs βk e^cum).
    const int col = tid & (D - 1);
    const bool is_u = tid < D;
    float x[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) x[i] = is_u && i < L ? v[(hrow + i) * D + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < CH; ++i) x[i] = (is_u ? x[i] : Ks[i * KP + col] * expf(cum[i])) * bet[i];
    // Forward substitution, column-oriented: once x_j is final, x_i -= L_ij x_j for every i > j. Each x_i
    // sees the same fma sequence (j ascending) as the row form x_i = r_i - Σ_{j<i} L_ij x_j, but the 63
    // updates of a step are independent (no 63-deep dependent chain), and L comes as broadcast float4s.
#pragma unroll
    for (int j = 0; j < CH - 1; ++j) {
#pragma unroll
        for (int i4 = (j + 1) / 4; i4 < CH / 4; ++i4) {
            const float4 l = *reinterpret_cast<const float4*>(Lt + j * LTP + 4 * i4);
            const float lv[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * i4 + e > j) x[4 * i4 + e] = fmaf(-lv[e], x[j], x[4 * i4 + e]);
        }
    }
    if (!is_u) {
        float* dst = sc.w + (((size_t)h * nch + c) * D + col) * CH;
#pragma unroll
        for (int i = 0; i < CH; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else {
        float* dst = sc.u + hrow * D + col;
#pragma unroll
        for (int i = 0; i < CH; ++i)
            if (i < L) dst[(size_t)i * D] = x[i];
    }
}

// One block per token: conv + SiLU of all 6144 channels, then per-head L2 norms of q and k.
__global__ void __launch_bounds__(256) dn_conv_prep_kernel(const float* __restrict__ y, int ldy,
                                                           const float* __restrict__ ring,
                                                           const float* __restrict__ conv_w,
                                                           const float* __restrict__ ssm_a,
                                                           const float* __restrict__ dt_bias, float* q, float* k,
                                                           float* v, float* g, float* beta, int T, int pos0) {
    __shared__ float mixed[2 * NH * D];
    const int t = blockIdx.x, p = pos0 + t, tid = threadIdx.x;
    for (int c = tid; c < C_QKV; c += 256) {
        const float4 w = *reinterpret_cast<const float4*>(conv_w + (size_t)c * 4);
        float x[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            // inputs at positions p-3 .. p: this prompt's rows, else the ring (decode history), else 0
            const int tt = t - 3 + jj, pp = p - 3 + jj;
            x[jj] = tt >= 0 ? y[(size_t)tt * ldy + c] : (pp >= 0 ? ring[(size_t)(pp & 3) * C_QKV + c] : 0.0f);
        }
        // same association as the decode kernel's dn_conv
        const float s = siluf_(fmaf(w.x, x[0], fmaf(w.y, x[1], fmaf(w.z, x[2], w.w * x[3]))));
        if (c < 2 * NH * D) mixed[c] = s;
        else v[((size_t)((c - 2 * NH * D) / D) * T + t) * D + (c % D)] = s;
    }
    __syncthreads();
    const int lane = tid & 31, warp = tid >> 5;
    for (int hh = warp; hh < 2 * NH; hh += 8) {
        const float4 a = *reinterpret_cast<const float4*>(mixed + hh * D + lane * 4);
        const float ss = lb::warp_sum(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w);
        // q additionally scaled by 1/sqrt(dk)
        const float r = hh < NH ? rsqrtf(ss + 1e-6f) * rsqrtf((float)D) : rsqrtf(ss + 1e-6f);
        float* dst = (hh < NH ? q + ((size_t)hh * T + t) * D : k + ((size_t)(hh - NH) * T + t) * D) + lane * 4;
        *reinterpret_cast<float4*>(dst) = make_float4(a.x * r, a.y * r, a.z * r, a.w * r);
    }
    if (tid < NH) {
        const float* yr = y + (size_t)t * ldy + C_QKV + NH * D;  // [beta (16) | alpha (16)]
        const float a = yr[NH + tid] + dt_bias[tid];
        const float sp = a > 20.0f ? a : log1pf(expf(a));
        beta[(size_t)tid * T + t] = sigmoidf_(yr[tid]);
        g[(size_t)tid * T + t] = ssm_a[tid] * sp;
    }
}

__global__ void dn_ring_write_kernel(const float* __restrict__ y, int ldy, float* ring, int T, int pos0) {
    const int nr = min(T, 4);
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < nr * C_QKV; idx += gridDim.x * blockDim.x) {
        const int t = T - nr + idx / C_QKV, c = idx % C_QKV;
        ring[(size_t)((pos0 + t) & 3) * C_QKV + c] = y[(size_t)t * ldy + c];
    }
}

// One warp per (token, head): RMSNorm over dv with the plain ssm_norm weight, times SiLU(z); split bf16 out.
__global__ void dn_gated_norm_kernel(const float* __restrict__ o, const float* __restrict__ z, int ldz,
                                     const float* __restrict__ norm, uint16_t* __restrict__ xb, int T, float eps) {
    const int gw = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (gw >= T * NH) return;
    const int t = gw / NH, h = gw % NH;
    const float4 a = *reinterpret_cast<const float4*>(o + (size_t)t * NH * D + h * D + lane * 4);
    const float ss = lb::warp_sum(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w);
    const float r = rsqrtf(ss / D + eps);
    const float4 zz = *reinterpret_cast<const float4*>(z + (size_t)t * ldz + h * D + lane * 4);
    const float4 w = *reinterpret_cast<const float4*>(norm + lane * 4);
    uint2 hi, lo;
    split_bf2(a.x * r * w.x * siluf_(zz.x), a.y * r * w.y * siluf_(zz.y), hi.x, lo.x);
    split_bf2(a.z * r * w.z * siluf_(zz.z), a.w * r * w.w * siluf_(zz.w), hi.y, lo.y);
    *reinterpret_cast<uint2*>(xb + (size_t)t * NH * D + h * D + lane * 4) = hi;
    *reinterpret_cast<uint2*>(xb + ((size_t)T + t) * NH * D + h * D + lane * 4) = lo;
}

}  // namespace

size_t dn_scratch_bytes_old(int T, int H) { return dn::scratch_floats(T, H) * 4; }

size_t dn_scratch_bytes(int T, int H) {
    const size_t a = dn_scratch_bytes_old(T, H), b = dn::tc_scratch_bytes(T, H);
    return a > b ? a : b;
}

int dn_prepare() {
    cudaError_t e = cudaFuncSetAttribute(dn_chunk_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PREP_SMEM);
    if (e == cudaSuccess) e = (cudaError_t)dn::split_prepare();
    bool ok = false;
    if (e == cudaSuccess) e = (cudaError_t)dn::tc_prepare(&ok);
    return (int)e;
}

// LUCEBOX_DN_SCAN: split1 / split2 force a single / double-buffered state pass; anything else (or unset): the
// occupancy decides (0).
static int scan_mode() {
    static const int mode = [] {
        const char* e = std::getenv("LUCEBOX_DN_SCAN");
        if (e && !std::strcmp(e, "split1")) return 1;
        if (e && !std::strcmp(e, "split2")) return 2;
        return 0;
    }();
    return mode;
}

int dn_tc_path(bool* tc) {
    *tc = false;
    if (!dn_prefill_tc()) return (int)cudaSuccess;
    return dn::tc_prepare(tc);
}

// The fp32 path: dn_chunk_prep, then the split scan (deltanet_split.cu).
static int chunked_old(const float* q, const float* k, const float* v, const float* g, const float* beta,
                       float* state, float* o, void* scratch, int T, int H, cudaStream_t s) {
    const Scratch sc = dn::carve(scratch, T, H);
    dn_chunk_prep<<<dim3(n_chunks(T), H), 256, PREP_SMEM, s>>>(q, k, v, g, beta, sc, T);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    return dn::split_scan(q, k, sc, state, o, T, H, scan_mode(), s);
}

// The head-major inputs [H, T, 128] / [H, T] of the 0.8B prefill as the tensor-core path's strides.
static dn::In head_major(const float* q, const float* k, const float* v, const float* g, const float* beta, int T,
                         int H) {
    dn::In in;
    in.q = q, in.k = k, in.v = v, in.g = g, in.beta = beta;
    in.qk_t = D, in.qk_h = (long long)T * D;
    in.v_t = D, in.v_h = (long long)T * D;
    in.gb_t = 1, in.gb_h = T;
    in.hk = H;
    return in;
}

int dn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
               float* o, void* scratch, int T, int H, cudaStream_t s) {
    bool tc = false;
    const int e = dn_tc_path(&tc);
    if (e != (int)cudaSuccess) return e;
    if (!tc) return chunked_old(q, k, v, g, beta, state, o, scratch, T, H, s);
    dn::Out out{};
    out.mode = dn::OUT_O;
    out.o = o;
    return dn::tc_run(head_major(q, k, v, g, beta, T, H), nullptr, state, true, out, scratch, T, H, s);
}

// The tensor-core path's output as the gated norm's split bf16 pair xb (dn::OUT_XB), z rows of stride ldz.
static dn::Out gated_xb(uint16_t* xb, const float* z, int ldz, const float* norm, float eps) {
    dn::Out out{};
    out.mode = dn::OUT_XB;
    out.xb = xb;
    out.z = z;
    out.ldz = ldz;
    out.norm = norm;
    out.eps = eps;
    return out;
}

int dn_chunked_norm(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                    float* o, const float* z, int ldz, const float* norm, uint16_t* xb, void* scratch, int T, int H,
                    float eps, cudaStream_t s) {
    bool tc = false;
    int e = dn_tc_path(&tc);
    if (e != (int)cudaSuccess) return e;
    if (!tc) {
        if ((e = chunked_old(q, k, v, g, beta, state, o, scratch, T, H, s)) != (int)cudaSuccess) return e;
        return dn_gated_norm(o, z, ldz, norm, xb, T, eps, s);
    }
    return dn::tc_run(head_major(q, k, v, g, beta, T, H), nullptr, state, true, gated_xb(xb, z, ldz, norm, eps),
                      scratch, T, H, s);
}

int dn_layer(const float* y, int ldy, float* ring, const float* conv_w, const float* ssm_a, const float* dt_bias,
             const float* norm, float* state, float* q, float* k, float* v, float* g, float* beta, float* o,
             uint16_t* xb, void* scratch, int T, int pos0, float eps, cudaStream_t s) {
    bool tc = false;
    int e = dn_tc_path(&tc);
    if (e != (int)cudaSuccess) return e;
    const float* z = y + C_QKV;  // y rows: [q | k | v (C_QKV) | z (NH·128) | beta (NH) | alpha (NH)]
    if (!tc) {
        if ((e = dn_conv_prep(y, ldy, ring, conv_w, ssm_a, dt_bias, q, k, v, g, beta, T, pos0, s)) != (int)cudaSuccess)
            return e;
        if ((e = dn_ring_write(y, ldy, ring, T, pos0, s)) != (int)cudaSuccess) return e;
        return dn_chunked_norm(q, k, v, g, beta, state, o, z, ldy, norm, xb, scratch, T, NH, eps, s);
    }
    dn::ConvIn cv{};
    cv.pre = y;
    cv.ld = ldy;
    for (int j = 0; j < 3; ++j) {
        // positions pos0 - 3 .. pos0 - 1: the ring slot of an earlier position, zeros before the sequence
        const int p = pos0 - 3 + j;
        cv.hist[j] = p >= 0 ? ring + (size_t)(p & 3) * C_QKV : nullptr;
    }
    cv.conv_w = conv_w;
    cv.b = y + C_QKV + NH * D;
    cv.a = cv.b + NH;
    cv.ab_t = ldy;
    cv.ssm_a = ssm_a;
    cv.dt_bias = dt_bias;
    cv.q = q;
    cv.v = v;
    // the ring's update inside the output kernel, after the prep kernel has read the history (dn_ring_write's copy)
    dn::Out out = gated_xb(xb, z, ldy, norm, eps);
    out.ring = ring;
    out.ring_pre = y;
    out.ring_ld = ldy;
    out.ring_c = C_QKV;
    out.ring_pos0 = pos0;
    return dn::tc_run(head_major(q, k, v, g, beta, T, NH), &cv, state, true, out, scratch, T, NH, s);
}

int dn_conv_prep(const float* y, int ldy, const float* ring, const float* conv_w, const float* ssm_a,
                 const float* dt_bias, float* q, float* k, float* v, float* g, float* beta, int T, int pos0,
                 cudaStream_t s) {
    dn_conv_prep_kernel<<<T, 256, 0, s>>>(y, ldy, ring, conv_w, ssm_a, dt_bias, q, k, v, g, beta, T, pos0);
    return (int)cudaGetLastError();
}

int dn_ring_write(const float* y, int ldy, float* ring, int T, int pos0, cudaStream_t s) {
    dn_ring_write_kernel<<<24, 256, 0, s>>>(y, ldy, ring, T, pos0);
    return (int)cudaGetLastError();
}

int dn_gated_norm(const float* o, const float* z, int ldz, const float* norm, uint16_t* xb, int T, float eps,
                  cudaStream_t s) {
    dn_gated_norm_kernel<<<(T * NH + 7) / 8, 256, 0, s>>>(o, z, ldz, norm, xb, T, eps);
    return (int)cudaGetLastError();
}

}  // namespace pf

extern "C" LB_API uint64_t lb_deltanet_chunked_scratch_bytes(int t, int h) {
    return t >= 1 && h >= 1 ? (uint64_t)pf::dn_scratch_bytes(t, h) : 0;
}

extern "C" LB_API int lb_deltanet_chunked_path(void) {
    bool tc = false;
    LB_CUDA_TRY((cudaError_t)pf::dn_tc_path(&tc));
    return tc ? 1 : 0;
}

extern "C" LB_API int lb_deltanet_chunked(const void* q, const void* k, const void* v, const void* g, const void* beta,
                                          void* state, void* o, void* scratch, int t, int h, void* stream) {
    LB_CHECK_ARG(q && k && v && g && beta && state && o && scratch, "null pointer");
    LB_CHECK_ARG(t >= 1 && h >= 1, "t and h must be positive");
    LB_CUDA_TRY((cudaError_t)pf::dn_prepare());
    LB_CUDA_TRY((cudaError_t)pf::dn_chunked(static_cast<const float*>(q), static_cast<const float*>(k),
                                             static_cast<const float*>(v), static_cast<const float*>(g),
                                             static_cast<const float*>(beta), static_cast<float*>(state),
                                             static_cast<float*>(o), scratch, t, h, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
