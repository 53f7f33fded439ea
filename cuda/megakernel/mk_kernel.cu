// The persistent 0.8B decode megakernel: one cooperative launch runs n_steps tokens end to end.
// Per token: 5 grid barriers per layer (in-proj | mixer | out-proj | gate/up | down) and one after
// the LM head; the next token comes from a redundant per-block reduction of the LM head's block
// argmaxes, so there is no host round trip and no extra barrier between tokens.
#include "mk_attn.cuh"
#include "mk_deltanet.cuh"
#include "mk_gemv.cuh"
#include "mk_launch.h"

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
__device__ void layer_forward(const Params& P, const Smem& sm, Ring& R, unsigned& bt, int l, int pos, int tok) {
    const Layer& L = P.layers[l];
    if (l == 0) x_rmsnorm(P, sm, nullptr, P.embed + (size_t)tok * HID, L.norm1);
    else x_rmsnorm(P, sm, P.h, nullptr, L.norm1);
    gemv_run(P, sm, R, 4 * l + 0, [&](int row, float v) { P.y_in[row] = v; });
    grid_barrier(P.bar, bt);

    if (L.is_attn) attn_phase(P, sm, L, pos);
    else dn_phase(P, sm, L, pos);
    grid_barrier(P.bar, bt);

    if (L.is_attn) x_attn_combine(P, sm, pos);
    else x_dn_gated_norm(P, sm, L);
    gemv_run(P, sm, R, 4 * l + 1, [&](int row, float v) { P.h[row] = ldcg(P.h + row) + v; });
    grid_barrier(P.bar, bt);

    x_rmsnorm(P, sm, P.h, nullptr, L.norm2);
    gemv_run(P, sm, R, 4 * l + 2, [&](int row, float v) { P.gu[row] = v; });
    grid_barrier(P.bar, bt);

    x_swiglu(P, sm);
    gemv_run(P, sm, R, 4 * l + 3, [&](int row, float v) { P.h[row] = ldcg(P.h + row) + v; });
    grid_barrier(P.bar, bt);
}

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
    R.pp = 0;
    R.pbyte = 0;
    R.psteps = P.n_steps;
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
        for (int l = 0; l < nl; ++l) layer_forward(P, sm, R, bt, l, pos, tok);

        x_rmsnorm(P, sm, P.h, nullptr, P.out_norm);
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        float* logits = step == P.n_steps - 1 ? P.logits : nullptr;
        gemv_run(P, sm, R, 4 * nl, [&](int row, float v) {
            if (logits) logits[row] = v;
            if (v > bv) { bv = v; bi = row; }  // rows arrive in increasing order: first max wins
        });
        publish_argmax(P, sm, bv, bi);
        grid_barrier(P.bar, bt);
    }
    if (blockIdx.x == 0) {
        const int am = reduce_argmax(P, sm);
        emit_token(P, P.n_steps - 1, am);
        if (threadIdx.x == 0) *P.last_token = am;
    }
}

int max_blocks_per_sm(size_t smem, int* out) {
    return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, decode_kernel, THREADS, smem);
}

int prepare(size_t smem) {
    return (int)cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

int launch(const Params& P, int n_blocks, cudaStream_t stream) {
    void* args[] = {const_cast<Params*>(&P)};
    return (int)cudaLaunchCooperativeKernel((const void*)decode_kernel, dim3(n_blocks), dim3(THREADS), args,
                                           smem_bytes(P.wslots, P.slot_bytes), stream);
}

}  // namespace mk
