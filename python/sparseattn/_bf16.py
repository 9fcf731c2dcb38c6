"""BF16 conversions through the library (round to nearest even, as the C code rounds)."""
import numpy as np

from ._core import lib
from ._tensors import ptr


def _convert(name, x, dtype, out_dtype, fn):
    """fn(out, x, n) over a contiguous `x` of `dtype` (TypeError naming `name` otherwise)."""
    x = np.ascontiguousarray(x)
    if x.dtype != dtype:
        raise TypeError("%s must be %s, got %s" % (name, np.dtype(dtype).name, x.dtype))
    out = np.empty(x.shape, out_dtype)
    fn(ptr(out), ptr(x), x.size)
    return out


def bf16_to_float32(bits):
    """uint16 BF16 bits -> float32 (exact)."""
    return _convert("bits", bits, np.uint16, np.float32, lib.sa_bf16_to_f32_array)


def bf16_bits(x):
    """float32 -> uint16 BF16 bits, round to nearest even (sa_bf16_from_f32_array)."""
    return _convert("x", x, np.float32, np.uint16, lib.sa_bf16_from_f32_array)


def bf16_round(x):
    """float32 -> float32 holding the nearest BF16 values (what the library computes on)."""
    return bf16_to_float32(bf16_bits(x))
