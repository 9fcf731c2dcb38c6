"""The attention entry points. Each takes numpy arrays or CPU torch tensors (the CPU reference,
exact up to FP32 accumulation) or torch CUDA tensors (the GPU stages / the KV-centric path)."""
import ctypes

import numpy as np

from . import _gpu
from ._capi import TILE, SaAttnOpts, SaOutputs, SaQueryLists, SaShape, SaTileLists
from ._checks import integer
from ._core import check, flag, lib, library_path
from ._errors import AbiMismatchError
from ._tensors import (attn_shape, check_layout, check_shape, common_kind, host_bf16, host_int32,
                       host_result, ptr, q_tiles, query_list_dims, tile_list_dims)


def _opts(validate, allow_empty_rows, causal, allow_future_blocks):
    o = SaAttnOpts()
    lib.sa_attn_opts_default(ctypes.byref(o))
    o.validate, o.allow_empty_rows = validate, allow_empty_rows
    o.causal, o.allow_future_blocks = causal, allow_future_blocks
    return o


def _host_outputs(s):
    o_bits = np.empty((s.batch, s.heads_q, s.len_q, s.head_dim), np.uint16)
    o_f32 = np.empty((s.batch, s.heads_q, s.len_q, s.head_dim), np.float32)
    lse = np.empty((s.batch, s.heads_q, s.len_q), np.float32)
    return o_bits, o_f32, lse, SaOutputs(ptr(o_bits), ptr(o_f32), ptr(lse))


def _host_only(**named):
    for name, x in named.items():
        if x is not None:
            raise ValueError("%s applies to the GPU path (CUDA tensors) only" % name)


def block_sparse_attention(q, k, v, indices, counts=None, *, layout="bhsd", validate=True,
                           allow_empty_rows=True, causal=False, allow_future_blocks=False,
                           stage=None, verdict=None):
    """Attention of each query tile over the KV blocks its list names -> (o, lse).

    q: (B, Hq, Sq, D), k, v: (B, Hkv, Skv, D) for layout "bhsd"; (B, S, H, D) for "bshd".
    indices: int32 (B, list_heads, ceil(Sq / 128), max_blocks), list_heads Hkv (a GQA group
    shares a list) or Hq; a row uses its first counts[b, h, t] entries (counts None: all).
    o has q's layout and shape; lse is float32 (B, Hq, Sq), natural log, -inf for an empty row.
    Softmax scale 1/sqrt(D).

    numpy float32 (or uint16 BF16 bits) / CPU tensors: sa_ref_tile_sparse; inputs rounded to
    BF16; numpy o is the reference's FP32 output, a CPU bf16 tensor's o its BF16 output.
    CUDA tensors (torch.bfloat16, contiguous; indices and counts int32 on the same device): the
    registry's SA_ROLE_DEFAULT_TILE stage when its check accepts the arguments, else the first
    sparse stage that does, or `stage` (a Stage, id or name), on torch's current stream.
    `verdict` (a Verdict) lets a validating stage record bad lists without waiting."""
    check_layout(layout)
    kind = common_kind([("q", q), ("k", k), ("v", v)])
    s = attn_shape(q, k, v, layout)
    list_heads, max_blocks = tile_list_dims(indices, s)
    flags = (flag("validate", validate), flag("allow_empty_rows", allow_empty_rows),
             flag("causal", causal), flag("allow_future_blocks", allow_future_blocks))
    if kind == "cuda":
        return _gpu.tile_sparse(q, k, v, indices, counts, s, list_heads, max_blocks, layout,
                                *flags, stage, verdict)
    _host_only(stage=stage, verdict=verdict)
    tiles = q_tiles(s)
    ind = host_int32("indices", indices, (s.batch, list_heads, tiles, max_blocks),
                     "(B, list_heads, q_tiles, max_blocks)")
    cnt = host_int32("counts", counts, (s.batch, list_heads, tiles), "(B, list_heads, q_tiles)")
    qb, kb, vb = (host_bf16(n, x, layout) for n, x in (("q", q), ("k", k), ("v", v)))
    o_bits, o_f32, lse, out = _host_outputs(s)
    lists = SaTileLists(ptr(ind), ptr(cnt), list_heads, max_blocks)
    opts = _opts(*flags)
    check(lib.sa_ref_tile_sparse(ctypes.byref(s), ptr(qb), ptr(kb), ptr(vb), ctypes.byref(lists),
                                 ctypes.byref(opts), ctypes.byref(out)), "sa_ref_tile_sparse")
    return host_result(kind, q, layout, o_bits, o_f32, lse)


