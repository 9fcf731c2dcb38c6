"""The attention entry points. Each takes numpy arrays or CPU torch tensors (the CPU reference,
exact up to FP32 accumulation) or torch CUDA tensors (the GPU stages / the KV-centric path)."""
import ctypes

import numpy as np

from . import _gpu
from ._capi import SaAttnOpts, SaOutputs, SaQueryLists, SaTileLists
from ._core import check, flag, lib
from ._tensors import (attn_shape, check_layout, common_kind, host_bf16, host_int32, host_result,
                       ptr, q_tiles, query_list_dims, tile_list_dims)


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
    (for lengths the dense stage does not take); or `stage`."""
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
                           partial_format="f32"):
    """Attention with one block list per query -> (o, lse).

    indices: int32 (B, Hkv, Sq, max_blocks) (the query heads of a GQA group share their
    query's list), counts (B, Hkv, Sq) or None. Otherwise as block_sparse_attention.
    CPU: sa_ref_query_sparse. GPU: the KV-centric path (sa_kvcentric_attention; head_dim 128;
    it answers causal with SA_ERR_UNSUPPORTED until it masks causally) with partials in "f32"
    or "bf16"."""
    check_layout(layout)
    if partial_format not in ("f32", "bf16"):
        raise ValueError("partial_format must be 'f32' or 'bf16', got %r" % (partial_format,))
    kind = common_kind([("q", q), ("k", k), ("v", v)])
    s = attn_shape(q, k, v, layout)
    max_blocks = query_list_dims(indices, s)
    flags = (flag("validate", validate), flag("allow_empty_rows", allow_empty_rows),
             flag("causal", causal), flag("allow_future_blocks", allow_future_blocks))
    if kind == "cuda":
        return _gpu.query_sparse(q, k, v, indices, counts, s, max_blocks, layout, *flags,
                                 partial_format)
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
