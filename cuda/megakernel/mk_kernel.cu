// The persistent 0.8B decode megakernel: one cooperative launch runs n_steps tokens end to end.
// Per token: 5 grid barriers per layer (in-proj | mixer | out-proj | gate/up | down) and one after
// the LM head; the next token comes from a redundant per-block reduction of the LM head's block
// argmaxes, so there is no host round trip and no extra barrier between tokens.
#include "mk_attn.cuh"
#include "mk_deltanet.cuh"
#include "mk_gemv.cuh"
#include "mk_launch.h"

#ifdef MK_PROFILE
#include <cstdio>
#endif

namespace mk {

// Best (value, index) over the blocks' LM-head partials; ties go to the lower index like np.argmax.
__device__ int reduce_argmax(const Params& P, const Smem& sm) {
    if (lb::warp_id() == 0) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = lb::lane_id(); i < (int)gridDim.x; i += 32) {
            const float v = __ldcg(P.am_val + i);
            const int ix = __ldcg(P.am_idx + i);
            if (v > bv || (v == bv && ix < bi)) { bv = v; bi = ix; }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float v = __shfl_xor_sync(LB_FULL_MASK, bv, off);
            const int ix = __shfl_xor_sync(LB_FULL_MASK, bi, off);
            if (v > bv || (v == bv && ix < bi)) { bv = v; bi = ix; }
        }
        if (lb::lane_id() == 0) sm.misc[0] = bi;
    }
    __syncthreads();
    const int r = sm.misc[0];
    __syncthreads();
    return r;
}

// Block-level argmax of the LM-head rows this block owns; thread 0 publishes it.
__device__ void publish_argmax(const Params& P, const Smem& sm, float bv, int bi) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(LB_FULL_MASK, bv, off);
        const int ix = __shfl_xor_sync(LB_FULL_MASK, bi, off);
        if (v > bv || (v == bv && ix < bi)) { bv = v; bi = ix; }
    }
    float* rv = sm.red;
    int* ri = reinterpret_cast<int*>(sm.red + WARPS);
    if (lb::lane_id() == 0) { rv[lb::warp_id()] = bv; ri[lb::warp_id()] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < WARPS; ++w)
            if (rv[w] > bv || (rv[w] == bv && ri[w] < bi)) { bv = rv[w]; bi = ri[w]; }
        // a block whose rows all produced NaN still publishes a valid (losing) index
        P.am_val[blockIdx.x] = bv;
        P.am_idx[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

__device__ void emit_token(const Params& P, int step, int tok) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        // volatile + system fence: the host may poll the mapped buffer while the kernel runs
        *reinterpret_cast<volatile int*>(P.host_tokens + step) = tok;
        __threadfence_system();
    }
}

// One decoder layer: 5 phases, each ended by a grid barrier.
template <int kHold>
__device__ void layer_forward(const Params& P, const Smem& sm, Ring& R, unsigned& bt, int l, int pos, int tok,
                              int step) {
    const Layer& L = P.layers[l];
    const int m = 1 + 14 * l;  // profile marks of this layer (mk_mark; nothing unless built with MK_PROFILE)
    if (l == 0) x_rmsnorm(P, sm, nullptr, P.embed + (size_t)tok * HID, L.norm1);
    else x_rmsnorm(P, sm, P.h, nullptr, L.norm1);
    mk_mark(step, m + 0);
    gemv_run<kHold>(P, sm, R, 4 * l + 0, [&](int row, float v) { P.y_in[row] = v; });
    grid_barrier(P.bar, bt, step, m + 1);  // mark m + 1: the whole block has arrived
    mk_mark(step, m + 2);

    if (L.is_attn) attn_phase(P, sm, L, pos);
    else dn_phase(P, sm, L, pos);
    grid_barrier(P.bar, bt, step, m + 3);  // mark m + 3: the whole block has arrived
    mk_mark(step, m + 4);

    if (L.is_attn) x_attn_out(P, sm);
    else x_dn_gated_norm(P, sm, L);
    mk_mark(step, m + 5);
    gemv_run<kHold>(P, sm, R, 4 * l + 1, [&](int row, float v) { P.h[row] = ldcg(P.h + row) + v; });
    grid_barrier(P.bar, bt, step, m + 6);  // mark m + 6: the whole block has arrived
    mk_mark(step, m + 7);

    x_rmsnorm(P, sm, P.h, nullptr, L.norm2);
    mk_mark(step, m + 8);
    gemv_run<kHold>(P, sm, R, 4 * l + 2, [&](int row, float v) { P.gu[row] = v; });
    grid_barrier(P.bar, bt, step, m + 9);  // mark m + 9: the whole block has arrived
    mk_mark(step, m + 10);

    x_swiglu(P, sm);
    mk_mark(step, m + 11);
    gemv_run<kHold>(P, sm, R, 4 * l + 3, [&](int row, float v) { P.h[row] = ldcg(P.h + row) + v; });
    grid_barrier(P.bar, bt, step, m + 12);  // mark m + 12: the whole block has arrived
    mk_mark(step, m + 13);
}

