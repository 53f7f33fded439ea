"""CI (no GPU): the megakernel sources compile for sm_86 and sm_90, and the engine says "no GPU" cleanly."""

from __future__ import annotations

import sys

import pytest
from cuda_build import REPO as ROOT
from cuda_build import compile_cu, needs_nvcc


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_megakernel_compiles(arch, tmp_path):
    returncode, log = compile_cu("cuda/megakernel/mk_kernel.cu", arch, tmp_path, timeout=600)
    assert returncode == 0, log[-2000:]
    # no local-memory spills in the persistent kernel (a spill would add traffic to every step)
    assert "0 bytes spill stores" in log


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