def dense_attention(q, k, v, *, layout="bhsd", causal=False, stage=None):
    """Attention of every query over every key -> (o, lse); shapes, layouts and dtypes as in
    block_sparse_attention.

    CPU: sa_ref_dense_opts. GPU: the SA_ROLE_DEFAULT_DENSE stage when its check accepts the
    arguments, else another dense stage that does, else a sparse stage on lists of every block
    (causal: no dense stage masks causally); or `stage`."""
    check_layout(layout)
    kind = common_kind([("q", q), ("k", k), ("v", v)])
    s = attn_shape(q, k, v, layout)
    causal = flag("causal", causal)
    if kind == "cuda":
        return _gpu.dense(q, k, v, s, layout, causal, stage)
    _host_only(stage=stage)
    qb, kb, vb = (host_bf16(n, x, layout) for n, x in (("q", q), ("k", k), ("v", v)))
    o_bits, o_f32, lse, out = _host_outputs(s)
    opts = _opts(1, 1, causal, 0)
    check(lib.sa_ref_dense_opts(ctypes.byref(s), ptr(qb), ptr(kb), ptr(vb), ctypes.byref(opts),
                                ctypes.byref(out)), "sa_ref_dense_opts")
    return host_result(kind, q, layout, o_bits, o_f32, lse)


def query_sparse_attention(q, k, v, indices, counts=None, *, layout="bhsd", validate=True,
                           allow_empty_rows=True, causal=False, allow_future_blocks=False,
                           partial_format="f32", schedule="kv", hybrid_share=None):
    """Attention with one block list per query -> (o, lse).

    indices: int32 (B, Hkv, Sq, max_blocks) (the query heads of a GQA group share their
    query's list), counts (B, Hkv, Sq) or None. Otherwise as block_sparse_attention.
    CPU: sa_ref_query_sparse. GPU: the KV-centric path (sa_kvcentric_attention; head_dim 128)
    with partials in "f32" or "bf16"; schedule "kv" (every pair KV-centric) or "hybrid" (per
    128-query tile the blocks that at least hybrid_share / 128 of its queries list run
    Q-centric, each masked to those queries' rows, planned on the GPU, and below 128 a tile
    whose other blocks hold few entries runs its whole union so; hybrid_share an int in 1..128,
    None: the library's default, SA_KV_HYBRID_SHARE_DEFAULT). The CPU result is the same
    whatever the schedule."""
    check_layout(layout)
    if partial_format not in ("f32", "bf16"):
        raise ValueError("partial_format must be 'f32' or 'bf16', got %r" % (partial_format,))
    if schedule not in ("kv", "hybrid"):
        raise ValueError("schedule must be 'kv' or 'hybrid', got %r" % (schedule,))
    hybrid_share = integer("hybrid_share", hybrid_share, 1, TILE, optional=True)
    kind = common_kind([("q", q), ("k", k), ("v", v)])
    s = attn_shape(q, k, v, layout)
    max_blocks = query_list_dims(indices, s)
    flags = (flag("validate", validate), flag("allow_empty_rows", allow_empty_rows),
             flag("causal", causal), flag("allow_future_blocks", allow_future_blocks))
    if kind == "cuda":
        return _gpu.query_sparse(q, k, v, indices, counts, s, max_blocks, layout, *flags,
                                 partial_format, schedule, hybrid_share)
    ind = host_int32("indices", indices, (s.batch, s.heads_kv, s.len_q, max_blocks),
                     "(B, heads_kv, len_q, max_blocks)")
    cnt = host_int32("counts", counts, (s.batch, s.heads_kv, s.len_q), "(B, heads_kv, len_q)")
    qb, kb, vb = (host_bf16(n, x, layout) for n, x in (("q", q), ("k", k), ("v", v)))
    o_bits, o_f32, lse, out = _host_outputs(s)
    lists = SaQueryLists(ptr(ind), ptr(cnt), max_blocks)
    opts = _opts(*flags)
    check(lib.sa_ref_query_sparse(ctypes.byref(s), ptr(qb), ptr(kb), ptr(vb), ctypes.byref(lists),
                                  ctypes.byref(opts), ctypes.byref(out)), "sa_ref_query_sparse")
    return host_result(kind, q, layout, o_bits, o_f32, lse)


# ---------------------------------------------------------------- backward (CPU reference)
_P = ctypes.POINTER
_GRADS = [ctypes.c_void_p] * 6  # o, lse, d_o, dq, dk, dv
_BACKWARD = {
    "sa_ref_dense_backward": [_P(SaShape)] + [ctypes.c_void_p] * 3 + [_P(SaAttnOpts)] + _GRADS,
    "sa_ref_tile_sparse_backward": [_P(SaShape)] + [ctypes.c_void_p] * 3 +
                                   [_P(SaTileLists), _P(SaAttnOpts)] + _GRADS,
    "sa_ref_query_sparse_backward": [_P(SaShape)] + [ctypes.c_void_p] * 3 +
                                    [_P(SaQueryLists), _P(SaAttnOpts)] + _GRADS,
}


def _bind_backward():
    """Prototypes of the backward entry points (a missing one: a library of another version)."""
    missing = [name for name in _BACKWARD if not hasattr(lib, name)]
    if missing:
        raise AbiMismatchError(
            "%s lacks %s: it is older (or newer) than this sparseattn package; rebuild the "
            "library from the same checkout as the package" % (library_path, ", ".join(missing)))
    for name, args in _BACKWARD.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = ctypes.c_int, args


