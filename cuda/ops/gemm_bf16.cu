// gemm_bf16: Y[M,N] = X[M,K] · W[N,K]ᵀ on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate),
// with the prefill's fused epilogues (fp32 store, residual add, SwiGLU of gate/up into bf16).
//
// Why this shape: the prefill GEMMs are skinny (M = prompt tokens, a few hundred) and K = 1024..3584,
// so a 3-stage cp.async pipeline of BK = 32 slices and 8 warps per block keeps tensor cores fed on
// sm_86 and sm_90 alike. Tiles are 128x128, 64x128 or 64x64, the largest that still gives every SM a
// block (N = 1024 outputs at M = 520 need 64x64 to fill 132 SMs). Rows past M and weight rows past N
// are zero-filled by cp.async and never stored, so any M works (37, 520, ...).
// Smem rows are padded to 40 bf16 (80 B): the 8 row addresses of one ldmatrix fall on distinct banks.
// Split X (SPLIT): X is [2][M][K], a bf16 hi part and the bf16 rounding of the remainder (x ≈ hi + lo,
// ~16 significant bits); two MMAs per fragment give near-fp32 inputs. A plain bf16 X loses 2^-9 per
// input, which over 24 layers of a random-weight model moves the logits by ~2.6% (measured on the H200
// and reproduced on the CPU engine), against ~1e-5 with the split. The SwiGLU output is written split.
// Later (issue 6): a wgmma + TMA path for sm_90a; mma.sync reaches only part of Hopper's tensor rate.
#include "lb_check.cuh"
#include "lucebox.h"
#include "pf_common.cuh"
#include "pf_ops.h"

namespace pf {
namespace {

constexpr int BK = 32;
constexpr int SK = BK + 8;  // padded smem row, in bf16
constexpr int STAGES = 3;
constexpr int THREADS = 256;

template <int BM, int BN, bool SPLIT>
constexpr size_t gemm_smem() {
    return (size_t)STAGES * ((SPLIT ? 2 : 1) * BM + BN) * SK * 2;
}

// Warps are 2 (M) x 4 (N); a warp owns a WM x WN tile = MT x NT mma tiles. For SwiGLU the block's B
// tile holds BN/2 gate rows then the BN/2 up rows of the same output columns, and each warp takes its
// n-tiles half from each, so gate and up of one output column land in the same thread.
template <int BM, int BN, int EPI, bool SPLIT>
__global__ void __launch_bounds__(THREADS) gemm_kernel(const uint16_t* __restrict__ X, const uint16_t* __restrict__ W,
                                                       void* __restrict__ Y, int M, int N, int K) {
    constexpr int WM = BM / 2, WN = BN / 4, MT = WM / 16, NT = WN / 8;
    static_assert(EPI != EPI_SWIGLU || NT % 2 == 0, "SwiGLU pairs gate and up n-tiles");
    constexpr int NA = SPLIT ? 2 : 1;            // A parts: hi (and lo)
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* As = smem;                         // [STAGES][NA][BM][SK]
    uint16_t* Bs = smem + STAGES * NA * BM * SK; // [STAGES][BN][SK]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.y * BM;
    const int n0 = EPI == EPI_SWIGLU ? blockIdx.x * (BN / 2) : blockIdx.x * BN;
    const int KT = K / BK;

    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
        uint16_t* as = As + stage * NA * BM * SK;
        uint16_t* bs = Bs + stage * BN * SK;
#pragma unroll
        for (int part = 0; part < NA; ++part) {
#pragma unroll
            for (int c = tid; c < BM * 4; c += THREADS) {
                const int r = c >> 2, kc = (c & 3) * 8, gr = m0 + r;
                const bool ok = gr < M;
                cp_async16_zfill(as + (part * BM + r) * SK + kc, X + ((size_t)part * M + (ok ? gr : 0)) * K + k0 + kc,
                                 ok);
            }
        }
#pragma unroll
        for (int c = tid; c < BN * 4; c += THREADS) {
            const int r = c >> 2, kc = (c & 3) * 8;
            int gr;
            bool ok;
            if (EPI == EPI_SWIGLU) {
                const int col = n0 + (r % (BN / 2));
                ok = col < N;
                gr = (r < BN / 2 ? 0 : N) + col;
            } else {
                gr = n0 + r;
                ok = gr < N;
            }
            cp_async16_zfill(bs + r * SK + kc, W + (size_t)(ok ? gr : 0) * K + k0 + kc, ok);
        }
    };
    // smem row of n-tile nt of this warp
    auto brow = [&](int nt) {
        if (EPI == EPI_SWIGLU)
            return nt < NT / 2 ? wn * (WN / 2) + nt * 8 : BN / 2 + wn * (WN / 2) + (nt - NT / 2) * 8;
        return wn * WN + nt * 8;
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        // stage kt has landed once at most STAGES-2 younger groups are pending
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        // refill the stage consumed in iteration kt-1 (every warp is past it after the barrier)
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_stage(nk % STAGES, nk);
        cp_async_commit();
        const uint16_t* as = As + (kt % STAGES) * NA * BM * SK;
        const uint16_t* bs = Bs + (kt % STAGES) * BN * SK;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t b[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                ldmatrix_x2(b[nt], bs + (brow(nt) + (lane & 7)) * SK + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int part = 0; part < NA; ++part) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(a[mt], as + (part * BM + wm * WM + mt * 16 + (lane & 15)) * SK + kk + (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt]);
            }
        }
    }
    cp_async_wait<0>();

