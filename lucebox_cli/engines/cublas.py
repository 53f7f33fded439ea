"""Find a libcublas on this machine and have liblucebox load it at run time (cuda/core/cublas_rt.cu).

The toolkit that builds lucebox ships no cuBLAS, but GPU machines usually have one inside the NVIDIA
Python wheels torch installs (site-packages/nvidia/cublas/lib/libcublas.so.12, or
nvidia/cu13/lib/libcublas.so.13). The 0.8B tensor-core prefill runs its GEMMs on it when it loads.

Knobs, read when an engine (or a TensorCorePrefill) is created:
  LUCEBOX_CUBLAS=off            never load one;
  LUCEBOX_CUBLAS=/path/to/lib   load exactly that file (no other candidate: a typo fails visibly);
  unset                         the wheel folders under every sys.path entry, then the plain sonames.
  LUCEBOX_PREFILL_GEMM=auto|own|cublas   the prefill's GEMM path (default auto: cuBLAS when loaded).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from lucebox_cli.errors import UsageError

CUBLAS_ENV = "LUCEBOX_CUBLAS"
GEMM_ENV = "LUCEBOX_PREFILL_GEMM"
# lb_mk_prefill_create_ex's LB_PREFILL_GEMM_* (cuda/include/lucebox.h)
GEMM_MODES = {"auto": 0, "own": 1, "cublas": 2}
GEMM_NAMES = {1: "own", 2: "cublas"}
# wheel folders, newest CUDA first: cu13 ships libcublas.so.13 there, the cu12 wheels in nvidia/cublas/lib
WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cu12/lib")
SONAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")
_NOT_LOADED = "cuBLAS not loaded: "  # how lb_cublas_load's messages start
_LIB_RE = re.compile(r"^libcublas\.so\.(\d+)(\.\d+)*$")


@dataclass(frozen=True)
class CublasStatus:
    loaded: bool
    path: Optional[str] = None  # the file the loader opened
    version: Optional[str] = None  # "12.4.5" when the library says
    tried: tuple[str, ...] = ()  # candidates asked for, in order
    reason: Optional[str] = None  # why none loaded (lb_last_error), or that LUCEBOX_CUBLAS=off


def gemm_mode(env: Optional[Mapping[str, str]] = None) -> str:
    """LUCEBOX_PREFILL_GEMM (auto, own or cublas; default auto); anything else is a UsageError."""
    value = (env if env is not None else os.environ).get(GEMM_ENV, "").strip().lower() or "auto"
    if value not in GEMM_MODES:
        raise UsageError(f"{GEMM_ENV}={value!r} is not a prefill GEMM path", hint="use auto, own or cublas")
    return value


def _wheel_libs(folder: Path) -> list[str]:
    """libcublas.so.N[.x.y] files of one folder: the plain soname first, newest major first."""
    try:
        names = [p.name for p in folder.iterdir() if _LIB_RE.match(p.name)]
    except OSError:
        return []
    return [str(folder / n) for n in sorted(names, key=lambda n: (-int(_LIB_RE.match(n).group(1)), len(n), n))]


def candidate_paths(env: Optional[Mapping[str, str]] = None, search: Optional[Sequence[str]] = None) -> list[str]:
    """What to try, in order: [] for LUCEBOX_CUBLAS=off, [that path] when it names one, else the wheel
    libraries under every `search` entry (default sys.path), then the sonames. Never raises."""
    value = (env if env is not None else os.environ).get(CUBLAS_ENV, "").strip()
    if value.lower() == "off":
        return []
    if value:
        return [value]
    found: list[str] = []
    seen: set[str] = set()
    for entry in (search if search is not None else sys.path):
        if not entry:
            continue
        for sub in WHEEL_DIRS:
            for lib in _wheel_libs(Path(entry) / sub):
                real = os.path.realpath(lib)
                if real not in seen:
                    seen.add(real)
                    found.append(lib)
    return found + list(SONAMES)


def loaded(lib: Any) -> CublasStatus:
    """What liblucebox has loaded, without loading anything."""
    buf = ctypes.create_string_buffer(1024)
    version = ctypes.c_int(0)
    if not lib.fn.lb_cublas_loaded(buf, len(buf), ctypes.byref(version)):
        return CublasStatus(False)
    v = version.value
    return CublasStatus(True, buf.value.decode("utf-8", "replace"),
                        f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else None)


def load(lib: Any, env: Optional[Mapping[str, str]] = None, search: Optional[Sequence[str]] = None) -> CublasStatus:
    """Ask liblucebox to load the first candidate that works (one loaded earlier in this process stays).
    LUCEBOX_CUBLAS=off reports "not loaded" even then, so callers keep their own kernels. Never raises:
    not finding cuBLAS is a normal state, reported in the status."""
    paths = candidate_paths(env, search)
    if not paths:
        return CublasStatus(False, reason=f"{CUBLAS_ENV}=off")
    have = loaded(lib)
    if have.loaded:
        return have
    reasons = []
    for path in paths:
        if lib.fn.lb_cublas_load(path.encode()) == 0:
            return replace(loaded(lib), tried=tuple(paths[: len(reasons) + 1]))
        reasons.append(lib.last_error().removeprefix(_NOT_LOADED))
    return CublasStatus(False, tried=tuple(paths), reason=_NOT_LOADED + "; ".join(reasons))
