"""The tensor-core prefill (cuda/ops/{gemm_bf16,deltanet_chunked,attn_prefill}.cu, cuda/prefill/) on the GPU.

Each op against a numpy reference at odd sizes with NaN-poisoned outputs (device buffers through
torch); then the whole 0.8B prefill at the real widths with random weights against the CPU engine
(last logits AND the state it leaves: recurrent state, conv ring, K/V cache), and decode after the
tensor-core prefill against decode after the megakernel's own token-by-token prefill. The GEMMs run on
both paths: our kernel ("own") and a cuBLAS loaded at run time ("cublas", skipped where none is found:
engines/cublas.py says where it looks; LUCEBOX_CUBLAS=/path names one). The attention runs on the tensor
cores (lb_attn_prefill_tc) unless LUCEBOX_ATTN_PREFILL=fp32 (lb_attn_prefill), read once per process:
test_prefill_attn_tc_vs_fp32 runs the fp32 side in a child process and compares the two. The chunked DeltaNet
likewise runs on the tensor cores unless LUCEBOX_DN_PREFILL=old: test_deltanet_chunked_variants and
test_prefill_dn_tc_vs_fp32 run the fp32 kernels (and the tensor-core state pass's other variants) in children.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from lucebox_cli.engines import cublas as cublas_mod
from lucebox_cli.engines import megakernel as mkmod
from lucebox_cli.engines.cpu import CPUEngine, gated_delta_recurrent
from lucebox_cli.engines.prefill_tc import TensorCorePrefill
from lucebox_cli.errors import EngineUnavailable
from lucebox_cli.models.qwen35 import ATTENTION, DELTANET, Qwen35Config

pytestmark = pytest.mark.gpu

GEMM_F32, GEMM_RESID, GEMM_SWIGLU, GEMM_SPLIT_X = 0, 1, 2, 8
MAX_CTX = 1024
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (as float32)."""
    return mkmod.bf16_bits_to_f32(mkmod.to_bf16_bits(x))


@pytest.fixture(scope="module")
def lib():
    return mkmod.open_gpu()[0]


@pytest.fixture(scope="module")
def cublas_lib(lib):
    """The library with a cuBLAS loaded, or a skip saying what was tried."""
    status = cublas_mod.load(lib)
    if not status.loaded:
        pytest.skip(f"no cuBLAS: {status.reason}")
    print(f"cuBLAS {status.version} from {status.path}")
    return lib


GEMM_PATHS = ["own", "cublas"]


