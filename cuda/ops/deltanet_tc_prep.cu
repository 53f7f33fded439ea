// The prep kernel of the tensor-core chunked DeltaNet (deltanet_tc.cu has the algorithm), one block per (chunk, value
// head), all chunks at once. From post-conv q, k, v, g, beta in any strides, or (CONV) from the pre-conv rows: the
// causal conv, SiLU, q / k L2 norms, g and beta computed here for the block's own heads (the 27B's three value heads of
// a key head each convolve its q and k: 256 of its 384 channels, cheap next to a launch and a q / k / v round trip).
// Then cum; the Gram k·kᵀ and q·kᵀ on the tensor cores (lower triangles); L and Aqk; the UT system solved blockwise.
// Out, per (head, chunk): Uᵀ in accumulator order, −Wᵀ, K̃ = k e^(last − cum) and Aqk as bf16 pairs, cum.
#include "deltanet_tc.cuh"

namespace pf {
namespace dn {
namespace tc {
namespace {

constexpr size_t PREP_SMEM = (size_t)(2 * CH * LDF + CH * LDL + 4 * 16 * LDI + 5 * CH) * 4;  // 95,488 B

template <bool CONV>
__global__ void __launch_bounds__(NT, 2) prep_kernel(const In in, const ConvIn cv, const TcScratch sc, int T) {
    extern __shared__ __align__(16) float sm[];
    float* Ks = sm;                  // [64][LDF] k (the key head's rows of this chunk)
    float* Qs = Ks + CH * LDF;       // [64][LDF] q; after the Gram v, [64][LDV]
    float* Vs = Qs;
    float* Ln = Qs + CH * LDF;       // [64][LDL] −L (strictly lower; zeros above the computed tiles unread)
    float* Iv = Ln + CH * LDL;       // [4][16][LDI] (I + L_bb)⁻¹
    float* cum = Iv + 4 * 16 * LDI;  // [64]
    float* bet = cum + CH;           // [64] beta, 0 past the prompt
    float* ecum = bet + CH;          // [64] e^cum
    float* etail = ecum + CH;        // [64] e^(last − cum)
    float* gs = etail + CH;          // [64] g, 0 past the prompt
    const int c = blockIdx.x, h = blockIdx.y, nch = gridDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int t0 = c * CH, L = min(CH, T - t0), kh = h % in.hk;
    const size_t unit = (size_t)h * nch + c;
    const long long qk0 = (long long)t0 * in.qk_t + (long long)kh * in.qk_h;

    // Rows past the prompt are zero (and get beta = 0, g = 0: they solve to zero and leave cum flat).
    if (CONV) {
        if (tid < 2 * CH) {
            // g = ssm_a softplus(alpha + dt_bias) (warps 0-1), beta = sigmoid(b) (warps 2-3), a row a thread
            // (dn_conv_prep_kernel's arithmetic)
            const int i = tid & (CH - 1);
            if (tid < CH) {
                float gv = 0.0f;
                if (i < L) {
                    const float a = cv.a[(long long)(t0 + i) * cv.ab_t + h] + cv.dt_bias[h];
                    gv = cv.ssm_a[h] * (a > 20.0f ? a : log1pf(expf(a)));
                }
                gs[i] = gv;
            } else {
                bet[i] = i < L ? sigmoidf_(cv.b[(long long)(t0 + i) * cv.ab_t + h]) : 0.0f;
            }
        }
        // Causal conv (kernel 4) + SiLU of the chunk's rows of this block's q, k and v heads: an item is one channel
        // over CR rows, whose CR + 3 inputs (3 before the rows: earlier rows of the prompt or the history) are loaded
        // together (3 rounds of L2 latency a thread); a warp takes 32 consecutive channels. q and k go to their tiles
        // (normed below), v out to global memory, read back after the Gram like post-conv inputs.
        constexpr int CR = 32;
        static_assert((CH / CR) * D == NT, "a thread's items: its channel d and rows r0.. of q, k and v");
        const int r0 = CR * (tid / D), d = tid & (D - 1);
        // grp 0 q, 1 k, 2 v: one body run three times (not unrolled: the body is the kernel's largest code)
#pragma unroll 1
        for (int grp = 0; grp < 3; ++grp) {
            const int ch = (grp == 0 ? kh : (grp == 1 ? in.hk + kh : 2 * in.hk + h)) * D + d;
            const float4 w = *reinterpret_cast<const float4*>(cv.conv_w + (size_t)ch * 4);
            float x[CR + 3];
            // Row r0 of the channel and the rows around it by 32-bit offsets (|j · ld| < 2^31 for any real width).
            // The strides and the row count are made opaque each round: else the compiler hoists the 35 row
            // offsets and predicates out of the loop (live across it: a stack frame).
            int ld = (int)cv.ld, vt = (int)in.v_t, Lr = L - r0;
            asm volatile("" : "+r"(ld), "+r"(vt), "+r"(Lr));
            const float* src = cv.pre + (long long)(t0 + r0) * cv.ld + ch;
#ifdef __CUDA_ARCH__
            asm volatile("" : "+l"(src));  // (one base register, not the parameter's reloaded for every row)
#endif
            if (t0 + r0 >= 3) {
                // the 3 rows before r0 are rows of the prompt
#pragma unroll
                for (int j = 0; j < 3; ++j) x[j] = j - 3 < Lr ? src[(j - 3) * ld] : 0.0f;
            } else {
                // the first rows of the prompt: the 3 before are the history's
#pragma unroll
                for (int j = 0; j < 3; ++j) {
                    const int r = r0 - 3 + j, t = t0 + r;
                    float val = 0.0f;
                    if (r < L) {
                        if (t >= 0) {
                            val = cv.pre[(long long)t * cv.ld + ch];
                        } else {
                            // (selects, not cv.hist[3 + t]: a dynamic index would copy the parameters to local
                            // memory)
                            const float* hp = t == -3 ? cv.hist[0] : (t == -2 ? cv.hist[1] : cv.hist[2]);
                            val = hp ? hp[ch] : 0.0f;
                        }
                    }
                    x[j] = val;
                }
            }
#pragma unroll
            for (int j = 0; j < CR; ++j) x[j + 3] = j < Lr ? src[j * ld] : 0.0f;
            // q and k to their tiles (every row), v out (the prompt's rows): one generic store path, not two
            // copies of the loop below
            float* const dst = grp < 2 ? (grp == 0 ? Qs : Ks) + r0 * LDF + d
                                       : cv.v + (long long)(t0 + r0) * in.v_t + (long long)h * in.v_h + d;
            const int dstride = grp < 2 ? LDF : vt;
            const int nst = grp < 2 ? CR : Lr;
            // SiLU u / (1 + e^−u) (siluf_'s arithmetic) in two passes: the 32 conv sums (the decode kernel's
            // association, dn_conv) and denominators straight-line, then the divisions, each its own branch region
            // (div.rn's FCHK slow path): else every row's whole chain sits in its own region and runs alone.
            float den[CR];
#pragma unroll
            for (int j = 0; j < CR; ++j) {
                x[j] = fmaf(w.x, x[j], fmaf(w.y, x[j + 1], fmaf(w.z, x[j + 2], w.w * x[j + 3])));
                den[j] = 1.0f + expf(-x[j]);
            }
#pragma unroll
            for (int j = 0; j < CR; ++j) {
                // computed for every row (the empty asm keeps the division out of a `j < Lr` branch region), zero
                // selected past the prompt
                float qv = x[j] / den[j];
#ifdef __CUDA_ARCH__
                asm volatile("" : "+f"(qv));
#endif
                const float s = j < Lr ? qv : 0.0f;
                if (j < nst) dst[j * dstride] = s;
            }
        }
        __syncthreads();
        // L2 norms of the q and k rows (q also / sqrt(dk)); the first value head of each key head writes q out for
        // the output kernel
        // Four rows a warp at a time (their loads first, the four shuffle chains interleaved): row m of a warp is
        // warp + 8m, q for m < 8, k after.
        constexpr int NR = 4;
#pragma unroll 1
        for (int m0 = 0; m0 < 2 * CH / (NT / 32); m0 += NR) {
            const bool isq = m0 < CH / (NT / 32);
            float* base = (isq ? Qs : Ks) + 4 * lane;
            float4 a[NR];
            float ss[NR];
#pragma unroll
            for (int u = 0; u < NR; ++u) {
                const int i = (warp + (NT / 32) * (m0 + u)) & (CH - 1);
                a[u] = *reinterpret_cast<const float4*>(base + i * LDF);
                ss[u] = a[u].x * a[u].x + a[u].y * a[u].y + a[u].z * a[u].z + a[u].w * a[u].w;
            }
#pragma unroll
            for (int u = 0; u < NR; ++u) ss[u] = lb::warp_sum(ss[u]);
#pragma unroll
            for (int u = 0; u < NR; ++u) {
                const int i = (warp + (NT / 32) * (m0 + u)) & (CH - 1);
                const float r = isq ? rsqrtf(ss[u] + 1e-6f) * rsqrtf((float)D) : rsqrtf(ss[u] + 1e-6f);
                const float4 y = make_float4(a[u].x * r, a[u].y * r, a[u].z * r, a[u].w * r);
                *reinterpret_cast<float4*>(base + i * LDF) = y;
                if (isq && h < in.hk && i < L)
                    *reinterpret_cast<float4*>(cv.q + qk0 + (long long)i * in.qk_t + 4 * lane) = y;
            }
        }
    } else {
        for (int idx = tid; idx < CH * (D / 4); idx += NT) {
            const int i = idx >> 5, d = (idx & 31) * 4;
            const bool ok = i < L;
            const long long off = qk0 + (long long)(ok ? i : 0) * in.qk_t + d;
            cp_async16_zfill(Ks + i * LDF + d, in.k + off, ok);
            cp_async16_zfill(Qs + i * LDF + d, in.q + off, ok);
        }
        cp_async_commit();
        if (warp < 2) {
            const float* src = (warp ? in.beta : in.g) + (long long)t0 * in.gb_t + (long long)h * in.gb_h;
            float* dst = warp ? bet : gs;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * lane + e;
                dst[i] = i < L ? src[(long long)i * in.gb_t] : 0.0f;
            }
        }
    }
    __syncthreads();
    if (warp == 0) {
        // cumsum over the 64 rows, two a lane: a shuffle scan of the pair sums
        const int i0 = 2 * lane;
        const float g0 = gs[i0], g1 = gs[i0 + 1];
        float p = g0 + g1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float y = __shfl_up_sync(LB_FULL_MASK, p, off);
            if (lane >= off) p += y;
        }
        float ex = __shfl_up_sync(LB_FULL_MASK, p, 1);
        if (lane == 0) ex = 0.0f;
        const float c0 = ex + g0, c1 = c0 + g1;
        const float last = __shfl_sync(LB_FULL_MASK, c1, 31);
        cum[i0] = c0;
        cum[i0 + 1] = c1;
        ecum[i0] = expf(c0);
        ecum[i0 + 1] = expf(c1);
        etail[i0] = expf(last - c0);
        etail[i0 + 1] = expf(last - c1);
        *reinterpret_cast<float2*>(sc.cum + unit * CH + i0) = make_float2(c0, c1);
    }
    cp_async_wait<0>();
    __syncthreads();

