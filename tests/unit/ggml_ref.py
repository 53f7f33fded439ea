"""llama.cpp's own quantizers, reached through ctypes in the ggml library that llama-cpp-python bundles.

`ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix=NULL)` with a NULL imatrix runs
the quantize_row_*_ref path for every type we write, which is what llama_model_quantize does without an
importance matrix. Tests skip when llama-cpp-python is not installed.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import pytest


@functools.lru_cache(maxsize=1)
def ggml_base() -> ctypes.CDLL:
    llama_cpp = pytest.importorskip("llama_cpp")
    libdir = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(libdir.glob("libggml-base.*"))
    if not candidates:
        pytest.skip(f"no libggml-base in {libdir}")
    lib = ctypes.CDLL(str(candidates[0]))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def reference_quantize(ggml_type: int, x: np.ndarray) -> np.ndarray:
    """llama.cpp's bytes for float32 [rows, cols] → uint8 [rows, row_size]."""
    lib = ggml_base()
    x = np.ascontiguousarray(x, dtype=np.float32)
    row_size = lib.ggml_row_size(ggml_type, x.shape[1])
    out = np.zeros((x.shape[0], row_size), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(ggml_type, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    assert written == out.nbytes
    return out