def prefill_for(engine, gemm: str, **kw) -> TensorCorePrefill:
    """A TensorCorePrefill on GEMM path `gemm` (a skip for cublas where none loads)."""
    try:
        pf = TensorCorePrefill(engine, gemm=gemm, **kw)
    except EngineUnavailable as err:
        if gemm == "cublas":
            pytest.skip(err.message)
        raise
    assert pf.gemm == gemm, pf.note
    return pf


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def dev(torch, a: np.ndarray):
    """A device copy of a numpy array (uint16 bf16 bits travel as int16)."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:
        a = a.view(np.int16)
    return torch.from_numpy(a.copy()).cuda()


def ptr(t, offset_bytes: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() + offset_bytes)


def host(torch, t, dtype=np.float32) -> np.ndarray:
    torch.cuda.synchronize()
    a = t.cpu().numpy()
    return mkmod.bf16_bits_to_f32(a.view(np.uint16)) if dtype == "bf16" else a


def split_bf16(x: np.ndarray) -> np.ndarray:
    """[2, ...] bf16 bits of the split pair hi = bf16(x), lo = bf16(x - hi), as the kernels write it."""
    hi = bf16(x)
    return np.stack([mkmod.to_bf16_bits(hi), mkmod.to_bf16_bits(np.asarray(x, np.float32) - hi)])


def from_split(bits: np.ndarray) -> np.ndarray:
    """hi + lo of a [2, ...] split pair of bf16 bits."""
    return mkmod.bf16_bits_to_f32(bits[0]) + mkmod.bf16_bits_to_f32(bits[1])


def nan_f32(torch, *shape):
    return torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")


def nan_bf16(torch, *shape):
    # 0xFFFF is a NaN in bf16
    return torch.full(shape, -1, dtype=torch.int16, device="cuda")


# ---- gemm_bf16 -----------------------------------------------------------------------------------


_EPI = {GEMM_F32: "f32", GEMM_RESID: "resid", GEMM_SWIGLU: "swiglu"}
S = GEMM_SPLIT_X
_GEMM_CASES = [(37, 3584, 1024, GEMM_SWIGLU), (129, 6144, 1024, GEMM_F32), (520, 1024, 2048, GEMM_RESID),
               (520, 8224, 1024, GEMM_F32), (1, 1024, 3584, GEMM_RESID), (520, 3584, 1024, GEMM_SWIGLU),
               (37, 5120, 1024, GEMM_F32), (200, 1000, 96, GEMM_F32), (37, 3584, 1024, GEMM_SWIGLU | S),
               (520, 8224, 1024, GEMM_F32 | S), (129, 1024, 2048, GEMM_RESID | S), (520, 1024, 3584, GEMM_RESID | S),
               (1, 5120, 1024, GEMM_F32 | S), (520, 3584, 1024, GEMM_SWIGLU | S)]


def _gemm_id(c) -> str:
    return f"M{c[0]}-N{c[1]}-K{c[2]}-{_EPI[c[3] & ~S]}" + ("-splitx" if c[3] & S else "")


def _gemm_case(seed: int, m: int, n: int, k: int, flags: int):
    """Random (x bits as the kernel reads them, bf16 w, float64 reference of the epilogue, y0 for RESID)."""
    epi, split_x = flags & ~S, bool(flags & S)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    xbits = split_bf16(x) if split_x else mkmod.to_bf16_bits(x)
    x = from_split(xbits) if split_x else bf16(x)  # exactly what the kernel multiplies
    rows = 2 * n if epi == GEMM_SWIGLU else n
    w = bf16(rng.standard_normal((rows, k), dtype=np.float32) / np.float32(np.sqrt(k)))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    if epi == GEMM_SWIGLU:
        g, u = ref[:, :n], ref[:, n:]
        ref = g / (1.0 + np.exp(-g)) * u
    y0 = rng.standard_normal((m, n), dtype=np.float32)
    if epi == GEMM_RESID:
        ref = ref + y0
    return xbits, w, ref, y0


@pytest.mark.parametrize("m,n,k,flags", [pytest.param(*c, id=_gemm_id(c)) for c in _GEMM_CASES])
def test_gemm_bf16(lib, torch, m, n, k, flags):
    epi = flags & ~S
    xbits, w, ref, y0 = _gemm_case(m * 7 + n + k + flags, m, n, k, flags)
    if epi == GEMM_RESID:
        dy = dev(torch, y0)
    else:
        dy = nan_bf16(torch, 2, m, n) if epi == GEMM_SWIGLU else nan_f32(torch, m, n)
    dx, dw = dev(torch, xbits), dev(torch, mkmod.to_bf16_bits(w))
    lib.call("lb_gemm_bf16", ptr(dx), ptr(dw), ptr(dy), m, n, k, flags, None)
    if epi == GEMM_SWIGLU:
        torch.cuda.synchronize()
        got = from_split(dy.cpu().numpy().view(np.uint16))
    else:
        got = host(torch, dy)
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    err = rel_rms(got, ref)
    # fp32 accumulation order only (the split SwiGLU output keeps ~16 significant bits)
    assert err < 1e-5, err


# the prefill's split shapes at odd M, every epilogue, plus plain X
_CUBLAS_CASES = [(m, n, k, epi | S) for m in (1, 37, 520)
                 for n, k, epi in ((8224, 1024, GEMM_F32), (1024, 2048, GEMM_RESID), (3584, 1024, GEMM_SWIGLU),
                                   (1024, 3584, GEMM_RESID))] + [
    (37, 5120, 1024, GEMM_F32), (129, 1024, 96, GEMM_RESID), (200, 1000, 96, GEMM_SWIGLU), (3, 8, 32, GEMM_F32 | S)]


def _run_gemm(lib, torch, name, dx, dw, y0, m, n, flags):
    """Output of `name` (lb_gemm_bf16 or lb_gemm_bf16_cublas) on NaN-poisoned (or y0 for RESID) outputs."""
    epi = flags & ~S
    if epi == GEMM_RESID:
        dy = dev(torch, y0)
    else:
        dy = nan_bf16(torch, 2, m, n) if epi == GEMM_SWIGLU else nan_f32(torch, m, n)
    lib.call(name, ptr(dx), ptr(dw), ptr(dy), m, n, dx.shape[-1], flags, None)
    torch.cuda.synchronize()
    return from_split(dy.cpu().numpy().view(np.uint16)) if epi == GEMM_SWIGLU else dy.cpu().numpy()


@pytest.mark.parametrize("m,n,k,flags", [pytest.param(*c, id=_gemm_id(c)) for c in _CUBLAS_CASES])
def test_gemm_bf16_cublas(cublas_lib, torch, m, n, k, flags):
    """lb_gemm_bf16_cublas against a float64 reference and against lb_gemm_bf16 on the same inputs."""
    lib = cublas_lib
    xbits, w, ref, y0 = _gemm_case(m * 11 + n + k + flags, m, n, k, flags)
    dx, dw = dev(torch, xbits), dev(torch, mkmod.to_bf16_bits(w))
    got = _run_gemm(lib, torch, "lb_gemm_bf16_cublas", dx, dw, y0, m, n, flags)
    own = _run_gemm(lib, torch, "lb_gemm_bf16", dx, dw, y0, m, n, flags)
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    err, vs_own = rel_rms(got, ref), rel_rms(got, own)
    print(f"cuBLAS vs float64 {err:.2e}, vs lb_gemm_bf16 {vs_own:.2e}")
    # fp32 accumulation order only (the split SwiGLU output keeps ~16 significant bits)
    assert err < 1e-5 and vs_own < 1e-5, (err, vs_own)


def test_gemm_bf16_cublas_refuses_bad_shapes(cublas_lib, torch):
    d = torch.zeros(4096, dtype=torch.float32, device="cuda")
    assert cublas_lib.fn.lb_gemm_bf16_cublas(ptr(d), ptr(d), ptr(d), 4, 16, 40, S, None) == 1  # K % 32
    assert cublas_lib.fn.lb_gemm_bf16_cublas(ptr(d), ptr(d), ptr(d, 4), 4, 16, 32, S, None) == 1  # y alignment


@pytest.mark.parametrize("m,k,split", [(1, 2048, 1), (37, 3584, 1), (520, 2048, 1), (520, 3584, 1), (129, 1024, 0)])
def test_gemm_bf16_cublas_resid_norm(cublas_lib, torch, m, k, split):
    """The fused residual + RMSNorm epilogue (the cuBLAS prefill's step after the out- and down-projections): the same
    bits as lb_gemm_bf16_cublas(RESID) then lb_pf_rmsnorm_bf16, and both outputs against float64."""
    lib, eps = cublas_lib, 1e-6
    flags = GEMM_RESID | (S if split else 0)
    xbits, w, ref, y0 = _gemm_case(m * 13 + k + flags, m, 1024, k, flags)
    nw = (1.0 + 0.1 * np.random.default_rng(m + k).standard_normal(1024)).astype(np.float32)
    dx, dw, dnw = dev(torch, xbits), dev(torch, mkmod.to_bf16_bits(w)), dev(torch, nw)
    dh, dxb = dev(torch, y0), nan_bf16(torch, 2, m, 1024)
    lib.call("lb_gemm_bf16_cublas_resid_norm", ptr(dx), ptr(dw), ptr(dh), ptr(dnw), ptr(dxb), m, k, split, eps, None)
    dh2, dxb2 = dev(torch, y0), nan_bf16(torch, 2, m, 1024)
    lib.call("lb_gemm_bf16_cublas", ptr(dx), ptr(dw), ptr(dh2), m, 1024, k, flags, None)
    lib.call("lb_pf_rmsnorm_bf16", ptr(dh2), ptr(dnw), ptr(dxb2), m, eps, None)
    torch.cuda.synchronize()
    h, h2 = dh.cpu().numpy(), dh2.cpu().numpy()
    xb, xb2 = dxb.cpu().numpy().view(np.uint16), dxb2.cpu().numpy().view(np.uint16)
    assert np.array_equal(h, h2) and np.array_equal(xb, xb2), "fused epilogue differs from RESID + rmsnorm_bf16"
    r64 = np.asarray(ref, np.float64)
    norm64 = r64 / np.sqrt(np.mean(r64**2, axis=1, keepdims=True) + eps) * nw.astype(np.float64)
    e_h, e_xb = rel_rms(h, r64), rel_rms(from_split(xb), norm64)
    print(f"h vs float64 {e_h:.2e}, xb vs float64 {e_xb:.2e}")
    assert e_h < 1e-5 and e_xb < 1e-5, (e_h, e_xb)


def test_gemm_bf16_cublas_resid_norm_refuses_bad_shapes(cublas_lib, torch):
    d = torch.zeros(4096, dtype=torch.float32, device="cuda")
    f = cublas_lib.fn.lb_gemm_bf16_cublas_resid_norm
    assert f(ptr(d), ptr(d), ptr(d), ptr(d), ptr(d), 4, 40, 1, 1e-6, None) == 1  # K % 32
    assert f(ptr(d), ptr(d), ptr(d, 4), ptr(d), ptr(d), 4, 32, 1, 1e-6, None) == 1  # h alignment


# ---- deltanet_chunked ----------------------------------------------------------------------------


def delta_inputs(t_len: int, h: int, g_max: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = (unit(rng.standard_normal((t_len, h, 128))) / np.sqrt(128)).astype(np.float32)
    k = unit(rng.standard_normal((t_len, h, 128))).astype(np.float32)
    v = rng.standard_normal((t_len, h, 128)).astype(np.float32)
    g = (-rng.uniform(0.0, g_max, (t_len, h))).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, (t_len, h)).astype(np.float32)
    state = rng.standard_normal((h, 128, 128)).astype(np.float32)
    return q, k, v, g, beta, state


DN_ENV = "LUCEBOX_DN_PREFILL"


def want_dn() -> int:
    """lb_deltanet_chunked_path of this process: 1 (tensor cores) unless LUCEBOX_DN_PREFILL=old (read once)."""
    return 0 if os.environ.get(DN_ENV) == "old" else 1


# (65, 128: one past and exactly at a chunk boundary; 48 heads: the 27B's count, which takes the tensor-core state
# pass's 64-column slices on the H200 (192 blocks of 32 columns would exceed its 132 SMs)
@pytest.mark.parametrize("t_len,h,g_max", [(1, 2, 1.5), (37, 4, 1.5), (64, 3, 0.2), (65, 2, 1.5), (128, 5, 0.5),
                                           (129, 16, 1.5), (200, 2, 12.0), (330, 48, 1.5), (520, 16, 1.5)],
                         ids=lambda p: f"{p}")
def test_deltanet_chunked_vs_recurrent(lib, torch, t_len, h, g_max):
    assert lib.fn.lb_deltanet_chunked_path() == want_dn()
    q, k, v, g, beta, state = delta_inputs(t_len, h, g_max, seed=t_len + h)
    o_ref, s_ref = gated_delta_recurrent(q, k, v, g, beta, state)  # s [H, dk, dv]
    head_major = lambda x: dev(torch, x.transpose(1, 0, 2))  # noqa: E731  [H, T, 128]
    dq, dk_, dv_ = head_major(q), head_major(k), head_major(v)
    dg, db = dev(torch, g.T), dev(torch, beta.T)
    ds = dev(torch, state.transpose(0, 2, 1))  # the megakernel's [H, dv, dk]
    do = nan_f32(torch, t_len, h * 128)
    nbytes = int(lib.fn.lb_deltanet_chunked_scratch_bytes(t_len, h))
    scratch = torch.full((nbytes,), 255, dtype=torch.uint8, device="cuda")  # NaN-filled scratch
    lib.call("lb_deltanet_chunked", ptr(dq), ptr(dk_), ptr(dv_), ptr(dg), ptr(db), ptr(ds), ptr(do), ptr(scratch),
             t_len, h, None)
    o = host(torch, do).reshape(t_len, h, 128)
    s = host(torch, ds).transpose(0, 2, 1)
    assert np.isfinite(o).all() and np.isfinite(s).all()
    eo, es = rel_rms(o, o_ref), rel_rms(s, s_ref)
    print(f"T={t_len} H={h} ({'tensor cores' if want_dn() else 'fp32'}): outputs {eo:.2e}, final state {es:.2e}")
    assert eo < 1e-4 and es < 1e-4


# The other forms of lb_deltanet_chunked, each in a child process (the switches are read once per process): the fp32
# kernels (their state pass as the occupancy picks it and single-buffered), and the tensor-core state pass with
# single-buffered tiles and with either slice width.
DN_VARIANTS = {"fp32": {DN_ENV: "old"}, "fp32-split1": {DN_ENV: "old", "LUCEBOX_DN_SCAN": "split1"},
               "split1": {"LUCEBOX_DN_SCAN": "split1"},
               "slice32": {"LUCEBOX_DN_SLICE": "32"}, "slice64-split1": {"LUCEBOX_DN_SLICE": "64",
                                                                         "LUCEBOX_DN_SCAN": "split1"}}


@pytest.mark.parametrize("variant", list(DN_VARIANTS))
def test_deltanet_chunked_variants(variant):
    if any(os.environ.get(k) for k in (DN_ENV, "LUCEBOX_DN_SCAN", "LUCEBOX_DN_SLICE")):
        pytest.skip("a variant switch is set in this process: this is a child")
    env = dict(os.environ, **DN_VARIANTS[variant])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-s", "-p", "no:cacheprovider",
                        str(HERE / "test_prefill.py"), "-k", "test_deltanet_chunked_vs_recurrent"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


# ---- attn_prefill ----------------------------------------------------------------------------------

# lb_attn_prefill (fp32, the LUCEBOX_ATTN_PREFILL=fp32 path) and lb_attn_prefill_tc (the tensor-core form the
# prefill runs by default), the latter without and with key splits (partials)
ATTN_PATHS = ["fp32", "tc", "tc-split"]


@pytest.mark.parametrize("path", ATTN_PATHS)
@pytest.mark.parametrize("t_len,pos0", [(1, 0), (7, 0), (37, 0), (129, 100), (520, 0), (9, 300), (33, 1), (130, 520)],
                         ids=lambda p: str(p))
def test_attn_prefill(lib, torch, path, t_len, pos0):
    nh, nkv, d = 8, 2, 256
    max_ctx = pos0 + t_len + 5
    rng = np.random.default_rng(t_len + pos0)
    q = rng.standard_normal((t_len, nh, d), dtype=np.float32)
    kc = bf16(rng.standard_normal((nkv, max_ctx, d), dtype=np.float32))
    vc = bf16(rng.standard_normal((nkv, max_ctx, d), dtype=np.float32))
    y = rng.standard_normal((t_len, nh * 2 * d), dtype=np.float32)  # [q_h | gate_h] per head, like attn_q rows
    ref = np.empty((t_len, nh, d))
    pos = pos0 + np.arange(t_len)
    for h in range(nh):
        keys, vals = kc[h // 4, : pos0 + t_len].astype(np.float64), vc[h // 4, : pos0 + t_len].astype(np.float64)
        s = q[:, h].astype(np.float64) @ keys.T / 16.0
        s = np.where(np.arange(pos0 + t_len)[None, :] <= pos[:, None], s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        o = (p / p.sum(axis=1, keepdims=True)) @ vals
        gate = y[:, h * 2 * d + d : (h + 1) * 2 * d]
        ref[:, h] = o / (1.0 + np.exp(-gate))
    # cache rows past the prompt hold NaN (bf16 0xFFFF; never written in a real cache)
    kbits, vbits = mkmod.to_bf16_bits(kc), mkmod.to_bf16_bits(vc)
    kbits[:, pos0 + t_len :] = 0xFFFF
    vbits[:, pos0 + t_len :] = 0xFFFF
    dq, dk_, dv_, dy = dev(torch, q), dev(torch, kbits), dev(torch, vbits), dev(torch, y)
    out = nan_bf16(torch, 2, t_len, nh * d)
    if path == "fp32":
        lib.call("lb_attn_prefill", ptr(dq), ptr(dk_), ptr(dv_), ptr(dy, d * 4), nh * 2 * d, 2 * d, ptr(out), t_len,
                 pos0, nh, nkv, max_ctx, None)
    else:
        max_splits = 8 if path == "tc-split" else 1
        nbytes = int(lib.fn.lb_attn_partials_bytes(t_len, nh, max_splits))
        part = torch.full((max(nbytes, 1),), 255, dtype=torch.uint8, device="cuda")  # NaN-filled partials
        lib.call("lb_attn_prefill_tc", ptr(dq), ptr(dk_), ptr(dv_), ptr(dy, d * 4), nh * 2 * d, 2 * d, ptr(out),
                 ptr(part) if nbytes else None, max_splits, t_len, pos0, nh, nkv, max_ctx, None)
    torch.cuda.synchronize()
    got = from_split(out.cpu().numpy().view(np.uint16)).reshape(t_len, nh, d)
    assert np.isfinite(got).all()
    err = rel_rms(got, ref)
    print(f"{path}: relative RMS vs float64 {err:.2e}")
    # fp32 online softmax vs float64; the output is a split pair (~16 significant bits). The tensor-core
    # form's split-precision Q and P add ~4e-6 (numpy model of the kernel: 2.4e-6 .. 4.0e-6 on these cases)
    assert err < 2e-5


# ---- the whole prefill ---------------------------------------------------------------------------


def real_config(n_layers: int) -> Qwen35Config:
    kinds = tuple(ATTENTION if (i + 1) % 4 == 0 else DELTANET for i in range(n_layers))
    return Qwen35Config(hidden=1024, n_layers=n_layers, n_heads=8, n_kv_heads=2, head_dim=256, hk=16, hv=16,
                        dk=128, dv=128, conv_kernel=4, ffn=3584, vocab=248320, rope_theta=1e7, rope_dims=64,
                        eps=1e-6, tied=True, layer_types=kinds, full_attention_interval=4)


@functools.lru_cache(maxsize=1)
def model(n_layers: int, seed: int = 0) -> tuple[Qwen35Config, dict[str, np.ndarray]]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_random_08b import random_internal_weights

    cfg = real_config(n_layers)
    w = random_internal_weights(cfg, seed)
    return cfg, {name: bf16(v) for name, v in w.items()}


def check_state(cpu: CPUEngine, gpu, n: int, tol: float = 1e-2) -> None:
    """Everything the decode kernel will read after n tokens, against the CPU engine's state."""
    worst = {}
    for layer in range(cpu.cfg.n_layers):
        if cpu.cfg.is_attention(layer):
            errs = {"k": rel_rms(gpu.read(mkmod.READ_KCACHE, layer)[:n], cpu._k_cache[layer][:n]),
                    "v": rel_rms(gpu.read(mkmod.READ_VCACHE, layer)[:n], cpu._v_cache[layer][:n])}
        else:
            conv = gpu.read(mkmod.READ_CONV, layer)
            ring = np.stack([conv[(n - 3 + j) % 4] for j in range(3)])
            errs = {"S": rel_rms(gpu.read(mkmod.READ_STATE, layer), cpu._state[layer]),
                    "conv": rel_rms(ring, cpu._conv[layer])}
        for key, e in errs.items():
            worst[key] = max(worst.get(key, 0.0), e)
            assert e < tol, f"layer {layer} {key}: relative RMS {e:.2e}"
    print("worst state errors:", {k: f"{v:.2e}" for k, v in worst.items()})


@functools.lru_cache(maxsize=1)
def cpu_prefill_24(n: int, seed: int) -> tuple[CPUEngine, np.ndarray]:
    """The CPU engine after prefilling n random tokens and its last logits (shared by both GEMM paths: it
    is slow; the tests only read its state)."""
    cfg, w = model(24)
    cpu = CPUEngine(cfg, w, max_context=MAX_CTX)
    return cpu, cpu.prefill(np.random.default_rng(seed).integers(0, cfg.vocab, n))


@pytest.mark.parametrize("gemm", GEMM_PATHS)
def test_prefill_matches_cpu_engine_24_layers(gemm):
    cfg, w = model(24)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab, 520)
    cpu, ref = cpu_prefill_24(520, 1)
    gpu = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    try:
        pf = prefill_for(gpu, gemm)
    except BaseException:
        gpu.close()
        raise
    try:
        gpu.poison()
        am, got = pf.run(prompt)
        assert np.isfinite(got).all(), "unwritten or NaN logits"
        err = rel_rms(got, ref)
        print(f"pp520 last logits relative RMS vs CPU ({gemm} GEMMs): {err:.2e}")
        assert err < 1e-2
        assert am == int(np.argmax(got)) and gpu.pending == am and gpu.n_past == 520
        assert np.array_equal(gpu.read(mkmod.READ_LOGITS), got)
        check_state(cpu, gpu, 520)
    finally:
        pf.close()
        gpu.close()


