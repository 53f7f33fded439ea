// C API of the 0.8B decode megakernel: handle lifetime, weight upload, launch, state readback.
// Device memory: one bf16 blob (weights), one fp32 blob (norms, conv, ssm vectors), one state blob
// (DeltaNet state, conv ring, KV cache) and small scratch buffers; host-visible mapped token buffer.
#include <algorithm>
#include <cstring>
#include <new>

#include "lb_check.cuh"
#include "lucebox.h"
#include "mk_handle.h"

using namespace mk;

namespace {

size_t layer_w_elems(int l) {
    const size_t m_in = is_attn_layer(l) ? AT_IN : DN_IN;
    return m_in * HID + (size_t)HID * DN_Z + (size_t)2 * FFN * HID + (size_t)HID * FFN;
}

constexpr size_t LAYER_F = 2 * HID + DN_QKV * 4 + 2 * DN_H + DN_D + 2 * AT_D;  // fp32 vectors per layer

size_t layer_state_bytes(int l, int max_ctx) {
    if (is_attn_layer(l)) return (size_t)2 * AT_HKV * max_ctx * AT_D * 2;
    return ((size_t)DN_H * DN_D * DN_D + 4 * DN_QKV) * 4;
}

int choose_geometry(Handle* H) {
    const lb_mk_config_t& c = H->cfg;
    cudaDeviceProp prop;
    LB_CUDA_TRY(cudaGetDeviceProperties(&prop, c.device));
    const int bps = c.blocks_per_sm > 0 ? c.blocks_per_sm : 1;
    // Shared memory per block: the opt-in limit, shared between co-resident blocks of one SM.
    size_t budget = prop.sharedMemPerBlockOptin;
    if (bps > 1) budget = std::min(budget, prop.sharedMemPerMultiprocessor / bps - 1024);
    // Per-warp weight rings (mk_gemv.cuh): the largest slot size that still leaves every warp 3 slots in
    // flight, then as many slots as fit (at most MAX_WSLOTS), unless the config names the ring.
    int wslots = 0, slot_bytes = 0;
    if (c.ring_hold < 0 || c.ring_hold > 1)
        return lb::set_error(LB_ERR_INVALID_ARG, "megakernel: ring_hold %d; need 0 or 1", c.ring_hold);
    if (c.ring_slots || c.ring_slot_bytes) {
        const int sb = c.ring_slot_bytes;
        if (c.ring_slots < 2 || c.ring_slots > MAX_WSLOTS || (sb != 1024 && sb != 2048 && sb != 4096))
            return lb::set_error(LB_ERR_INVALID_ARG,
                                 "megakernel: weight ring of %d slots x %d B; need 2..%d slots of 1024, 2048 or 4096 B",
                                 c.ring_slots, sb, MAX_WSLOTS);
        if (smem_bytes(c.ring_slots, sb) > budget)
            return lb::set_error(LB_ERR_UNSUPPORTED,
                                 "megakernel: a weight ring of %d slots x %d B needs %zu B of shared memory per "
                                 "block, the device gives %zu",
                                 c.ring_slots, sb, smem_bytes(c.ring_slots, sb), budget);
        wslots = c.ring_slots;
        slot_bytes = sb;
    } else {
        for (int sb = 4096; sb >= 1024 && wslots < 3; sb /= 2) {
            slot_bytes = sb;
            wslots = budget > smem_bytes(0, sb) ? (int)((budget - smem_bytes(0, sb)) / ((size_t)WARPS * sb)) : 0;
        }
        wslots = std::min(wslots, MAX_WSLOTS);
    }
    if (wslots < 2)
        return lb::set_error(LB_ERR_UNSUPPORTED, "megakernel: %zu B of shared memory per block is too little", budget);
    const size_t smem = smem_bytes(wslots, slot_bytes);
    LB_CUDA_TRY((cudaError_t)prepare(smem));
    int maxb = 0;
    LB_CUDA_TRY((cudaError_t)max_blocks_per_sm(smem, &maxb));
    const int n_blocks = c.n_blocks > 0 ? c.n_blocks : prop.multiProcessorCount * bps;
    if (maxb < 1 || n_blocks > maxb * prop.multiProcessorCount)
        return lb::set_error(LB_ERR_UNSUPPORTED,
                             "megakernel: %d blocks requested but only %d x %d SMs can be co-resident "
                             "(%d threads, %zu B shared memory each)",
                             n_blocks, maxb, prop.multiProcessorCount, THREADS, smem);
    if (!prop.cooperativeLaunch)
        return lb::set_error(LB_ERR_UNSUPPORTED, "megakernel: device %d has no cooperative launch", c.device);
    H->info.n_blocks = n_blocks;
    H->info.threads = THREADS;
    H->info.nslots = wslots;
    H->slot_bytes = slot_bytes;
    H->info.max_blocks_per_sm = maxb;
    H->info.sm_count = prop.multiProcessorCount;
    H->info.max_splits = std::max(1, std::min(AT_MAX_SPLITS, n_blocks / AT_HQ));
    H->info.smem_bytes = smem;
    return LB_OK;
}

int allocate(Handle* H) {
    const lb_mk_config_t& c = H->cfg;
    size_t w_elems = (size_t)c.vocab * HID, s_bytes = 0;
    for (int l = 0; l < c.n_layers; ++l) {
        w_elems += layer_w_elems(l);
        s_bytes += layer_state_bytes(l, c.max_context);
    }
    LB_CUDA_TRY(cudaMalloc(&H->wblob, w_elems * 2));
    LB_CUDA_TRY(cudaMalloc(&H->fblob, (LAYER_F * c.n_layers + HID) * 4));
    LB_CUDA_TRY(cudaMalloc(&H->sblob, s_bytes));
    const size_t n_part = (size_t)AT_HQ * H->info.max_splits * AT_PART;
    const size_t n_scr = HID + DN_IN + DN_Z + 2 * FFN + n_part + AT_O + H->info.n_blocks + (size_t)c.vocab;
    LB_CUDA_TRY(cudaMalloc(&H->scratch, n_scr * 4));
    const size_t n_iscr = (size_t)H->info.n_blocks + 2 + AT_HQ + c.max_context;
    LB_CUDA_TRY(cudaMalloc(&H->iscratch, n_iscr * 4));
    LB_CUDA_TRY(cudaMemset(H->iscratch, 0, n_iscr * 4));
    LB_CUDA_TRY(cudaHostAlloc(&H->host_tokens, (size_t)c.max_context * 4, cudaHostAllocMapped));
    LB_CUDA_TRY(cudaMalloc(&H->d_layers, sizeof(Layer) * c.n_layers));
    LB_CUDA_TRY(cudaStreamCreateWithFlags(&H->stream, cudaStreamNonBlocking));
    LB_CUDA_TRY(cudaEventCreate(&H->ev0));
    LB_CUDA_TRY(cudaEventCreate(&H->ev1));
    H->info.weight_bytes = w_elems * 2 + (LAYER_F * c.n_layers + HID) * 4;
    H->info.state_bytes = s_bytes;
    H->state_bytes = s_bytes;
    return LB_OK;
}

// Carve the blobs into per-layer pointers and fill the kernel parameters.
int wire(Handle* H) {
    const lb_mk_config_t& c = H->cfg;
    uint16_t* w = H->wblob + (size_t)c.vocab * HID;
    float* f = H->fblob;
    uint8_t* s = H->sblob;
    H->layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        Layer& L = H->layers[l];
        L = Layer{};
        L.is_attn = is_attn_layer(l);
        L.m_in = L.is_attn ? AT_IN : DN_IN;
        L.w_in = w; w += (size_t)L.m_in * HID;
        L.w_out = w; w += (size_t)HID * DN_Z;
        L.w_gu = w; w += (size_t)2 * FFN * HID;
        L.w_down = w; w += (size_t)HID * FFN;
        L.norm1 = f; f += HID;
        L.norm2 = f; f += HID;
        L.conv_w = f; f += DN_QKV * 4;
        L.ssm_a = f; f += DN_H;
        L.dt_bias = f; f += DN_H;
        L.ssm_norm = f; f += DN_D;
        L.q_norm = f; f += AT_D;
        L.k_norm = f; f += AT_D;
        if (L.is_attn) {
            L.kc = reinterpret_cast<uint16_t*>(s); s += (size_t)AT_HKV * c.max_context * AT_D * 2;
            L.vc = reinterpret_cast<uint16_t*>(s); s += (size_t)AT_HKV * c.max_context * AT_D * 2;
        } else {
            L.S = reinterpret_cast<float*>(s); s += (size_t)DN_H * DN_D * DN_D * 4;
            L.conv_state = reinterpret_cast<float*>(s); s += (size_t)4 * DN_QKV * 4;
        }
    }
    H->out_norm = f;
    LB_CUDA_TRY(cudaMemcpy(H->d_layers, H->layers.data(), sizeof(Layer) * c.n_layers, cudaMemcpyHostToDevice));
    Params& P = H->P;
    P.layers = H->d_layers;
    P.n_layers = c.n_layers;
    P.vocab = c.vocab;
    P.embed = H->wblob;
    P.out_norm = H->out_norm;
    float* x = H->scratch;
    P.h = x; x += HID;
    P.y_in = x; x += DN_IN;
    P.o_buf = x; x += DN_Z;
    P.gu = x; x += 2 * FFN;
    P.attn_part = x; x += (size_t)AT_HQ * H->info.max_splits * AT_PART;
    P.attn_out = x; x += AT_O;
    P.am_val = x; x += H->info.n_blocks;
    P.logits = x;
    int* ix = H->iscratch;
    P.am_idx = ix; ix += H->info.n_blocks;
    P.bar = reinterpret_cast<unsigned*>(ix); ix += 1;
    P.attn_cnt = reinterpret_cast<unsigned*>(ix); ix += AT_HQ;
    P.last_token = ix; ix += 1;
    P.forced = ix;
    LB_CUDA_TRY(cudaHostGetDevicePointer((void**)&P.host_tokens, H->host_tokens, 0));
    P.max_ctx = c.max_context;
    P.max_splits = H->info.max_splits;
    P.wslots = H->info.nslots;
    P.slot_bytes = H->slot_bytes;
    P.eps = c.rms_eps;
    P.rope_theta = c.rope_theta;
    return LB_OK;
}

