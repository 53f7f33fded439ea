// Gated DeltaNet decode step inside the megakernel: causal conv + SiLU, q/k L2 norm, and the delta
// rule on the fp32 state, split over DN_ITEMS = 128 items (value head, 16-column slice) so that most
// blocks share the state traffic instead of 16.
//
// Every column j of the state is independent once k, q, alpha, beta are known:
//   u_j = beta (v_j - alpha S_j.k),  o_j = alpha S_j.q + (k.q) u_j,  S_j <- alpha S_j + k u_j
// (S_j = column j of S, stored contiguously as row j of the transposed state). Items of one head
// recompute the q/k conv and norms redundantly: 256 channels, far cheaper than another barrier.
#pragma once

#include "mk_common.cuh"

namespace mk {

// Conv state is a 4-slot ring indexed by position: slot pos%4 receives this step's input while the
// three older slots are read. Items of one head read the q/k channels that item 0 writes, and the
// ring keeps those reads and writes on different slots, so no barrier is needed between them.
__device__ __forceinline__ float dn_conv(const Params& P, const Layer& L, int ch, int pos, bool own) {
    const float x = ldcg(P.y_in + ch);
    const float4 w = *reinterpret_cast<const float4*>(L.conv_w + (size_t)ch * 4);
    const float c0 = L.conv_state[(size_t)((pos + 1) & 3) * DN_QKV + ch];  // input at pos-3
    const float c1 = L.conv_state[(size_t)((pos + 2) & 3) * DN_QKV + ch];  // pos-2
    const float c2 = L.conv_state[(size_t)((pos + 3) & 3) * DN_QKV + ch];  // pos-1
    if (own) L.conv_state[(size_t)(pos & 3) * DN_QKV + ch] = x;
    return silu(fmaf(w.x, c0, fmaf(w.y, c1, fmaf(w.z, c2, w.w * x))));
}

__device__ void dn_phase(const Params& P, const Smem& sm, const Layer& L, int pos) {
    float* qs = sm.xs;            // [DN_D] conv'd q of the key head
    float* ks = sm.xs + DN_D;     // [DN_D]
    float* vs = sm.xs + 2 * DN_D;  // [DN_COLS]
    const int t = threadIdx.x, lane = lb::lane_id(), warp = lb::warp_id();
    constexpr int CHUNKS = DN_D / DN_COLS;
    for (int item = blockIdx.x; item < DN_ITEMS; item += gridDim.x) {
        const int h = item / CHUNKS, c = item % CHUNKS;
        const int kh = h % DN_H;  // tiled value heads: value head h uses key head h % Hk
        if (t < DN_D) {
            qs[t] = dn_conv(P, L, kh * DN_D + t, pos, c == 0);
        } else if (t < 2 * DN_D) {
            ks[t - DN_D] = dn_conv(P, L, DN_H * DN_D + kh * DN_D + t - DN_D, pos, c == 0);
        } else if (t < 2 * DN_D + DN_COLS) {
            vs[t - 2 * DN_D] = dn_conv(P, L, 2 * DN_H * DN_D + h * DN_D + c * DN_COLS + t - 2 * DN_D, pos, true);
        }
        __syncthreads();
        if (warp < 3) {
            // warp 0: |q|^2, warp 1: |k|^2, warp 2: q.k (raw; scaled below)
            const float4 a = *reinterpret_cast<const float4*>((warp == 1 ? ks : qs) + lane * 4);
            const float4 b = *reinterpret_cast<const float4*>((warp == 0 ? qs : ks) + lane * 4);
            const float s = lb::warp_sum(a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w);
            if (lane == 0) sm.red[warp] = s;
        }
        __syncthreads();
        const float rq = rsqrtf(sm.red[0] + 1e-6f) * rsqrtf((float)DN_D);
        const float rk = rsqrtf(sm.red[1] + 1e-6f);
        const float kq = sm.red[2] * rq * rk;
        const float bq = ldcg(P.y_in + DN_QKV + DN_Z + h);
        const float aq = ldcg(P.y_in + DN_QKV + DN_Z + DN_H + h) + L.dt_bias[h];
        const float beta = sigmoidf(bq);
        const float softplus = aq > 20.0f ? aq : log1pf(expf(aq));
        const float alpha = expf(L.ssm_a[h] * softplus);

        const int j = c * DN_COLS + warp;
        float4 q4 = *reinterpret_cast<const float4*>(qs + lane * 4);
        float4 k4 = *reinterpret_cast<const float4*>(ks + lane * 4);
        q4.x *= rq; q4.y *= rq; q4.z *= rq; q4.w *= rq;
        k4.x *= rk; k4.y *= rk; k4.z *= rk; k4.w *= rk;
        float4* Sp = reinterpret_cast<float4*>(L.S + ((size_t)h * DN_D + j) * DN_D) + lane;
        float4 s = *Sp;
        const float kS = lb::warp_sum(s.x * k4.x + s.y * k4.y + s.z * k4.z + s.w * k4.w);
        const float qS = lb::warp_sum(s.x * q4.x + s.y * q4.y + s.z * q4.z + s.w * q4.w);
        const float u = beta * (vs[warp] - alpha * kS);
        s.x = fmaf(alpha, s.x, k4.x * u);
        s.y = fmaf(alpha, s.y, k4.y * u);
        s.z = fmaf(alpha, s.z, k4.z * u);
        s.w = fmaf(alpha, s.w, k4.w * u);
        *Sp = s;
        if (lane == 0) P.o_buf[h * DN_D + j] = fmaf(alpha, qS, kq * u);
        // qs/ks/vs and red are rewritten by the next item
        __syncthreads();
    }
}

}  // namespace mk