@pytest.mark.parametrize("gemm", GEMM_PATHS)
def test_decode_after_prefill_equals_decode_only_24_layers(gemm):
    cfg, w = model(24)
    prompt = np.random.default_rng(2).integers(0, cfg.vocab, 200)
    a = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    b = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    try:
        pf = prefill_for(a, gemm)
    except BaseException:
        a.close()
        b.close()
        raise
    try:
        la = pf.run(prompt)[1]
        lb = b.prefill(prompt)
        err = rel_rms(la, lb)
        print(f"prefill logits, tensor-core ({gemm} GEMMs) vs decode kernel: {err:.2e}")
        assert err < 1e-2
        feed = [int(np.argmax(lb))] + np.random.default_rng(3).integers(0, cfg.vocab, 15).tolist()
        worst = 0.0
        for step, tok in enumerate(feed):
            a.poison()
            ga, gb = a.step(tok), b.step(tok)
            e = rel_rms(ga, gb)
            worst = max(worst, e)
            assert e < 1e-2, f"decode step {step}: relative RMS {e:.2e}"
        print(f"decode after prefill vs decode only, worst over {len(feed)} steps: {worst:.2e}")
    finally:
        pf.close()
        a.close()
        b.close()


@pytest.mark.parametrize("gemm", GEMM_PATHS)
def test_segmented_prefill_after_decode_4_layers(gemm):
    """Prompt, one decode step, then a prompt longer than max_chunk: the hand-offs between the two
    kernels (conv ring, state, cache rows) and between segments, against the CPU engine."""
    cfg, w = model4()
    rng = np.random.default_rng(4)
    p1, p2 = rng.integers(0, cfg.vocab, 37), rng.integers(0, cfg.vocab, 150)
    cpu = CPUEngine(cfg, w, max_context=MAX_CTX)
    gpu = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    try:
        pf = prefill_for(gpu, gemm, max_chunk=64)
    except BaseException:
        gpu.close()
        raise
    try:
        assert rel_rms(pf.run(p1)[1], cpu.prefill(p1)) < 1e-2
        assert rel_rms(gpu.step(777), cpu.step(777)) < 1e-2
        gpu.poison()
        got, ref = pf.run(p2)[1], cpu.prefill(p2)
        assert np.isfinite(got).all() and rel_rms(got, ref) < 1e-2
        check_state(cpu, gpu, 37 + 1 + 150)
        # greedy continuation on the small model: identical tokens
        want, logits = [], ref
        for _ in range(24):
            want.append(int(np.argmax(logits)))
            logits = cpu.step(want[-1])
        assert gpu.pending == want[0]
        assert [want[0]] + gpu.decode(23).tolist() == want
    finally:
        pf.close()
        gpu.close()


