/* lucebox.h: the whole C ABI of liblucebox.so, declared once. engines/_lib.py mirrors it in one
 * ctypes table; tests/unit/test_lib.py parses this file and checks every LB_API prototype against it.
 *
 * Rules for additions (see the sections at the end):
 *   - every exported function is declared here as `LB_API <ret> lb_<name>(...);` on its own;
 *     the library is built with -fvisibility=hidden, so only LB_API functions are exported;
 *   - functions return lb_status (int) unless they are pure queries; details go to lb_last_error();
 *   - parameters are scalars, pointers and POD structs of fixed-width fields (no C++ types, no enums
 *     by value: pass int); device pointers are `void*` / `const void*`; streams are `void*`
 *     (a cudaStream_t, NULL = the default stream);
 *   - a change to an existing signature or struct bumps LB_ABI_VERSION (and _lib.ABI_VERSION).
 *   - state lives behind an opaque handle with lb_<thing>_create / lb_<thing>_free; no globals.
 */
#ifndef LUCEBOX_H
#define LUCEBOX_H

#include <stddef.h>
#include <stdint.h>

#define LB_ABI_VERSION 1

#if defined(_WIN32)
#define LB_API __declspec(dllexport)
#else
#define LB_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================================================
 * Status codes. lb_last_error() holds the message of the last failure on the calling thread.
 * ================================================================================================ */
typedef enum lb_status {
    LB_OK = 0,
    LB_ERR_INVALID_ARG = 1,  /* a bad pointer, size or shape */
    LB_ERR_NO_DRIVER = 2,    /* no NVIDIA driver, or one too old for this CUDA runtime */
    LB_ERR_NO_DEVICE = 3,    /* a driver but no usable GPU */
    LB_ERR_CUDA = 4,         /* any other CUDA runtime error */
    LB_ERR_OUT_OF_MEMORY = 5,
    LB_ERR_UNSUPPORTED = 6,  /* not built for this arch, or a shape/type this op does not handle */
    LB_ERR_INTERNAL = 7,
    LB_ERR_NOT_FOUND = 8     /* an optional run-time library (cuBLAS) is not loaded or lacks a symbol */
} lb_status;

/* ================================================================================================
 * Core: ABI, build info, devices (cuda/core/build_info.cu)
 * ================================================================================================ */

/* Device facts for profile matching and doctor. Fixed-width fields only; mirrored in _lib.py. */
typedef struct lb_device_props {
    char name[256];
    int32_t cc_major;
    int32_t cc_minor;
    int32_t sm_count;
    int32_t max_threads_per_sm;
    uint64_t total_mem_bytes;
    int32_t smem_per_block_optin;  /* bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin */
    int32_t smem_per_sm;           /* bytes */
    int32_t l2_bytes;
    int32_t mem_clock_khz;         /* 0 when the driver does not report it */
    int32_t mem_bus_width_bits;    /* 0 when the driver does not report it */
    int32_t pci_bus_id;
} lb_device_props_t;

/* LB_ABI_VERSION as compiled into the library. */
LB_API int lb_abi_version(void);

/* JSON object: {"abi": 1, "archs": ["sm_86"], "arch_flag": "sm_86", "nvcc": "13.0.88",
 * "built": "...", "commit": "..."}. Static storage; never NULL. */
LB_API const char* lb_build_info(void);

/* Message of the last failed call on this thread ("" if none). Valid until the next failing call. */
LB_API const char* lb_last_error(void);

/* Number of usable GPUs. LB_OK, LB_ERR_NO_DRIVER or LB_ERR_NO_DEVICE (then *count = 0). Never crashes
 * on a machine without a GPU or driver. */
LB_API int lb_device_count(int* count);

/* Properties of device `dev`. */
LB_API int lb_device_props(int dev, lb_device_props_t* out);

/* CUDA driver and runtime versions as CUDA encodes them (13000 = 13.0); driver 0 = no driver. */
LB_API int lb_cuda_versions(int* driver_version, int* runtime_version);

/* Programmatic dependent launch (cuda/common/lb_pdl.cuh), an experiment, OFF by default: on = 1 lets the
 * ops that support it overlap the start of a kernel with the end of the one before it (sm_90+); measured
 * slower on the 27B step, and not yet correct with every op (see lb_pdl.cuh). LUCEBOX_PDL=1 at the first
 * launch turns it on. Returns the previous setting. Needs no GPU. */
LB_API int lb_set_pdl(int on);

/* ================================================================================================
 * Ops (cuda/ops/*.cu): one section per op, reachable from Python for tests.
 * ================================================================================================ */

/* ---- Prefill ops (cuda/ops/gemm_bf16.cu, deltanet_chunked.cu, attn_prefill.cu) ----------------
 * Device pointers and a stream (NULL = the legacy default stream); the launch returns at once. Used by
 * the 0.8B prefill (cuda/prefill/) and reachable here for tests. bf16 values are raw uint16 bits. */

/* gemm_bf16 epilogues. Y = X[m,k] · W[n,k]ᵀ, X and W bf16 row-major, fp32 accumulate (tensor cores). */
#define LB_GEMM_F32 0    /* y fp32 [m, n] = result */
#define LB_GEMM_RESID 1  /* y fp32 [m, n] += result */
#define LB_GEMM_SWIGLU 2 /* w has 2n rows (gate rows, then up rows); y bf16 [2, m, n] = SiLU(gate) * up as
                            a split pair: y[0] = bf16(v) (hi), y[1] = bf16(v - hi) (lo) */
#define LB_GEMM_SPLIT_X 8 /* OR-ed into the epilogue: x is bf16 [2, m, k], a split pair (x ≈ x[0] + x[1]),
                             two MMAs per fragment: near-fp32 inputs (the prefill uses it everywhere) */
/* k % 32 == 0, n % 8 == 0, any m >= 1. */
LB_API int lb_gemm_bf16(const void* x, const void* w, void* y, int m, int n, int k, int epilogue, void* stream);

/* lb_gemm_bf16's contract (same arguments, epilogues and split X) through cuBLAS (lb_cublas_load first:
 * LB_ERR_NOT_FOUND otherwise): one cublasGemmEx (bf16 inputs, fp32 compute and output) over both halves
 * of a split x at once into fp32 scratch, then an epilogue kernel that adds the halves and applies the
 * epilogue as gemm_bf16 does. y 16-byte aligned. A test entry: it makes a cuBLAS handle and scratch per
 * call and blocks until done (the prefill keeps both in its context). */
