"""torch.autograd over the library: sparse_attention(q, k, v, ...) returns O and LSE that
backpropagate to q, k and v, so a model can be trained (or its gradients inspected) with
block-sparse attention.

CUDA tensors: the forward is the GPU forward (block_sparse_attention: the registry's default
tile-list stage; dense attention as tile lists of every block) and the backward the GPU
backward (block_sparse_attention_backward, docs/backward.md). Per-query lists on CUDA tensors
raise NotImplementedError (there is no GPU backward for them yet).
CPU tensors: the forward is the CPU reference (block_sparse_attention, query_sparse_attention or
dense_attention) and the backward its exact backward (attention_backward, sa_ref_*_backward).

Numerics are the library's: q, k, v are rounded to BF16 on the way in (as every entry point
does); dO is rounded to BF16 (the format of the forward's O); dQ, dK, dV are FP32 sums, returned
in the inputs' dtype. On the CPU, O is the reference's FP32 output; on the GPU the stage's BF16
O. LSE is an output without a gradient (torch.autograd marks it non-differentiable)."""
import importlib

import numpy as np

from ._attention import (attention_backward, block_sparse_attention, dense_attention,
                         query_sparse_attention)
from ._backward_gpu import block_sparse_attention_backward
from ._capi import TILE


def torch_mod():
    """torch, imported on first use (this module is the one part of the package that needs it)."""
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise ImportError("sparseattn.autograd needs PyTorch (pip install torch)") from e


def _numpy(name, x):
    t = torch_mod()
    if not isinstance(x, t.Tensor):
        raise TypeError("%s must be a torch tensor, got %s" % (name, type(x).__name__))
    if x.device.type != "cpu":
        raise ValueError("%s is on %s but q on the CPU: keep q, k and v on one device"
                         % (name, x.device))
    return np.ascontiguousarray(x.detach().to(t.float32).numpy())