@functools.lru_cache(maxsize=1)
def model4() -> tuple[Qwen35Config, dict[str, np.ndarray]]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_random_08b import random_internal_weights

    cfg = real_config(4)
    return cfg, {name: bf16(v) for name, v in random_internal_weights(cfg, 5).items()}


def test_prefill_refuses_overflow_and_bad_tokens():
    cfg, w = model4()
    gpu = mkmod.MegakernelEngine(cfg, w, max_context=64)
    pf = TensorCorePrefill(gpu)
    try:
        from lucebox_cli.errors import LuceboxError

        with pytest.raises(LuceboxError, match="max_context"):
            pf.run(np.zeros(65, dtype=np.int64))
        with pytest.raises(LuceboxError, match="out of range"):
            pf.run([cfg.vocab])
        assert gpu.n_past == 0
    finally:
        pf.close()
        gpu.close()


def test_engine_reports_its_prefill_gemm():
    """The engine's info (every bench row's engine_info) names the GEMM path its prefill runs, and its
    attention path."""
    cfg, w = model4()
    own = mkmod.MegakernelEngine(cfg, w, max_context=64, prefill_gemm="own")
    try:
        assert own.info["prefill_gemm"] == "own" and own.info["cublas"] is None
        assert own.info["prefill_attn"] == want_attn()
    finally:
        own.close()
    auto = mkmod.MegakernelEngine(cfg, w, max_context=64)
    try:
        status = cublas_mod.load(auto.lib)
        assert auto.info["prefill_gemm"] in ("own", "cublas")
        assert (auto.info["prefill_gemm"] == "cublas") == (status.loaded and not auto.info.get("prefill_gemm_note"))
        print("auto:", auto.info["prefill_gemm"], auto.info["cublas"], auto.info.get("prefill_gemm_note"))
    finally:
        auto.close()


