"""Argument checks and conversions shared by the CPU (numpy) and GPU (torch) paths.

Inputs are one of three kinds: numpy arrays, CPU torch tensors (both run the CPU reference,
which copies them into BF16 BHSD buffers), or CUDA torch tensors (passed to the GPU without a
copy, except BSHD, which is made contiguous BHSD). torch is never imported here: a torch
tensor can only exist when the caller imported torch already."""
import sys

import numpy as np

from ._capi import INT32_MAX, TILE, SaShape
from ._core import lib

LAYOUTS = ("bhsd", "bshd")


def torch_mod():
    return sys.modules.get("torch")


def is_torch(x):
    t = torch_mod()
    return t is not None and isinstance(x, t.Tensor)


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError("layout must be 'bhsd' or 'bshd', got %r" % (layout,))


def kind_of(name, x):
    """'numpy', 'torch' (a CPU tensor) or 'cuda'."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if is_torch(x):
        if x.is_cuda:
            return "cuda"
        if x.device.type == "cpu":
            return "torch"
        raise ValueError("%s is on %s: only CPU and CUDA tensors are supported" % (name, x.device))
    raise TypeError("%s must be a numpy array or a torch tensor, got %s" % (name, type(x).__name__))


KIND_WORDS = {"numpy": "a numpy array", "torch": "a CPU tensor", "cuda": "a CUDA tensor"}


def common_kind(named):
    """The kind all of [(name, x)] share (None entries skipped); TypeError or ValueError naming
    the first argument that differs from the first one."""
    named = [(n, x) for n, x in named if x is not None]
    n0, x0 = named[0]
    k0 = kind_of(n0, x0)
    for n, x in named[1:]:
        k = kind_of(n, x)
        if k != k0:
            raise TypeError("%s is %s but %s is %s: pass all numpy arrays, all CPU tensors or all "
                            "CUDA tensors" % (n, KIND_WORDS[k], n0, KIND_WORDS[k0]))
        if k == "cuda" and x.device != x0.device:
            raise ValueError("%s is on %s but %s on %s" % (n, x.device, n0, x0.device))
    return k0


def dims4(name, x, layout, last="D"):
    """(B, H, S, D) of a 4-D tensor in `layout`."""
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != 4:
        want = "(B, H, S, %s)" % last if layout == "bhsd" else "(B, S, H, %s)" % last
        raise ValueError("%s must be 4-D %s for layout %r, got shape %s"
                         % (name, want, layout, shape))
    b, a, c, d = shape
    h, s = (a, c) if layout == "bhsd" else (c, a)
    if min(shape) <= 0:
        raise ValueError("%s has an empty dimension: shape %s" % (name, shape))
    if max(shape) > INT32_MAX:
        raise ValueError("%s: a dimension exceeds INT32_MAX: shape %s" % (name, shape))
    return b, h, s, d


def attn_shape(q, k, v, layout):
    """The sa_shape of q, k, v (v may be None: selectors read q and k only)."""
    b, hq, sq, d = dims4("q", q, layout)
    bk, hkv, skv, dk = dims4("k", k, layout)
    if v is not None and tuple(v.shape) != tuple(k.shape):
        raise ValueError("v must have k's shape %s, got %s" % (tuple(k.shape), tuple(v.shape)))
    if bk != b:
        raise ValueError("k's batch (%d) differs from q's (%d)" % (bk, b))
    if dk != d:
        raise ValueError("k's head_dim (%d) differs from q's (%d)" % (dk, d))
    if hq % hkv:
        raise ValueError("q's heads (%d) must be a multiple of k's heads (%d) (GQA)" % (hq, hkv))
    return SaShape(b, hq, hkv, sq, skv, d)


def q_tiles(s):
    return (s.len_q + TILE - 1) // TILE


def kv_blocks(s):
    return (s.len_kv + TILE - 1) // TILE


def shape_desc(s):
    return "B=%d, heads_q=%d, heads_kv=%d, len_q=%d, len_kv=%d" % (
        s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_kv)


def tile_list_dims(x, s):
    """(list_heads, max_blocks) of tile-list indices (B, list_heads, q_tiles, max_blocks)."""
    shape = tuple(int(d) for d in np.shape(x)) if not is_torch(x) else tuple(x.shape)
    t = q_tiles(s)
    if len(shape) != 4 or shape[0] != s.batch or shape[2] != t:
        raise ValueError("indices must be 4-D (B, list_heads, q_tiles, max_blocks) = (%d, "
                         "list_heads, %d, max_blocks) (%d query tiles of %d for len_q=%d), got "
                         "shape %s" % (s.batch, t, t, TILE, s.len_q, shape))
    if shape[1] not in (s.heads_kv, s.heads_q):
        raise ValueError("indices.shape[1] (list heads) must be heads_kv=%d (a GQA group shares "
                         "a list) or heads_q=%d, got %d" % (s.heads_kv, s.heads_q, shape[1]))
    if shape[3] < 1:
        raise ValueError("indices.shape[3] (max_blocks) must be at least 1")
    return shape[1], shape[3]


def query_list_dims(x, s):
    """max_blocks of per-query indices (B, heads_kv, len_q, max_blocks)."""
    shape = tuple(int(d) for d in np.shape(x)) if not is_torch(x) else tuple(x.shape)
    if len(shape) != 4 or shape[:3] != (s.batch, s.heads_kv, s.len_q):
        raise ValueError("indices must be 4-D (B, heads_kv, len_q, max_blocks) = (%d, %d, %d, "
                         "max_blocks), got shape %s" % (s.batch, s.heads_kv, s.len_q, shape))
    if shape[3] < 1:
        raise ValueError("indices.shape[3] (max_blocks) must be at least 1")
    return shape[3]


def check_shape(name, got, want, names):
    got = tuple(int(d) for d in got)
    if got != tuple(want):
        raise ValueError("%s must have shape %s = %s, got %s" % (name, names, tuple(want), got))


# ---------------------------------------------------------------- the CPU path (numpy)
def host_bf16(name, x, layout):
    """x as a contiguous BHSD uint16 numpy array of BF16 bits. float32 (numpy or torch) is
    rounded to nearest even by sa_bf16_from_f32_array; uint16 numpy arrays and torch.bfloat16
    tensors are taken as BF16 bits."""
    if x is None:
        return None
    if is_torch(x):
        t = torch_mod()
        x = x.detach()
        if x.dtype == t.bfloat16:
            a = x.contiguous().view(t.int16).numpy().view(np.uint16)
        elif x.dtype == t.float32:
            a = x.contiguous().numpy()
        else:
            raise TypeError("%s must be torch.bfloat16 or torch.float32, got %s" % (name, x.dtype))
    else:
        a = x
        if a.dtype != np.float32 and a.dtype != np.uint16:
            raise TypeError("%s must be float32 (rounded to BF16, nearest even) or uint16 (BF16 "
                            "bits), got %s" % (name, a.dtype))
    if layout == "bshd":
        a = a.transpose(0, 2, 1, 3)
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:
        return a
    out = np.empty(a.shape, np.uint16)
    lib.sa_bf16_from_f32_array(out.ctypes.data, a.ctypes.data, a.size)
    return out


def host_int32(name, x, want, names):
    """x (array-like of integers, or a CPU tensor) as a contiguous int32 numpy array of shape
    `want`; other integer dtypes are converted when every value fits int32."""
    if x is None:
        return None
    if is_torch(x):
        if x.is_cuda:
            raise ValueError("%s is a CUDA tensor but the attention inputs are on the CPU" % name)
        x = x.detach().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError("%s must hold integers (int32), got dtype %s" % (name, a.dtype))
    check_shape(name, a.shape, want, names)
    if a.dtype != np.int32:
        if a.size and (a.min() < -INT32_MAX - 1 or a.max() > INT32_MAX):
            raise ValueError("%s holds values outside int32" % name)
        a = a.astype(np.int32)
    return np.ascontiguousarray(a)


def ptr(a):
    """The data pointer of a numpy array or tensor, None for None."""
    if a is None:
        return None
    return a.data_ptr() if is_torch(a) else a.ctypes.data


def host_result(kind, like, layout, o_bits, o_f32, lse):
    """(o, lse) for the caller of the CPU path: numpy float32 for numpy inputs (o is the
    reference's FP32 output); CPU tensors of q's dtype for tensor inputs (o bf16 from the
    reference's BF16 output, or float32)."""
    if layout == "bshd":
        o_bits = np.ascontiguousarray(o_bits.transpose(0, 2, 1, 3))
        o_f32 = np.ascontiguousarray(o_f32.transpose(0, 2, 1, 3))
    if kind == "numpy":
        return o_f32, lse
    t = torch_mod()
    if like.dtype == t.bfloat16:
        o = t.from_numpy(o_bits.view(np.int16)).view(t.bfloat16)
    else:
        o = t.from_numpy(o_f32)
    return o, t.from_numpy(lse)


def host_ints_result(kind, *arrays):
    if kind == "numpy":
        return arrays
    t = torch_mod()
    return tuple(t.from_numpy(a) for a in arrays)


# ---------------------------------------------------------------- the GPU path (torch)
def cuda_bf16(name, x, layout):
    """x as a contiguous BHSD torch.bfloat16 CUDA tensor (BSHD is transposed into a copy)."""
    t = torch_mod()
    if x.dtype != t.bfloat16:
        raise TypeError("%s must be torch.bfloat16 on the GPU, got %s (use .bfloat16(), or pass "
                        "numpy float32 arrays to run the CPU reference)" % (name, x.dtype))
    if not x.is_contiguous():
        raise ValueError("%s must be contiguous in its %s layout; call .contiguous()"
                         % (name, layout))
    if layout == "bshd":
        x = x.transpose(1, 2).contiguous()
    if x.data_ptr() % 16:
        raise ValueError("%s's data must start 16-byte aligned (a view that starts inside a row?); "
                         "pass a .clone()" % name)
    return x


def cuda_int32(name, x, device, want, names):
    t = torch_mod()
    if x is None:
        return None
    if not is_torch(x) or not x.is_cuda:
        raise TypeError("%s must be a CUDA tensor (torch.int32) on %s like q, got %s"
                        % (name, device, type(x).__name__ if not is_torch(x) else x.device))
    if x.device != device:
        raise ValueError("%s is on %s but q on %s" % (name, x.device, device))
    if x.dtype != t.int32:
        raise TypeError("%s must be torch.int32, got %s (use .int())" % (name, x.dtype))
    if not x.is_contiguous():
        raise ValueError("%s must be contiguous; call .contiguous()" % name)
    check_shape(name, x.shape, want, names)
    if x.data_ptr() % 4:
        raise ValueError("%s's data must be 4-byte aligned" % name)
    return x
