// C API of the megakernel, second half: weight upload, decode launches (blocking and streaming),
// position queries and state readback.
#include <cstring>

#include "lb_check.cuh"
#include "lucebox.h"
#include "mk_handle.h"

using namespace mk;

namespace {

struct Dest {
    void* ptr;
    size_t bytes;
};

// Where a weight kind lives on the device, and how many bytes it must have; ptr null: not valid here.
Dest weight_dest(Handle* H, int kind, int layer) {
    if (kind == LB_MK_TOKEN_EMBD) return {H->wblob, (size_t)H->cfg.vocab * HID * 2};
    if (kind == LB_MK_OUTPUT_NORM) return {H->out_norm, HID * 4};
    if (layer < 0 || layer >= H->cfg.n_layers) return {nullptr, 0};
    const Layer& L = H->layers[layer];
    uint16_t* in = const_cast<uint16_t*>(L.w_in);
    const bool at = L.is_attn;
    auto f32 = [](const float* p, size_t n) { return Dest{const_cast<float*>(p), n * 4}; };
    auto b16 = [](const uint16_t* p, size_t rows, size_t cols) {
        return Dest{const_cast<uint16_t*>(p), rows * cols * 2};
    };
    switch (kind) {
        case LB_MK_ATTN_NORM: return f32(L.norm1, HID);
        case LB_MK_POST_NORM: return f32(L.norm2, HID);
        case LB_MK_FFN_GATE: return b16(L.w_gu, FFN, HID);
        case LB_MK_FFN_UP: return b16(L.w_gu + (size_t)FFN * HID, FFN, HID);
        case LB_MK_FFN_DOWN: return b16(L.w_down, HID, FFN);
        default: break;
    }
    if (!at) {
        switch (kind) {
            case LB_MK_ATTN_QKV: return b16(in, DN_QKV, HID);
            case LB_MK_ATTN_GATE: return b16(in + (size_t)DN_QKV * HID, DN_Z, HID);
            case LB_MK_SSM_BETA: return b16(in + (size_t)(DN_QKV + DN_Z) * HID, DN_H, HID);
            case LB_MK_SSM_ALPHA: return b16(in + (size_t)(DN_QKV + DN_Z + DN_H) * HID, DN_H, HID);
            case LB_MK_SSM_OUT: return b16(L.w_out, HID, DN_Z);
            case LB_MK_SSM_CONV1D: return f32(L.conv_w, (size_t)DN_QKV * 4);
            case LB_MK_SSM_A: return f32(L.ssm_a, DN_H);
            case LB_MK_SSM_DT: return f32(L.dt_bias, DN_H);
            case LB_MK_SSM_NORM: return f32(L.ssm_norm, DN_D);
            default: return {nullptr, 0};
        }
    }
    switch (kind) {
        case LB_MK_ATTN_Q: return b16(in, AT_Q, HID);
        case LB_MK_ATTN_K: return b16(in + (size_t)AT_Q * HID, AT_HKV * AT_D, HID);
        case LB_MK_ATTN_V: return b16(in + (size_t)(AT_Q + AT_HKV * AT_D) * HID, AT_HKV * AT_D, HID);
        case LB_MK_ATTN_OUTPUT: return b16(L.w_out, HID, AT_O);
        case LB_MK_ATTN_Q_NORM: return f32(L.q_norm, AT_D);
        case LB_MK_ATTN_K_NORM: return f32(L.k_norm, AT_D);
        default: return {nullptr, 0};
    }
}

Dest read_src(Handle* H, int what, int layer) {
    if (what == LB_MK_READ_HIDDEN) return {H->P.h, HID * 4};
    if (what == LB_MK_READ_LOGITS) return {H->P.logits, (size_t)H->cfg.vocab * 4};
    if (layer < 0 || layer >= H->cfg.n_layers) return {nullptr, 0};
    const Layer& L = H->layers[layer];
    const size_t kv = (size_t)AT_HKV * H->cfg.max_context * AT_D * 2;
    switch (what) {
        case LB_MK_READ_STATE: return {L.S, L.S ? (size_t)DN_H * DN_D * DN_D * 4 : 0};
        case LB_MK_READ_CONV: return {L.conv_state, L.conv_state ? (size_t)4 * DN_QKV * 4 : 0};
        case LB_MK_READ_KCACHE: return {L.kc, L.kc ? kv : 0};
        case LB_MK_READ_VCACHE: return {L.vc, L.vc ? kv : 0};
        default: return {nullptr, 0};
    }
}

}  // namespace

extern "C" LB_API int lb_mk_set_weight(void* handle, int kind, int layer, const void* host, uint64_t nbytes) {
    LB_CHECK_ARG(handle && host, "null argument");
    Handle* H = static_cast<Handle*>(handle);
    const Dest d = weight_dest(H, kind, layer);
    if (!d.ptr)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_set_weight: kind %d is not a tensor of layer %d", kind, layer);
    if (d.bytes != nbytes)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_set_weight: kind %d layer %d needs %zu bytes, got %llu", kind,
                             layer, d.bytes, (unsigned long long)nbytes);
    LB_CUDA_TRY(cudaMemcpy(d.ptr, host, d.bytes, cudaMemcpyHostToDevice));
    return LB_OK;
}