void destroy(Handle* H) {
    cudaFree(H->d_layers);
    cudaFree(H->wblob);
    cudaFree(H->fblob);
    cudaFree(H->sblob);
    cudaFree(H->scratch);
    cudaFree(H->iscratch);
    if (H->host_tokens) cudaFreeHost(H->host_tokens);
    if (H->ev0) cudaEventDestroy(H->ev0);
    if (H->ev1) cudaEventDestroy(H->ev1);
    if (H->stream) cudaStreamDestroy(H->stream);
    delete H;
}

}  // namespace

extern "C" LB_API int lb_mk_create(const lb_mk_config_t* cfg, void** handle) {
    LB_CHECK_ARG(cfg && handle, "null argument");
    *handle = nullptr;
    LB_CHECK_ARG(cfg->n_layers >= 1 && cfg->n_layers <= MAX_LAYERS, "n_layers must be 1..24");
    LB_CHECK_ARG(cfg->vocab >= 1, "vocab must be positive");
    LB_CHECK_ARG(cfg->max_context >= 1, "max_context must be positive");
    if (cfg->threads != 0 && cfg->threads != THREADS)
        return lb::set_error(LB_ERR_UNSUPPORTED, "megakernel: built for %d threads per block, profile asks %d",
                             THREADS, cfg->threads);
    LB_API_BEGIN
    Handle* H = new Handle();
    H->cfg = *cfg;
    int st = cudaSetDevice(cfg->device) == cudaSuccess ? LB_OK
                                                       : lb::set_cuda_error(cudaGetLastError(), "cudaSetDevice",
                                                                            __FILE__, __LINE__);
    if (st == LB_OK) st = choose_geometry(H);
    if (st == LB_OK) st = allocate(H);
    if (st == LB_OK) st = wire(H);
    if (st != LB_OK) {
        destroy(H);
        return st;
    }
    *handle = H;
    return lb_mk_reset(H);
    LB_API_END
}

