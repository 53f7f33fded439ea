// The Qwen3.5-0.8B prefill on tensor cores, over a decode megakernel handle (cuda/megakernel/).
//
// It reads the handle's weights and writes the state its decode kernel reads, in that kernel's layouts:
// K/V cache rows (bf16, K after norm + RoPE) at the prompt's positions, the DeltaNet recurrent state
// (fp32, transposed [H, dv, dk]), the conv ring (slot p % 4 = pre-conv input of position p), the
// pending token (*P.last_token), the last logits (P.logits) and the residual row (P.h); then it
// advances the handle's position. A prompt longer than the context's max_chunk runs as several
// segments, each continuing from the state the previous one left (the same path as a prompt that
// follows earlier tokens), which bounds the scratch memory.
//
// Per layer: RMSNorm -> in-proj GEMM (fp32 out) -> DeltaNet (conv, chunked rule, gated norm: pf::dn_layer) or
// attention (prep into the cache, then causal attention on the 27B's tensor-core kernel, pf::attn_tc; the
// fp32 pf::attn_flash under LUCEBOX_ATTN_PREFILL=fp32, fixed when the context is made, lb_mk_prefill_attn)
// -> out-proj GEMM + residual -> RMSNorm -> gate/up GEMM with SwiGLU -> down GEMM + residual (on the cuBLAS path
// each RMSNorm after the first runs inside the residual epilogue before it, pf::gemm_cublas_resid_norm, the same
// bits; LUCEBOX_PREFILL_NORM=separate, read when the context is made, keeps them separate kernels). GEMM inputs
// are split bf16 (x ≈ hi + lo, two MMAs each: plain bf16 activations moved the 24-layer logits by ~2.6%),
// accumulation and everything between GEMMs is fp32. On the cuBLAS path the last layer's attention query,
// out-projection and FFN run for the one row the LM head reads (LUCEBOX_PREFILL_TAIL=all: for every row, as before;
// the cache rows and the DeltaNet state are written before that tail and are the same either way).
// The GEMMs run on our own kernel (cuda/ops/gemm_bf16.cu) or, chosen once when the context is made, on a
// cuBLAS loaded at run time (cuda/ops/gemm_cublas.cu: one GEMM over both split halves into fp32 scratch,
// then the same epilogues); lb_mk_prefill_gemm says which.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "../megakernel/mk_handle.h"
#include "../ops/attn_ops.h"
#include "../ops/pf_ops.h"
#include "lb_check.cuh"
#include "../core/cublas_gemm.cuh"
#include "lb_cublas.h"
#include "lucebox.h"

