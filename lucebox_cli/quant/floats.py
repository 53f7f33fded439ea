"""F32 / F16 / BF16 encodings, and the float scalar helpers every quantizer kernel shares.

Bit-exactness with llama.cpp rests on three things done here exactly as ggml does them:
- fp32 → fp16 uses ggml's portable bit trick (round to nearest even, NaN → 0x7E00 with the sign),
  which is what the reference build uses (ggml-base is compiled without F16C);
- fp32 → bf16 is ggml_compute_fp32_to_bf16 (round to nearest even, NaN forced quiet);
- nearest_int is ggml's "add 1.5·2^23 and read the mantissa" rounding, bit for bit, including its
  behaviour outside the range where it equals round-half-even.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

F32_MAGIC_ROUND = np.float32(12582912.0)  # 1.5 * 2^23


@intrinsic
def f32_bits(typingctx, x):
    """Reinterpret a float32 as int32 (no conversion)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def bits_f32(typingctx, x):
    """Reinterpret an int32 as float32 (no conversion)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(cache=True, inline="always")
def nearest_int(fval):
    # ggml's nearest_int: float32 add of 1.5*2^23, then the low mantissa bits are the integer
    val = np.float32(fval + F32_MAGIC_ROUND)
    return (np.int64(f32_bits(val)) & 0x007FFFFF) - 0x00400000


@njit(cache=True, inline="always")
def fp32_to_fp16_bits(f):
    """ggml_compute_fp32_to_fp16 (the portable path), returns the uint16 bits as an int."""
    f = np.float32(f)
    scale_to_inf = np.float32(5.192296858534828e33)  # 0x1.0p+112f
    scale_to_zero = np.float32(7.703719777548943e-34)  # 0x1.0p-110f
    base = np.float32(np.float32(abs(f) * scale_to_inf) * scale_to_zero)
    w = np.int64(f32_bits(f)) & 0xFFFFFFFF
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = np.float32(bits_f32(np.int32((bias >> 1) + 0x07800000)) + base)
    bits = np.int64(f32_bits(base)) & 0xFFFFFFFF
    exp_bits = (bits >> 13) & 0x00007C00
    mantissa_bits = bits & 0x00000FFF
    nonsign = exp_bits + mantissa_bits
    out = 0x7E00 if shl1_w > 0xFF000000 else nonsign
    return (sign >> 16) | out


@njit(cache=True, inline="always")
def fp16_bits_to_fp32(h):
    """Exact fp16 → fp32 from the uint16 bits (all values, subnormals included)."""
    sign = (h >> 15) & 1
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0:
        v = np.float32(np.float32(mant) * np.float32(5.960464477539063e-08))  # 2^-24, exact
        return -v if sign else v
    if exp == 31:
        bits = (sign << 31) | 0x7F800000 | (mant << 13)
    else:
        bits = (sign << 31) | ((exp + 112) << 23) | (mant << 13)
    return bits_f32(np.int32(bits - (1 << 32) if bits >= (1 << 31) else bits))


@njit(cache=True, inline="always")
def fp16_round(f):
    """The float32 value that survives a trip through ggml's fp16 store and load."""
    return fp16_bits_to_fp32(fp32_to_fp16_bits(f))


@njit(cache=True, parallel=True)
def _f16_rows(x, out):
    for r in prange(x.shape[0]):
        for c in range(x.shape[1]):
            out[r, c] = np.uint16(fp32_to_fp16_bits(x[r, c]))


def to_f16(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] → F16 as uint16 bits, exactly as ggml_fp32_to_fp16_row."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    out = np.empty(x2.shape, dtype=np.uint16)
    _f16_rows(x2, out)
    return out.reshape(x.shape).view(np.float16)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → BF16 as uint16 bits, exactly as ggml_fp32_to_bf16_row_ref (and gguf's quantizer)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(is_nan, quiet, rounded).astype(np.uint16)


def to_f32(x: np.ndarray) -> np.ndarray:
    """float32 as is (a copy only when the input is not already contiguous float32)."""
    return np.ascontiguousarray(x, dtype=np.float32)