#ifdef MK_PROFILE
// Block 0's phase timeline of step 1, as deltas in ns (one line per layer, then the head), then every block's
// stamps relative to block 0's first (step 1's stamps are complete once block 0 is past step 1's last barrier).
__device__ void print_profile(const Params& P) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || P.n_steps < 2) return;
    const unsigned long long* t = g_mk_prof[0];
    printf("MKPROF layer: pro1 in bar1 mix bar2 pro2 out bar3 pro3 gu bar4 pro4 down bar5 (ns)\n");
    for (int l = 0; l < P.n_layers; ++l) {
        const int m = 1 + 14 * l;
        printf("MKPROF %d:", l);
        for (int k = 0; k < 14; ++k) printf(" %llu", t[m + k] - t[m + k - 1]);
        printf("\n");
    }
    const int e = 1 + 14 * P.n_layers;
    printf("MKPROF head: norm %llu lm %llu argmax+bar %llu total %llu\n", t[e] - t[e - 1], t[e + 1] - t[e],
           t[e + 2] - t[e + 1], t[e + 2] - t[0]);
    const int nb = min((int)gridDim.x, MK_PROF_BLOCKS);
    printf("MKPB blocks %d marks %d\n", nb, e + 2);  // the last mark (after the final barrier) is left out
    for (int b = 0; b < nb; ++b) {
        printf("MKPB %d:", b);
        for (int k = 0; k < e + 2; ++k) printf(" %lld", (long long)(g_mk_prof[b][k] - t[0]));
        printf("\n");
    }
}
#endif

// kHold: when the weight ring refills (lb_mk_config_t.ring_hold; mk_gemv.cuh gemv_run).
template <int kHold>
__global__ void __launch_bounds__(THREADS, 1) decode_kernel(Params P) {
    extern __shared__ __align__(128) uint8_t smem_raw[];
    Smem sm;
    sm.slots = smem_raw;
    sm.mbar = reinterpret_cast<uint64_t*>(smem_raw + (size_t)WARPS * P.wslots * P.slot_bytes);
    sm.ph = reinterpret_cast<PhaseDesc*>(sm.mbar + WARPS * MAX_WSLOTS);
    sm.xs = reinterpret_cast<float*>(sm.ph + MAX_PHASES);
    sm.red = sm.xs + XS_FLOATS;
    sm.misc = reinterpret_cast<int*>(sm.red + 2 * WARPS);
    if (threadIdx.x < WARPS * MAX_WSLOTS) mbar_init(&sm.mbar[threadIdx.x], mbar_count());
    build_phase_table(P, sm);
    __syncthreads();

    Ring R;
    R.head = R.tail = 0;
    R.prod = Cursor{0, 0, P.n_steps};
    ring_fill(P, sm, R);  // the first weights stream while the first token is looked up

    unsigned bt = 0;
    const int nl = P.n_layers;
    for (int step = 0; step < P.n_steps; ++step) {
        const int pos = P.pos0 + step;
        int tok;
        if (step > 0) {
            const int am = reduce_argmax(P, sm);
            emit_token(P, step - 1, am);
            tok = step < P.n_forced ? P.forced[step] : am;
        } else {
            tok = P.n_forced > 0 ? P.forced[0] : *P.last_token;
        }
        // h = embedding row; layer 0 reads the row directly, this copy feeds the first residual add
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < HID; i += THREADS) P.h[i] = bf16_to_f(P.embed[(size_t)tok * HID + i]);
        mk_mark(step, 0);
        for (int l = 0; l < nl; ++l) layer_forward<kHold>(P, sm, R, bt, l, pos, tok, step);

        x_rmsnorm(P, sm, P.h, nullptr, P.out_norm);
        mk_mark(step, 1 + 14 * nl);
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        float* logits = step == P.n_steps - 1 ? P.logits : nullptr;
        gemv_run<kHold>(P, sm, R, 4 * nl, [&](int row, float v) {
            if (logits) logits[row] = v;
            if (v > bv) { bv = v; bi = row; }  // rows arrive in increasing order: first max wins
        });
        mk_mark(step, 2 + 14 * nl);
        publish_argmax(P, sm, bv, bi);
        grid_barrier(P.bar, bt);
        mk_mark(step, 3 + 14 * nl);
    }
    if (blockIdx.x == 0) {
        const int am = reduce_argmax(P, sm);
        emit_token(P, P.n_steps - 1, am);
        if (threadIdx.x == 0) *P.last_token = am;
    }
#ifdef MK_PROFILE
    print_profile(P);
#endif
}

// Both instances have the same launch shape and shared memory; the occupancy query asks the plain one.
int max_blocks_per_sm(size_t smem, int* out) {
    return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, decode_kernel<0>, THREADS, smem);
}

int prepare(size_t smem) {
    cudaError_t e = cudaFuncSetAttribute(decode_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(decode_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return (int)e;
}

int launch(const Params& P, int n_blocks, int ring_hold, cudaStream_t stream) {
    void* args[] = {const_cast<Params*>(&P)};
    const void* k = ring_hold ? (const void*)decode_kernel<1> : (const void*)decode_kernel<0>;
    return (int)cudaLaunchCooperativeKernel(k, dim3(n_blocks), dim3(THREADS), args,
                                           smem_bytes(P.wslots, P.slot_bytes), stream);
}

}  // namespace mk