namespace {

struct Prefill {
    mk::Handle* H = nullptr;
    int max_chunk = 0;
    int sm_count = 0;
    int n_part = 0;
    void* blob = nullptr;
    int32_t* tok = nullptr;   // [Tm]
    float* h = nullptr;       // [Tm, 1024] residual stream
    uint16_t* xb = nullptr;   // [2][Tm, 2048] split bf16 GEMM input (normed x, mixer output)
    uint16_t* act = nullptr;  // [2][Tm, 3584] split bf16 SwiGLU output
    float* y = nullptr;       // [Tm, 8224] in-projection output
    float *q = nullptr, *k = nullptr, *v = nullptr;  // [16, Tm, 128] DeltaNet; q doubles as attention qf
    float *g = nullptr, *beta = nullptr;             // [16, Tm]
    float* o = nullptr;       // [Tm, 2048] DeltaNet output before the gated norm
    void* dn_scr = nullptr;
    float* part_val = nullptr;
    int* part_idx = nullptr;
    int* am = nullptr;
    int gemm = LB_PREFILL_GEMM_OWN;  // the GEMM path, fixed at creation
    float* gemm_scr = nullptr;  // cuBLAS path: fp32 [2][Tm, GEMM_ROWS_MAX], both halves of a split GEMM
    bool attn_tc = true;        // attention on the tensor cores (pf::attn_tc), else pf::attn_flash; fixed at creation
    void* attn_part = nullptr;  // tensor cores: the key splits' partials, 2 Tm (split, token) rows
    bool fuse_norm = true;      // cuBLAS path: RMSNorms inside the residual epilogues (LUCEBOX_PREFILL_NORM=separate: not)
    // cuBLAS path: the last layer's attention query (an attention layer), out-projection, FFN and residual only for the
    // row the LM head reads (T - 1 of the final segment; none in earlier segments, whose h the next segment's embedding
    // overwrites). The other rows feed nothing: the mixer's prep has already written their cache rows / state.
    // LUCEBOX_PREFILL_TAIL=all (or old): every row, as before.
    bool tail_row = true;
    // cuBLAS path: the in-projection's halves summed by cuBLAS (two GEMMs, beta 1 on the second: W, 17 MB, is L2-resident
    // for the second) instead of scratch + epilogue_kernel<EPI_F32> (measured: pp520 100.0k -> 103.4k tok/s on the H200).
    // LUCEBOX_PREFILL_INPROJ=epilogue (or old): the scratch + epilogue path, for A/B.
    bool inproj_acc = true;
};

// Whether the residual epilogues also write the next RMSNorm (only the cuBLAS path has a row-wide epilogue).
bool fused_norms(const Prefill* P) { return P->gemm == LB_PREFILL_GEMM_CUBLAS && P->fuse_norm; }

// The most output rows of one prefill GEMM (W rows): the DeltaNet in-projection.
constexpr int GEMM_ROWS_MAX = std::max(std::max(mk::DN_IN, mk::AT_IN), std::max(2 * mk::FFN, mk::HID));

// The tensor-core attention splits along the keys while its query tiles alone leave SMs idle (attn::run: about
// two blocks per SM; 3 splits at pp520 on 132 SMs, none from ~800 tokens on). Its partials are sized for two
// splits of a full segment (2 Tm (split, token) rows), so a T-token segment splits at most 2 Tm / T ways,
// and at most 16 as the 27B's prefill.
constexpr int ATTN_MAX_SPLITS = 16;
int attn_max_splits(int Tm, int T) { return std::min(ATTN_MAX_SPLITS, 2 * Tm / T); }

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// Carve (or, with base == nullptr, size) the scratch blob.
size_t carve(Prefill* P, char* base) {
    const size_t Tm = (size_t)P->max_chunk;
    size_t off = 0;
    auto take = [&](size_t bytes) {
        char* p = base ? base + off : nullptr;
        off += align256(bytes);
        return p;
    };
    P->tok = reinterpret_cast<int32_t*>(take(Tm * 4));
    P->h = reinterpret_cast<float*>(take(Tm * mk::HID * 4));
    P->xb = reinterpret_cast<uint16_t*>(take(2 * Tm * mk::DN_Z * 2));
    P->act = reinterpret_cast<uint16_t*>(take(2 * Tm * mk::FFN * 2));
    P->y = reinterpret_cast<float*>(take(Tm * mk::DN_IN * 4));
    P->q = reinterpret_cast<float*>(take(Tm * mk::DN_Z * 4));
    P->k = reinterpret_cast<float*>(take(Tm * mk::DN_Z * 4));
    P->v = reinterpret_cast<float*>(take(Tm * mk::DN_Z * 4));
    P->g = reinterpret_cast<float*>(take(Tm * mk::DN_H * 4));
    P->beta = reinterpret_cast<float*>(take(Tm * mk::DN_H * 4));
    P->o = reinterpret_cast<float*>(take(Tm * mk::DN_Z * 4));
    P->dn_scr = take(pf::dn_scratch_bytes((int)Tm, mk::DN_H));
    P->part_val = reinterpret_cast<float*>(take((size_t)P->n_part * 4));
    P->part_idx = reinterpret_cast<int*>(take((size_t)P->n_part * 4));
    P->am = reinterpret_cast<int*>(take(4));
    // 2 * Tm * 8224 floats on the cuBLAS path (128.5 MiB at Tm = 2048), nothing on ours
    const size_t scr = pf::gemm_cublas_scratch_bytes((int)Tm, GEMM_ROWS_MAX, pf::EPI_F32, true);
    P->gemm_scr = reinterpret_cast<float*>(take(P->gemm == LB_PREFILL_GEMM_CUBLAS ? scr : 0));
    // 2 * Tm * 8 * 258 floats on the tensor-core attention (33.8 MB at Tm = 2048), nothing on the fp32 one
    P->attn_part = take(P->attn_tc ? attn::partials_bytes((int)Tm, mk::AT_HQ, 2) : 0);
    return off;
}

#define PF_TRY(expr) LB_CUDA_TRY((cudaError_t)(expr))
// for calls that return an lb_status with its message already recorded
#define LB_TRY(expr)                        \
    do {                                    \
        const int lb_st_ = (expr);          \
        if (lb_st_ != LB_OK) return lb_st_; \
    } while (0)

// Y = X · Wᵀ with a split X on the context's GEMM path (an lb_status). ldx != 0 (cuBLAS path only): X's row stride,
// as pf::gemm_cublas (the tail row reads one row of the [2][T] pair).
int gemm(Prefill* P, const uint16_t* X, const uint16_t* W, void* Y, int T, int N, int K, int epi, int ldx = 0) {
    const cudaStream_t s = P->H->stream;
    if (P->gemm == LB_PREFILL_GEMM_CUBLAS) return pf::gemm_cublas(X, W, Y, T, N, K, epi, true, P->gemm_scr, s, ldx);
    PF_TRY(pf::gemm_bf16(X, W, Y, T, N, K, epi, true, P->sm_count, s));
    return LB_OK;
}

// The in-projection y = X · Wᵀ (fp32 [T, N]).
int gemm_in(Prefill* P, const uint16_t* X, const uint16_t* W, int T, int N) {
    if (P->gemm == LB_PREFILL_GEMM_CUBLAS && P->inproj_acc)
        return pf::gemm_cublas_f32_acc(X, W, P->y, T, N, mk::HID, P->H->stream);
    return gemm(P, X, W, P->y, T, N, mk::HID, pf::EPI_F32);
}

// h += X · Wᵀ (X split, N = 1024; h: T rows from P->h on), then, when norm is not null, xb = RMSNorm(h, norm) for the
// next GEMM. On the cuBLAS path one epilogue kernel does both (pf::gemm_cublas_resid_norm: the same bits as the two
// steps); our GEMM adds the residual inside its own epilogue, per output tile, so the norm (it needs the whole row)
// stays a kernel there. ldx as gemm.
int gemm_resid_norm(Prefill* P, const uint16_t* X, const uint16_t* W, float* h, int T, int K, const float* norm,
                    int ldx = 0) {
    const cudaStream_t s = P->H->stream;
    if (norm && fused_norms(P))
        return pf::gemm_cublas_resid_norm(X, W, h, norm, P->xb, T, mk::HID, K, P->H->cfg.rms_eps, true, P->gemm_scr,
                                          s, ldx);
    LB_TRY(gemm(P, X, W, h, T, mk::HID, K, pf::EPI_RESID, ldx));
    if (norm) PF_TRY(pf::rmsnorm_bf16(h, norm, P->xb, T, mk::HID, P->H->cfg.rms_eps, s));
    return LB_OK;
}

// Whether the last layer's tail (out-projection, FFN) runs on one row (tail_row; cuBLAS only: our GEMM reads a
// contiguous split pair and has no row stride).
bool tail_rows_only(const Prefill* P) { return P->gemm == LB_PREFILL_GEMM_CUBLAS && P->tail_row; }

// One layer. xb_ready: the previous layer's last epilogue already left RMSNorm(h, L.norm1) in xb; next_norm: the
// next layer's norm1, applied by this layer's last epilogue (nullptr for the last layer: the LM head norms itself).
// tail: which rows get the out-projection and the FFN: TAIL_ALL, TAIL_LAST (row T - 1 alone) or TAIL_NONE.
enum { TAIL_ALL, TAIL_LAST, TAIL_NONE };
int layer_forward(Prefill* P, const mk::Layer& L, int T, int pos0, bool xb_ready, const float* next_norm,
                  int tail = TAIL_ALL) {
    mk::Handle* H = P->H;
    const cudaStream_t s = H->stream;
    const float eps = H->cfg.rms_eps;
    if (!xb_ready) PF_TRY(pf::rmsnorm_bf16(P->h, L.norm1, P->xb, T, mk::HID, eps, s));
    if (!L.is_attn) {
        LB_TRY(gemm_in(P, P->xb, L.w_in, T, mk::DN_IN));
        // conv (ring in and out), the chunked rule, the gated norm into xb: on the tensor-core path three kernels
        // (the conv inside the chunk prep; the norm and the ring write inside the chunk output)
        PF_TRY(pf::dn_layer(P->y, mk::DN_IN, L.conv_state, L.conv_w, L.ssm_a, L.dt_bias, L.ssm_norm, L.S, P->q, P->k,
                            P->v, P->g, P->beta, P->o, P->xb, P->dn_scr, T, pos0, eps, s));
    } else {
        const int mc = H->cfg.max_context;
        LB_TRY(gemm_in(P, P->xb, L.w_in, T, mk::AT_IN));
        PF_TRY(pf::attn_prep(P->y, mk::AT_IN, L.q_norm, L.k_norm, P->q, L.kc, L.vc, T, pos0, mk::AT_HQ, mk::AT_HKV, mc,
                             eps, H->cfg.rope_theta, s));
        // Only the queries whose output the tail reads: all T, or (TAIL_LAST) the query of row T - 1 alone, at position
        // pos0 + T - 1 over the cache rows prep has just written (a one-token chunk's call), into a one-row pair at xb;
        // none for TAIL_NONE. The gate of head h sits right after its q in the interleaved rows: offset 256, head
        // stride 512.
        const int r = tail == TAIL_LAST ? T - 1 : 0, nq = tail == TAIL_LAST ? 1 : T;
        const float* qf = P->q + (size_t)r * mk::AT_HQ * mk::AT_D;
        const float* gate = P->y + (size_t)r * mk::AT_IN + mk::AT_D;
        if (tail != TAIL_NONE && P->attn_tc)
            PF_TRY(pf::attn_tc(qf, L.kc, L.vc, gate, mk::AT_IN, 2 * mk::AT_D, P->xb, P->attn_part,
                               attn_max_splits(P->max_chunk, nq), nq, pos0 + r, mk::AT_HQ, mk::AT_HKV, mc, s));
        else if (tail != TAIL_NONE)
            PF_TRY(pf::attn_flash(qf, L.kc, L.vc, gate, mk::AT_IN, 2 * mk::AT_D, P->xb, nq, pos0 + r, mk::AT_HQ,
                                  mk::AT_HKV, mc, s));
    }
    if (tail == TAIL_NONE) return LB_OK;
    if (tail == TAIL_LAST) {
        // row T - 1 of the mixer's split output: the attention's one-row pair at xb, or the DeltaNet's row of its
        // [2][T] pair (hi at xb + r * 2048, lo T rows further: ldx = T * 2048); the norm then leaves a one-row pair
        // [2][1][1024] at xb, the SwiGLU one at act, both contiguous
        const size_t r = (size_t)T - 1;
        float* h = P->h + r * mk::HID;
        const uint16_t* x = L.is_attn ? P->xb : P->xb + r * mk::DN_Z;
        LB_TRY(gemm_resid_norm(P, x, L.w_out, h, 1, mk::DN_Z, L.norm2, L.is_attn ? 0 : T * mk::DN_Z));
        LB_TRY(gemm(P, P->xb, L.w_gu, P->act, 1, mk::FFN, mk::HID, pf::EPI_SWIGLU));
        return gemm_resid_norm(P, P->act, L.w_down, h, 1, mk::FFN, next_norm);
    }
    LB_TRY(gemm_resid_norm(P, P->xb, L.w_out, P->h, T, mk::DN_Z, L.norm2));
    LB_TRY(gemm(P, P->xb, L.w_gu, P->act, T, mk::FFN, mk::HID, pf::EPI_SWIGLU));
    LB_TRY(gemm_resid_norm(P, P->act, L.w_down, P->h, T, mk::FFN, next_norm));
    return LB_OK;
}

// One segment of at most max_chunk tokens at positions pos0 .. pos0 + T - 1; final: the prompt's last (its last row
// feeds the LM head).
int segment(Prefill* P, const int32_t* tokens, int T, int pos0, bool final) {
    mk::Handle* H = P->H;
    LB_CUDA_TRY(cudaMemcpyAsync(P->tok, tokens, (size_t)T * 4, cudaMemcpyHostToDevice, H->stream));
    PF_TRY(pf::embed_gather(H->wblob, P->tok, P->h, T, mk::HID, H->stream));
    // on the cuBLAS path each layer's down-projection epilogue also writes the next layer's normed input
    const bool fused = fused_norms(P);
    const int last_tail = !tail_rows_only(P) ? TAIL_ALL : final ? TAIL_LAST : TAIL_NONE;
    for (int l = 0; l < H->cfg.n_layers; ++l) {
        const float* next_norm = fused && l + 1 < H->cfg.n_layers ? H->layers[l + 1].norm1 : nullptr;
        const int st = layer_forward(P, H->layers[l], T, pos0, fused && l > 0, next_norm,
                                     l + 1 < H->cfg.n_layers ? TAIL_ALL : last_tail);
        if (st != LB_OK) return st;
    }
    return LB_OK;
}

// The GEMM path of a new context: cuBLAS when asked (or, for AUTO, when one is loaded) and lb::blas has a
// handle on this device. AUTO falls back to our kernel and leaves the reason in lb_last_error.
int choose_gemm(Prefill* P, int want) {
    P->gemm = LB_PREFILL_GEMM_OWN;
    if (want == LB_PREFILL_GEMM_OWN || (want == LB_PREFILL_GEMM_AUTO && !lb::cublas_api())) return LB_OK;
    const int st = lb::blas::check();
    if (st == LB_OK) P->gemm = LB_PREFILL_GEMM_CUBLAS;
    return want == LB_PREFILL_GEMM_CUBLAS ? st : LB_OK;
}

}  // namespace

