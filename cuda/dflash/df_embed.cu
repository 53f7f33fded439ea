// The device-resident greedy loop of the 27B target engine (engines/dflash.py, greedy_tokens): the
// embedding row of a token id that lives in device memory, and the step's tail that turns the argmax
// into the next step's input. With both inside the captured decode step, step s + 1 needs nothing from
// the host, so the host queues several steps ahead and only reads tokens as they land.
//
// Embedding rows are dequantized from the quantized token_embd in the device layout of
// cuda/common/quant_blocks.cuh (Q4_K / Q5_K: GGUF blocks; tiled Q4_K: the same blocks in 16-row tiles; Q6_K: 208-byte bodies then one fp16 d per
// block; tiled Q6_K: 16-row tiles of 3360 bytes, d inside; Q8_0: int8 [rows, K] then fp16 d [rows, K/32]), in fp32 with the formulas of ggml's
// dequantize_row_* (the CPU engine's numbers: gguf_io dequantizes the same bytes the same way).
#include <cuda_fp16.h>
#include <stdint.h>

#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "quant_blocks.cuh"

namespace {

__device__ __forceinline__ float ld_half(const uint8_t* p) {
    return __half2float(__ushort_as_half((uint16_t)(p[0] | (p[1] << 8))));
}

// K-quant 6-bit (scale, min) of sub-block is (0..7) from the 12 packed bytes (ggml get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int is, const uint8_t* q, int& sc, int& m) {
    if (is < 4) {
        sc = q[is] & 63;
        m = q[is + 4] & 63;
    } else {
        sc = (q[is + 4] & 0xF) | ((q[is - 4] >> 6) << 4);
        m = (q[is + 4] >> 4) | ((q[is] >> 6) << 4);
    }
}

// Weight j (0..255) of 256-block b (row-major block index; for the tiled Q4_K_T / Q6_K_T the tiled one) of a [n_rows, k]
// tensor.
template <int QT>
__device__ __forceinline__ float dequant(const uint8_t* w, int64_t n_blocks, int64_t b, int j, int64_t row, int k,
                                         int cb) {
    using namespace lb::q;
    if constexpr (QT == Q4_K || QT == Q5_K || QT == Q4_K_T) {  // 144 B / 176 B: d, dmin, scales[12], (qh[32]), qs[128]
        const uint8_t* blk = w + b * (QT == Q5_K ? 176 : 144);
        const uint8_t* qs = blk + (QT == Q5_K ? 48 : 16);
        const int g = j / 64, l = j % 64, is = j / 32;
        int q = l < 32 ? (qs[g * 32 + l] & 0xF) : (qs[g * 32 + l - 32] >> 4);
        if constexpr (QT == Q5_K) q += ((blk[16 + (l & 31)] >> is) & 1) << 4;
        int sc, m;
        scale_min_k4(is, blk + 4, sc, m);
        return ld_half(blk) * (float)sc * (float)q - ld_half(blk + 2) * (float)m;
    } else if constexpr (QT == Q6_K) {  // Q6_K body [ql 128 | qh 64 | scales 16], d after all bodies
        const uint8_t* blk = w + b * 208;
        const int n = j / 128, r = j % 128, l = r % 32, qq = r / 32;
        const uint8_t* ql = blk + 64 * n;
        const uint8_t qh = blk[128 + 32 * n + l];
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n);
        const uint8_t lo = (qq & 1) ? ql[l + 32] : ql[l];
        const int q = ((qq & 2) ? (lo >> 4) : (lo & 0xF)) | (((qh >> (2 * qq)) & 3) << 4);
        return ld_half(w + n_blocks * 208 + b * 2) * (float)sc[l / 16 + 2 * qq] * (float)(q - 32);
    } else if constexpr (QT == Q6_K_T) {  // the same bytes at their places in tile b / 16 (q6t_offset)
        const uint8_t* tile = w + (b >> 4) * Q6T::kBytes;
        const int r16 = (int)(b & 15);
        const int n = j / 128, r = j % 128, l = r % 32, qq = r / 32;
        const uint8_t qh = tile[q6t_offset(r16, 128 + 32 * n + l)];
        const int8_t sc = (int8_t)tile[q6t_offset(r16, 192 + 8 * n + l / 16 + 2 * qq)];
        const uint8_t lo = tile[q6t_offset(r16, 64 * n + l + ((qq & 1) ? 32 : 0))];
        const int q = ((qq & 2) ? (lo >> 4) : (lo & 0xF)) | (((qh >> (2 * qq)) & 3) << 4);
        return ld_half(tile + q6t_offset(r16, 208)) * (float)sc * (float)(q - 32);
    } else {  // Q8_0: qs int8 [rows, k], then d [rows, k / 32]
        const int64_t col = (int64_t)cb * 256 + j;
        const int8_t q = reinterpret_cast<const int8_t*>(w)[row * k + col];
        // n_blocks 256-weight units: the qs bytes end at w + n_blocks * 256 (= rows * k)
        return ld_half(w + n_blocks * 256 + (row * k + col) / 32 * 2) * (float)q;
    }
}

