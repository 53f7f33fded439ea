"""The quantized matrix ops build for both profiles' archs without register spills, and their C ABI
rows agree with lucebox.h (CPU only: the kernels themselves run in tests/gpu/test_quant_gemv.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_build import assert_api_rows, compile_cu, needs_nvcc, spill_stores

SOURCES = ["gemv_q.cu", "gemm_q_smalln.cu", "quant_repack.cu", "dev_buffers.cu"]
API = ["lb_quant_bytes", "lb_quant_repack", "lb_quant_fill_random", "lb_gemv_q", "lb_gemm_q_smalln", "lb_bench_qmm",
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


def test_api_rows_in_header_and_table():
    assert_api_rows(API)
