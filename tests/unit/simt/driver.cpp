// tests/unit/simt: runs the tensor-core chunked DeltaNet kernels (the device parts of cuda/ops/deltanet_tc_prep.cu
// and deltanet_tc.cu, extracted into tc_dev.inc by test_deltanet_tc_simt.py) on the CPU, one block at a time, on
// inputs read from a directory; writes o (or y), the split xb, the final state and the conv front end's q back.
#include "simt.hpp"
#include <fstream>
#include <string>
#include <sstream>
namespace simt {
thread_local uint3_ tidx, bidx;
thread_local dim3 gdim;
thread_local Block* blk;
thread_local std::vector<Pending> pending;
thread_local std::vector<std::vector<Pending>> groups;
}
#include "tc_dev.inc"

using namespace pf::dn;
using namespace pf::dn::tc;
static int g_bad_async = 0;
template <class F>
void launch(dim3 grid, size_t smem, F body) {
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            simt::Block* b = new simt::Block();
            b->smem.assign(smem, 0xff);  // NaN-filled
            std::vector<std::thread> th;
            for (int t = 0; t < 256; ++t)
                th.emplace_back([&, t] {
                    simt::tidx = {(unsigned)t, 0, 0};
                    simt::bidx = {bx, by, 0};
                    simt::gdim = grid;
                    simt::blk = b;
                    simt::pending.clear();
                    simt::groups.clear();
                    body();
                    if (!simt::pending.empty()) ++g_bad_async;
                    for (auto& gr : simt::groups) if (!gr.empty()) ++g_bad_async;
                });
            for (auto& x : th) x.join();
            delete b;
        }
}
static std::vector<float> rd(const std::string& p, size_t n) {
    std::vector<float> v(n);
    std::ifstream f(p, std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), n * 4);
    if (!f) { std::fprintf(stderr, "short read %s\n", p.c_str()); std::exit(2); }
    return v;
}
static void wr(const std::string& p, const void* d, size_t bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(d), bytes);
}
int main(int argc, char** argv) {
    // dir T H hk token_major state_t mode ns dbl conv(0: post-conv inputs, 1: conv with history, 2: conv from zeros)
    std::string dir = argv[1];
    const int T = atoi(argv[2]), H = atoi(argv[3]), hk = atoi(argv[4]), tokmaj = atoi(argv[5]), state_t = atoi(argv[6]);
    const int mode = atoi(argv[7]), ns = atoi(argv[8]), dbl = atoi(argv[9]), conv = argc > 10 ? atoi(argv[10]) : 0;
    const int C = (2 * hk + H) * 128;
    auto q = rd(dir + "/q", (size_t)T * hk * 128), k = rd(dir + "/k", (size_t)T * hk * 128);
    auto v = rd(dir + "/v", (size_t)T * H * 128), g = rd(dir + "/g", (size_t)T * H), beta = rd(dir + "/beta", (size_t)T * H);
    auto state = rd(dir + "/state", (size_t)H * 128 * 128);
    auto z = rd(dir + "/z", (size_t)T * H * 128), norm = rd(dir + "/norm", 128);
    In in;
    in.q = q.data(), in.k = k.data(), in.v = v.data(), in.g = g.data(), in.beta = beta.data();
    if (tokmaj) { in.qk_t = hk * 128; in.qk_h = 128; in.v_t = H * 128; in.v_h = 128; in.gb_t = H; in.gb_h = 1; }
    else { in.qk_t = 128; in.qk_h = (long long)T * 128; in.v_t = 128; in.v_h = (long long)T * 128; in.gb_t = 1; in.gb_h = T; }
    in.hk = hk;
    size_t total = 0;
    carve_tc(nullptr, T, H, &total);
    void* base = std::aligned_alloc(256, (total + 255) / 256 * 256);
    std::memset(base, 0xff, total);
    const TcScratch sc = carve_tc(base, T, H, nullptr);
    std::vector<float> o((size_t)T * H * 128, NAN);
    std::vector<uint16_t> xb((size_t)2 * T * H * 128, 0xffff);
    Out out{};
    out.mode = mode; out.o = o.data(); out.xb = xb.data(); out.z = z.data(); out.ldz = H * 128; out.norm = norm.data(); out.eps = 1e-6f;
    const int nch = n_chunks(T);
    ConvIn cv{};
    std::vector<float> pre, hist, convw, a, b, ssma, dtb, qo, vo, ring;
    if (conv) {
        pre = rd(dir + "/pre", (size_t)T * C); hist = rd(dir + "/hist", (size_t)3 * C); convw = rd(dir + "/conv_w", (size_t)C * 4);
        a = rd(dir + "/a", (size_t)T * H); b = rd(dir + "/b", (size_t)T * H);
        ssma = rd(dir + "/ssm_a", H); dtb = rd(dir + "/dt_bias", H);
        qo.assign((size_t)T * hk * 128, NAN); vo.assign((size_t)T * H * 128, NAN);
        cv.pre = pre.data(); cv.ld = C;
        for (int j = 0; j < 3; ++j) cv.hist[j] = (conv == 1 || (conv == 3 && j > 0)) ? hist.data() + (size_t)j * C : nullptr;
        cv.conv_w = convw.data(); cv.a = a.data(); cv.b = b.data(); cv.ab_t = H; cv.ssm_a = ssma.data(); cv.dt_bias = dtb.data();
        cv.q = qo.data(); cv.v = vo.data();
        in.q = qo.data(); in.v = vo.data(); in.k = nullptr; in.g = nullptr; in.beta = nullptr;
        // the conv ring's update inside the output kernel (Out::ring), at position 5 (slots wrap), over a poisoned ring
        ring.assign((size_t)4 * C, -7.0f);
        out.ring = ring.data(); out.ring_pre = pre.data(); out.ring_ld = C; out.ring_c = C; out.ring_pos0 = 5;
    }
    if (conv) launch(dim3(nch, H), PREP_SMEM, [&] { prep_kernel<true>(in, cv, sc, T); });
    else launch(dim3(nch, H), PREP_SMEM, [&] { prep_kernel<false>(in, cv, sc, T); });
    const dim3 sg(128 / ns, H);
    if (ns == 32 && dbl) launch(sg, state_smem(32, true), [&] { tc_state<32, true>(sc, state.data(), state_t, nch); });
    if (ns == 32 && !dbl) launch(sg, state_smem(32, false), [&] { tc_state<32, false>(sc, state.data(), state_t, nch); });
    if (ns == 64 && dbl) launch(sg, state_smem(64, true), [&] { tc_state<64, true>(sc, state.data(), state_t, nch); });
    if (ns == 64 && !dbl) launch(sg, state_smem(64, false), [&] { tc_state<64, false>(sc, state.data(), state_t, nch); });
    const dim3 og(nch, H);
    if (mode == OUT_O) launch(og, OUT_SMEM, [&] { tc_output<OUT_O>(in, sc, out, T, H); });
    if (mode == OUT_Y) launch(og, OUT_SMEM, [&] { tc_output<OUT_Y>(in, sc, out, T, H); });
    if (mode == OUT_XB) launch(og, OUT_SMEM, [&] { tc_output<OUT_XB>(in, sc, out, T, H); });
    wr(dir + "/o_out", o.data(), o.size() * 4);
    wr(dir + "/xb_out", xb.data(), xb.size() * 2);
    wr(dir + "/state_out", state.data(), state.size() * 4);
    if (conv) wr(dir + "/q_out", qo.data(), qo.size() * 4);
    if (conv) wr(dir + "/ring_out", ring.data(), ring.size() * 4);
    if (g_bad_async) std::fprintf(stderr, "cp.async groups never waited: %d threads\n", g_bad_async);
    return g_bad_async ? 3 : 0;
}