LB_API int lb_gemm_bf16_cublas(const void* x, const void* w, void* y, int m, int n, int k, int epilogue, void* stream);
/* The cuBLAS path's residual epilogue with the next RMSNorm inside it (the 0.8B prefill's fused step): h fp32
 * [m, 1024] += x · wᵀ (x split bf16 [2, m, k] when split_x, else [m, k]; w bf16 [1024, k]), then xb bf16 [2, m, 1024]
 * = rmsnorm(h) * norm_w as a split pair. The same bits as lb_gemm_bf16_cublas(LB_GEMM_RESID) followed by
 * lb_pf_rmsnorm_bf16. A test entry: blocks until done. */
LB_API int lb_gemm_bf16_cublas_resid_norm(const void* x, const void* w, void* h, const void* norm_w, void* xb, int m,
                                          int k, int split_x, float eps, void* stream);
/* The prefill's RMSNorm: xb bf16 [2, t, 1024] = h[t, :] * rsqrt(mean(h²) + eps) * w as a split pair (hi, lo). */
LB_API int lb_pf_rmsnorm_bf16(const void* h, const void* w, void* xb, int t, float eps, void* stream);

/* Device scratch bytes lb_deltanet_chunked needs for t tokens and h heads (0 for bad sizes). */
LB_API uint64_t lb_deltanet_chunked_scratch_bytes(int t, int h);
/* Chunked gated delta rule (chunk 64, dk = dv = 128), the math of cpu.py gated_delta_chunked: fp32 inputs and
 * outputs; the products on the tensor cores in split bf16 pairs (three MMAs each, ~6e-6 relative error) unless
 * LUCEBOX_DN_PREFILL=old (fp32 CUDA cores; read once per process), lb_deltanet_chunked_path says which.
 * q, k, v f32 [h, t, 128] (head-major; q L2-normed and scaled by 1/sqrt(128), k L2-normed); g (log
 * decay <= 0) and beta f32 [h, t]; state f32 [h, dv, dk] (the megakernel's transposed layout), read as
 * the initial state and overwritten with the final one; o f32 [t, h*128] (token-major). */
LB_API int lb_deltanet_chunked(const void* q, const void* k, const void* v, const void* g, const void* beta,
                               void* state, void* o, void* scratch, int t, int h, void* stream);
/* 1 where the chunked DeltaNet (lb_deltanet_chunked, lb_gdn_chunked, lb_gdn_prefill and the 0.8B prefill) runs on
 * the tensor cores on the current device, 0 where it runs the fp32 kernels; < 0 (an lb_status) on a CUDA error. */
LB_API int lb_deltanet_chunked_path(void);

/* Causal gated attention of t queries at positions pos0 .. pos0+t-1 over cache rows [0, pos] (head_dim
 * 256, n_heads == 4 * n_kv_heads), online softmax in fp32. qf f32 [t, n_heads, 256] (normed + RoPE'd,
 * unscaled); k_cache / v_cache bf16 [n_kv_heads, max_ctx, 256] (the rows of this prompt already
 * written); out bf16 [2, t, n_heads*256], a split pair (hi, lo as LB_GEMM_SWIGLU writes) of
 * softmax(q·Kᵀ/16)·V ⊙ sigmoid(gate[i*gate_ld + h*gate_hs + d]). */
LB_API int lb_attn_prefill(const void* qf, const void* k_cache, const void* v_cache, const void* gate, int gate_ld,
                           int gate_hs, void* out, int t, int pos0, int n_heads, int n_kv_heads, int max_ctx,
                           void* stream);
/* The same contract on the tensor cores (lb_attn_causal's kernel, split-precision Q and P: ~4e-6 relative
 * RMS from the fp32 math), any group n_heads / n_kv_heads <= 8, writing the split pair itself; what
 * lb_mk_prefill runs unless LUCEBOX_ATTN_PREFILL=fp32. Splits along the keys as lb_attn_causal
 * (partials: lb_attn_partials_bytes(t, n_heads, max_splits) bytes, or NULL). */
LB_API int lb_attn_prefill_tc(const void* qf, const void* k_cache, const void* v_cache, const void* gate, int gate_ld,
                              int gate_hs, void* out, void* partials, int max_splits, int t, int pos0, int n_heads,
                              int n_kv_heads, int max_ctx, void* stream);

/* ---- Quantized matrix ops (cuda/ops/gemv_q.cu, gemm_q_smalln.cu, quant_repack.cu) ------------
 * qtype is the ggml type id: 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K. W [n_rows, k] is in the DEVICE layout
 * (cuda/common/quant_blocks.cuh): the GGUF bytes for Q4_K / Q5_K; for Q6_K and Q8_0 the blocks with
 * their fp16 d moved to a trailing array (same byte count), made on the GPU by lb_quant_repack from the
 * GGUF bytes. k must be a multiple of 256. x / y are fp32 device pointers; X and Y of the small-N
 * form are column-major: vector j at X + j*k and Y + j*n_rows. accumulate = 0 writes y = W·x (zeroing
 * y first), 1 adds W·x to y (a fused residual add). fp16 dequantized weights and activations into fp32
 * tensor-core accumulation; split-K partial sums are added with fp32 atomics, so results are
 * reproducible to rounding, not bitwise. Launches return at once. */
#define LB_QT_Q8_0 8
#define LB_QT_Q4_K 12
#define LB_QT_Q5_K 13
#define LB_QT_Q6_K 14
/* A layout flag on qtype: LB_QT_Q4_K_TILED (268) is Q4_K in the tiled device layout, the same 144-byte blocks
 * ordered [n_rows/16][k/256][16 rows][144 B] (quant_blocks.cuh Q4_K_T; n_rows must be a multiple of 16), made by
 * lb_quant_repack(LB_QT_Q4_K_TILED, ...) from the GGUF bytes. Every op above and below that takes Q4_K takes it
 * (lb_gemv_q, lb_gemm_q_smalln in its shipped shapes, lb_gemm_q_smalln_seg, lb_dequant_f16, lb_gemm_q_cublas,
 * lb_df_embed_q); consecutive tiled tensors are one tiled tensor of their summed rows. */
#define LB_QT_TILED 0x100
#define LB_QT_Q4_K_TILED (LB_QT_Q4_K | LB_QT_TILED)
/* LB_QT_Q6_K_TILED (270) is Q6_K in its tiled device layout: tiles of 16 rows × one 256-block, [n_rows/16][k/256],
 * each the 16 GGUF blocks' 3360 bytes with their fp16 d inside the tile and the 16-byte pieces in the order of the
 * n = 1 GEMV's lanes (quant_blocks.cuh Q6_K_T; n_rows a multiple of 16), made by lb_quant_repack(LB_QT_Q6_K_TILED,
 * ...) from the GGUF bytes. lb_gemv_q, lb_gemm_q_smalln, lb_dequant_f16, lb_gemm_q_cublas and lb_df_embed_q take it
 * (not lb_gemm_q_smalln_seg). */
#define LB_QT_Q6_K_TILED (LB_QT_Q6_K | LB_QT_TILED)