    // Gram: warps 0-3 k·kᵀ (strictly lower: L), warps 4-7 q·kᵀ (lower: Aqk). The 20 lower 16 x 8 tiles of each
    // are 5 per warp: `mA` from n-tile `njA` for e0 tiles, then m-tile mB from n-tile 0.
    {
        const int kind = warp >> 2, sub = warp & 3;
        const int mA = sub < 2 ? 3 : 2, njA = (sub & 1) ? 5 : 0;
        const int e0 = sub == 0 ? 5 : (sub == 1 ? 3 : (sub == 2 ? 5 : 1));
        const int mB = sub == 1 ? 0 : 1;
        const float* As = kind ? Qs : Ks;
        float acc[5][4];
#pragma unroll
        for (int e = 0; e < 5; ++e)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[e][r] = 0.0f;
#pragma unroll 2
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t aAh[4], aAl[4], aBh[4] = {}, aBl[4] = {};
            frag_a_f32(As, LDF, 16 * mA, 16 * kk, aAh, aAl);
            if (e0 < 5) frag_a_f32(As, LDF, 16 * mB, 16 * kk, aBh, aBl);
#pragma unroll
            for (int e = 0; e < 5; ++e) {
                const bool onA = e < e0;
                const int nj = onA ? njA + e : e - e0;
                uint32_t bh[2], bl[2], ah[4], al[4];
                frag_b_f32(Ks, LDF, 8 * nj, 16 * kk, bh, bl);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    ah[r] = onA ? aAh[r] : aBh[r];
                    al[r] = onA ? aAl[r] : aBl[r];
                }
                mma3(acc[e], ah, al, bh[0], bh[1], bl[0], bl[1]);
            }
        }
        uint16_t* aq = sc.aqk + unit * AQ_N;
#pragma unroll
        for (int e = 0; e < 5; ++e) {
            const bool onA = e < e0;
            const int mi = onA ? mA : mB, nj = onA ? njA + e : e - e0;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int i = 16 * mi + gq + 8 * half, j = 8 * nj + 2 * tq;
                const float ci = cum[i];
                // decay e^(cum_i − cum_j) only where j <= i: the exponent is never positive there
                const float d0 = expf(ci - cum[j]), d1 = expf(ci - cum[j + 1]);
                const float x0 = acc[e][2 * half], x1 = acc[e][2 * half + 1];
                if (kind == 0) {
                    const float b = bet[i];
                    *reinterpret_cast<float2*>(Ln + i * LDL + j) =
                        make_float2(j < i ? -(b * x0 * d0) : 0.0f, j + 1 < i ? -(b * x1 * d1) : 0.0f);
                } else {
                    uint32_t hi, lo;
                    split_bf2(j <= i ? x0 * d0 : 0.0f, j + 1 <= i ? x1 * d1 : 0.0f, hi, lo);
                    *reinterpret_cast<uint32_t*>(aq + i * CH + j) = hi;
                    *reinterpret_cast<uint32_t*>(aq + CH * CH + i * CH + j) = lo;
                }
            }
        }
    }
    __syncthreads();  // q read by every warp, −L written: v may land over q
    {
        const long long v0 = (long long)t0 * in.v_t + (long long)h * in.v_h;
        // a fixed count a thread (no remainder code; one basic block)
        static_assert(CH * (D / 4) % NT == 0, "whole rounds");
#pragma unroll
        for (int u = 0; u < CH * (D / 4) / NT; ++u) {
            const int idx = tid + u * NT, i = idx >> 5, d = (idx & 31) * 4;
            const bool ok = i < L;
            cp_async16_zfill(Vs + i * LDV + d, in.v + v0 + (long long)(ok ? i : 0) * in.v_t + d, ok);
        }
        cp_async_commit();
    }
    // (I + L_bb)⁻¹ of the four diagonal blocks, one column per thread, column-oriented substitution:
    // x = e_j; for m ascending, x_i += (−L)_im x_m for every i > m.
    if (tid < 64) {
        const int b = tid >> 4, j = tid & 15;
        const float* Lb = Ln + 16 * b * LDL + 16 * b;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) x[i] = i == j ? 1.0f : 0.0f;
