// Host-side launchers of the prefill ops (cuda/ops/{gemm_bf16,deltanet_chunked,attn_prefill,pf_small}.cu),
// used by cuda/prefill/prefill_08b.cu and by the ops' own C API entry points. Each returns a
// cudaError_t as int (the launch error; execution errors show at the next synchronising call).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace pf {

// ---- gemm_bf16.cu ----
// Y = X[M,K] · W[N,K]ᵀ, bf16 inputs (row-major as stored), fp32 accumulate on tensor cores.
enum { EPI_F32 = 0, EPI_RESID = 1, EPI_SWIGLU = 2 };
// EPI_F32: Y fp32 [M, N]; EPI_RESID: Y fp32 [M, N] += result; EPI_SWIGLU: W has 2N rows (gate rows
// [0, N), up rows [N, 2N)), Y bf16 [2][M, N] = SiLU(gate) * up as hi and lo parts. split_x: X is
// bf16 [2][M, K] (hi, lo parts; x ≈ hi + lo), else bf16 [M, K]. K % 32 == 0, N % 8 == 0.
int gemm_bf16(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, bool split_x, int sm_count,
              cudaStream_t s);
// Opt into the shared-memory sizes the GEMM variants need (once per device; idempotent).
int gemm_bf16_prepare();

// ---- gemm_cublas.cu ---- (cuBLAS loaded at run time: cuda/core/cublas_rt.cu)
// gemm_bf16's contract through one cublasGemmEx into fp32 scratch (gemm_cublas_scratch_bytes) and an
// epilogue kernel, on stream s through lb::blas (cuda/core/cublas_gemm.cuh). Returns an lb_status (the message
// recorded), not a cudaError_t: cuBLAS failures are not CUDA errors. Y 16-byte aligned.
size_t gemm_cublas_scratch_bytes(int M, int N, int epi, bool split_x);
// ldx (0: K): the row stride of X seen as [2M, K] (split) or [M, K]; at M = 1 with split_x, ldx = T * K reads row r
// of a [2][T][K] pair from X = pair + r * K (hi there, lo ldx further).
int gemm_cublas(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, bool split_x,
                float* scratch, cudaStream_t s, int ldx = 0);
// EPI_RESID into h [M, 1024] followed by the next layer part's RMSNorm: xb = rmsnorm_bf16(h, norm_w) as split bf16
// [2][M, 1024], in one epilogue kernel (one block a row) with the same bits as gemm_cublas(EPI_RESID) then
// rmsnorm_bf16. N must be 1024; scratch as gemm_cublas_scratch_bytes(M, 1024, EPI_RESID, split_x). An lb_status.
int gemm_cublas_resid_norm(const uint16_t* X, const uint16_t* W, float* h, const float* norm_w, uint16_t* xb, int M,
                           int N, int K, float eps, bool split_x, float* scratch, cudaStream_t s, int ldx = 0);
// EPI_F32 of a split X [2][M, K] as two cublasGemmEx into Y [M, N] (hi with beta 0, lo with beta 1): no scratch and
// no epilogue kernel (the 0.8B prefill's LUCEBOX_PREFILL_INPROJ=accumulate). An lb_status.
int gemm_cublas_f32_acc(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, cudaStream_t s);

// ---- deltanet_chunked.cu ---- (dk = dv = 128, chunk 64, everything fp32)
constexpr int DN_D = 128;
constexpr int DN_CHUNK = 64;
// Scratch of the chunked rule for T tokens and H heads, enough for either path (deltanet_chunked.cuh has both
// layouts); dn_scratch_bytes_old: the fp32 path's alone.
size_t dn_scratch_bytes(int T, int H);
size_t dn_scratch_bytes_old(int T, int H);
// Opt into the shared-memory sizes of the chunk kernels (idempotent).
int dn_prepare();
// q, k, v [H, T, 128] (q L2-normed and scaled by 1/sqrt(dk), k normed), g (log-decay), beta [H, T];
// state [H, dv, dk] (the megakernel's transposed layout) read and overwritten with the final state;
// o [T, H*128] token-major. On the tensor cores (deltanet_tc.cu) unless LUCEBOX_DN_PREFILL=old or the device lacks
// them (dn_tc_path says which).
int dn_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
               float* o, void* scratch, int T, int H, cudaStream_t s);
// dn_chunked followed by dn_gated_norm (H = 16) into xb; the tensor-core path fuses the norm into its output kernel
// and leaves o unwritten, the fp32 path uses o in between.
int dn_chunked_norm(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                    float* o, const float* z, int ldz, const float* norm, uint16_t* xb, void* scratch, int T, int H,
                    float eps, cudaStream_t s);