/* Bytes of a [n_rows, k] tensor of qtype (GGUF and device layout alike); 0 for a bad shape or type (a tiled qtype
 * with n_rows not a multiple of 16 included). */
LB_API uint64_t lb_quant_bytes(int qtype, int n_rows, int k);
/* GGUF bytes (device, src) → device layout (dst, another buffer). */
LB_API int lb_quant_repack(int qtype, const void* src, void* dst, int n_rows, int k, void* stream);
/* Random device-layout weights (small positive fp16 scales, random quants) for benchmarks. */
LB_API int lb_quant_fill_random(int qtype, void* dst, int n_rows, int k, uint64_t seed, void* stream);
/* y[n_rows] (+)= W · x[k] */
LB_API int lb_gemv_q(int qtype, const void* w, int n_rows, int k, const float* x, float* y, int accumulate,
                     void* stream);
/* ya[rows_a] (+)= Wa · x[k] and yb[rows_b] (+)= Wb · x[k]: two lb_gemv_q of the same x. Wa Q6_K_T (270) and Wb
 * Q4_K_T (268) run as one launch (the 27B DeltaNet decode's attn_qkv and attn_gate + ssm_beta + ssm_alpha), unless
 * LUCEBOX_QKV_ZBA=0 (read once per process); any other pair of types, or that switch, is lb_gemv_q(a) then lb_gemv_q(b).
 * Results are the two calls' up to the order of fp32 atomics. */
LB_API int lb_gemv_q_pair(int qtype_a, const void* wa, int rows_a, float* ya, int qtype_b, const void* wb, int rows_b,
                          float* yb, int k, const float* x, int accumulate, void* stream);
/* 1 when lb_gemv_q_pair runs these two types as one launch in this process, else 0. */
LB_API int lb_gemv_q_pair_merged(int qtype_a, int qtype_b);
/* Y[n_rows, n] (+)= W · X[k, n], n = 1..64; every weight is read once for all n columns. */
LB_API int lb_gemm_q_smalln(int qtype, const void* w, int n_rows, int k, const float* x, int n, float* y,
                            int accumulate, void* stream);
/* Mean milliseconds per call of the n-column op on random weights, rotating over enough weight copies
 * to cover twice the L2 (so it measures HBM), accumulate = 1 (kernels only). Blocks. */
LB_API int lb_bench_qmm(int qtype, int n_rows, int k, int n, int iters, float* ms_out);
/* One product over nseg (1..4) matrices that sit back to back in one weight stream (seg_rows[i] rows each,
 * summing to n_rows), segment i's rows written to ys[i] as [n, seg_rows[i]] (column-major, as Y above); n >= 2,
 * Q4_K or Q5_K (consecutive tensors of these are one tensor of their summed rows: the caller vouches for that),
 * the shipped kernel shapes (lb_qmm_smalln_select does not apply). */
LB_API int lb_gemm_q_smalln_seg(int qtype, const void* w, int n_rows, int k, const float* x, int n, int nseg,
                                const int* seg_rows, float* const* ys, int accumulate, void* stream);
/* Which kernel lb_gemm_q_smalln runs, for A/B measurements (tests/gpu/test_qmm_smalln.py):
 * 0 the shipped choice (default; at n = 33..64 the same as 8), 1 the register kernel of qmm.cuh for every
 * n, 2..7 the x-staged kernel of qmm_smalln.cuh at n = 2..32 in launch shape A..F (n > 32 on the register
 * kernel); 8, 9 the shipped choice at n <= 32 and the x-staged kernel at n = 33..64 in launch shape G (2 row
 * tiles × 8 warps), H (1 × 16) with 6 column tiles up to n = 48 and 8 above; 10, 11 shapes G, H with 8
 * column tiles at every n = 33..64 (cuda/ops/gemm_q_smalln.cu,
 * docs/perf.md "small-N v2"). Process-wide; needs no GPU; other values fail with LB_ERR_INVALID_ARG. */
LB_API int lb_qmm_smalln_select(int which);

/* ---- cuBLAS at run time (cuda/core/cublas_rt.cu) -------------------------------------------------
 * The toolkit that builds lucebox has no cuBLAS; GPU machines often have one (the nvidia-cublas Python
 * wheels that torch installs). lb_cublas_load dlopen()s `path` (NULL or "": the sonames libcublas.so.13,
 * libcublas.so.12, libcublas.so on the loader's search path; a libcublasLt.so.* beside a named path is
 * opened first) and resolves cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasGemmEx (and
 * cublasSetMathMode, cublasGetProperty when present). Process-wide, like the loader's own state: once one
 * is loaded later calls return LB_OK and keep it; it is never unloaded. LB_ERR_NOT_FOUND (dlerror()'s
 * reasons in lb_last_error) when nothing loads: a normal state, callers keep their own kernels. Needs
 * no GPU. */
LB_API int lb_cublas_load(const char* path);
/* 1 when a cuBLAS is loaded, else 0 (a pure query). path (n bytes with the NUL; NULL: skipped) gets the
 * file the loader opened ("" when none); *version (NULL: skipped) major*10000 + minor*100 + patch, 0 if
 * unknown or none. */
LB_API int lb_cublas_loaded(char* path, int n, int* version);

/* ---- fp16 dequantization and the cuBLAS quantized GEMM (cuda/ops/dequant_f16.cu, gemm_q_cublas.cu) --------
 * For wide products (the 27B prefill's passes of hundreds of rows): dequantize W to fp16 once per call, then
 * tensor-core GEMMs through cuBLAS, loaded at run time (cuda/core/cublas_gemm.cuh). */
/* out_f16 [rows, k] (fp16, row-major, 16-byte aligned) = rows [row0, row0 + rows) of W [n_rows, k] of qtype
 * in the device layout (n_rows: the whole tensor's, which places the trailing d arrays of Q6_K / Q8_0). Each
 * value is ggml's dequantization in fp32 (the gguf package's numbers) rounded to fp16 (RN), bit for bit. */
LB_API int lb_dequant_f16(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out_f16,
                          void* stream);
/* 1 when a cuBLAS is loaded (lb_cublas_load) and a handle starts on the current device, else 0. */
LB_API int lb_blas_ready(void);
/* Scratch bytes of lb_gemm_q_cublas for n columns and fp16 weight chunks of chunk_rows rows:
 * align256(2·n·k) + align256(2·chunk_rows·k) (0 for a bad shape). */
