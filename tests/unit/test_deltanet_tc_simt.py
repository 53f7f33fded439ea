"""The tensor-core chunked DeltaNet kernels (cuda/ops/deltanet_tc_prep.cu, deltanet_tc.cu) run on the CPU.

tests/unit/simt/ is a small SIMT emulator: every CUDA thread an OS thread, __syncthreads a block barrier, shuffles,
ldmatrix and mma.sync warp collectives computed by the PTX ISA's fragment rules, cp.async performed at its wait. The
kernels' device code is taken from the sources as they are (everything above each file's host section), compiled with
g++ against the emulator's stand-ins for pf_common.cuh / lb_arch.cuh, and run on small shapes against float64
(cpu.py's recurrent form): the same 1e-4 as tests/gpu (the emulation gives ~5-7e-6, the GPU's split bf16 products
the same up to accumulation order). Covers both input layouts (the 0.8B's head-major with the transposed state, the
27B's token-major with Hv > Hk), every output mode (o, the fused out_norm, the split bf16 xb), all four state-pass
variants and the conv front end (full, partial and no history) with the output kernel's conv-ring update. Slow:
~10-60 s a case on two cores.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lucebox_cli.engines.cpu import _l2_norm, _rms_norm, _silu, gated_delta_recurrent

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "cuda" / "ops"
SIMT = Path(__file__).resolve().parent / "simt"
D = 128
OUT_O, OUT_Y, OUT_XB = 0, 1, 2


def device_part(name: str) -> str:
    """The kernels of one source: up to its host section's rule, else to the end of its anonymous namespace."""
    src = (OPS / name).read_text()
    if "// host\n" in src:
        dev = src[: src.rindex("// ----", 0, src.index("// host\n"))]
    else:
        dev = src[: src.index("}  // namespace\n")]
    dev = re.sub(r"extern __shared__ __align__\(16\) (\w+) (\w+)\[\];",
                 r"\1* \2 = reinterpret_cast<\1*>(::simt::blk->smem.data());", dev)
    dev = dev.replace('#include "deltanet_tc.cuh"', "")
    return dev + "}  // namespace\n}  // namespace tc\n}  // namespace dn\n}  // namespace pf\n"


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    out = tmp_path_factory.mktemp("simt")
    inc = (OPS / "deltanet_tc.cuh").read_text() + device_part("deltanet_tc_prep.cu") + device_part("deltanet_tc.cu")
    (out / "tc_dev.inc").write_text(inc)
    exe = out / "driver"
    r = subprocess.run([gxx, "-std=c++20", "-O2", "-pthread", "-w", f"-I{out}", f"-I{SIMT}", f"-I{OPS}",
                        f"-I{ROOT / 'cuda' / 'include'}", str(SIMT / "driver.cpp"), "-o", str(exe)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode and "barrier" in r.stderr and "No such file" in r.stderr:
        pytest.skip("no C++20 <barrier>")
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def conv_case(t, h, hk, conv, rng):
    """Pre-conv inputs and cpu.py's prep of them (float64): the conv over [history | pre], SiLU, norms, g, beta.
    conv 1: full history; 2: none (zeros, no pointers); 3: the oldest row missing (a ring at position 2)."""
    c = (2 * hk + h) * D
    files = {"pre": rng.standard_normal((t, c)), "hist": rng.standard_normal((3, c)),
             "conv_w": rng.standard_normal((c, 4)) * 0.5, "a": rng.standard_normal((t, h)),
             "b": rng.standard_normal((t, h)), "ssm_a": -np.exp(rng.standard_normal(h) * 0.5),
             "dt_bias": rng.standard_normal(h) * 0.5}
    files = {k: v.astype(np.float32) for k, v in files.items()}
    h0 = files["hist"].astype(np.float64) * (1.0 if conv == 1 else 0.0)
    if conv == 3:
        h0 = files["hist"].astype(np.float64).copy()
        h0[0] = 0.0
    hist = np.concatenate([h0, files["pre"].astype(np.float64)])
    mixed = _silu(sum(hist[j: j + t] * files["conv_w"][:, j].astype(np.float64) for j in range(4)))
    q = _l2_norm(mixed[:, : hk * D].reshape(t, hk, D)) / np.sqrt(D)
    k = _l2_norm(mixed[:, hk * D: 2 * hk * D].reshape(t, hk, D))
    v = mixed[:, 2 * hk * D:].reshape(t, h, D)
    g = files["ssm_a"].astype(np.float64) * np.logaddexp(0.0, files["a"] + files["dt_bias"].astype(np.float64))
    beta = 1.0 / (1.0 + np.exp(-files["b"].astype(np.float64)))
    return q, k, v, g, beta, files


# (T, Hv, Hk, token-major, transposed state, output mode, slice, double-buffered, conv)
CASES = [(70, 2, 2, 0, 1, OUT_O, 32, 1, 0), (130, 3, 1, 1, 0, OUT_Y, 64, 1, 1), (65, 2, 2, 0, 1, OUT_XB, 32, 0, 3),
         (130, 6, 2, 1, 0, OUT_O, 64, 0, 0), (1, 2, 2, 0, 1, OUT_O, 32, 1, 2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-Hv{}-Hk{}-{}-mode{}-ns{}{}-conv{}".format(
    c[0], c[1], c[2], "tok" if c[3] else "head", c[5], c[6], "d" if c[7] else "s", c[8]))
def test_kernels_on_the_cpu(driver, tmp_path, case):
    t, h, hk, tokmaj, state_t, mode, ns, dbl, conv = case
    rng = np.random.default_rng(t * 7 + h)
    q = _l2_norm(rng.standard_normal((t, hk, D))) / np.sqrt(D)
    k = _l2_norm(rng.standard_normal((t, hk, D)))
    v = rng.standard_normal((t, h, D))
    g = -rng.uniform(0.0, 1.5, (t, h))
    beta = rng.uniform(0.05, 1.0, (t, h))
    state = rng.standard_normal((h, D, D)).astype(np.float32)  # [H, dk, dv]
    z = rng.standard_normal((t, h * D)).astype(np.float32)
    norm = (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    if conv:
        q, k, v, g, beta, files = conv_case(t, h, hk, conv, rng)
        for name, x in files.items():
            np.ascontiguousarray(x, np.float32).tofile(tmp_path / name)
    f32 = [np.asarray(x, np.float32) for x in (q, k, v, g, beta)]
    lay = (lambda x: x) if tokmaj else (lambda x: np.swapaxes(x, 0, 1))
    for name, x in zip(("q", "k", "v", "g", "beta"), f32):
        np.ascontiguousarray(lay(x), np.float32).tofile(tmp_path / name)
    np.ascontiguousarray(state.transpose(0, 2, 1) if state_t else state).tofile(tmp_path / "state")
    z.tofile(tmp_path / "z")
    norm.tofile(tmp_path / "norm")
    r = subprocess.run([str(driver), str(tmp_path), *map(str, case)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]

    o_ref, s_ref = gated_delta_recurrent(*(np.asarray(x, np.float64) for x in (q, k, v, g, beta)),
                                         state.astype(np.float64))
    s = np.fromfile(tmp_path / "state_out", np.float32).reshape(h, D, D)
    s = s.transpose(0, 2, 1) if state_t else s
    if mode == OUT_O:
        ref, got = o_ref, np.fromfile(tmp_path / "o_out", np.float32).reshape(t, h, D)
    else:
        ref = _rms_norm(o_ref, norm.astype(np.float64), 1e-6) * _silu(z.reshape(t, h, D).astype(np.float64))
        if mode == OUT_Y:
            got = np.fromfile(tmp_path / "o_out", np.float32).reshape(t, h, D)
        else:
            bits = np.fromfile(tmp_path / "xb_out", np.uint16).reshape(2, t, h, D).astype(np.uint32) << 16
            got = bits[0].view(np.float32).astype(np.float64) + bits[1].view(np.float32)
    errs = {"out": rel(got, ref), "state": rel(s, s_ref)}
    if conv:
        qo = np.fromfile(tmp_path / "q_out", np.float32)
        qo = qo.reshape(t, hk, D) if tokmaj else qo.reshape(hk, t, D).transpose(1, 0, 2)
        errs["q"] = rel(qo, q)
        # the output kernel's conv-ring copy (the 0.8B layer path; dn_ring_write's copy, exact): slot (5 + t) & 3 holds
        # pre-conv row t for the last min(T, 4) rows, other slots untouched
        ring = np.fromfile(tmp_path / "ring_out", np.float32).reshape(4, -1)
        want = np.full_like(ring, -7.0)
        for tt in range(max(0, t - 4), t):
            want[(5 + tt) & 3] = files["pre"][tt]
        assert np.array_equal(ring, want), "conv ring update"
    print(case, " ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    assert np.isfinite(got).all() and np.isfinite(s).all()
    assert max(errs.values()) < 1e-4, errs