#pragma unroll
        for (int m = 0; m < 15; ++m)
#pragma unroll
            for (int i = m + 1; i < 16; ++i) x[i] = fmaf(Lb[i * LDL + m], x[m], x[i]);
        float* Ib = Iv + b * 16 * LDI;
#pragma unroll
        for (int i = 0; i < 16; ++i) Ib[i * LDI + j] = x[i];
    } else {
        // meanwhile, warps 2-7: K̃ = k e^(last − cum) as a pair, for the state pass's S update
        uint16_t* kh = sc.kt + unit * KT_N;
        for (int idx = tid - 64; idx < CH * (D / 4); idx += NT - 64) {
            const int i = idx >> 5, d = (idx & 31) * 4;
            const float4 x = *reinterpret_cast<const float4*>(Ks + i * LDF + d);
            const float e = etail[i];
            uint2 hi, lo;
            split_bf2(x.x * e, x.y * e, hi.x, lo.x);
            split_bf2(x.z * e, x.w * e, hi.y, lo.y);
            *reinterpret_cast<uint2*>(kh + i * D + d) = hi;
            *reinterpret_cast<uint2*>(kh + CH * D + i * D + d) = lo;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // The blocked solve, transposed: warp w owns right-hand columns col0 .. col0 + 31 (w < 4: u = (I + L)⁻¹ βv,
    // else w = (I + L)⁻¹ βk e^cum) as Xᵀ [2 m-tiles of columns][4 time blocks][2 n-tiles of 8 times].
    //   Cᵀ_b = Rᵀ_b + Σ_{a<b} Xᵀ_a (−L_ba)ᵀ;  Xᵀ_b = Cᵀ_b ((I + L_bb)⁻¹)ᵀ
    {
        const int part = warp >> 2, col0 = 32 * (warp & 3);
        float x[2][4][2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const int col = col0 + 16 * mt + gq + 8 * (r >> 1), i = 16 * b + 8 * nt + 2 * tq + (r & 1);
                        x[mt][b][nt][r] = part ? Ks[i * LDF + col] * ecum[i] * bet[i] : Vs[i * LDV + col] * bet[i];
                    }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
#pragma unroll
            for (int a = 0; a < b; ++a) {
                uint32_t ah[2][4], al[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) c_to_a(x[mt][a][0], x[mt][a][1], ah[mt], al[mt]);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    uint32_t bh[2], bl[2];
                    frag_b_f32(Ln, LDL, 16 * b + 8 * nt, 16 * a, bh, bl);
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) mma3(x[mt][b][nt], ah[mt], al[mt], bh[0], bh[1], bl[0], bl[1]);
                }
            }
            uint32_t ch[2][4], cl[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                c_to_a(x[mt][b][0], x[mt][b][1], ch[mt], cl[mt]);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) x[mt][b][nt][r] = 0.0f;
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                uint32_t bh[2], bl[2];
                frag_b_f32(Iv + b * 16 * LDI, LDI, 8 * nt, 0, bh, bl);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) mma3(x[mt][b][nt], ch[mt], cl[mt], bh[0], bh[1], bl[0], bl[1]);
            }
        }
        if (part == 0) {
            // Uᵀ in accumulator order: [dv m-tile][time n-tile][lane][4], the state pass's initial V_newᵀ
            float* up = sc.uv + unit * UV_N;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int b = 0; b < 4; ++b)
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
                        *reinterpret_cast<float4*>(up + (((2 * warp + mt) * 8 + 2 * b + nt) * 32 + lane) * 4) =
                            make_float4(x[mt][b][nt][0], x[mt][b][nt][1], x[mt][b][nt][2], x[mt][b][nt][3]);
        } else {
            // −Wᵀ [dk][time] as a pair
            uint16_t* wp = sc.wt + unit * WT_N;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int b = 0; b < 4; ++b)
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int dk = col0 + 16 * mt + gq + 8 * half, i = 16 * b + 8 * nt + 2 * tq;
                            uint32_t hi, lo;
                            split_bf2(-x[mt][b][nt][2 * half], -x[mt][b][nt][2 * half + 1], hi, lo);
                            *reinterpret_cast<uint32_t*>(wp + dk * CH + i) = hi;
                            *reinterpret_cast<uint32_t*>(wp + D * CH + dk * CH + i) = lo;
                        }
        }
    }
}

}  // namespace

size_t prep_smem() { return PREP_SMEM; }

cudaError_t prep_prepare() {
    cudaError_t e = cudaFuncSetAttribute(prep_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PREP_SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(prep_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PREP_SMEM);
    return e;
}

cudaError_t prep_launch(const In& in, const ConvIn* cv, const TcScratch& sc, int T, int H, cudaStream_t s) {
    const dim3 grid(n_chunks(T), H);
    if (cv)
        prep_kernel<true><<<grid, NT, PREP_SMEM, s>>>(in, *cv, sc, T);
    else
        prep_kernel<false><<<grid, NT, PREP_SMEM, s>>>(in, ConvIn{}, sc, T);
    return cudaGetLastError();
}

}  // namespace tc
}  // namespace dn
}  // namespace pf