LB_API uint64_t lb_gemm_q_cublas_scratch_bytes(int n, int k, int64_t chunk_rows);
/* lb_gemm_q_smalln's product and layouts (x fp32 [n, k], y fp32 [n, n_rows], both token-major; accumulate 0:
 * y = W·x, 1: y += W·x) for any n >= 1: x to fp16 in the scratch, then per row chunk (as many rows as the rest
 * of the scratch holds, a multiple of 128 when shorter than W) lb_dequant_f16 and one cublasGemmEx (fp16 in,
 * fp32 accumulate). scratch: 256-byte aligned, at least lb_gemm_q_cublas_scratch_bytes(n, k, 1) bytes. x 16-byte
 * aligned. LB_ERR_NOT_FOUND "cuBLAS not loaded" (before any CUDA work) when lb_blas_ready() is 0.
 * qtype LB_QT_F16 (here and in the two _x16 forms): W is already fp16 row-major [n_rows, k] (16-byte aligned, k a
 * multiple of 256; e.g. lb_dequant_f16's output kept resident), one cublasGemmEx over all rows, no weight chunk
 * written (the scratch still holds x16 in this form). */
#define LB_QT_F16 1
LB_API int lb_gemm_q_cublas(int qtype, const void* w, int64_t n_rows, int k, const float* x, int n, float* y,
                            int accumulate, void* scratch, uint64_t scratch_bytes, void* stream);
/* x fp32 → out fp16 (round to nearest), count a multiple of 8, both 16-byte aligned. */
LB_API int lb_f32_to_f16(const float* x, int64_t count, void* out, void* stream);
/* lb_gemm_q_cublas with x already in fp16 (x16 [n, k], 16-byte aligned, e.g. from lb_f32_to_f16), so that several
 * matrices reading one input convert it once; scratch (256-byte aligned) holds only the fp16 weight chunks: at
 * least 2·k bytes, rows as it holds. */
LB_API int lb_gemm_q_cublas_x16(int qtype, const void* w, int64_t n_rows, int k, const void* x16, int n, float* y,
                                int accumulate, void* scratch, uint64_t scratch_bytes, void* stream);
/* lb_gemm_q_cublas_x16 with an fp16 Y: y16 [n, n_rows] token-major (16-byte aligned), cuBLAS's fp32 accumulator
 * rounded to fp16 by its epilogue. accumulate must be 0 (LB_ERR_INVALID_ARG otherwise: an fp16 Y is only written).
 * The 27B prefill's gate + up as one GEMM over both tensors, read by lb_df_swiglu_f16_rows. */
LB_API int lb_gemm_q_cublas_x16_h(int qtype, const void* w, int64_t n_rows, int k, const void* x16, int n, void* y16,
                                  int accumulate, void* scratch, uint64_t scratch_bytes, void* stream);
/* Y[n, n_rows] (+)= X16[n, k] · W16[n_rows, k]^T, W16 fp16 already (an lb_dequant_f16 output), on cuBLAS. */
LB_API int lb_gemm_f16w_cublas(const void* w16, int64_t n_rows, int k, const void* x16, int n, float* y,
                               int accumulate, void* stream);
/* The SMs cuBLAS sizes its GEMMs for on the current device (cublasSetSmCountTarget; 0 = all), so that a side
 * stream's kernels find room beside them. LB_ERR_UNSUPPORTED where the loaded cuBLAS has no such call. */
LB_API int lb_cublas_set_sm_target(int sms);

/* ---- Device buffers (cuda/ops/dev_buffers.cu): for callers without another CUDA binding --------- */
LB_API int lb_dev_alloc(uint64_t nbytes, void** out);
LB_API int lb_dev_free(void* ptr);
LB_API int lb_dev_h2d(void* dst, const void* src, uint64_t nbytes);
LB_API int lb_dev_d2h(void* dst, const void* src, uint64_t nbytes);
LB_API int lb_dev_memset(void* dst, int byte, uint64_t nbytes);
LB_API int lb_dev_sync(void);
/* A CUDA stream with default flags (it synchronises with the legacy default stream, so the blocking
 * lb_dev_* copies above stay ordered against its kernels), for an engine's launches; kernels launched
 * with programmatic dependent launch overlap their boundaries on it (cuda/common/lb_pdl.cuh).
 * lb_stream_destroy(NULL) does nothing. */
LB_API int lb_stream_create(void** out);
LB_API int lb_stream_destroy(void* stream);

/* ---- CUDA graphs, events, mapped host memory (cuda/core/graph.cu) -----------------------------
 * lb_graph_begin starts capturing `stream` (an lb_stream_create stream, not NULL; thread-local mode);
 * the calls that follow on that stream are recorded, not run, until lb_graph_end, which instantiates
 * them into *exec (an opaque executable graph) and leaves capture mode even when it fails: an unsafe
 * call inside the capture (a synchronous copy, an allocation, legacy-stream work) or a failed launch
 * makes it fail with LB_ERR_CUDA and *exec = NULL. lb_graph_launch replays the whole graph on a stream
 * with the arguments it was captured with (what must vary lives in device memory the kernels read). */
LB_API int lb_graph_begin(void* stream);
LB_API int lb_graph_end(void* stream, void** exec);
LB_API int lb_graph_launch(void* exec, void* stream);
LB_API int lb_graph_destroy(void* exec);
/* Events without timing, for the host to follow queued work: record on a stream, query (*done = 1 when
 * everything before the record finished), wait. */
LB_API int lb_event_create(void** out);
LB_API int lb_event_record(void* event, void* stream);
LB_API int lb_event_query(void* event, int* done);
LB_API int lb_event_sync(void* event);
LB_API int lb_event_destroy(void* event);
/* Pinned host memory mapped into the device's address space (the same pointer on both sides:
 * unified addressing; LB_ERR_UNSUPPORTED without it): kernels write results the host reads after an
 * event, with no copy queued. */
LB_API int lb_host_alloc(uint64_t nbytes, void** out);
LB_API int lb_host_free(void* ptr);

/* ---- 27B DeltaNet (cuda/ops/gdn_conv.cu, gdn_delta.cu, gdn_chunked.cu) ------------------------
 * Any Hk key heads and Hv value heads (Hv % Hk == 0; value head p reads key head p % Hk), dk = dv = 128,
 * fp32 everywhere, the layouts of lucebox_cli/engines/cpu.py: pre-conv inputs pre [t, ld_pre] (first
 * C = 2*Hk*128 + Hv*128 columns, [q | k | v]); a, b [t, Hv] (ssm_alpha / ssm_beta projections); z
 * [t, Hv*128]; conv_w [C, 4]; ssm_a, dt_bias [Hv]; norm_w [128]; conv_state [3, C] (last 3 pre-conv
 * inputs, oldest first); state [Hv, 128 (dk), 128 (dv)]; post-prep q, k [t, Hk, 128] (L2-normed, q also
 * / sqrt(128)), v [t, Hv, 128], g (log decay) and beta [t, Hv]; o [t, Hv, 128]; y [t, Hv*128].
 * Tree slots: parents [n] int32 on the device, parents[0] == -1, parents[i] < i, n <= 64. */

