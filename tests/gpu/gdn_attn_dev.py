"""Device-buffer helpers for tests/gpu/test_gdn_ops.py and test_attn_ops.py (lb_dev_* through _lib; no
other CUDA binding needed). `tests/gpu` is on sys.path under pytest and in script mode."""

from __future__ import annotations

import ctypes

import numpy as np
from gpu_lib import lib


class Dev:
    """A device buffer (freed on close / context exit). `at(byte_offset)` gives an interior pointer."""

    def __init__(self, nbytes: int):
        self.ptr = ctypes.c_void_p()
        self.nbytes = max(int(nbytes), 4)
        lib().call("lb_dev_alloc", self.nbytes, ctypes.byref(self.ptr))

    @classmethod
    def of(cls, a: np.ndarray) -> "Dev":
        a = np.ascontiguousarray(a)
        d = cls(a.nbytes)
        lib().call("lb_dev_h2d", d.ptr, a.ctypes.data, a.nbytes)
        return d

    @classmethod
    def nan(cls, nbytes: int) -> "Dev":
        """Filled with 0xFF bytes: NaN as fp32, f16 and bf16, so unwritten outputs show."""
        d = cls(nbytes)
        lib().call("lb_dev_memset", d.ptr, 0xFF, d.nbytes)
        return d

    def at(self, offset: int) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.ptr.value + int(offset))

    def put(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        lib().call("lb_dev_h2d", self.ptr, a.ctypes.data, a.nbytes)

    def get(self, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        lib().call("lb_dev_sync")
        lib().call("lb_dev_d2h", out.ctypes.data, self.ptr, out.nbytes)
        return out

    def close(self) -> None:
        if self.ptr:
            lib().call("lb_dev_free", self.ptr)
            self.ptr = ctypes.c_void_p()

    def __enter__(self) -> "Dev":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Pool:
    """Buffers freed together: `p = Pool(); x = p.of(arr); ...; p.close()`."""

    def __init__(self):
        self.bufs: list[Dev] = []

    def _keep(self, d: Dev) -> Dev:
        self.bufs.append(d)
        return d

    def of(self, a: np.ndarray) -> Dev:
        return self._keep(Dev.of(a))

    def nan(self, nbytes: int) -> Dev:
        return self._keep(Dev.nan(nbytes))

    def close(self) -> None:
        for d in self.bufs:
            d.close()
        self.bufs.clear()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def call(name: str, *args) -> None:
    lib().call(name, *args)


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.sqrt(np.mean((a64 - b64) ** 2)) / max(np.sqrt(np.mean(b64**2)), 1e-30))


def assert_close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    assert not np.isnan(got).any(), f"{what}: NaN (unwritten) outputs"
    err = rel_rms(got, want)
    assert err < tol, f"{what}: relative RMS {err:.3g} >= {tol}"


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as __float2bfloat16_rn does for finite inputs."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_kv(x: np.ndarray, kv_dtype: int) -> np.ndarray:
    """fp32 -> uint16 bits of the cache type (0 f16, 1 bf16)."""
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint16) if kv_dtype == 0 else f32_to_bf16_bits(x)


def from_kv(bits: np.ndarray, kv_dtype: int) -> np.ndarray:
    return bits.view(np.float16).astype(np.float32) if kv_dtype == 0 else bf16_bits_to_f32(bits)
