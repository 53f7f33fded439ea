// attn_tree: the verify and prefill entry points of the attention kernel in attn_decode.cu.
//  - lb_attn_tree: N tree slots at positions n_past + depth (RoPE'd by lb_attn_prep with a positions
//    array); their K/V sit at cache rows n_past + slot, so after the walk the state/ kv_compact kernel
//    moves the accepted rows onto n_past .. n_past + n - 1. Slot i sees every committed row and the
//    rows of the slots in its ancestor mask (bit j = slot j; vis[i] = vis[parent(i)] | 1 << i).
//  - lb_attn_causal: T prompt tokens at positions pos0 .. pos0 + T - 1 (cache rows already written),
//    flash-style over rows [0, pos]; one query (T = 1) is the decode step.
#include "attn_ops.h"
#include "lb_check.cuh"
#include "lucebox.h"

namespace {

int check_common(const void* qf, const void* kc, const void* vc, int kv_dtype, const void* gate, const void* out,
                 int n_heads, int n_kv) {
    LB_CHECK_ARG(qf && kc && vc && gate && out, "null pointer");
    LB_CHECK_ARG(kv_dtype == LB_KV_F16 || kv_dtype == LB_KV_BF16, "kv_dtype must be LB_KV_F16 or LB_KV_BF16");
    LB_CHECK_ARG(n_kv >= 1 && n_heads % n_kv == 0 && n_heads / n_kv <= attn::MAX_GROUP,
                 "n_heads must be a multiple of n_kv_heads, at most 8 per kv head");
    return LB_OK;
}

attn::Params params(const void* qf, const void* kc, const void* vc, const void* gate, int gate_ld, int gate_hs,
                    void* out, const void* mask, int tq, int pos0, int nh, int nkv, int max_ctx) {
    attn::Params P{};
    P.qf = static_cast<const float*>(qf);
    P.kc = static_cast<const uint16_t*>(kc);
    P.vc = static_cast<const uint16_t*>(vc);
    P.gate = static_cast<const float*>(gate);
    P.gate_ld = gate_ld;
    P.gate_hs = gate_hs;
    P.out = static_cast<float*>(out);
    P.mask = static_cast<const uint64_t*>(mask);
    P.Tq = tq;
    P.pos0 = pos0;
    P.nh = nh;
    P.nkv = nkv;
    P.group = nh / nkv;
    P.max_ctx = max_ctx;
    return P;
}

}  // namespace

extern "C" LB_API int lb_attn_tree(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype,
                                   const void* gate, int gate_ld, int gate_hs, void* out, void* partials,
                                   int max_splits, const void* masks, int n, int n_past, int n_heads, int n_kv_heads,
                                   int max_ctx, void* stream) {
    if (int st = check_common(qf, k_cache, v_cache, kv_dtype, gate, out, n_heads, n_kv_heads)) return st;
    LB_CHECK_ARG(masks && n >= 1 && n <= attn::MAX_TREE, "a tree has 1..64 slots and a mask per slot");
    LB_CHECK_ARG(n_past >= 0 && n_past + n <= max_ctx, "tree rows outside the cache");
    const attn::Params P = params(qf, k_cache, v_cache, gate, gate_ld, gate_hs, out, masks, n, n_past, n_heads,
                                  n_kv_heads, max_ctx);
    LB_CUDA_TRY((cudaError_t)attn::run(P, kv_dtype, partials, max_splits, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_attn_causal(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype,
                                     const void* gate, int gate_ld, int gate_hs, void* out, void* partials,
                                     int max_splits, int t, int pos0, int n_heads, int n_kv_heads, int max_ctx,
                                     void* stream) {
    if (int st = check_common(qf, k_cache, v_cache, kv_dtype, gate, out, n_heads, n_kv_heads)) return st;
    LB_CHECK_ARG(t >= 1 && pos0 >= 0 && pos0 + t <= max_ctx, "positions outside the cache");
    const attn::Params P = params(qf, k_cache, v_cache, gate, gate_ld, gate_hs, out, nullptr, t, pos0, n_heads,
                                  n_kv_heads, max_ctx);
    LB_CUDA_TRY((cudaError_t)attn::run(P, kv_dtype, partials, max_splits, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

// The graph forms (CUDA graphs replayed at every n_past): n_past read on the device (*n_past_dev); the
// split count is fixed by the SM count and max_splits, not the context (attn::run). The caller keeps
// *n_past_dev + n <= max_ctx (the host can not check it).
extern "C" LB_API int lb_attn_tree_at(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype,
                                      const void* gate, int gate_ld, int gate_hs, void* out, void* partials,
                                      int max_splits, const void* masks, int n, const void* n_past_dev, int n_heads,
                                      int n_kv_heads, int max_ctx, void* stream) {
    if (int st = check_common(qf, k_cache, v_cache, kv_dtype, gate, out, n_heads, n_kv_heads)) return st;
    LB_CHECK_ARG(masks && n >= 1 && n <= attn::MAX_TREE, "a tree has 1..64 slots and a mask per slot");
    LB_CHECK_ARG(n_past_dev && n <= max_ctx, "null n_past_dev, or a tree larger than the cache");
    const attn::Params P = params(qf, k_cache, v_cache, gate, gate_ld, gate_hs, out, masks, n, 0, n_heads,
                                  n_kv_heads, max_ctx);
    LB_CUDA_TRY((cudaError_t)attn::run(P, kv_dtype, partials, max_splits, static_cast<cudaStream_t>(stream),
                                       static_cast<const int32_t*>(n_past_dev)));
    return LB_OK;
}

// One decode query at row *n_past_dev over rows [0, *n_past_dev] (lb_attn_decode with n_ctx = *n_past_dev + 1).
extern "C" LB_API int lb_attn_decode_at(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype,
                                        const void* gate, int gate_ld, int gate_hs, void* out, void* partials,
                                        int max_splits, const void* n_past_dev, int n_heads, int n_kv_heads,
                                        int max_ctx, void* stream) {
    if (int st = check_common(qf, k_cache, v_cache, kv_dtype, gate, out, n_heads, n_kv_heads)) return st;
    LB_CHECK_ARG(n_past_dev && max_ctx >= 1, "null n_past_dev or empty cache");
    const attn::Params P = params(qf, k_cache, v_cache, gate, gate_ld, gate_hs, out, nullptr, 1, 0, n_heads,
                                  n_kv_heads, max_ctx);
    LB_CUDA_TRY((cudaError_t)attn::run(P, kv_dtype, partials, max_splits, static_cast<cudaStream_t>(stream),
                                       static_cast<const int32_t*>(n_past_dev)));
    return LB_OK;
}