// One DeltaNet layer of the 0.8B prefill after its in-projection y [T, ldy] = [q | k | v | z | beta | alpha]: conv
// (history from and then into `ring`, as dn_conv_prep / dn_ring_write), the chunked rule on state, the gated norm
// into xb. The tensor-core path does the conv in its prep kernel (q and v written to q, v; k, g, beta, o unused);
// the fp32 path runs dn_conv_prep, dn_ring_write, dn_chunked and dn_gated_norm through q, k, v, g, beta, o. The
// tensor-core path's output kernel also does the ring write (dn::Out::ring): three launches.
int dn_layer(const float* y, int ldy, float* ring, const float* conv_w, const float* ssm_a, const float* dt_bias,
             const float* norm, float* state, float* q, float* k, float* v, float* g, float* beta, float* o,
             uint16_t* xb, void* scratch, int T, int pos0, float eps, cudaStream_t s);
// *tc = whether dn_chunked runs on the tensor cores on the current device (LUCEBOX_DN_PREFILL read once a process).
int dn_tc_path(bool* tc);
// Causal conv (kernel 4, history from the position ring `ring` [4, C], slot p % 4 = position p) +
// SiLU over the qkv part of y rows (row stride ldy), q/k L2 norms, beta and g; writes q, k, v
// [16, T, 128] and g, beta [16, T] (H = 16 heads, C = 6144 channels). pos0 = position of row 0.
int dn_conv_prep(const float* y, int ldy, const float* ring, const float* conv_w, const float* ssm_a,
                 const float* dt_bias, float* q, float* k, float* v, float* g, float* beta, int T, int pos0,
                 cudaStream_t s);
// ring slot (pos0 + t) % 4 <- pre-conv qkv of row t, for the last min(T, 4) rows (run after dn_conv_prep).
int dn_ring_write(const float* y, int ldy, float* ring, int T, int pos0, cudaStream_t s);
// xb[t, h*128 + d] = RMSNorm(o[t, h, :]) * norm[d] * SiLU(z[t, h*128 + d]) as split bf16 [2][T, 2048]
// (hi, lo parts), z row stride ldz.
int dn_gated_norm(const float* o, const float* z, int ldz, const float* norm, uint16_t* xb, int T, float eps,
                  cudaStream_t s);

// ---- attn_prefill.cu ---- (head_dim 256, 4 query heads per kv head)
constexpr int AT_D = 256;
// From the in-projection rows y [T, ldy] = [q/gate interleaved (n_heads*512) | k (n_kv*256) | v]:
// q -> RMSNorm1p(q_norm) + RoPE -> qf fp32 [T, n_heads, 256]; k -> norm + RoPE, v as is, both rounded to
// bf16 into the caches [n_kv, max_ctx, 256] at positions pos0 + t.
int attn_prep(const float* y, int ldy, const float* q_norm, const float* k_norm, float* qf, uint16_t* kc,
              uint16_t* vc, int T, int pos0, int n_heads, int n_kv, int max_ctx, float eps, float theta,
              cudaStream_t s);
// Causal attention of T queries at positions pos0 + t over cache rows [0, pos0 + t], online softmax in
// fp32; out split bf16 [2][T, n_heads*256] (hi, lo) = attention ⊙ sigmoid(gate[t*gate_ld + h*gate_hs + d]).
int attn_flash(const float* qf, const uint16_t* kc, const uint16_t* vc, const float* gate, int gate_ld, int gate_hs,
               uint16_t* out, int T, int pos0, int n_heads, int n_kv, int max_ctx, cudaStream_t s);
int attn_prepare();
// attn_flash's contract on the tensor cores: attn::run's causal tc::tree_kernel (cuda/ops/attn_decode.cu)
// writing the split pair itself, split-precision Q and P (~4e-6 relative RMS from the fp32 math). Splits
// along the keys when partials != nullptr and max_splits > 1: attn::partials_bytes(T, n_heads, max_splits)
// bytes. Any group n_heads / n_kv <= 8.
int attn_tc(const float* qf, const uint16_t* kc, const uint16_t* vc, const float* gate, int gate_ld, int gate_hs,
            uint16_t* out, void* partials, int max_splits, int T, int pos0, int n_heads, int n_kv, int max_ctx,
            cudaStream_t s);

// ---- pf_small.cu ----
// h[t, :] = embed[tok[t], :] as fp32 (HID = 1024).
int embed_gather(const uint16_t* embed, const int32_t* tok, float* h, int T, int hid, cudaStream_t s);
// xb = h[t, :] * rsqrt(mean(h²) + eps) * w as split bf16 [2][T, 1024] (hi, lo); hid = 1024.
int rmsnorm_bf16(const float* h, const float* w, uint16_t* xb, int T, int hid, float eps, cudaStream_t s);
// logits[v] = RMSNorm(h_row, w) · E[v, :] for one row (hid = 1024); block partial argmaxes into
// part_val/part_idx; returns the number of blocks through *n_part.
int lm_head(const float* h_row, const float* w, const uint16_t* E, float* logits, float* part_val, int* part_idx,
            int vocab, int hid, float eps, int* n_part, cudaStream_t s);
// *out = argmax over the partials (ties: lower index, like np.argmax); also *out2 if not null.
int argmax_reduce(const float* part_val, const int* part_idx, int n_part, int* out, int* out2, cudaStream_t s);
int lm_head_max_parts(int vocab);

}  // namespace pf