extern "C" LB_API int lb_mk_read(void* handle, int what, int layer, void* host, uint64_t nbytes) {
    LB_CHECK_ARG(handle && host, "null argument");
    Handle* H = static_cast<Handle*>(handle);
    LB_CHECK_ARG(!H->running, "a decode launch is in flight");
    const Dest d = read_src(H, what, layer);
    if (!d.ptr) return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_read: nothing of kind %d at layer %d", what, layer);
    if (d.bytes != nbytes)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_read: kind %d needs %zu bytes, got %llu", what, d.bytes,
                             (unsigned long long)nbytes);
    LB_CUDA_TRY(cudaMemcpy(host, d.ptr, d.bytes, cudaMemcpyDeviceToHost));
    return LB_OK;
}

extern "C" LB_API int lb_mk_decode_start(void* handle, const int32_t* forced, int n_forced, int n_steps,
                                         int want_logits) {
    LB_CHECK_ARG(handle, "null handle");
    Handle* H = static_cast<Handle*>(handle);
    LB_CHECK_ARG(!H->running, "a decode launch is already in flight");
    LB_CHECK_ARG(n_steps >= 1, "n_steps must be at least 1");
    LB_CHECK_ARG(n_forced >= 0 && n_forced <= n_steps && (n_forced == 0 || forced), "bad forced tokens");
    if (n_forced == 0 && H->pending < 0)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_decode: no pending token; feed a prompt first");
    if (H->pos + n_steps > H->cfg.max_context)
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_mk_decode: position %d + %d steps exceeds max_context %d", H->pos,
                             n_steps, H->cfg.max_context);
    for (int i = 0; i < n_forced; ++i)
        LB_CHECK_ARG(forced[i] >= 0 && forced[i] < H->cfg.vocab, "token id out of range");
    Params P = H->P;
    P.n_forced = n_forced;
    P.n_steps = n_steps;
    P.pos0 = H->pos;
    if (!want_logits) P.logits = nullptr;
    if (n_forced)
        LB_CUDA_TRY(cudaMemcpyAsync(const_cast<int*>(P.forced), forced, (size_t)n_forced * 4, cudaMemcpyHostToDevice,
                                    H->stream));
    // the barrier counter and the attention split counters (those reset themselves; zeroed too in case a
    // launch was abandoned)
    LB_CUDA_TRY(cudaMemsetAsync(P.bar, 0, (1 + AT_HQ) * 4, H->stream));
    // -1 marks tokens not yet produced, for lb_mk_decode_poll
    std::memset(H->host_tokens, 0xFF, (size_t)n_steps * 4);
    LB_CUDA_TRY(cudaEventRecord(H->ev0, H->stream));
    LB_CUDA_TRY((cudaError_t)launch(P, H->info.n_blocks, H->cfg.ring_hold, H->stream));
    LB_CUDA_TRY(cudaEventRecord(H->ev1, H->stream));
    H->running = n_steps;
    H->want_logits = want_logits;
    return LB_OK;
}

extern "C" LB_API int lb_mk_decode_poll(void* handle, int32_t* out_tokens, int* n_ready) {
    LB_CHECK_ARG(handle && n_ready, "null argument");
    Handle* H = static_cast<Handle*>(handle);
    const volatile int* t = H->host_tokens;
    int n = 0;
    while (n < H->running && t[n] >= 0) {
        if (out_tokens) out_tokens[n] = t[n];
        ++n;
    }
    *n_ready = n;
    return LB_OK;
}

extern "C" LB_API int lb_mk_decode_finish(void* handle, int32_t* out_tokens, float* logits) {
    LB_CHECK_ARG(handle, "null handle");
    Handle* H = static_cast<Handle*>(handle);
    LB_CHECK_ARG(H->running, "no decode launch in flight");
    const int n = H->running;
    H->running = 0;
    LB_CUDA_TRY(cudaStreamSynchronize(H->stream));
    H->pos += n;
    H->pending = H->host_tokens[n - 1];
    if (out_tokens) std::memcpy(out_tokens, H->host_tokens, (size_t)n * 4);
    if (logits && H->want_logits)
        LB_CUDA_TRY(cudaMemcpy(logits, H->P.logits, (size_t)H->cfg.vocab * 4, cudaMemcpyDeviceToHost));
    return LB_OK;
}

extern "C" LB_API int lb_mk_decode(void* handle, const int32_t* forced, int n_forced, int n_steps,
                                   int32_t* out_tokens, float* logits) {
    const int st = lb_mk_decode_start(handle, forced, n_forced, n_steps, logits != nullptr);
    if (st != LB_OK) return st;
    return lb_mk_decode_finish(handle, out_tokens, logits);
}

extern "C" LB_API int lb_mk_position(void* handle, int* n_past, int* pending) {
    LB_CHECK_ARG(handle && n_past && pending, "null argument");
    Handle* H = static_cast<Handle*>(handle);
    *n_past = H->pos;
    *pending = H->pending;
    return LB_OK;
}

extern "C" LB_API int lb_mk_last_time_ms(void* handle, float* ms) {
    LB_CHECK_ARG(handle && ms, "null argument");
    Handle* H = static_cast<Handle*>(handle);
    LB_CUDA_TRY(cudaEventElapsedTime(ms, H->ev0, H->ev1));
    return LB_OK;
}