    // Accumulator layout: c0,c1 at (row lane/4, cols 2*(lane%4) + 0/1); c2,c3 at row + 8.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = m0 + wm * WM + mt * 16 + (lane >> 2) + half * 8;
            if (row >= M) continue;
            if (EPI == EPI_SWIGLU) {
#pragma unroll
                for (int nt = 0; nt < NT / 2; ++nt) {
                    const int col = n0 + wn * (WN / 2) + nt * 8 + (lane & 3) * 2;
                    if (col >= N) continue;
                    const float g0 = acc[mt][nt][half * 2], g1 = acc[mt][nt][half * 2 + 1];
                    const float u0 = acc[mt][nt + NT / 2][half * 2], u1 = acc[mt][nt + NT / 2][half * 2 + 1];
                    uint32_t hi, lo;
                    split_bf2(siluf_(g0) * u0, siluf_(g1) * u1, hi, lo);
                    uint16_t* yp = static_cast<uint16_t*>(Y) + (size_t)row * N + col;
                    *reinterpret_cast<uint32_t*>(yp) = hi;
                    *reinterpret_cast<uint32_t*>(yp + (size_t)M * N) = lo;
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int col = n0 + wn * WN + nt * 8 + (lane & 3) * 2;
                    if (col >= N) continue;
                    float2* p = reinterpret_cast<float2*>(static_cast<float*>(Y) + (size_t)row * N + col);
                    float2 v = make_float2(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
                    if (EPI == EPI_RESID) {
                        const float2 o = *p;
                        v.x += o.x;
                        v.y += o.y;
                    }
                    *p = v;
                }
            }
        }
    }
}

long long n_blocks(int M, int N, int BM, int BN, int epi) {
    const int bn_out = epi == EPI_SWIGLU ? BN / 2 : BN;
    return (long long)((M + BM - 1) / BM) * ((N + bn_out - 1) / bn_out);
}

template <int BM, int BN, bool SPLIT>
cudaError_t set_attr() {
    const int bytes = (int)gemm_smem<BM, BN, SPLIT>();
    cudaError_t e = cudaFuncSetAttribute(gemm_kernel<BM, BN, EPI_F32, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<BM, BN, EPI_RESID, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<BM, BN, EPI_SWIGLU, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
}

template <int BM, int BN, bool SPLIT>
int launch(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, cudaStream_t s) {
    const int bn_out = epi == EPI_SWIGLU ? BN / 2 : BN;
    const dim3 grid((unsigned)((N + bn_out - 1) / bn_out), (unsigned)((M + BM - 1) / BM));
    const size_t sm = gemm_smem<BM, BN, SPLIT>();
    if (epi == EPI_F32) gemm_kernel<BM, BN, EPI_F32, SPLIT><<<grid, THREADS, sm, s>>>(X, W, Y, M, N, K);
    else if (epi == EPI_RESID) gemm_kernel<BM, BN, EPI_RESID, SPLIT><<<grid, THREADS, sm, s>>>(X, W, Y, M, N, K);
    else gemm_kernel<BM, BN, EPI_SWIGLU, SPLIT><<<grid, THREADS, sm, s>>>(X, W, Y, M, N, K);
    return (int)cudaGetLastError();
}

template <bool SPLIT>
int launch_tile(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, int sm_count,
                cudaStream_t s) {
    // The largest tile that still gives every SM at least one block.
    if (n_blocks(M, N, 128, 128, epi) >= sm_count) return launch<128, 128, SPLIT>(X, W, Y, M, N, K, epi, s);
    if (n_blocks(M, N, 64, 128, epi) >= sm_count) return launch<64, 128, SPLIT>(X, W, Y, M, N, K, epi, s);
    return launch<64, 64, SPLIT>(X, W, Y, M, N, K, epi, s);
}

}  // namespace

int gemm_bf16_prepare() {
    cudaError_t e = set_attr<128, 128, false>();
    if (e == cudaSuccess) e = set_attr<64, 128, false>();
    if (e == cudaSuccess) e = set_attr<64, 64, false>();
    if (e == cudaSuccess) e = set_attr<128, 128, true>();
    if (e == cudaSuccess) e = set_attr<64, 128, true>();
    if (e == cudaSuccess) e = set_attr<64, 64, true>();
    return (int)e;
}

int gemm_bf16(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, bool split_x, int sm_count,
              cudaStream_t s) {
    return split_x ? launch_tile<true>(X, W, Y, M, N, K, epi, sm_count, s)
                   : launch_tile<false>(X, W, Y, M, N, K, epi, sm_count, s);
}

}  // namespace pf

extern "C" LB_API int lb_gemm_bf16(const void* x, const void* w, void* y, int m, int n, int k, int epilogue,
                                   void* stream) {
    LB_CHECK_ARG(x && w && y, "null pointer");
    LB_CHECK_ARG(m >= 1 && n >= 8 && k >= 32, "shape too small");
    LB_CHECK_ARG(k % 32 == 0, "K must be a multiple of 32");
    LB_CHECK_ARG(n % 8 == 0, "N must be a multiple of 8");
    const int epi = epilogue & ~LB_GEMM_SPLIT_X;
    LB_CHECK_ARG(epi >= LB_GEMM_F32 && epi <= LB_GEMM_SWIGLU, "unknown epilogue");
    int dev = 0, sms = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    LB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LB_CUDA_TRY((cudaError_t)pf::gemm_bf16_prepare());
    LB_CUDA_TRY((cudaError_t)pf::gemm_bf16(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w), y, m, n, k,
                                            epi, (epilogue & LB_GEMM_SPLIT_X) != 0, sms,
                                            static_cast<cudaStream_t>(stream)));
    return LB_OK;
}