# ---- the attention path: tensor cores (default) and fp32 (LUCEBOX_ATTN_PREFILL=fp32) -----------------

# Prompts fed as consecutive prefill chunks into one engine: every odd length at pos0 = 0 (the first chunk) or
# after earlier chunks (pos0 = 1 .. 650), ending mid query tile (12 tokens) and mid key tile (32 keys).
# The 4-layer model's attention layer is its last, so its output reaches the logits, checked after each chunk.
CHUNK_SEQS = {"up": (1, 7, 33, 130, 520), "down": (520, 130, 33, 7, 1)}
ATTN_ENV = "LUCEBOX_ATTN_PREFILL"


def want_attn() -> str:
    """The attention path this process's library runs (the switch is read once per process)."""
    return "fp32" if os.environ.get(ATTN_ENV) == "fp32" else "tc"


def chunk_prompts(seq: str) -> list[np.ndarray]:
    rng = np.random.default_rng({"up": 101, "down": 102}[seq])
    vocab = model4()[0].vocab
    return [rng.integers(0, vocab, n) for n in CHUNK_SEQS[seq]]


@functools.lru_cache(maxsize=None)
def cpu_chunks(seq: str) -> tuple[CPUEngine, list[np.ndarray]]:
    """The CPU engine after every chunk of `seq` and the last logits of each (shared by the tests below)."""
    cfg, w = model4()
    cpu = CPUEngine(cfg, w, max_context=MAX_CTX)
    return cpu, [cpu.prefill(p) for p in chunk_prompts(seq)]