extern "C" LB_API int lb_mk_prefill_create(void* mk_handle, int max_chunk, void** prefill) {
    return lb_mk_prefill_create_ex(mk_handle, max_chunk, LB_PREFILL_GEMM_AUTO, prefill);
}

extern "C" LB_API int lb_mk_prefill_create_ex(void* mk_handle, int max_chunk, int gemm, void** prefill) {
    LB_CHECK_ARG(mk_handle && prefill, "null argument");
    *prefill = nullptr;
    LB_CHECK_ARG(max_chunk >= 0 && max_chunk <= (1 << 16), "max_chunk out of range");
    LB_CHECK_ARG(gemm >= LB_PREFILL_GEMM_AUTO && gemm <= LB_PREFILL_GEMM_CUBLAS, "unknown GEMM path");
    LB_API_BEGIN
    mk::Handle* H = static_cast<mk::Handle*>(mk_handle);
    Prefill* P = new Prefill();
    P->H = H;
    P->max_chunk = max_chunk > 0 ? max_chunk : 2048;
    P->n_part = pf::lm_head_max_parts(H->cfg.vocab);
    P->attn_tc = attn::prefill_on_tensor_cores();
    {  // read per context (not once a process), so one process can compare both
        const char* e = std::getenv("LUCEBOX_PREFILL_NORM");
        P->fuse_norm = !(e && std::strcmp(e, "separate") == 0);
        e = std::getenv("LUCEBOX_PREFILL_TAIL");
        P->tail_row = !(e && (std::strcmp(e, "all") == 0 || std::strcmp(e, "old") == 0));
        e = std::getenv("LUCEBOX_PREFILL_INPROJ");
        P->inproj_acc = !(e && (std::strcmp(e, "epilogue") == 0 || std::strcmp(e, "old") == 0));
    }
    int st = LB_OK;
    auto fail = [&](int status) {
        cudaFree(P->blob);
        delete P;
        return status;
    };
    if (cudaSetDevice(H->cfg.device) != cudaSuccess)
        return fail(lb::set_cuda_error(cudaGetLastError(), "cudaSetDevice", __FILE__, __LINE__));
    st = choose_gemm(P, gemm);
    if (st != LB_OK) return fail(st);
    cudaError_t e = cudaDeviceGetAttribute(&P->sm_count, cudaDevAttrMultiProcessorCount, H->cfg.device);
    if (e == cudaSuccess) e = (cudaError_t)pf::gemm_bf16_prepare();
    if (e == cudaSuccess) e = (cudaError_t)pf::dn_prepare();
    if (e == cudaSuccess) e = (cudaError_t)pf::attn_prepare();
    if (e == cudaSuccess) e = cudaMalloc(&P->blob, carve(P, nullptr));
    if (e != cudaSuccess) return fail(lb::set_cuda_error(e, "prefill setup", __FILE__, __LINE__));
    carve(P, static_cast<char*>(P->blob));
    *prefill = P;
    return st;
    LB_API_END
}

