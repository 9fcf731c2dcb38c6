"""Block selectors (the registry of include/sa_selectors.h) and the synthetic workloads."""
import collections
import ctypes
import math

import numpy as np

from . import _gpu
from ._capi import (INT32_MAX, SA_ERR_UNSUPPORTED, SA_MAX_INDEX_DIM, UINT64_MAX, SaSelectParams,
                    SaShape)
from ._checks import integer
from ._core import check, flag, lib
from ._bf16 import bf16_to_float32
from ._tensors import (attn_shape, check_layout, check_shape, common_kind, cuda_bf16, dims4,
                       host_bf16, host_ints_result, kv_blocks, ptr, torch_mod)

Selector = collections.namedtuple(
    "Selector",
    "name description per_query has_cuda head_lists cuda_head_lists ignores_index")
Selector.__doc__ = """A registered selector. per_query: writes per-query lists (B, Hkv, Sq, k)
instead of tile lists (B, Hkv, q_tiles, k); has_cuda: has a GPU function; head_lists: the
select(head_lists=...) modes its CPU function takes, a tuple of names from HEAD_LISTS;
cuda_head_lists: those its GPU function takes (() without one); ignores_index: True when it
never scores q_index/k_index (the oracle scores q/k, random reads nothing)."""

# select(head_lists=...): the names of SA_HEAD_LISTS_GROUP, _PER_HEAD, _POOLED, by mode value.
HEAD_LISTS = ("group", "per_head", "pooled")


def _mode_names(bits):
    return tuple(m for i, m in enumerate(HEAD_LISTS) if bits >> i & 1)

Workload = collections.namedtuple("Workload", "name description knob default_strength")


def _c_selector(name):
    if not isinstance(name, str):
        raise TypeError("selector name must be a str, got %r" % (name,))
    p = lib.sa_selector_by_name(name.encode())
    if not p:
        raise ValueError("unknown selector %r; selectors: %s"
                         % (name, ", ".join(s.name for s in selectors())))
    return p


def selectors():
    """Every registered selector, in registry order."""
    out = []
    for i in range(lib.sa_selector_count()):
        p = lib.sa_selector_at(i)
        if p:
            c = p.contents
            out.append(Selector(c.name.decode(), c.description.decode(), bool(c.per_query),
                                bool(c.cuda), _mode_names(c.head_lists),
                                _mode_names(c.cuda_head_lists), bool(c.ignores_index)))
    return out


