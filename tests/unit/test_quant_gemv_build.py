"""The quantized matrix ops build for both profiles' archs without register spills, and their C ABI
rows agree with lucebox.h (CPU only: the kernels themselves run in tests/gpu/test_quant_gemv.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lucebox_cli.engines import _lib

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["gemv_q.cu", "gemm_q_smalln.cu", "quant_repack.cu", "dev_buffers.cu"]
API = ["lb_quant_bytes", "lb_quant_repack", "lb_quant_fill_random", "lb_gemv_q", "lb_gemm_q_smalln", "lb_bench_qmm",
       "lb_dev_alloc", "lb_dev_free", "lb_dev_h2d", "lb_dev_d2h", "lb_dev_memset", "lb_dev_sync"]


def _nvcc() -> str | None:
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, arch: str, tmp_path: Path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    cmd = [nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", f"-arch={arch}",
           "-Icuda/include", "-Icuda/common", "-Xptxas", "-v", "-c", f"cuda/ops/{source}", "-o", str(tmp_path / "o.o")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    if source != "dev_buffers.cu":  # the only source without kernels
        assert spills, "ptxas reported no kernels:\n" + proc.stderr[-4000:]
    assert not any(spills), "register spills:\n" + proc.stderr[-4000:]


def test_api_rows_in_header_and_table():
    header = (REPO / "cuda" / "include" / "lucebox.h").read_text()
    for name in API:
        assert re.search(rf"\bLB_API\s+\w+\s+{name}\s*\(", header), f"{name} missing from lucebox.h"
        assert name in _lib.DECLS, f"{name} missing from _lib.DECLS"