def gpu_chunks(gemm: str, seq: str, cpu: Optional[CPUEngine] = None) -> tuple[str, list[np.ndarray]]:
    """(attention path, last logits of each chunk) of the tensor-core prefill on a fresh engine; with `cpu`,
    the state after the last chunk is checked against it."""
    cfg, w = model4()
    gpu = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    try:
        pf = prefill_for(gpu, gemm)
    except BaseException:
        gpu.close()
        raise
    try:
        logits = []
        for p in chunk_prompts(seq):
            gpu.poison()
            logits.append(pf.run(p)[1])
            assert np.isfinite(logits[-1]).all(), "unwritten or NaN logits"
        n = sum(CHUNK_SEQS[seq])
        assert gpu.n_past == n
        if cpu is not None:
            check_state(cpu, gpu, n)
        return pf.attn, logits
    finally:
        pf.close()
        gpu.close()


@pytest.mark.parametrize("gemm", GEMM_PATHS)
@pytest.mark.parametrize("seq", list(CHUNK_SEQS))
def test_prefill_chunks_vs_cpu(gemm, seq):
    """Consecutive prefill chunks on the attention path this process runs (tensor cores unless
    LUCEBOX_ATTN_PREFILL=fp32) against the CPU engine: every chunk's last logits and the state after the
    last, at the whole-prefill tests' 1e-2."""
    cpu, ref = cpu_chunks(seq)
    attn, got = gpu_chunks(gemm, seq, cpu)
    assert attn == want_attn()
    errs = [rel_rms(g, r) for g, r in zip(got, ref)]
    print(f"{CHUNK_SEQS[seq]} {attn} attention, {gemm} GEMMs: logits vs CPU", " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < 1e-2


def dump_chunks(gemm: str, path: str) -> None:
    """The child of test_prefill_attn_tc_vs_fp32 and test_prefill_dn_tc_vs_fp32: gpu_chunks of every sequence into
    an .npz, with the attention and DeltaNet paths that ran."""
    out = {}
    for seq in CHUNK_SEQS:
        attn, logits = gpu_chunks(gemm, seq)
        out["attn"] = np.array(attn)
        out[seq] = np.stack(logits)
    out["dn"] = np.array(mkmod.open_gpu()[0].fn.lb_deltanet_chunked_path())
    np.savez(path, **out)


@pytest.mark.parametrize("gemm", GEMM_PATHS)
def test_prefill_attn_tc_vs_fp32(gemm, tmp_path):
    """The same chunks on both attention paths: fp32 (LUCEBOX_ATTN_PREFILL=fp32, in a child process: the
    switch is read once per process) against the CPU engine at 1e-2 as above, and the tensor cores against
    fp32 at 1e-3 (an integration check: wrong rows, heads, halves or partials show far above it; the
    kernels' ~4e-6 difference is held by test_attn_prefill)."""
    if want_attn() != "tc":
        pytest.skip(f"{ATTN_ENV}=fp32 in this process: no tensor-core side to compare")
    tc = {seq: gpu_chunks(gemm, seq) for seq in CHUNK_SEQS}  # (a skip here where no cuBLAS loads)
    path = tmp_path / "fp32.npz"
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(HERE)!r}]; import test_prefill as t; "
            f"t.dump_chunks({gemm!r}, {str(path)!r})")
    env = dict(os.environ, **{ATTN_ENV: "fp32"})
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    fp32 = np.load(path)
    assert str(fp32["attn"]) == "fp32"
    identical = True
    for seq in CHUNK_SEQS:
        attn, tc_logits = tc[seq]
        assert attn == "tc"
        ref = cpu_chunks(seq)[1]
        for n, f, t, r_ in zip(CHUNK_SEQS[seq], fp32[seq], tc_logits, ref):
            e_cpu, e_tc = rel_rms(f, r_), rel_rms(t, f)
            print(f"{seq} chunk of {n}: fp32 attention vs CPU {e_cpu:.2e}; tensor cores vs fp32 {e_tc:.2e}")
            assert e_cpu < 1e-2 and e_tc < 1e-3
            identical = identical and np.array_equal(f, t)
    # the two paths round differently: bit-identical logits everywhere would mean one path ran twice
    assert not identical