def select(name, q, k, topk=16, *, layout="bhsd", keep_diagonal=False, keep_sink=False, seed=0,
           q_index=None, k_index=None, causal=False, index_heads=0, keep_local=False,
           head_lists="group", pool_cap=None):
    """Run selector `name` on q and k -> (indices, counts), ready for block_sparse_attention
    (tile-list selectors) or query_sparse_attention (per-query ones).

    indices: int32 (B, Hkv, ceil(Sq / 128), topk), or (B, Hkv, Sq, topk) for a per-query
    selector, rows sorted by block index; counts (B, Hkv, rows), all topk. q and k as in the
    attention functions (v is not needed); q_index (B, Hq, Sq, I) and k_index (B, Hkv, Skv, I)
    are optional separate index vectors in the same layout (I a multiple of 16 up to 1024).
    numpy arrays and CPU tensors run the selector's CPU function (sa_select_cpu); CUDA tensors
    its GPU function, where it has one. keep_diagonal and keep_sink force blocks (they count toward
    topk); seed drives the "random" selector. causal: a row picks only among the blocks it can
    see (bottom-right aligned), always keeps its diagonal block and holds min(topk, visible
    blocks) entries, its count, with -1 in the slots past it (CPU and GPU functions alike);
    pass the lists on with causal=True. index_heads Hi > 0: the
    index vectors have Hi heads of their own, q_index (B, Hi, Sq, I) and k_index (B, Hi, Skv, I),
    Hi dividing Hq and dividing or a multiple of Hkv (docs/selectors.md, "Index heads"; the GPU
    functions of r1 and r4 refuse it). keep_local keeps the block holding each row's own position (bottom-right aligned,
    len_q <= len_kv).

    head_lists (tile-list selectors; docs/selectors.md, "Head lists"):
    "group" (default), one list per KV head as above, scored over its GQA group's heads;
    "per_head", one list per query head, (B, Hq, q_tiles, topk), each scored from that head
    alone; "pooled", one list per query head, (B, Hq, q_tiles, pool_cap): per tile each of the
    group's heads keeps its forced blocks (diagonal under causal, keep_* blocks), or its best
    block where none is forced, then the heads share the rest of the group's Hq / Hkv *
    min(topk, visible blocks) by score, a row holding at most min(pool_cap, visible blocks),
    its count, and -1 past it. pool_cap (pooled only, an int in [topk, kv_blocks]; None:
    min(2 topk, kv_blocks)). The modes a selector takes are its Selector.head_lists (pooled: the
    selectors that score attention mass) and, on CUDA tensors, its Selector.cuda_head_lists;
    another mode raises SparseAttnError (SA_ERR_UNSUPPORTED), on CUDA tensors ValueError. The
    lists go to block_sparse_attention as they are (list_heads Hq)."""
    check_layout(layout)
    sel = _c_selector(name).contents
    if not isinstance(head_lists, str) or head_lists not in HEAD_LISTS:
        raise ValueError("head_lists must be one of %s, got %r"
                         % (", ".join(repr(m) for m in HEAD_LISTS), head_lists))
    if pool_cap is not None:
        if head_lists != "pooled":
            raise ValueError("pool_cap is for head_lists='pooled' only (head_lists=%r)"
                             % head_lists)
    if (q_index is None) != (k_index is None):
        raise ValueError("q_index and k_index go together: pass both or neither")
    kind = common_kind([("q", q), ("k", k), ("q_index", q_index), ("k_index", k_index)])
    cuda_modes = _mode_names(sel.cuda_head_lists)
    if kind == "cuda" and head_lists not in cuda_modes:
        raise ValueError("head_lists=%r: the GPU function of selector %r takes %s; pass numpy "
                         "arrays or CPU tensors for its CPU function"
                         % (head_lists, name, " or ".join(repr(m) for m in cuda_modes) or
                            "no mode (it has none)"))
    s = attn_shape(q, k, None, layout)
    nb = kv_blocks(s)
    topk = integer("topk", topk, 1, nb,
                   interval="[1, %d] (the KV blocks of len_kv=%d)" % (nb, s.len_kv))
    pool_cap = integer("pool_cap", pool_cap, topk, nb, optional=True,
                       interval="[topk, kv_blocks] = [%d, %d]" % (topk, nb))
    index_heads = integer("index_heads", index_heads, 0, INT32_MAX)
    if index_heads and q_index is None:
        raise ValueError("index_heads describes q_index and k_index: pass them too")
    index_dim = 0
    if q_index is not None:
        # The rules of sel_index_heads and sel_begin (sa_selectors.h), judged here so that a
        # mistake is a ValueError naming the argument rather than SA_ERR_ARG.
        if index_heads and (s.heads_q % index_heads or
                            (s.heads_kv % index_heads and index_heads % s.heads_kv)):
            raise ValueError("index_heads (%d) must divide heads_q (%d) and divide heads_kv (%d) "
                             "or be a multiple of it" % (index_heads, s.heads_q, s.heads_kv))
        hq_i, hk_i = (index_heads, index_heads) if index_heads else (s.heads_q, s.heads_kv)
        nq, nk = ("Hi", "Hi") if index_heads else ("Hq", "Hkv")
        b, h, sq, index_dim = dims4("q_index", q_index, layout, "I")
        check_shape("q_index", (b, h, sq), (s.batch, hq_i, s.len_q), "(B, %s, Sq)" % nq)
        if index_dim % 16 or index_dim > SA_MAX_INDEX_DIM:
            raise ValueError("q_index's last dimension (index_dim I) must be a multiple of 16 up "
                             "to %d, got %d" % (SA_MAX_INDEX_DIM, index_dim))
        bk, hk, skv, ik = dims4("k_index", k_index, layout, "I")
        check_shape("k_index", (bk, hk, skv, ik), (s.batch, hk_i, s.len_kv, index_dim),
                    "(B, %s, Skv, I)" % nk)
    p = SaSelectParams()
    lib.sa_select_params_default(ctypes.byref(p))
    p.k = topk
    p.keep_diagonal, p.keep_sink = flag("keep_diagonal", keep_diagonal), flag("keep_sink",
                                                                              keep_sink)
    p.seed = integer("seed", seed, 0, UINT64_MAX)
    p.causal = flag("causal", causal)
    p.keep_local = flag("keep_local", keep_local)
    p.index_dim = index_dim
    p.index_heads = index_heads
    p.head_lists = HEAD_LISTS.index(head_lists)
    p.pool_cap = pool_cap or 0
    out_shape = _layout(name, sel, s, p)
    if kind == "cuda":
        return _select_cuda(name, sel, s, q, k, q_index, k_index, p, out_shape, layout)
    qb, kb = host_bf16("q", q, layout), host_bf16("k", k, layout)
    qi, ki = host_bf16("q_index", q_index, layout), host_bf16("k_index", k_index, layout)
    p.q_index, p.k_index = ptr(qi), ptr(ki)
    indices = np.empty(out_shape, np.int32)
    counts = np.empty(out_shape[:3], np.int32)
    check(lib.sa_select_cpu(name.encode(), ctypes.byref(s), ptr(qb), ptr(kb), ctypes.byref(p),
                            ptr(indices), ptr(counts)), "sa_select_cpu(%r)" % name)
    return host_ints_result(kind, indices, counts)


