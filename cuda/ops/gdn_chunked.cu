// gdn_chunked: chunked (WY / UT, chunk 64) prefill of the gated delta rule for any Hk, Hv — an adapter
// over the 0.8B prefill's pf::dn_chunked (cuda/ops/deltanet_chunked.cu) rather than a second copy of
// the chunk kernels. That op is generic in the head count but takes head-major inputs, one key head per
// value head, and the megakernel's transposed state [H, dv, dk]; this file relayouts the CPU-order
// inputs (q, k [T, Hk, 128] expanded to the tiled Hv heads, v [T, Hv, 128], g / beta [T, Hv]) and
// transposes the state [Hv, dk, dv] in and out. The relayout moves ~3·T·Hv·512 B, small next to the
// prefill's GEMMs; a native Hk-aware kernel would save it (noted in docs/perf.md).
// The relayout and transpose kernels launch with programmatic dependent launch (lb_pdl.cuh; every input
// is an activation or the state, so each waits first); pf::dn_chunked's own kernels launch the classic
// way, which keeps full stream order around them.
#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"
#include "pf_ops.h"

namespace gdn {
namespace {

struct Parts {
    void* dn;
    float *qh, *kh, *vh, *gh, *bh, *st;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Byte offsets of the adapter's buffers inside one scratch allocation (each 256-byte aligned: the chunk
// kernels read float4).
Parts carve(void* base, int T, int hv, size_t* total) {
    char* p = static_cast<char*>(base);
    size_t off = 0;
    Parts r{};
    auto take = [&](size_t bytes) {
        char* at = p ? p + off : nullptr;
        off += align256(bytes);
        return at;
    };
    r.dn = take(pf::dn_scratch_bytes(T, hv));
    const size_t big = (size_t)hv * T * D * 4, small = (size_t)hv * T * 4;
    r.qh = reinterpret_cast<float*>(take(big));
    r.kh = reinterpret_cast<float*>(take(big));
    r.vh = reinterpret_cast<float*>(take(big));
    r.gh = reinterpret_cast<float*>(take(small));
    r.bh = reinterpret_cast<float*>(take(small));
    r.st = reinterpret_cast<float*>(take((size_t)hv * D * D * 4));
    if (total) *total = off;
    return r;
}

// [T, H*, 128] token-major -> [Hv, T, 128] head-major; q and k heads tiled (value head p reads p % Hk).
__global__ void relayout_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ g,
                                const float* __restrict__ beta, Parts P, int T, int hk, int hv) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const size_t n = (size_t)hv * T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const size_t ht = i / D;
        const int t = (int)(ht % T), h = (int)(ht / T);
        P.qh[i] = q[((size_t)t * hk + h % hk) * D + d];
        P.kh[i] = k[((size_t)t * hk + h % hk) * D + d];
        P.vh[i] = v[((size_t)t * hv + h) * D + d];
        if (d == 0) {
            P.gh[ht] = g[(size_t)t * hv + h];
            P.bh[ht] = beta[(size_t)t * hv + h];
        }
    }
}

// dst[h][j][i] = src[h][i][j] for each head's 128 x 128 block (the transpose is its own inverse).
__global__ void transpose_kernel(const float* __restrict__ src, float* __restrict__ dst) {
    lb::pdl_trigger();
    lb::pdl_wait();
    __shared__ float tile[32][33];
    const size_t head = (size_t)blockIdx.z * D * D;
    const int bx = blockIdx.x * 32, by = blockIdx.y * 32, tx = threadIdx.x, ty = threadIdx.y;
    for (int r = ty; r < 32; r += 8) tile[r][tx] = src[head + (size_t)(by + r) * D + bx + tx];
    __syncthreads();
    for (int r = ty; r < 32; r += 8) dst[head + (size_t)(bx + r) * D + by + tx] = tile[tx][r];
}

}  // namespace

size_t chunked_scratch_bytes(int T, int hv) {
    size_t total = 0;
    carve(nullptr, T, hv, &total);
    return total;
}

int chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
            float* o, void* scratch, int T, int hk, int hv, cudaStream_t s) {
    const Parts P = carve(scratch, T, hv, nullptr);
    cudaError_t e = (cudaError_t)pf::dn_prepare();
    if (e != cudaSuccess) return (int)e;
    if ((e = lb::launch_pdl(relayout_kernel, dim3(1024), dim3(256), 0, s, q, k, v, g, beta, P, T, hk, hv)) !=
        cudaSuccess)
        return (int)e;
    const dim3 tgrid(D / 32, D / 32, hv), tblock(32, 8);
    if ((e = lb::launch_pdl(transpose_kernel, tgrid, tblock, 0, s, (const float*)state, P.st)) != cudaSuccess)
        return (int)e;
    e = (cudaError_t)pf::dn_chunked(P.qh, P.kh, P.vh, P.gh, P.bh, P.st, o, P.dn, T, hv, s);
    if (e != cudaSuccess) return (int)e;
    return (int)lb::launch_pdl(transpose_kernel, tgrid, tblock, 0, s, (const float*)P.st, state);
}

}  // namespace gdn

extern "C" LB_API uint64_t lb_gdn_chunked_scratch_bytes(int t, int hv) {
    return t >= 1 && hv >= 1 ? (uint64_t)gdn::chunked_scratch_bytes(t, hv) : 0;
}

// The op test entry: post-prep inputs in the CPU layouts, state [Hv, dk, dv] in and out, o [T, Hv, 128].
extern "C" LB_API int lb_gdn_chunked(const void* q, const void* k, const void* v, const void* g, const void* beta,
                                     void* state, void* o, void* scratch, int t, int hk, int hv, void* stream) {
    LB_CHECK_ARG(q && k && v && g && beta && state && o && scratch, "null pointer");
    LB_CHECK_ARG(t >= 1 && hk >= 1 && hv >= hk && hv % hk == 0, "need t >= 1, hv a multiple of hk");
    LB_CUDA_TRY((cudaError_t)gdn::chunked(
        static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
        static_cast<const float*>(g), static_cast<const float*>(beta), static_cast<float*>(state),
        static_cast<float*>(o), scratch, t, hk, hv, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API uint64_t lb_gdn_prefill_scratch_bytes(int t, int hk, int hv) {
    if (t < 1 || hk < 1 || hv < hk || hv % hk) return 0;
    const uint64_t step = (uint64_t)t * (2 * hk * gdn::D + 2 * hv * gdn::D + 2 * hv) * 4;
    return (step + 255) / 256 * 256 + gdn::chunked_scratch_bytes(t, hv);
}

// A prompt segment of one DeltaNet layer: conv + prep (advancing the conv state), the chunked rule
// (advancing the state), the gated output norm into y [T, Hv*128]. z [T, Hv*128]; pre [T, C].
extern "C" LB_API int lb_gdn_prefill(const void* pre, const void* a, const void* b, const void* z,
                                     const void* conv_w, const void* ssm_a, const void* dt_bias, const void* norm_w,
                                     void* conv_state, void* state, void* y, void* scratch, int t, int hk, int hv,
                                     float eps, void* stream) {
    LB_CHECK_ARG(pre && a && b && z && conv_w && ssm_a && dt_bias && norm_w && conv_state && state && y && scratch,
                 "null pointer");
    LB_CHECK_ARG(t >= 1 && hk >= 1 && hv >= hk && hv % hk == 0, "need t >= 1, hv a multiple of hk");
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int D = gdn::D, C = (2 * hk + hv) * D;
    float* q = static_cast<float*>(scratch);
    float* k = q + (size_t)t * hk * D;
    float* v = k + (size_t)t * hk * D;
    float* o = v + (size_t)t * hv * D;
    float* g = o + (size_t)t * hv * D;
    float* bt = g + (size_t)t * hv;
    const uint64_t step = (uint64_t)t * (2 * hk * D + 2 * hv * D + 2 * hv) * 4;
    void* rest = static_cast<char*>(scratch) + (step + 255) / 256 * 256;
    LB_CUDA_TRY((cudaError_t)gdn::conv_prep(static_cast<const float*>(pre), C, static_cast<const float*>(a),
                                            static_cast<const float*>(b), static_cast<const float*>(conv_w),
                                            static_cast<const float*>(ssm_a), static_cast<const float*>(dt_bias),
                                            static_cast<float*>(conv_state), nullptr, q, k, v, g, bt, t, hk, hv, true,
                                            s));
    LB_CUDA_TRY((cudaError_t)gdn::chunked(q, k, v, g, bt, static_cast<float*>(state), o, rest, t, hk, hv, s));
    LB_CUDA_TRY((cudaError_t)gdn::out_norm(o, static_cast<const float*>(z), hv * D,
                                           static_cast<const float*>(norm_w), static_cast<float*>(y), t, hv, eps, s));
    return LB_OK;
}
