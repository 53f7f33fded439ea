"""The tensor-core prefill without a GPU: its sources compile for every profile's arch with no register
spills, its C entry points reject bad arguments before touching CUDA, and the engine path reports a
missing GPU cleanly."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lucebox_cli.config import get_profile
from lucebox_cli.engines import _lib
from lucebox_cli.errors import EngineUnavailable
from cuda_build import REPO, finish_compile, needs_nvcc, start_compile

SOURCES = ["cuda/ops/gemm_bf16.cu", "cuda/ops/gemm_cublas.cu", "cuda/ops/deltanet_chunked.cu",
           "cuda/ops/deltanet_split.cu", "cuda/ops/deltanet_tc.cu", "cuda/ops/deltanet_tc_prep.cu",
           "cuda/ops/attn_prefill.cu",
           "cuda/ops/pf_small.cu", "cuda/prefill/prefill_08b.cu", "cuda/core/cublas_rt.cu"]
PROFILES = ["rtx3090-sm86", "h200-sm90"]


@needs_nvcc
@pytest.mark.parametrize("profile", PROFILES)
def test_sources_compile_without_spills(profile: str, tmp_path: Path):
    arch = get_profile(profile).arch
    procs = [start_compile(src, arch, tmp_path) for src in SOURCES]
    for src, proc in zip(SOURCES, procs):
        returncode, out = finish_compile(proc, timeout=600)
        assert returncode == 0, f"{src} ({arch}):\n{out[-3000:]}"
        spills = [line for line in out.splitlines() if re.search(r"[1-9]\d* bytes spill", line)]
        assert not spills, f"{src} ({arch}) spills registers:\n" + "\n".join(spills)


def _built_lib():
    for profile in PROFILES:
        path = _lib.lib_path(profile)
        if path.exists():
            return _lib.open_lib(path, profile)
    pytest.skip("no built liblucebox.so (make build PROFILE=…)")


def test_entry_points_reject_bad_arguments_without_a_gpu():
    lib = _built_lib()
    fn = lib.fn
    handle = ctypes.c_void_p()
    assert fn.lb_mk_prefill_create(None, 0, ctypes.byref(handle)) == _lib.LB_ERR_INVALID_ARG
    assert "null" in lib.last_error()
    assert fn.lb_mk_prefill(None, None, 1, None, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_mk_prefill_free(None) == _lib.LB_OK
    p = ctypes.c_void_p(16)  # never dereferenced: the shape checks fail first
    assert fn.lb_gemm_bf16(p, p, p, 37, 1024, 1000, 0, None) == _lib.LB_ERR_INVALID_ARG  # K % 32
    assert "multiple of 32" in lib.last_error()
    assert fn.lb_gemm_bf16(p, p, p, 37, 1020, 1024, 0, None) == _lib.LB_ERR_INVALID_ARG  # N % 8
    assert fn.lb_gemm_bf16(p, p, p, 37, 1024, 1024, 3, None) == _lib.LB_ERR_INVALID_ARG  # epilogue
    assert fn.lb_attn_prefill(p, p, p, p, 4096, 512, p, 37, 0, 8, 3, 64, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_attn_prefill(p, p, p, p, 4096, 512, p, 37, 40, 8, 2, 64, None) == _lib.LB_ERR_INVALID_ARG
    # the tensor-core form: any group up to 8, positions inside the cache
    assert fn.lb_attn_prefill_tc(p, p, p, p, 4096, 512, p, None, 1, 37, 0, 8, 3, 64, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_attn_prefill_tc(p, p, p, p, 4096, 512, p, None, 1, 37, 0, 18, 2, 64, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_attn_prefill_tc(p, p, p, p, 4096, 512, p, None, 1, 37, 40, 8, 2, 64, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_attn_prefill_tc(p, p, p, None, 4096, 512, p, None, 1, 37, 0, 8, 2, 64, None) == _lib.LB_ERR_INVALID_ARG
    assert fn.lb_mk_prefill_attn(None) == -1
    assert fn.lb_deltanet_chunked(p, p, p, p, p, p, p, p, 0, 16, None) == _lib.LB_ERR_INVALID_ARG
    # the larger of the two paths' scratch. fp32: u [H, T, 128] + w [H, Tp, 128] + Aqk [H, Tp, 64] + cum [H, Tp] +
    # chunk start states [H, Tp / 64, 128, 128], Tp = T rounded up to the chunk (64). Tensor cores, per (head, chunk)
    # unit, each region 256-byte aligned: Uᵀ / V_newᵀ 32 KB, −Wᵀ 32 KB, K̃ 32 KB, Aqk 16 KB, start state 64 KB, cum 256 B
    for t, h in [(520, 16), (1, 2), (130, 3)]:
        tp = (t + 63) // 64 * 64
        fp32 = 4 * (h * t * 128 + h * tp * 128 + h * tp * 64 + h * tp + h * (tp // 64) * 128 * 128)
        units = h * tp // 64
        tc = sum((units * n + 255) // 256 * 256 for n in (32768, 32768, 32768, 16384, 65536, 256))
        assert fn.lb_deltanet_chunked_scratch_bytes(t, h) == max(fp32, tc)
    assert fn.lb_deltanet_chunked_scratch_bytes(0, 16) == 0


def test_engine_without_gpu_is_engine_unavailable(monkeypatch):
    monkeypatch.setenv(_lib.FORCE_NO_GPU_ENV, "1")
    from lucebox_cli.engines import megakernel as mkmod

    with pytest.raises(EngineUnavailable) as info:
        mkmod.open_gpu()
    assert "GPU" in info.value.message and info.value.hint


def test_prefill_wrapper_has_no_import_side_effects():
    code = "import lucebox_cli.engines.prefill_tc, sys; print('lucebox_cli.engines._lib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
