"""CI (no GPU): the megakernel sources compile for sm_86 and sm_90, and the engine says "no GPU" cleanly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_megakernel_compiles(arch, tmp_path):
    src = ROOT / "cuda" / "megakernel" / "mk_kernel.cu"
    out = subprocess.run(
        [NVCC, "-O3", "-std=c++17", f"-arch={arch}", "-I", str(ROOT / "cuda/include"), "-I", str(ROOT / "cuda/common"),
         "-Xptxas", "-v", "-c", str(src), "-o", str(tmp_path / "mk.o")],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # no local-memory spills in the persistent kernel (a spill would add traffic to every step)
    assert "0 bytes spill stores" in out.stderr


def test_engine_reports_no_gpu_cleanly(monkeypatch):
    monkeypatch.setenv("LUCEBOX_FORCE_NO_GPU", "1")
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_random_08b import config_08b

    from lucebox_cli.engines.megakernel import MegakernelEngine, unsupported_reason
    from lucebox_cli.errors import EngineUnavailable

    cfg = config_08b(4)
    assert unsupported_reason(cfg) is None
    from lucebox_cli.models.qwen35 import expected_tensors
    import numpy as np

    weights = {n: np.zeros(s, np.float32) for n, s in expected_tensors(cfg).items()}
    with pytest.raises(EngineUnavailable) as err:
        MegakernelEngine(cfg, weights)
    assert "GPU" in err.value.message and err.value.hint


def test_other_shapes_are_refused_with_a_reason():
    from dataclasses import replace

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_random_08b import config_08b

    from lucebox_cli.engines.megakernel import unsupported_reason

    assert "hidden" in unsupported_reason(replace(config_08b(4), hidden=5120))