/* Conv + SiLU + norms + g, beta. parents NULL: t tokens in sequence (update_conv advances the conv
 * state); parents set: each slot's conv window follows its ancestry, the conv state is left alone. */
LB_API int lb_gdn_conv_prep(const void* pre, int ld_pre, const void* a, const void* b, const void* conv_w,
                            const void* ssm_a, const void* dt_bias, void* conv_state, const void* parents, void* q,
                            void* k, void* v, void* g, void* beta, int t, int hk, int hv, int update_conv,
                            void* stream);
/* y = RMSNorm(o) * norm_w * SiLU(z) per value head (z row stride ld_z). */
LB_API int lb_gdn_out_norm(const void* o, const void* z, int ld_z, const void* norm_w, void* y, int t, int hv,
                           float eps, void* stream);
/* Host: save_idx[i] = compact index of slot i's saved state or -1 (saved iff some child != i + 1);
 * *n_saves = how many states lb_gdn_delta / lb_gdn_tree_verify write to `saves`. */
LB_API int lb_gdn_tree_plan(const int32_t* parents, int n, int32_t* save_idx, int* n_saves);
/* The delta rule over n steps. parents NULL: in sequence (recurrent / decode); parents set: tree slots
 * (state kept on chip along the spine, reloaded from `saves` [max_saves, Hv, 128, 128] after a branch).
 * write_state 1 stores the final state (sequence), 0 leaves it (verify). */
LB_API int lb_gdn_delta(const void* q, const void* k, const void* v, const void* g, const void* beta, void* state,
                        void* o, const void* parents, void* saves, int max_saves, int n, int hk, int hv,
                        int write_state, void* stream);
/* After a verify: replay the accepted slots' saved inputs k, v, g, beta (the tree's [n_slots, ...]
 * buffers) onto state in place, and set conv_state to the last 3 inputs along the path. path [n] int32
 * on the device: the accepted slots, root first. */
LB_API int lb_gdn_commit(const void* k, const void* v, const void* g, const void* beta, const void* pre, int ld_pre,
                         void* state, void* conv_state, const void* path, int n, int hk, int hv, void* stream);
/* Scratch of lb_gdn_decode_step for t tokens. */
LB_API uint64_t lb_gdn_step_scratch_bytes(int t, int hk, int hv);
/* t tokens (1 for decode) of one layer through the recurrent form: conv_prep (advancing conv_state),
 * delta (advancing state), out_norm into y. pre has ld C, z has ld Hv*128. At t == 1 on sm_90 one fused
 * kernel does all three (scratch unused; LUCEBOX_GDN_DECODE=split keeps the three kernels). */
LB_API int lb_gdn_decode_step(const void* pre, const void* a, const void* b, const void* z, const void* conv_w,
                              const void* ssm_a, const void* dt_bias, const void* norm_w, void* conv_state,
                              void* state, void* y, void* scratch, int t, int hk, int hv, float eps, void* stream);
/* 1 where lb_gdn_decode_step(t, hk, hv) runs one fused kernel on the current device (t == 1, Hv / Hk <= 8,
 * sm_90 clusters, LUCEBOX_GDN_DECODE != "split"), 0 where it runs conv_prep + delta + out_norm. */
LB_API int lb_gdn_decode_path(int t, int hk, int hv);
/* Verify of one layer: conv_prep along parents into the caller's q, k, v, g, beta (keep them for
 * lb_gdn_commit), the tree delta into o (state and conv_state are only read), out_norm into y. */
LB_API int lb_gdn_tree_verify(const void* pre, const void* a, const void* b, const void* z, const void* conv_w,
                              const void* ssm_a, const void* dt_bias, const void* norm_w, const void* conv_state,
                              const void* state, const void* parents, void* q, void* k, void* v, void* g,
                              void* beta, void* o, void* saves, int max_saves, void* y, int n, int hk, int hv,
                              float eps, void* stream);
/* Chunked (chunk 64) form over post-prep inputs, state advanced in place; scratch of
 * lb_gdn_chunked_scratch_bytes(t, hv). */
LB_API uint64_t lb_gdn_chunked_scratch_bytes(int t, int hv);
LB_API int lb_gdn_chunked(const void* q, const void* k, const void* v, const void* g, const void* beta, void* state,
                          void* o, void* scratch, int t, int hk, int hv, void* stream);
/* A prompt segment of one layer: conv_prep + chunked rule + out_norm (pre ld C, z ld Hv*128). */
LB_API uint64_t lb_gdn_prefill_scratch_bytes(int t, int hk, int hv);
LB_API int lb_gdn_prefill(const void* pre, const void* a, const void* b, const void* z, const void* conv_w,
                          const void* ssm_a, const void* dt_bias, const void* norm_w, void* conv_state, void* state,
                          void* y, void* scratch, int t, int hk, int hv, float eps, void* stream);
/* lb_gdn_prefill with z rows of stride ld_z floats and a, b rows of stride ld_ab (e.g. one [t, ld] GEMM output of
 * back-to-back tensors: attn_gate | ssm_beta | ssm_alpha, or ssm_beta | ssm_alpha): ld_z >= hv*128 and a multiple
 * of 4, z 16-byte aligned, ld_ab >= hv. LB_ERR_UNSUPPORTED unless the DeltaNet prefill runs on the tensor cores
 * (lb_deltanet_chunked_path() == 1). */
LB_API int lb_gdn_prefill_ld(const void* pre, const void* a, const void* b, const void* z, int ld_z, int ld_ab,
                             const void* conv_w, const void* ssm_a, const void* dt_bias, const void* norm_w,
                             void* conv_state, void* state, void* y, void* scratch, int t, int hk, int hv, float eps,
                             void* stream);

/* ---- 27B gated attention (cuda/ops/attn_rope.cu, attn_decode.cu, attn_tree.cu) ---------------------
 * head_dim 256, any n_heads / n_kv_heads with at most 8 query heads per kv head (head h reads kv head
 * h / (n_heads / n_kv_heads)). KV cache of one layer: k_cache, v_cache [n_kv_heads, max_ctx, 256] of
 * f16 or bf16 (kv_dtype). qf fp32 [t, n_heads, 256] (normed, RoPE'd, unscaled); the output gate of
 * query t, head h, dim d is gate[t*gate_ld + h*gate_hs + d] (the q projection: gate_ld = n_heads*512,
 * gate_hs = 512, pointer at +256); out fp32 [t, n_heads*256] = softmax(q.K^T/16).V * sigmoid(gate).
 * partials (lb_attn_partials_bytes(t, n_heads, max_splits) bytes, or NULL) lets a launch split the keys
 * over up to max_splits blocks per kv head (flash-decoding), about two blocks per SM. */