def test_prefill_fused_norms_bit_identical(monkeypatch):
    """The cuBLAS prefill with its RMSNorms inside the residual epilogues (default) against the same prefill with them
    as separate kernels (LUCEBOX_PREFILL_NORM=separate, read when the context is made): the same logits, bit for bit,
    on every chunk sequence (each chunk continuing from the state the last left; the first layer's norm of each
    segment stays a kernel in both)."""
    fused = {seq: gpu_chunks("cublas", seq)[1] for seq in CHUNK_SEQS}  # (a skip here where no cuBLAS loads)
    monkeypatch.setenv("LUCEBOX_PREFILL_NORM", "separate")
    for seq in CHUNK_SEQS:
        sep = gpu_chunks("cublas", seq)[1]
        for n, a, b in zip(CHUNK_SEQS[seq], fused[seq], sep):
            print(f"{seq} chunk of {n}: fused vs separate norms, max |diff| {np.max(np.abs(a - b)):.3e}")
            assert np.array_equal(a, b)


# ---- the DeltaNet path: tensor cores (default) and fp32 (LUCEBOX_DN_PREFILL=old) ------------------------------


@pytest.mark.parametrize("gemm", GEMM_PATHS)
def test_prefill_dn_tc_vs_fp32(gemm, tmp_path):
    """The chunk sequences above on both chunked-DeltaNet paths (the tensor-core path fuses the gated norm into its
    output kernel): fp32 (LUCEBOX_DN_PREFILL=old, in a child process) against the CPU engine at 1e-2, and the
    tensor cores against fp32 at 1e-3 (an integration check, as for the attention paths: the kernels' ~6e-6
    difference is held by test_deltanet_chunked_vs_recurrent)."""
    if want_dn() != 1 or want_attn() != "tc":
        pytest.skip("a path switch is set in this process: this is a child, or no tensor-core side to compare")
    tc = {seq: gpu_chunks(gemm, seq, cpu_chunks(seq)[0] if seq == "up" else None) for seq in CHUNK_SEQS}
    path = tmp_path / "dn_fp32.npz"
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(HERE)!r}]; import test_prefill as t; "
            f"t.dump_chunks({gemm!r}, {str(path)!r})")
    env = dict(os.environ, **{DN_ENV: "old"})
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    fp32 = np.load(path)
    assert int(fp32["dn"]) == 0 and str(fp32["attn"]) == "tc"
    identical = True
    for seq in CHUNK_SEQS:
        tc_logits = tc[seq][1]
        ref = cpu_chunks(seq)[1]
        for n, f, t, r_ in zip(CHUNK_SEQS[seq], fp32[seq], tc_logits, ref):
            e_cpu, e_tc, e_tc_cpu = rel_rms(f, r_), rel_rms(t, f), rel_rms(t, r_)
            print(f"{seq} chunk of {n}: fp32 DeltaNet vs CPU {e_cpu:.2e}; tensor cores vs fp32 {e_tc:.2e}, "
                  f"vs CPU {e_tc_cpu:.2e}")
            assert e_cpu < 1e-2 and e_tc_cpu < 1e-2 and e_tc < 1e-3
            identical = identical and np.array_equal(f, t)
    # the two paths round differently: bit-identical logits everywhere would mean one path ran twice
    assert not identical


# ---- the cuBLAS path's knobs: the last layer's tail on one row (default), the in-projection summed by cuBLAS ----------