_bind_backward()


def _host_f32(name, x, layout):
    """A floating numpy array as contiguous BHSD float32."""
    if x.dtype.kind != "f":
        raise TypeError("%s must be float32 (the forward's output), got %s" % (name, x.dtype))
    if layout == "bshd":
        x = x.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(x, dtype=np.float32)


def attention_backward(q, k, v, o, lse, do, indices=None, counts=None, *, per_query=False,
                       layout="bhsd", validate=True, allow_empty_rows=True, causal=False,
                       allow_future_blocks=False):
    """Gradients (dq, dk, dv) of L with dL/dO = do through the CPU reference's attention.

    The backward of the forward call with the same q, k, v, lists and options: dense_attention
    (indices None), block_sparse_attention (tile lists) or, with per_query=True,
    query_sparse_attention. o and lse are what that call returned (numpy float32: o is the
    reference's FP32 output, lse (B, Hq, Sq)); do has q's shape and layout, float32 (rounded to
    BF16, the format of the forward's O) or uint16 (BF16 bits). numpy arrays only.
    Returns float32 arrays: dq in q's shape and layout, dk and dv in k's (summed over the query
    heads of each KV head's group). A query with no key gets dq = 0.
    C: sa_ref_dense_backward, sa_ref_tile_sparse_backward, sa_ref_query_sparse_backward."""
    check_layout(layout)
    for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)):
        if not isinstance(x, np.ndarray):
            raise TypeError("%s must be a numpy array (attention_backward runs the CPU "
                            "reference), got %s" % (name, type(x).__name__))
    s = attn_shape(q, k, v, layout)
    flags = (flag("validate", validate), flag("allow_empty_rows", allow_empty_rows),
             flag("causal", causal), flag("allow_future_blocks", allow_future_blocks))
    per_query = flag("per_query", per_query)
    check_shape("o", o.shape, q.shape, "q's shape")
    check_shape("do", do.shape, q.shape, "q's shape")
    check_shape("lse", lse.shape, (s.batch, s.heads_q, s.len_q), "(B, Hq, Sq)")
    if indices is None and (counts is not None or per_query):
        raise ValueError("%s needs indices" % ("counts" if counts is not None else "per_query"))
    o32 = _host_f32("o", o, layout)
    if lse.dtype.kind != "f":
        raise TypeError("lse must be float32 (the forward's output), got %s" % lse.dtype)
    lse32 = np.ascontiguousarray(lse, dtype=np.float32)
    qb, kb, vb, dob = (host_bf16(n, x, layout)
                       for n, x in (("q", q), ("k", k), ("v", v), ("do", do)))
    dq = np.empty((s.batch, s.heads_q, s.len_q, s.head_dim), np.float32)
    dk = np.empty((s.batch, s.heads_kv, s.len_kv, s.head_dim), np.float32)
    dv = np.empty_like(dk)
    opts = _opts(*flags)
    grads = (ptr(o32), ptr(lse32), ptr(dob), ptr(dq), ptr(dk), ptr(dv))
    head = (ctypes.byref(s), ptr(qb), ptr(kb), ptr(vb))
    if indices is None:
        fn = "sa_ref_dense_backward"
        rc = lib.sa_ref_dense_backward(*head, ctypes.byref(opts), *grads)
    elif per_query:
        max_blocks = query_list_dims(indices, s)
        ind = host_int32("indices", indices, (s.batch, s.heads_kv, s.len_q, max_blocks),
                         "(B, heads_kv, len_q, max_blocks)")
        cnt = host_int32("counts", counts, (s.batch, s.heads_kv, s.len_q),
                         "(B, heads_kv, len_q)")
        lists = SaQueryLists(ptr(ind), ptr(cnt), max_blocks)
        fn = "sa_ref_query_sparse_backward"
        rc = lib.sa_ref_query_sparse_backward(*head, ctypes.byref(lists), ctypes.byref(opts),
                                              *grads)
    else:
        list_heads, max_blocks = tile_list_dims(indices, s)
        tiles = q_tiles(s)
        ind = host_int32("indices", indices, (s.batch, list_heads, tiles, max_blocks),
                         "(B, list_heads, q_tiles, max_blocks)")
        cnt = host_int32("counts", counts, (s.batch, list_heads, tiles),
                         "(B, list_heads, q_tiles)")
        lists = SaTileLists(ptr(ind), ptr(cnt), list_heads, max_blocks)
        fn = "sa_ref_tile_sparse_backward"
        rc = lib.sa_ref_tile_sparse_backward(*head, ctypes.byref(lists), ctypes.byref(opts),
                                             *grads)
    check(rc, fn)
    if layout == "bshd":
        dq, dk, dv = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (dq, dk, dv))
    return dq, dk, dv