#define LB_KV_F16 0
#define LB_KV_BF16 1
/* RMSNorm1p (weights with the +1) of q heads (from qg [t, ld_q], head h = [q | gate] at h*512) and of
 * k [t, ld_kv]; RoPE of dims [0, rope_dims) (i pairs with i + rope_dims/2) at positions[t] (device
 * int32, or NULL: pos0 + t); qf out; K, V into cache row pos0 + t (tree slots: pos0 = n_past). */
LB_API int lb_attn_prep(const void* qg, int ld_q, const void* k, const void* v, int ld_kv, const void* q_norm,
                        const void* k_norm, const void* positions, int pos0, void* qf, void* k_cache, void* v_cache,
                        int kv_dtype, int t, int n_heads, int n_kv_heads, int max_ctx, int rope_dims, float eps,
                        float theta, void* stream);
/* lb_attn_prep with k [t, ld_k] and v [t, ld_v] of their own row strides (ld_kv is both in lb_attn_prep): a
 * prefill's q | k | v written by one GEMM of back-to-back tensors, or q | k by one and v by another. */
LB_API int lb_attn_prep_ld(const void* qg, int ld_q, const void* k, int ld_k, const void* v, int ld_v,
                           const void* q_norm, const void* k_norm, const void* positions, int pos0, void* qf,
                           void* k_cache, void* v_cache, int kv_dtype, int t, int n_heads, int n_kv_heads, int max_ctx,
                           int rope_dims, float eps, float theta, void* stream);
LB_API uint64_t lb_attn_partials_bytes(int t, int n_heads, int max_splits);
/* One query over cache rows [0, n_ctx) (its own K/V already at row n_ctx - 1). */
LB_API int lb_attn_decode(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype, const void* gate,
                          int gate_ld, int gate_hs, void* out, void* partials, int max_splits, int n_ctx, int n_heads,
                          int n_kv_heads, int max_ctx, void* stream);
/* n tree slots: slot i sees rows [0, n_past) and row n_past + j for each bit j of masks[i] (device
 * uint64 [n], its ancestors and itself); the slots' K/V are at rows n_past + slot. */
LB_API int lb_attn_tree(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype, const void* gate,
                        int gate_ld, int gate_hs, void* out, void* partials, int max_splits, const void* masks, int n,
                        int n_past, int n_heads, int n_kv_heads, int max_ctx, void* stream);
/* t prompt tokens at positions pos0 .. pos0 + t - 1 over rows [0, pos] (flash-style). */
LB_API int lb_attn_causal(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype, const void* gate,
                          int gate_ld, int gate_hs, void* out, void* partials, int max_splits, int t, int pos0,
                          int n_heads, int n_kv_heads, int max_ctx, void* stream);
/* Graph forms (a pass captured once, replayed at every n_past): pos0 / n_past read on the device from
 * a device int32 (pos0_dev, n_past_dev) when the kernels run. The split count of the split-KV forms is
 * then fixed by the SM count and max_splits (splits past the context come out empty), and the host
 * can not check the rows: the caller keeps *pos0_dev + t <= max_ctx. Same math as the forms above. */
LB_API int lb_attn_prep_at(const void* qg, int ld_q, const void* k, const void* v, int ld_kv, const void* q_norm,
                           const void* k_norm, const void* positions, const void* pos0_dev, void* qf, void* k_cache,
                           void* v_cache, int kv_dtype, int t, int n_heads, int n_kv_heads, int max_ctx, int rope_dims,
                           float eps, float theta, void* stream);
/* lb_attn_decode with n_ctx = *n_past_dev + 1 (the query's own K/V at row *n_past_dev). */
LB_API int lb_attn_decode_at(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype, const void* gate,
                             int gate_ld, int gate_hs, void* out, void* partials, int max_splits,
                             const void* n_past_dev, int n_heads, int n_kv_heads, int max_ctx, void* stream);
LB_API int lb_attn_tree_at(const void* qf, const void* k_cache, const void* v_cache, int kv_dtype, const void* gate,
                           int gate_ld, int gate_hs, void* out, void* partials, int max_splits, const void* masks,
                           int n, const void* n_past_dev, int n_heads, int n_kv_heads, int max_ctx, void* stream);
/* One decode step (t = 1) of a layer in one kernel (cuda/ops/attn_decode_fused.cu): lb_attn_prep of the
 * token at row n_past (qg [n_heads*512], k / v [n_kv_heads*256]; K, V into cache row n_past) and
 * lb_attn_decode over rows [0, n_past] with the gate from qg (gate_ld = n_heads*512, gate_hs = 512);
 * out fp32 [n_heads*256]. Split-KV (partials of lb_attn_partials_bytes(1, n_heads, max_splits) bytes and
 * max_splits > 1) needs tickets: n_kv_heads uint32 counters, zero before the first call; every call
 * leaves them zero. qf (fp32 [n_heads*256]) is scratch, written only under LUCEBOX_ATTN_DECODE=split
 * (read once per process), which runs lb_attn_prep + lb_attn_decode's three kernels instead. */
LB_API int lb_attn_decode_fused(const void* qg, const void* k, const void* v, const void* q_norm, const void* k_norm,
                                int n_past, void* qf, void* k_cache, void* v_cache, int kv_dtype, void* out,
                                void* partials, int max_splits, void* tickets, int n_heads, int n_kv_heads,
                                int max_ctx, int rope_dims, float eps, float theta, void* stream);
/* lb_attn_decode_fused with n_past = *n_past_dev (graph form; the caller keeps *n_past_dev < max_ctx). */
LB_API int lb_attn_decode_fused_at(const void* qg, const void* k, const void* v, const void* q_norm,
                                   const void* k_norm, const void* n_past_dev, void* qf, void* k_cache, void* v_cache,
                                   int kv_dtype, void* out, void* partials, int max_splits, void* tickets,
                                   int n_heads, int n_kv_heads, int max_ctx, int rope_dims, float eps, float theta,
                                   void* stream);

/* ================================================================================================
 * Megakernel (cuda/megakernel/*.cu): persistent 0.8B decode kernel behind an opaque handle.
 * ================================================================================================ */

/* Specialised for the Qwen3.5-0.8B widths (hidden 1024, DeltaNet 16x128, attention 8/2x256, FFN 3584);
 * only the layer count (layer i is attention iff (i+1) % 4 == 0) and the vocab vary. BF16 weights,
 * fp32 activations and recurrent state, bf16 KV cache. One cooperative launch runs n_steps tokens with
 * a device-side greedy token loop. Prefill is the same kernel fed the prompt one token per step
 * (correct, not fast: no tensor-core prefill yet). */
