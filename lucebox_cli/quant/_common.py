"""Small pieces the quantizer kernels share: input checks, C float→int conversions, fp16 stores,
stack scratch.

Numba's on-disk cache (cache=True) is keyed on the file that defines a kernel, not on the helpers it
inlines from other files: after editing a helper here, in floats.py or in q4_k.py (Q5_K reuses it),
delete lucebox_cli/quant/__pycache__/*.nbi *.nbc or the old machine code keeps running.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from lucebox_cli.quant.floats import fp32_to_fp16_bits


def as_rows(x: np.ndarray, block: int) -> np.ndarray:
    """float32 C-contiguous [rows, cols] with cols a multiple of `block` (a 1-D input is one row)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1])
    if x.shape[1] % block:
        raise ValueError(f"row length {x.shape[1]} is not a multiple of the block size {block}")
    return x


def quantize_rows(kernel, x: np.ndarray, block: int, block_bytes: int, *args) -> np.ndarray:
    """float32 [rows, cols] → uint8 [rows, cols/block*block_bytes] through a row kernel
    kernel(x, out, *args) that packs every block."""
    x = as_rows(x, block)
    out = np.empty((x.shape[0], x.shape[1] // block * block_bytes), dtype=np.uint8)
    kernel(x, out, *args)
    return out


TWO31 = np.float32(2147483648.0)


@njit(cache=True, inline="always")
def cvtt(v):
    """C float → int conversion as x86-64 does it (cvttss2si): truncation, and INT32_MIN for NaN,
    infinities and values out of the int32 range, which the reference meets on degenerate blocks
    (a denormal scale whose reciprocal overflows)."""
    if not (v > -TWO31 - np.float32(1.0) and v < TWO31):
        return -2147483648
    return np.int64(v)


@njit(cache=True, inline="always")
def roundf(v):
    """C roundf (half away from zero) then the x86-64 float → int conversion."""
    a = abs(v)
    if not a < TWO31:
        return cvtt(v)
    t = np.int64(a)
    if np.float32(a - np.float32(t)) >= np.float32(0.5):
        t += 1
    return -t if v < 0 else t


@njit(cache=True, inline="always")
def to_int8(i):
    """C's wrap of an int into int8_t."""
    return ((i + 128) & 0xFF) - 128


@njit(cache=True, inline="always")
def store_fp16(out, pos, f):
    """Store f as ggml fp16 at out[pos:pos+2] (little-endian)."""
    h = fp32_to_fp16_bits(f)
    out[pos] = h & 0xFF
    out[pos + 1] = (h >> 8) & 0xFF


@intrinsic
def stack_f32(typingctx, n):
    """Pointer to n float32 on the stack (n a compile-time constant); wrap it with numba.carray.

    For per-call scratch inside an inlined kernel: LLVM knows that a stack slot which does not
    escape cannot alias any other array, so values kept there (lane accumulators, say) stay in
    registers across loops. With np.zeros scratch it must assume that a store to one array may
    change another, keeps every accumulator in memory and, in the Q4_K lane search, left most
    loops scalar. The slot lives until the enclosing compiled function returns: never return or
    store an array made from it. Not zeroed."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    count = n.literal_value

    def codegen(context, builder, signature, args):
        with builder.goto_entry_block():  # one slot per function call, also when used in a loop
            ptr = builder.alloca(ir.FloatType(), size=ir.Constant(ir.IntType(64), count))
            ptr.align = 64
        return ptr

    return types.CPointer(types.float32)(n), codegen