def _all_blocks(t, q, k, layout):
    """Tile lists naming every KV block (dense attention through the tile-list kernels)."""
    b = q.shape[0]
    if layout == "bhsd":
        sq, hkv, skv = q.shape[2], k.shape[1], k.shape[2]
    else:
        sq, hkv, skv = q.shape[1], k.shape[2], k.shape[1]
    tiles, blocks = -(-sq // TILE), -(-skv // TILE)
    return t.arange(blocks, dtype=t.int32, device=q.device).expand(b, hkv, tiles,
                                                                   blocks).contiguous()


def _cuda_function():
    t = torch_mod()

    class SparseAttentionCuda(t.autograd.Function):
        """Forward and backward on the GPU; see the module's docstring."""

        @staticmethod
        def forward(ctx, q, k, v, indices, counts, causal, allow_future_blocks, layout):
            qb, kb, vb = (x.detach().to(t.bfloat16).contiguous() for x in (q, k, v))
            if indices is None:
                indices, counts = _all_blocks(t, qb, kb, layout), None
                if causal:
                    allow_future_blocks = True  # every block: the future ones add nothing
            o, lse = block_sparse_attention(qb, kb, vb, indices, counts, layout=layout,
                                            causal=causal,
                                            allow_future_blocks=allow_future_blocks)
            ctx.save_for_backward(qb, kb, vb, o, lse, indices,
                                  counts if counts is not None else indices.new_empty(0))
            ctx.has_counts = counts is not None
            ctx.opts = (causal, allow_future_blocks, layout)
            ctx.dtypes = (q.dtype, k.dtype, v.dtype)
            ctx.mark_non_differentiable(lse)
            return o.to(q.dtype), lse

        @staticmethod
        def backward(ctx, d_o, d_lse):
            qb, kb, vb, o, lse, indices, counts = ctx.saved_tensors
            causal, allow_future, layout = ctx.opts
            dq, dk, dv = block_sparse_attention_backward(
                qb, kb, vb, o, lse, d_o.to(t.bfloat16).contiguous(), indices,
                counts if ctx.has_counts else None, layout=layout, causal=causal,
                allow_future_blocks=allow_future)
            tq, tk, tv = ctx.dtypes
            return dq.to(tq), dk.to(tk), dv.to(tv), None, None, None, None, None

    return SparseAttentionCuda


def _lists(name, x):
    if x is None:
        return None
    t = torch_mod()
    return np.ascontiguousarray(x.detach().cpu().numpy() if isinstance(x, t.Tensor) else x)


def _function():
    t = torch_mod()

    class SparseAttentionFunction(t.autograd.Function):
        """Forward and backward through the CPU reference; see the module's docstring."""

        @staticmethod
        def forward(ctx, q, k, v, indices, counts, per_query, causal, allow_future_blocks,
                    layout):
            qn, kn, vn = _numpy("q", q), _numpy("k", k), _numpy("v", v)
            ind, cnt = _lists("indices", indices), _lists("counts", counts)
            opts = dict(layout=layout, causal=causal)
            if ind is None:
                o, lse = dense_attention(qn, kn, vn, **opts)
            elif per_query:
                o, lse = query_sparse_attention(qn, kn, vn, ind, cnt,
                                                allow_future_blocks=allow_future_blocks, **opts)
            else:
                o, lse = block_sparse_attention(qn, kn, vn, ind, cnt,
                                                allow_future_blocks=allow_future_blocks, **opts)
            ctx.saved = (qn, kn, vn, o, lse, ind, cnt, per_query, causal, allow_future_blocks,
                         layout)
            ctx.dtypes = (q.dtype, k.dtype, v.dtype)
            lse_t = t.from_numpy(lse)
            ctx.mark_non_differentiable(lse_t)
            return t.from_numpy(o).to(q.dtype), lse_t

        @staticmethod
        def backward(ctx, d_o, d_lse):
            qn, kn, vn, o, lse, ind, cnt, per_query, causal, allow_future, layout = ctx.saved
            do = np.ascontiguousarray(d_o.detach().to(t.float32).numpy())
            dq, dk, dv = attention_backward(qn, kn, vn, o, lse, do, ind, cnt,
                                            per_query=bool(per_query and ind is not None),
                                            layout=layout, causal=causal,
                                            allow_future_blocks=allow_future)
            tq, tk, tv = ctx.dtypes
            return (t.from_numpy(dq).to(tq), t.from_numpy(dk).to(tk), t.from_numpy(dv).to(tv),
                    None, None, None, None, None, None)

    return SparseAttentionFunction


_FUNCTION = None
_CUDA_FUNCTION = None


def sparse_attention(q, k, v, indices=None, counts=None, *, per_query=False, causal=False,
                     allow_future_blocks=False, layout="bhsd"):
    """Differentiable attention -> (o, lse) as torch tensors of q's dtype (lse float32, no
    gradient). indices None: dense attention; tile lists (B, list_heads, q_tiles, max_blocks)
    as block_sparse_attention takes them; with per_query=True per-query lists (B, Hkv, Sq,
    max_blocks) as query_sparse_attention takes them (CPU tensors only). CUDA tensors run the
    GPU forward and backward, CPU tensors the reference (see the module)."""
    global _FUNCTION, _CUDA_FUNCTION
    t = torch_mod()
    if isinstance(q, t.Tensor) and q.is_cuda:
        if per_query and indices is not None:
            raise NotImplementedError("per-query lists have no GPU backward yet: use tile lists "
                                      "on CUDA tensors, or CPU tensors")
        if _CUDA_FUNCTION is None:
            _CUDA_FUNCTION = _cuda_function()
        return _CUDA_FUNCTION.apply(q, k, v, indices, counts, bool(causal),
                                    bool(allow_future_blocks), layout)
    if _FUNCTION is None:
        _FUNCTION = _function()
    return _FUNCTION.apply(q, k, v, indices, counts, bool(per_query), bool(causal),
                           bool(allow_future_blocks), layout)
