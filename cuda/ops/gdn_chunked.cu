// gdn_chunked: chunked (WY / UT, chunk 64) prefill of the gated delta rule for any Hk, Hv, over the 0.8B prefill's
// chunk kernels rather than a second copy of them. The tensor-core path (pf::dn::tc_run, deltanet_tc.cu, the
// default) reads the CPU-order inputs in place (q, k [T, Hk, 128], value head p reading key head p % Hk; v [T, Hv,
// 128]; g / beta [T, Hv]) and the state [Hv, dk, dv] as it is, and lb_gdn_prefill has it fuse the gated output norm.
// Under LUCEBOX_DN_PREFILL=old the fp32 pf::dn_chunked runs instead, which takes head-major inputs, one key head per
// value head, and the megakernel's transposed state [H, dv, dk]: this file then relayouts the inputs (~3·T·Hv·512 B)
// and transposes the state in and out. The relayout and transpose kernels launch with programmatic dependent launch
// (lb_pdl.cuh; every input is an activation or the state, so each waits first); the chunk kernels launch the
// classic way, which keeps full stream order around them.
#include "gdn.cuh"
#include "gdn_ops.h"
#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "lucebox.h"
#include "deltanet_chunked.cuh"
#include "pf_ops.h"

namespace gdn {
namespace {

struct Parts {
    void* dn;
    float *qh, *kh, *vh, *gh, *bh, *st;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Byte offsets of the fp32 path's buffers inside one scratch allocation (each 256-byte aligned: the chunk kernels read
// float4). The tensor-core path's scratch (pf::dn::tc_scratch_bytes, never more than this total) starts at the same
// base.
Parts carve(void* base, int T, int hv, size_t* total) {
    char* p = static_cast<char*>(base);
    size_t off = 0;
    Parts r{};
    auto take = [&](size_t bytes) {
        char* at = p ? p + off : nullptr;
        off += align256(bytes);
        return at;
    };
    r.dn = take(pf::dn_scratch_bytes_old(T, hv));
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

// The fp32 path: relayout, transpose the state, pf::dn_chunked's fp32 kernels, transpose back.
static int chunked_old(const float* q, const float* k, const float* v, const float* g, const float* beta,
                       float* state, float* o, void* scratch, int T, int hk, int hv, cudaStream_t s) {
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

// With y (and z, norm_w) set, y = out_norm(o) instead of o (the tensor-core path fuses it; o may be null there).
static int run(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
               float* o, const float* z, const float* norm_w, float* y, float eps, void* scratch, int T, int hk,
               int hv, cudaStream_t s) {
    bool tc = false;
    int e = pf::dn_tc_path(&tc);
    if (e != (int)cudaSuccess) return e;
    if (!tc) {
        if ((e = chunked_old(q, k, v, g, beta, state, o, scratch, T, hk, hv, s)) != (int)cudaSuccess) return e;
        return y ? out_norm(o, z, hv * D, norm_w, y, T, hv, eps, s) : (int)cudaSuccess;
    }
    pf::dn::In in;
    in.q = q, in.k = k, in.v = v, in.g = g, in.beta = beta;
    in.qk_t = (long long)hk * D, in.qk_h = D;
    in.v_t = (long long)hv * D, in.v_h = D;
    in.gb_t = hv, in.gb_h = 1;
    in.hk = hk;
    pf::dn::Out out{};
    out.mode = y ? pf::dn::OUT_Y : pf::dn::OUT_O;
    out.o = y ? y : o;
    out.z = z;
    out.ldz = hv * D;
    out.norm = norm_w;
    out.eps = eps;
    return pf::dn::tc_run(in, nullptr, state, false, out, scratch, T, hv, s);
}

int chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
            float* o, void* scratch, int T, int hk, int hv, cudaStream_t s) {
    return run(q, k, v, g, beta, state, o, nullptr, nullptr, nullptr, 0.0f, scratch, T, hk, hv, s);
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
// (advancing the state), the gated output norm into y [T, Hv*128]. z [T, Hv*128]; pre [T, C]. On the tensor-core
// path the conv runs inside the chunk prep and the norm inside the chunk output (three kernels and the conv advance).
// ld_z / ld_ab: the row strides (floats) of z and of a and b, 0 = packed ([T, Hv*128], [T, Hv], [T, Hv]); other
// strides only on the tensor-core path (its kernels take strides; the fp32 path's read packed rows).
static int gdn_prefill(const void* pre, const void* a, const void* b, const void* z, int ld_z, int ld_ab,
                       const void* conv_w, const void* ssm_a, const void* dt_bias, const void* norm_w, void* conv_state,
                       void* state, void* y, void* scratch, int t, int hk, int hv, float eps, void* stream) {
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
    bool tc = false;
    LB_CUDA_TRY((cudaError_t)pf::dn_tc_path(&tc));
    if (ld_z != 0 || ld_ab != 0) {
        if (!tc) return ::lb::set_error(LB_ERR_UNSUPPORTED, "lb_gdn_prefill_ld: strided z/a/b need the tensor-core "
                                                               "DeltaNet path (lb_deltanet_chunked_path() == 1)");
        // the output norm reads z as float4 rows
        LB_CHECK_ARG(ld_z >= hv * D && ld_z % 4 == 0 && reinterpret_cast<uintptr_t>(z) % 16 == 0 && ld_ab >= hv,
                     "need ld_z >= hv*128 and a multiple of 4, z 16-byte aligned, ld_ab >= hv");
    }
    if (tc) {
        // the conv, norms, g and beta inside the chunk prep (q and v through the step buffers), the out_norm inside
        // the chunk output; then the conv state advanced, after the prep has read it
        pf::dn::In in{};
        in.q = q, in.v = v;
        in.qk_t = (long long)hk * D, in.qk_h = D;
        in.v_t = (long long)hv * D, in.v_h = D;
        in.gb_t = hv, in.gb_h = 1;
        in.hk = hk;
        pf::dn::ConvIn cv{};
        cv.pre = static_cast<const float*>(pre);
        cv.ld = C;
        for (int j = 0; j < 3; ++j) cv.hist[j] = static_cast<const float*>(conv_state) + (size_t)j * C;
        cv.conv_w = static_cast<const float*>(conv_w);
        cv.a = static_cast<const float*>(a);
        cv.b = static_cast<const float*>(b);
        cv.ab_t = ld_ab ? ld_ab : hv;
        cv.ssm_a = static_cast<const float*>(ssm_a);
        cv.dt_bias = static_cast<const float*>(dt_bias);
        cv.q = q;
        cv.v = v;
        pf::dn::Out out{};
        out.mode = pf::dn::OUT_Y;
        out.o = static_cast<float*>(y);
        out.z = static_cast<const float*>(z);
        out.ldz = ld_z ? ld_z : hv * D;
        out.norm = static_cast<const float*>(norm_w);
        out.eps = eps;
        LB_CUDA_TRY((cudaError_t)pf::dn::tc_run(in, &cv, static_cast<float*>(state), false, out, rest, t, hv, s));
        LB_CUDA_TRY((cudaError_t)gdn::conv_advance(static_cast<const float*>(pre), C, static_cast<float*>(conv_state),
                                                   t, C, s));
        return LB_OK;
    }
    LB_CUDA_TRY((cudaError_t)gdn::conv_prep(static_cast<const float*>(pre), C, static_cast<const float*>(a),
                                            static_cast<const float*>(b), static_cast<const float*>(conv_w),
                                            static_cast<const float*>(ssm_a), static_cast<const float*>(dt_bias),
                                            static_cast<float*>(conv_state), nullptr, q, k, v, g, bt, t, hk, hv, true,
                                            s));
    LB_CUDA_TRY((cudaError_t)gdn::run(q, k, v, g, bt, static_cast<float*>(state), o, static_cast<const float*>(z),
                                      static_cast<const float*>(norm_w), static_cast<float*>(y), eps, rest, t, hk,
                                      hv, s));
    return LB_OK;
}

extern "C" LB_API int lb_gdn_prefill(const void* pre, const void* a, const void* b, const void* z,
                                     const void* conv_w, const void* ssm_a, const void* dt_bias, const void* norm_w,
                                     void* conv_state, void* state, void* y, void* scratch, int t, int hk, int hv,
                                     float eps, void* stream) {
    return gdn_prefill(pre, a, b, z, 0, 0, conv_w, ssm_a, dt_bias, norm_w, conv_state, state, y, scratch, t, hk, hv,
                       eps, stream);
}

extern "C" LB_API int lb_gdn_prefill_ld(const void* pre, const void* a, const void* b, const void* z, int ld_z,
                                        int ld_ab, const void* conv_w, const void* ssm_a, const void* dt_bias,
                                        const void* norm_w, void* conv_state, void* state, void* y, void* scratch, int t,
                                        int hk, int hv, float eps, void* stream) {
    LB_CHECK_ARG(ld_z > 0 && ld_ab > 0, "need ld_z, ld_ab > 0 (lb_gdn_prefill takes packed rows)");
    return gdn_prefill(pre, a, b, z, ld_z, ld_ab, conv_w, ssm_a, dt_bias, norm_w, conv_state, state, y, scratch, t, hk,
                       hv, eps, stream);
}