extern "C" LB_API int lb_mk_free(void* handle) {
    if (!handle) return LB_OK;
    Handle* H = static_cast<Handle*>(handle);
    if (H->running) cudaStreamSynchronize(H->stream);
    destroy(H);
    return LB_OK;
}

extern "C" LB_API int lb_mk_get_info(void* handle, lb_mk_info_t* out) {
    LB_CHECK_ARG(handle && out, "null argument");
    *out = static_cast<Handle*>(handle)->info;
    return LB_OK;
}

extern "C" LB_API int lb_mk_reset(void* handle) {
    LB_CHECK_ARG(handle, "null handle");
    Handle* H = static_cast<Handle*>(handle);
    LB_CHECK_ARG(!H->running, "a decode launch is in flight");
    LB_CUDA_TRY(cudaMemset(H->sblob, 0, H->state_bytes));
    LB_CUDA_TRY(cudaMemset(H->P.last_token, 0, 4));
    H->pos = 0;
    H->pending = -1;
    return LB_OK;
}

extern "C" LB_API int lb_mk_poison(void* handle) {
    LB_CHECK_ARG(handle, "null handle");
    Handle* H = static_cast<Handle*>(handle);
    const size_t n_part = (size_t)AT_HQ * H->info.max_splits * AT_PART;
    const size_t n_scr = HID + DN_IN + DN_Z + 2 * FFN + n_part + AT_O + H->info.n_blocks + (size_t)H->cfg.vocab;
    // 0xFF bytes are a NaN in fp32; h is poisoned too: every step rewrites it from the embedding
    LB_CUDA_TRY(cudaMemset(H->scratch, 0xFF, n_scr * 4));
    LB_CUDA_TRY(cudaMemset(H->P.am_idx, 0xFF, (size_t)H->info.n_blocks * 4));
    return LB_OK;
}
