"""The quantized matrix ops build for both profiles' archs without register spills, and their C ABI
rows agree with lucebox.h (CPU only: the kernels themselves run in tests/gpu/test_quant_gemv.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from lucebox_cli.engines import _lib
from cuda_build import assert_api_rows, compile_cu, needs_nvcc, spill_stores

SOURCES = ["gemv_q.cu", "gemm_q_smalln.cu", "quant_repack.cu", "dev_buffers.cu"]
API = ["lb_quant_bytes", "lb_quant_repack", "lb_quant_fill_random", "lb_gemv_q", "lb_gemm_q_smalln",
       "lb_gemm_q_smalln_seg", "lb_bench_qmm",
       "lb_dev_alloc", "lb_dev_free", "lb_dev_h2d", "lb_dev_d2h", "lb_dev_memset", "lb_dev_sync"]


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, arch: str, tmp_path: Path):
    returncode, log = compile_cu(f"cuda/ops/{source}", arch, tmp_path)
    assert returncode == 0, log[-4000:]
    spills = spill_stores(log)
    if source != "dev_buffers.cu":  # the only source without kernels
        assert spills, "ptxas reported no kernels:\n" + log[-4000:]
    assert not any(spills), "register spills:\n" + log[-4000:]


@needs_nvcc
def test_load_pattern_probe_compiles(tmp_path: Path):
    """scripts/probe_load_pattern.cu (docs/perf.md "v8"): the standalone probe stays buildable for the H200."""
    returncode, log = compile_cu("scripts/probe_load_pattern.cu", "sm_90", tmp_path)
    assert returncode == 0, log[-4000:]
    assert not any(spill_stores(log)), "register spills:\n" + log[-4000:]


def test_api_rows_in_header_and_table():
    assert_api_rows(API)


def test_segmented_gemm_rejects_bad_tables_without_a_gpu():
    """lb_gemm_q_smalln_seg's table checks come before any CUDA call (so they run on the CPU-only CI)."""
    path = next((p for p in (_lib.lib_path(n) for n in ("rtx3090-sm86", "h200-sm90")) if p.exists()), None)
    if path is None:
        pytest.skip("no built liblucebox.so (make build PROFILE=…)")
    lib = _lib.open_lib(path)
    fn = lib.fn
    p = ctypes.c_void_p(16)  # never dereferenced: the checks fail first
    rows = (ctypes.c_int32 * 4)(100, 48, 48, 105)
    outs = (ctypes.c_void_p * 4)(16, 32, 48, 64)
    call = lambda n_rows, n, nseg: fn.lb_gemm_q_smalln_seg(12, p, n_rows, 1792, p, n, nseg, ctypes.addressof(rows),
                                                           ctypes.addressof(outs), 1, None)
    assert call(300, 23, 4) == _lib.LB_ERR_INVALID_ARG  # the rows sum to 301
    assert "sum to 301" in lib.last_error()
    assert call(301, 1, 4) == _lib.LB_ERR_INVALID_ARG  # one column: lb_gemv_q's business
    assert call(301, 23, 5) == _lib.LB_ERR_INVALID_ARG  # at most 4 segments
    assert fn.lb_gemm_q_smalln_seg(14, p, 301, 1792, p, 23, 4, ctypes.addressof(rows), ctypes.addressof(outs), 1,
                                   None) == _lib.LB_ERR_UNSUPPORTED  # Q6_K: scales after each tensor's blocks
    rows[1] = 0
    assert call(253, 23, 4) == _lib.LB_ERR_INVALID_ARG and "segment 1" in lib.last_error()