typedef struct lb_mk_config {
    int32_t n_layers;
    int32_t vocab;
    int32_t max_context;    /* KV cache rows; pos + n_steps must stay within it */
    int32_t n_blocks;       /* 0: sm_count * blocks_per_sm; refused if more than can be co-resident */
    int32_t blocks_per_sm;  /* 0: 1 (the profile's build.megakernel.blocks_per_sm) */
    int32_t threads;        /* 0 or 512 (the profile's build.megakernel.threads; only 512 is built) */
    int32_t device;
    float rms_eps;
    float rope_theta;
    /* Per-warp weight ring (mk_gemv.cuh); 0 = the largest that fits (today 3 slots of 4 KB on a 227 KB
     * card). Slots 2..8, slot bytes 1024, 2048 or 4096; refused if they do not fit the shared memory.
     * For measuring how many weight bytes in flight the critical loads can stand (docs/perf.md). */
    int32_t ring_slots;
    int32_t ring_slot_bytes;
    /* 0: a warp refills each slot as soon as it has read it; 1: refills of chunks for later phases wait until
     * the next GEMV phase starts (after its grid barrier and prologue), so the barrier's round trip does not
     * queue behind them (an experiment: docs/perf.md "All-block timeline and ring_hold"). */
    int32_t ring_hold;
} lb_mk_config_t;

typedef struct lb_mk_info {
    int32_t n_blocks;
    int32_t threads;
    int32_t nslots;            /* weight-ring slots per warp (1-4 KB chunks in flight) */
    int32_t max_blocks_per_sm; /* occupancy query at this shared-memory size */
    int32_t sm_count;
    int32_t max_splits;        /* attention context splits per head */
    uint64_t smem_bytes;       /* dynamic shared memory per block */
    uint64_t weight_bytes;     /* device bytes of weights */
    uint64_t state_bytes;      /* recurrent + conv state + KV cache */
} lb_mk_info_t;

/* Weight kinds for lb_mk_set_weight (GGUF tensor names, internal layout of docs/internals.md).
 * Matrices are bf16 bits [out, in] row-major; vectors are fp32. */
#define LB_MK_TOKEN_EMBD 0   /* bf16 [vocab, 1024], also the tied LM head; layer ignored */
#define LB_MK_OUTPUT_NORM 1  /* f32 [1024]; layer ignored */
#define LB_MK_ATTN_NORM 2    /* f32 [1024] */
#define LB_MK_POST_NORM 3    /* f32 [1024] */
#define LB_MK_FFN_GATE 4     /* bf16 [3584, 1024] */
#define LB_MK_FFN_UP 5       /* bf16 [3584, 1024] */
#define LB_MK_FFN_DOWN 6     /* bf16 [1024, 3584] */
#define LB_MK_ATTN_QKV 7     /* DeltaNet: bf16 [6144, 1024] */
#define LB_MK_ATTN_GATE 8    /* DeltaNet z: bf16 [2048, 1024] */
#define LB_MK_SSM_BETA 9     /* bf16 [16, 1024] */
#define LB_MK_SSM_ALPHA 10   /* bf16 [16, 1024] */
#define LB_MK_SSM_OUT 11     /* bf16 [1024, 2048] */
#define LB_MK_SSM_CONV1D 12  /* f32 [6144, 4] */
#define LB_MK_SSM_A 13       /* f32 [16] = -exp(A_log) */
#define LB_MK_SSM_DT 14      /* f32 [16] */
#define LB_MK_SSM_NORM 15    /* f32 [128] */
#define LB_MK_ATTN_Q 16      /* attention: bf16 [4096, 1024], per head [q | gate] */
#define LB_MK_ATTN_K 17      /* bf16 [512, 1024] */
#define LB_MK_ATTN_V 18      /* bf16 [512, 1024] */
#define LB_MK_ATTN_OUTPUT 19 /* bf16 [1024, 2048] */
#define LB_MK_ATTN_Q_NORM 20 /* f32 [256] */
#define LB_MK_ATTN_K_NORM 21 /* f32 [256] */

/* What lb_mk_read copies back (tests). */
#define LB_MK_READ_STATE 0   /* f32 [16 (v head), 128 (dv), 128 (dk)]: S transposed, of DeltaNet layer `layer` */
#define LB_MK_READ_CONV 1    /* f32 [4, 6144]: pre-conv inputs, slot p % 4 holds position p */
#define LB_MK_READ_KCACHE 2  /* bf16 [2, max_context, 256] of attention layer `layer` */
#define LB_MK_READ_VCACHE 3  /* bf16 [2, max_context, 256] */
#define LB_MK_READ_HIDDEN 4  /* f32 [1024]: residual stream after the last step (before the final norm) */
#define LB_MK_READ_LOGITS 5  /* f32 [vocab] of the last decode call that asked for logits */

LB_API int lb_mk_create(const lb_mk_config_t* cfg, void** handle);
LB_API int lb_mk_free(void* handle);
LB_API int lb_mk_get_info(void* handle, lb_mk_info_t* out);
/* Copy one tensor (host memory, nbytes must match the kind) into the device weights. */
LB_API int lb_mk_set_weight(void* handle, int kind, int layer, const void* host, uint64_t nbytes);
/* Forget every token: zero the recurrent and conv state, position 0. Weights stay. */
LB_API int lb_mk_reset(void* handle);
/* Fill activations, partials and the logits buffer with NaN (tests: unwritten outputs show). */
LB_API int lb_mk_poison(void* handle);
/* Run n_steps tokens from the current position. Step s feeds forced[s] for s < n_forced, else the
 * previous step's argmax (step 0 with n_forced == 0 feeds the pending token, the last argmax).
 * out_tokens[s] (host, n_steps) = argmax after step s; logits (host [vocab] or NULL) = the last step's.
 * Blocks until done. */
LB_API int lb_mk_decode(void* handle, const int32_t* forced, int n_forced, int n_steps, int32_t* out_tokens,
                        float* logits);
/* Streaming form: start the launch, poll how many tokens are in host-visible memory, then finish
 * (which waits and fills out_tokens / logits like lb_mk_decode). */
LB_API int lb_mk_decode_start(void* handle, const int32_t* forced, int n_forced, int n_steps, int want_logits);
LB_API int lb_mk_decode_poll(void* handle, int32_t* out_tokens, int* n_ready);
LB_API int lb_mk_decode_finish(void* handle, int32_t* out_tokens, float* logits);
/* Position of the next token, and the pending token (argmax of the last step, -1 if none). */
LB_API int lb_mk_position(void* handle, int* n_past, int* pending);
/* Kernel time of the last launch in milliseconds (CUDA events). */
LB_API int lb_mk_last_time_ms(void* handle, float* ms);
LB_API int lb_mk_read(void* handle, int what, int layer, void* host, uint64_t nbytes);

