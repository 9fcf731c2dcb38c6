"""BF16 conversions through the library (round to nearest even, as the C code rounds)."""
import numpy as np

from ._core import lib
from ._tensors import ptr


def bf16_to_float32(bits):
    """uint16 BF16 bits -> float32 (exact)."""
    bits = np.ascontiguousarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError("bits must be uint16, got %s" % bits.dtype)
    out = np.empty(bits.shape, np.float32)
    lib.sa_bf16_to_f32_array(ptr(out), ptr(bits), bits.size)
    return out


def bf16_bits(x):
    """float32 -> uint16 BF16 bits, round to nearest even (sa_bf16_from_f32_array)."""
    x = np.ascontiguousarray(x)
    if x.dtype != np.float32:
        raise TypeError("x must be float32, got %s" % x.dtype)
    out = np.empty(x.shape, np.uint16)
    lib.sa_bf16_from_f32_array(ptr(out), ptr(x), x.size)
    return out


def bf16_round(x):
    """float32 -> float32 holding the nearest BF16 values (what the library computes on)."""
    return bf16_to_float32(bf16_bits(x))
