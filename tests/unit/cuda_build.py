"""CUDA build checks that need no GPU, shared by the *_build tests: compile one source as the Makefile
does with ptxas statistics (to look for register spills), and find C entry points in lucebox.h and in
_lib's argtypes table."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lucebox_cli.engines import _lib

REPO = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
# the Makefile's NVCCFLAGS (less -lineinfo and the arch) plus ptxas statistics
FLAGS = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden", "--expt-relaxed-constexpr", "-Icuda/include",
         "-Icuda/common", "-Xptxas", "-v"]

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def start_compile(source: str, arch: str, out_dir: Path) -> subprocess.Popen:
    """nvcc on `source` (a path under the repo) for `arch`, in the background; finish_compile() waits."""
    obj = out_dir / (Path(source).stem + ".o")
    return subprocess.Popen([NVCC, *FLAGS, f"-arch={arch}", "-c", source, "-o", str(obj)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_compile(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    """(exit status, nvcc's whole log: errors and ptxas statistics)."""
    log = proc.communicate(timeout=timeout)[0]
    return proc.returncode, log


def compile_cu(source: str, arch: str, out_dir: Path, timeout: float = 900) -> tuple[int, str]:
    return finish_compile(start_compile(source, arch, out_dir), timeout)


def spill_stores(log: str) -> list[int]:
    """Bytes of spill stores, one entry per function ptxas reported on."""
    return [int(m) for m in re.findall(r"(\d+) bytes spill stores", log)]


def assert_api_rows(names: list[str]) -> None:
    """Each entry point is declared in lucebox.h and has a row in _lib.DECLS."""
    header = (REPO / "cuda" / "include" / "lucebox.h").read_text()
    for name in names:
        assert re.search(rf"\bLB_API\s+\w+\s+{name}\s*\(", header), f"{name} missing from lucebox.h"
        assert name in _lib.DECLS, f"{name} missing from _lib.DECLS"