/* ---- Tensor-core prefill (cuda/prefill/prefill_08b.cu) over a megakernel handle ----------------
 * A prefill context borrows a megakernel handle (free the context first) and owns scratch for
 * max_chunk tokens (0: 2048); longer prompts run in segments of max_chunk. lb_mk_prefill appends n
 * tokens at the handle's position with tensor-core GEMMs, the chunked DeltaNet and tensor-core attention,
 * writing the K/V cache, conv ring and recurrent state exactly as lb_mk_decode reads them, the
 * pending token (the last position's argmax, fed by the next lb_mk_decode with n_forced = 0) and the
 * LB_MK_READ_LOGITS / LB_MK_READ_HIDDEN buffers. logits (host [vocab]) and argmax_out may be NULL.
 * Blocks until done; lb_mk_last_time_ms then reports its GPU time. */
LB_API int lb_mk_prefill_create(void* mk_handle, int max_chunk, void** prefill);
/* Which GEMMs a prefill context runs, chosen once at creation (lb_mk_prefill_create is AUTO): */
#define LB_PREFILL_GEMM_AUTO 0   /* cuBLAS when lb_cublas_load has loaded one and a handle starts, else OWN */
#define LB_PREFILL_GEMM_OWN 1    /* cuda/ops/gemm_bf16.cu */
#define LB_PREFILL_GEMM_CUBLAS 2 /* cuBLAS (lb_gemm_bf16_cublas's math), with fp32 scratch of 2 * max_chunk *
                                    8224 floats; LB_ERR_NOT_FOUND when none is loaded */
LB_API int lb_mk_prefill_create_ex(void* mk_handle, int max_chunk, int gemm, void** prefill);
/* The GEMM path of a context: LB_PREFILL_GEMM_OWN or LB_PREFILL_GEMM_CUBLAS (-1 for NULL). A pure query. */
LB_API int lb_mk_prefill_gemm(void* prefill);
/* The attention of a context, fixed at creation: 1 tensor cores (lb_attn_prefill_tc), 0 fp32 (lb_attn_prefill,
 * under LUCEBOX_ATTN_PREFILL=fp32), -1 for NULL. A pure query. */
LB_API int lb_mk_prefill_attn(void* prefill);
LB_API int lb_mk_prefill_free(void* prefill);
LB_API int lb_mk_prefill(void* prefill, const int32_t* tokens, int n, float* logits, int32_t* argmax_out);

/* ================================================================================================
 * DFlash (cuda/dflash/*.cu): 27B target prefill / verify / commit, draft forward.
 * ================================================================================================ */

/* ---- 27B target engine helpers (cuda/dflash/df_small.cu), used by engines/dflash.py ---------------
 * fp32 device pointers unless stated; launches return at once on `stream`. */
/* y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w for t rows of n (w holds RMSNorm1p's +1). The
 * same launch sets zero0_bytes bytes at zero0 and zero1_bytes at zero1 to 0 (each pointer 16-byte
 * aligned, bytes a multiple of 4, overlapping neither x nor y; NULL and 0: no range): the outputs of
 * the projections that read y, which then accumulate onto zeros (accumulate = 1) with no memset. */
LB_API int lb_df_rmsnorm(const void* x, const void* w, void* y, int t, int n, float eps, void* zero0,
                         uint64_t zero0_bytes, void* zero1, uint64_t zero1_bytes, void* stream);
/* y[i] = SiLU(g[i]) * u[i], i < count. */
LB_API int lb_df_swiglu(const void* g, const void* u, void* y, uint64_t count, void* stream);
/* lb_df_rmsnorm (no zero ranges) and lb_df_swiglu with fp16 outputs, rounded to nearest: the same bits as the fp32
 * op followed by lb_f32_to_f16, for the GEMMs of a cuBLAS pass (lb_gemm_q_cublas_x16). */
LB_API int lb_df_rmsnorm_f16(const void* x, const void* w, void* y16, int t, int n, float eps, void* stream);
LB_API int lb_df_swiglu_f16(const void* g, const void* u, void* y16, uint64_t count, void* stream);
/* y16[r, j] = SiLU(gu16[r, j]) * gu16[r, ffn + j] for t rows: gu16 fp16 [t, 2·ffn] (rows of [gate | up], an
 * lb_gemm_q_cublas_x16_h output), y16 fp16 [t, ffn]; fp32 math and rounding as lb_df_swiglu_f16 (the same bits on
 * the same values). */
LB_API int lb_df_swiglu_f16_rows(const void* gu16, void* y16, int t, int ffn, void* stream);
/* Stream-ordered device-to-device copy of nbytes. */
LB_API int lb_df_copy(void* dst, const void* src, uint64_t nbytes, void* stream);
/* Commit of a verify's K or V rows: cache [heads, max_ctx, row] of 16-bit words, row n_past + j <-
 * row n_past + path[j] for j = 0..n-1 in order (path: device int32, the accepted slots, root first). */
LB_API int lb_df_kv_compact(void* cache, const void* path, int n, int n_past, int heads, int max_ctx, int row,
                            void* stream);
/* ---- argmax / top-K over logits rows (cuda/dflash/df_argmax.cu) ------------------------------------
 * ids[r, 0..k) (int32) = the k best columns of row r of x [rows, ld] fp32, best first; vals (optional,
 * may be null) their values. Order: NaN above every number, then larger value; ties (equal values, or
 * two NaNs) to the lower column, so k = 1 equals np.argmax. 1 <= k <= 8, k <= cols, rows <= 65535.
 * scratch: lb_df_topk_scratch_bytes(rows, cols, k) bytes, reused by the next call. */
LB_API uint64_t lb_df_topk_scratch_bytes(int rows, int cols, int k);
LB_API int lb_df_topk(const void* x, int rows, int cols, int ld, int k, void* scratch, void* ids, void* vals,
                      void* stream);
/* ---- device-resident greedy loop (cuda/dflash/df_embed.cu) ----------------------------------------
 * out[i, :] (fp32 [t, k]) = row ids[i] (device int32 [t]) of W [n_rows, k] of qtype (Q4_K, Q5_K, Q6_K,
 * Q8_0) in the device layout, dequantized as ggml does; an id outside [0, n_rows) gives a NaN row. */
LB_API int lb_df_embed_q(int qtype, const void* w, int n_rows, int k, const void* ids, int t, void* out,
                         void* stream);
/* The greedy step's tail, one thread: state (device int32 [3]) = {n_past, token, steps}; token = ids[0],
 * ring[steps % ring_n] = ids[0] (ring: lb_host_alloc memory the host reads after the step's event),
 * steps += 1, n_past += 1. */
LB_API int lb_df_greedy_advance(void* state, const void* ids, void* ring, int ring_n, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* LUCEBOX_H */
