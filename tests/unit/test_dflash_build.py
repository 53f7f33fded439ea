"""The 27B target engine's own kernels (cuda/dflash/) build for both profiles' archs without register
spills, and their C ABI rows agree with lucebox.h. They run in tests/gpu/test_dflash_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_build import assert_api_rows, compile_cu, needs_nvcc, spill_stores

SOURCES = ["df_small.cu", "df_argmax.cu"]
API = ["lb_df_rmsnorm", "lb_df_swiglu", "lb_df_copy", "lb_df_kv_compact", "lb_df_topk_scratch_bytes", "lb_df_topk"]


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source: str, arch: str, tmp_path: Path):
    returncode, log = compile_cu(f"cuda/dflash/{source}", arch, tmp_path)
    assert returncode == 0, log[-4000:]
    spills = spill_stores(log)
    assert spills and not any(spills), "register spills:\n" + log[-4000:]


def test_api_rows_in_header_and_table():
    assert_api_rows(API)