extern "C" LB_API int lb_mk_prefill_free(void* prefill) {
    if (!prefill) return LB_OK;
    Prefill* P = static_cast<Prefill*>(prefill);
    cudaFree(P->blob);
    delete P;
    return LB_OK;
}

extern "C" LB_API int lb_mk_prefill_gemm(void* prefill) {
    return prefill ? static_cast<Prefill*>(prefill)->gemm : -1;
}

extern "C" LB_API int lb_mk_prefill_attn(void* prefill) {
    return prefill ? (int)static_cast<Prefill*>(prefill)->attn_tc : -1;
}

extern "C" LB_API int lb_mk_prefill(void* prefill, const int32_t* tokens, int n, float* logits, int32_t* argmax_out) {
    LB_CHECK_ARG(prefill && tokens, "null argument");
    Prefill* P = static_cast<Prefill*>(prefill);
    mk::Handle* H = P->H;
    LB_CHECK_ARG(!H->running, "a decode launch is in flight");
    LB_CHECK_ARG(n >= 1, "n must be at least 1");
    if (H->pos + n > H->cfg.max_context)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_prefill: position %d + %d tokens exceeds max_context %d",
                             H->pos, n, H->cfg.max_context);
    for (int i = 0; i < n; ++i) LB_CHECK_ARG(tokens[i] >= 0 && tokens[i] < H->cfg.vocab, "token id out of range");
    LB_CUDA_TRY(cudaSetDevice(H->cfg.device));
    LB_CUDA_TRY(cudaEventRecord(H->ev0, H->stream));
    int done = 0, last_T = 0;
    while (done < n) {
        last_T = std::min(P->max_chunk, n - done);
        const int st = segment(P, tokens + done, last_T, H->pos + done, done + last_T == n);
        if (st != LB_OK) return st;
        done += last_T;
    }
    const float* hlast = P->h + (size_t)(last_T - 1) * mk::HID;
    int n_part = 0;
    PF_TRY(pf::lm_head(hlast, H->out_norm, H->wblob, H->P.logits, P->part_val, P->part_idx, H->cfg.vocab, mk::HID,
                       H->cfg.rms_eps, &n_part, H->stream));
    PF_TRY(pf::argmax_reduce(P->part_val, P->part_idx, n_part, P->am, H->P.last_token, H->stream));
    LB_CUDA_TRY(cudaMemcpyAsync(H->P.h, hlast, mk::HID * 4, cudaMemcpyDeviceToDevice, H->stream));
    LB_CUDA_TRY(cudaEventRecord(H->ev1, H->stream));
    int am = -1;
    LB_CUDA_TRY(cudaMemcpyAsync(&am, P->am, 4, cudaMemcpyDeviceToHost, H->stream));
    if (logits)
        LB_CUDA_TRY(cudaMemcpyAsync(logits, H->P.logits, (size_t)H->cfg.vocab * 4, cudaMemcpyDeviceToHost, H->stream));
    LB_CUDA_TRY(cudaStreamSynchronize(H->stream));
    H->pos += n;
    H->pending = am;
    if (argmax_out) *argmax_out = am;
    return LB_OK;
}