// grid (t, k / 256), 256 threads: out[i, cb*256 + j] = row ids[i] of w. An id outside [0, n_rows) gives
// NaN (a bad token shows in the logits instead of reading another tensor's bytes).
template <int QT>
__global__ void __launch_bounds__(256) embed_kernel(const uint8_t* __restrict__ w, int n_rows, int k,
                                                    const int32_t* __restrict__ ids, float* __restrict__ out) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int i = blockIdx.x, cb = blockIdx.y, j = threadIdx.x;
    const int32_t row = ids[i];
    float v = __int_as_float(0x7fc00000);
    if (row >= 0 && row < n_rows) {
        const int64_t nb_row = k / 256, n_blocks = (int64_t)n_rows * nb_row;
        v = dequant<QT>(w, n_blocks, lb::q::block_index<lb::q::is_tiled(QT)>(row, cb, nb_row), j, row, k, cb);
    }
    out[(int64_t)i * k + (int64_t)cb * 256 + j] = v;
}

// The greedy step's tail (one thread): state = {n_past, token, steps}. The argmax ids[0] becomes the
// token the next step embeds, goes to ring[steps % ring_n] (mapped host memory the host reads after
// this step's event), and n_past and steps advance.
__global__ void advance_kernel(int32_t* state, const int32_t* __restrict__ ids, int32_t* ring, int ring_n) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int32_t tok = ids[0], step = state[2];
    state[1] = tok;
    ring[step % ring_n] = tok;
    state[2] = step + 1;
    state[0] += 1;
    __threadfence_system();
}

}  // namespace

extern "C" LB_API int lb_df_embed_q(int qtype, const void* w, int n_rows, int k, const void* ids, int t, void* out,
                                    void* stream) {
    LB_CHECK_ARG(w && ids && out, "null pointer");
    LB_CHECK_ARG(n_rows >= 1 && k >= 256 && k % 256 == 0 && t >= 1 && t <= 65535, "need k a multiple of 256, 1 <= t <= 65535");
    const dim3 grid((unsigned)t, (unsigned)(k / 256));
    const auto* W = static_cast<const uint8_t*>(w);
    const auto* I = static_cast<const int32_t*>(ids);
    auto* O = static_cast<float*>(out);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (qtype) {
        case LB_QT_Q4_K: LB_CUDA_TRY(lb::launch_pdl(embed_kernel<12>, grid, dim3(256), 0, s, W, n_rows, k, I, O)); break;
        case LB_QT_Q4_K_TILED:
            LB_CHECK_ARG(n_rows % 16 == 0, "tiled Q4_K needs n_rows a multiple of 16");
            LB_CUDA_TRY(lb::launch_pdl(embed_kernel<LB_QT_Q4_K_TILED>, grid, dim3(256), 0, s, W, n_rows, k, I, O));
            break;
        case LB_QT_Q5_K: LB_CUDA_TRY(lb::launch_pdl(embed_kernel<13>, grid, dim3(256), 0, s, W, n_rows, k, I, O)); break;
        case LB_QT_Q6_K: LB_CUDA_TRY(lb::launch_pdl(embed_kernel<14>, grid, dim3(256), 0, s, W, n_rows, k, I, O)); break;
        case LB_QT_Q6_K_TILED:
            LB_CHECK_ARG(n_rows % 16 == 0, "tiled Q6_K needs n_rows a multiple of 16");
            LB_CUDA_TRY(lb::launch_pdl(embed_kernel<LB_QT_Q6_K_TILED>, grid, dim3(256), 0, s, W, n_rows, k, I, O));
            break;
        case LB_QT_Q8_0: LB_CUDA_TRY(lb::launch_pdl(embed_kernel<8>, grid, dim3(256), 0, s, W, n_rows, k, I, O)); break;
        default:
            return lb::set_error(LB_ERR_UNSUPPORTED, "lb_df_embed_q: qtype %d (Q4_K, Q5_K, Q6_K, Q8_0, tiled Q4_K, tiled Q6_K)",
                                 qtype);
    }
    return LB_OK;
}

extern "C" LB_API int lb_df_greedy_advance(void* state, const void* ids, void* ring, int ring_n, void* stream) {
    LB_CHECK_ARG(state && ids && ring && ring_n >= 1, "null pointer or empty ring");
    LB_CUDA_TRY(lb::launch_pdl(advance_kernel, dim3(1), dim3(1), 0, static_cast<cudaStream_t>(stream),
                               static_cast<int32_t*>(state), static_cast<const int32_t*>(ids),
                               static_cast<int32_t*>(ring), ring_n));
    return LB_OK;
}