def _layout(name, sel, s, p):
    """(B, list_heads, rows, row_width) of the lists selector `sel` writes under p
    (sa_select_layout); SparseAttnError with the library's code otherwise, naming the modes the
    selector takes when it does not take p.head_lists."""
    heads, rows, width = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    rc = lib.sa_select_layout(ctypes.byref(sel), ctypes.byref(s), ctypes.byref(p),
                              ctypes.byref(heads), ctypes.byref(rows), ctypes.byref(width))
    detail = None
    if rc == SA_ERR_UNSUPPORTED:
        detail = "selector %r takes head_lists %s, not %r" % (
            name, " or ".join(repr(m) for m in _mode_names(sel.head_lists)),
            HEAD_LISTS[p.head_lists])
    check(rc, "sa_select_layout(%r)" % name, detail)
    out_shape = (s.batch, heads.value, rows.value, width.value)
    if p.head_lists == 0 and lib.sa_selector_list_len(ctypes.byref(sel), ctypes.byref(s),
                                                      p.k) != math.prod(out_shape):
        raise RuntimeError("selector %r: the library's list length differs from %s"
                           % (name, out_shape))
    return out_shape


def _select_cuda(name, sel, s, q, k, q_index, k_index, p, out_shape, layout):
    t = torch_mod()
    if not sel.cuda:
        raise ValueError("selector %r has no GPU function; pass numpy arrays or CPU tensors to "
                         "run its CPU function" % name)
    _gpu.require_gpu()
    dev = q.device
    with t.cuda.device(dev):
        qd, kd = cuda_bf16("q", q, layout), cuda_bf16("k", k, layout)
        qi = cuda_bf16("q_index", q_index, layout) if q_index is not None else None
        ki = cuda_bf16("k_index", k_index, layout) if k_index is not None else None
        p.q_index, p.k_index = ptr(qi), ptr(ki)
        p.stream = _gpu.stream_ptr()
        indices = t.empty(out_shape, dtype=t.int32, device=dev)
        counts = t.empty(out_shape[:3], dtype=t.int32, device=dev)
        check(sel.cuda(ctypes.byref(s), ptr(qd), ptr(kd), ctypes.byref(p), ptr(indices),
                       ptr(counts)), "selector %r (cuda)" % name)
    return indices, counts


def workloads():
    """The synthetic workloads (sa_workload_at), in registry order."""
    out = []
    for i in range(lib.sa_workload_count()):
        p = lib.sa_workload_at(i)
        if p:
            c = p.contents
            out.append(Workload(c.name.decode(), c.description.decode(), c.knob.decode(),
                                c.default_strength))
    return out


def workload(name, *, batch=1, heads_q=1, heads_kv=1, len_q=128, len_kv=128, head_dim=128,
             seed=0, strength=None):
    """Q, K, V of workload `name` (sa_workload_generate), reproducible from its arguments on
    every machine -> three float32 numpy arrays, BHSD, whose values are BF16. strength None:
    the workload's default."""
    if not isinstance(name, str):
        raise TypeError("workload name must be a str, got %r" % (name,))
    # The ranges of sa_shape's ints and the uint64_t seed here; the shape's own rules (head_dim,
    # GQA, element counts) stay sa_shape_check's.
    s = SaShape(*(integer(n, x, 1, INT32_MAX) for n, x in zip(
        ("batch", "heads_q", "heads_kv", "len_q", "len_kv", "head_dim"),
        (batch, heads_q, heads_kv, len_q, len_kv, head_dim))))
    seed = integer("seed", seed, 0, UINT64_MAX)
    check(lib.sa_shape_check(ctypes.byref(s)), "sa_shape_check")
    q = np.empty((s.batch, s.heads_q, s.len_q, s.head_dim), np.uint16)
    k = np.empty((s.batch, s.heads_kv, s.len_kv, s.head_dim), np.uint16)
    v = np.empty_like(k)
    check(lib.sa_workload_generate(name.encode(), ctypes.byref(s), seed,
                                   -1.0 if strength is None else float(strength), ptr(q), ptr(k),
                                   ptr(v)), "sa_workload_generate(%r)" % name)
    return tuple(bf16_to_float32(x) for x in (q, k, v))
