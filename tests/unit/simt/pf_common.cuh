// tests/unit/simt: cuda/ops/pf_common.cuh's helpers for the CPU emulation, same names and contracts: the bf16
// conversions bit for bit, cp.async queued per thread and performed at its wait (so a read before the wait sees the
// NaN fill, not the data), ldmatrix and mma.sync as warp collectives by the PTX ISA's fragment ownership rules
// (products exact, sums in double: a model of the tensor core's fp32 accumulation, not its rounding).
#pragma once
#include "simt.hpp"
namespace pf {
inline float bf2f(uint16_t u) { uint32_t x = (uint32_t)u << 16; float f; std::memcpy(&f, &x, 4); return f; }
inline uint16_t f2bf(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline uint32_t pack_bf2(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
inline void split_bf2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    const uint16_t h0 = f2bf(x0), h1 = f2bf(x1);
    hi = (uint32_t)h0 | ((uint32_t)h1 << 16);
    lo = pack_bf2(x0 - bf2f(h0), x1 - bf2f(h1));
}
inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
inline float siluf_(float x) { return x / (1.0f + expf(-x)); }

inline void cp_async16_zfill(void* dst, const void* src, bool valid) {
    if ((reinterpret_cast<uintptr_t>(dst) & 15) || (valid && (reinterpret_cast<uintptr_t>(src) & 15))) {
        std::fprintf(stderr, "cp.async misaligned\n"); std::abort();
    }
    simt::pending.push_back({dst, src, 16, valid});
}
inline void cp_async4_zfill(void* dst, const void* src, bool valid) { simt::pending.push_back({dst, src, 4, valid}); }
inline void cp_async_commit() { simt::groups.push_back(simt::pending); simt::pending.clear(); }
template <int N>
inline void cp_async_wait() {
    while ((int)simt::groups.size() > N) {
        for (auto& p : simt::groups.front()) {
            if (p.ok) std::memcpy(p.dst, p.src, p.n); else std::memset(p.dst, 0, p.n);
        }
        simt::groups.erase(simt::groups.begin());
    }
}
inline uint16_t ld16(const void* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
// ldmatrix .x4: lanes 8m..8m+7 address the rows of matrix m (8 bf16 each); lane i receives, of matrix m,
// (row i/4, elements 2(i%4), 2(i%4)+1), or with .trans (rows 2(i%4), 2(i%4)+1, element i/4).
inline void ldmatrix_impl(uint32_t r[4], const void* p, bool trans) {
    uint64_t me = (uint64_t)reinterpret_cast<uintptr_t>(p);
    if (me & 15) { std::fprintf(stderr, "ldmatrix row address misaligned\n"); std::abort(); }
    const int i = simt::lane();
    warp_exchange(&me, 1, [&](uint64_t (*s)[16]) {
        for (int m = 0; m < 4; ++m) {
            uint16_t e0, e1;
            if (!trans) {
                const char* row = reinterpret_cast<const char*>(s[8 * m + i / 4][0]);
                e0 = ld16(row + 2 * (2 * (i % 4))); e1 = ld16(row + 2 * (2 * (i % 4) + 1));
            } else {
                const char* r0 = reinterpret_cast<const char*>(s[8 * m + 2 * (i % 4)][0]);
                const char* r1 = reinterpret_cast<const char*>(s[8 * m + 2 * (i % 4) + 1][0]);
                e0 = ld16(r0 + 2 * (i / 4)); e1 = ld16(r1 + 2 * (i / 4));
            }
            r[m] = (uint32_t)e0 | ((uint32_t)e1 << 16);
        }
    });
}
inline void ldmatrix_x4(uint32_t r[4], const void* p) { ldmatrix_impl(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* p) { ldmatrix_impl(r, p, true); }
inline float bfv(uint32_t w, int half) { return bf2f((uint16_t)(half ? w >> 16 : w & 0xffff)); }
// mma.sync m16n8k16 row.col f32.bf16: A a[0] (g, 2t..), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..);
// B b[0] (k 2t.., n g), b[1] (k 2t+8.., n g); C c[0..1] (g, 2t..), c[2..3] (g+8, 2t..).
inline void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    uint64_t me[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    float A[16][16], B[16][8];
    warp_exchange(me, 6, [&](uint64_t (*s)[16]) {
        for (int l = 0; l < 32; ++l) {
            const int g = l >> 2, t = l & 3;
            for (int e = 0; e < 2; ++e) {
                A[g][2 * t + e] = bfv((uint32_t)s[l][0], e);
                A[g + 8][2 * t + e] = bfv((uint32_t)s[l][1], e);
                A[g][2 * t + 8 + e] = bfv((uint32_t)s[l][2], e);
                A[g + 8][2 * t + 8 + e] = bfv((uint32_t)s[l][3], e);
                B[2 * t + e][g] = bfv((uint32_t)s[l][4], e);
                B[2 * t + 8 + e][g] = bfv((uint32_t)s[l][5], e);
            }
        }
    });
    const int g = simt::lane() >> 2, t = simt::lane() & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int r = 0; r < 4; ++r) {
        double acc = c[r];
        for (int k = 0; k < 16; ++k) acc += (double)A[rows[r]][k] * (double)B[k][cols[r]];
        c[r] = (float)acc;
    }
}
}  // namespace pf