@functools.lru_cache(maxsize=1)
def model3() -> tuple[Qwen35Config, dict[str, np.ndarray]]:
    """Three DeltaNet layers: a last layer that is not attention (the tail's other branch)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from make_random_08b import random_internal_weights

    cfg = real_config(3)
    assert not any(cfg.is_attention(i) for i in range(3))
    return cfg, {name: bf16(v) for name, v in random_internal_weights(cfg, 6).items()}


def knob_run(seq: str, max_chunk: int = 0, layers: int = 4) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                    dict[str, np.ndarray]]:
    """The cuBLAS prefill of `seq`'s chunks (the knobs as this process's environment sets them, read when the context is
    made) on a fresh engine of model4 (layers 4) or model3 (3), with max_chunk (0: the default) to force segments:
    (every chunk's last logits, every chunk's hidden row P.h, the whole state after the last chunk: caches, DeltaNet
    state, conv ring)."""
    cfg, w = model4() if layers == 4 else model3()
    gpu = mkmod.MegakernelEngine(cfg, w, max_context=MAX_CTX, prefill_mode="decode")
    try:
        pf = prefill_for(gpu, "cublas", **({"max_chunk": max_chunk} if max_chunk else {}))
    except BaseException:
        gpu.close()
        raise
    try:
        logits, hidden = [], []
        for p in chunk_prompts(seq):
            gpu.poison()
            logits.append(pf.run(p)[1])
            hidden.append(gpu.read(mkmod.READ_HIDDEN))
            assert np.isfinite(logits[-1]).all() and np.isfinite(hidden[-1]).all(), "unwritten or NaN outputs"
        state, n = {}, sum(CHUNK_SEQS[seq])
        assert gpu.n_past == n
        for layer in range(cfg.n_layers):
            if cfg.is_attention(layer):  # the cache rows written so far
                state[f"k{layer}"] = gpu.read(mkmod.READ_KCACHE, layer)[:n]
                state[f"v{layer}"] = gpu.read(mkmod.READ_VCACHE, layer)[:n]
            else:
                state[f"S{layer}"] = gpu.read(mkmod.READ_STATE, layer)
                state[f"conv{layer}"] = gpu.read(mkmod.READ_CONV, layer)
        return logits, hidden, state
    finally:
        pf.close()
        gpu.close()


@pytest.mark.parametrize("layers", [4, 3])
@pytest.mark.parametrize("max_chunk", [0, 64])
@pytest.mark.parametrize("seq", list(CHUNK_SEQS))
def test_prefill_tail_row_vs_all_rows(monkeypatch, seq, max_chunk, layers):
    """The cuBLAS prefill's last layer (the 4-layer model's attention layer, as the 0.8B's) with its attention query,
    out-projection and FFN on the LM head's row alone (default; with max_chunk 64 the earlier segments skip all three)
    against every row (LUCEBOX_PREFILL_TAIL=all, the path before): the state, written before that tail (cache rows by
    the attention prep, DeltaNet state and ring by the earlier layers), bit for bit; the logits and the hidden row at
    1e-4 (a one-query attention splits its keys differently and the one-row GEMMs accumulate in another order: ~1e-6;
    a wrong row, head or half shows at ~1), and against the CPU engine at the whole-prefill tests' 1e-2. layers 3: a
    last DeltaNet layer (its out-projection reads one row of the [2][T] pair through the GEMM's row stride), without
    the CPU engine."""
    monkeypatch.delenv("LUCEBOX_PREFILL_TAIL", raising=False)
    row = knob_run(seq, max_chunk, layers)  # (a skip here where no cuBLAS loads)
    monkeypatch.setenv("LUCEBOX_PREFILL_TAIL", "all")
    full = knob_run(seq, max_chunk, layers)
    for key in full[2]:
        assert np.array_equal(row[2][key], full[2][key]), f"state {key} differs"
    ref = cpu_chunks(seq)[1] if layers == 4 else full[0]
    for n, a, b, ha, hb, r in zip(CHUNK_SEQS[seq], row[0], full[0], row[1], full[1], ref):
        e, e_h, e_cpu = rel_rms(a, b), rel_rms(ha, hb), rel_rms(a, r)
        print(f"{seq} chunk of {n} (max_chunk {max_chunk}): tail row vs all rows: logits {e:.2e}, hidden {e_h:.2e}; "
              f"vs CPU {e_cpu:.2e}")
        assert e < 1e-4 and e_h < 1e-4 and e_cpu < 1e-2


@pytest.mark.parametrize("seq", list(CHUNK_SEQS))
def test_prefill_inproj_accumulate(monkeypatch, seq):
    """The default in-projection (its split halves summed by cuBLAS: two GEMMs, beta 1 on the second, no epilogue
    kernel) against LUCEBOX_PREFILL_INPROJ=epilogue (scratch + epilogue_kernel<EPI_F32>, the path before): logits,
    hidden row and state at 1e-4 (fp32 accumulation order only, ~1e-6, though a K/V element may round to the other
    bf16; a missing half shows at ~4e-3), and against the CPU engine at 1e-2."""
    monkeypatch.setenv("LUCEBOX_PREFILL_INPROJ", "epilogue")
    base = knob_run(seq)  # (a skip here where no cuBLAS loads)
    monkeypatch.delenv("LUCEBOX_PREFILL_INPROJ", raising=False)
    acc = knob_run(seq)
    for key in base[2]:
        e = rel_rms(acc[2][key], base[2][key])
        assert e < 1e-4, f"state {key}: {e:.2e}"
    ref = cpu_chunks(seq)[1]
    for n, a, b, ha, hb, r in zip(CHUNK_SEQS[seq], acc[0], base[0], acc[1], base[1], ref):
        e, e_h, e_cpu = rel_rms(a, b), rel_rms(ha, hb), rel_rms(a, r)
        print(f"{seq} chunk of {n}: in-projection accumulated by cuBLAS vs epilogue: logits {e:.2e}, hidden {e_h:.2e}; "
              f"vs CPU {e_cpu:.2e}")
        assert e < 1e-4 and e_h < 1e-4 and e_cpu < 1e-2
