"""The GPU backward of tile-list attention (sa_gpu_tile_sparse_backward) on torch CUDA tensors.

    dq, dk, dv = sparseattn.block_sparse_attention_backward(q, k, v, o, lse, d_o, indices,
                                                            counts=None, causal=False, ...)

q, k, v, o, d_o: torch.bfloat16 CUDA tensors in `layout` ("bhsd" or "bshd"); lse float32
(B, Hq, Sq) as the forward returned it; indices/counts the forward's tile lists. dq, dk, dv are
float32 tensors in the same layout (dk, dv summed over each GQA group). Exact and deterministic
(docs/backward.md); on torch's current stream. validate=True checks the lists on the GPU and
synchronizes once to return the code (with a verdict, no synchronization). dq_pass: "auto" (default), "stored" (dS^T kept in the workspace, 5 GEMMs)
or "recompute" (7 GEMMs, a small workspace); the workspace comes from torch's caching
allocator."""
import ctypes
from ctypes import c_int, c_size_t, c_void_p

from . import _capi
from ._capi import SaShape, SaTileLists
from ._core import check, flag, lib, library_path
from ._tensors import attn_shape, check_layout, cuda_bf16, tile_list_dims, torch_mod


class SaGpuAttnBwd(ctypes.Structure):
    _fields_ = [("shape", SaShape), ("q", c_void_p), ("k", c_void_p), ("v", c_void_p),
                ("o", c_void_p), ("lse", c_void_p), ("d_o", c_void_p), ("lists", SaTileLists),
                ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p), ("validate", c_int),
                ("allow_empty_rows", c_int), ("causal", c_int), ("allow_future_blocks", c_int),
                ("workspace", c_void_p), ("workspace_bytes", c_size_t), ("stream", c_void_p),
                ("dq_pass", c_int), ("verdict", c_void_p)]

# sparseattn.h's SA_BWD_DQ_*
DQ_PASSES = {"auto": 0, "recompute": 1, "stored": 2}


_checked = False


def _bind():
    """The entry points' signatures and the mirror's ABI check, once (a library without the
    backward raises here, not at import)."""
    global _checked
    if _checked:
        return
    for name in ("sa_gpu_attn_bwd_default", "sa_gpu_tile_sparse_backward",
                 "sa_gpu_backward_workspace_size"):
        if not hasattr(lib, name):
            raise RuntimeError("%s has no %s: rebuild the library" % (library_path, name))
    lib.sa_gpu_attn_bwd_default.restype = None
    lib.sa_gpu_attn_bwd_default.argtypes = [ctypes.POINTER(SaGpuAttnBwd)]
    lib.sa_gpu_tile_sparse_backward.restype = c_int
    lib.sa_gpu_tile_sparse_backward.argtypes = [ctypes.POINTER(SaGpuAttnBwd)]
    lib.sa_gpu_backward_workspace_size.restype = c_int
    lib.sa_gpu_backward_workspace_size.argtypes = [ctypes.POINTER(SaGpuAttnBwd),
                                                   ctypes.POINTER(c_size_t)]
    _capi.check_abi(lib, library_path, {"sa_gpu_attn_bwd": SaGpuAttnBwd})
    _checked = True


def _lse(name, x, s, device):
    t = torch_mod()
    want = (s.batch, s.heads_q, s.len_q)
    if not isinstance(x, t.Tensor) or x.device != device or x.dtype != t.float32:
        raise TypeError("%s must be a float32 tensor on %s" % (name, device))
    if tuple(x.shape) != want:
        raise ValueError("%s has shape %s, expected (B, Hq, Sq) = %s" % (name, tuple(x.shape),
                                                                          want))
    return x.contiguous()


def block_sparse_attention_backward(q, k, v, o, lse, d_o, indices, counts=None, *,
                                    layout="bhsd", validate=True, allow_empty_rows=True,
                                    causal=False, allow_future_blocks=False, dq_pass="auto",
                                    verdict=None):
    """Gradients (dq, dk, dv) of block_sparse_attention on CUDA tensors; see the module.
    verdict (a Verdict, with validate): the lists' check records its code there and the call
    returns without waiting for it (sa_gpu_attn_bwd.verdict); bad lists then give defined,
    wrong gradients, and verdict.check() raises."""
    t = torch_mod()
    if dq_pass not in DQ_PASSES:
        raise ValueError("dq_pass must be one of %s, got %r" % (sorted(DQ_PASSES), dq_pass))
    from ._gpu import require_gpu, stream_ptr, tile_lists
    require_gpu()
    _bind()
    check_layout(layout)
    s = attn_shape(q, k, v, layout)
    if tuple(o.shape) != tuple(q.shape) or tuple(d_o.shape) != tuple(q.shape):
        raise ValueError("o and d_o must have q's shape %s, got %s and %s"
                         % (tuple(q.shape), tuple(o.shape), tuple(d_o.shape)))
    list_heads, max_blocks = tile_list_dims(indices, s)
    dev = q.device
    ind, cnt = tile_lists(indices, counts, s, list_heads, max_blocks, dev)
    with t.cuda.device(dev):
        qb, kb, vb = (cuda_bf16(n, x, layout) for n, x in (("q", q), ("k", k), ("v", v)))
        ob, dob = cuda_bf16("o", o, layout), cuda_bf16("d_o", d_o, layout)
        lse_c = _lse("lse", lse, s, dev)
        dq = t.empty(tuple(qb.shape), dtype=t.float32, device=dev)
        dk = t.empty(tuple(kb.shape), dtype=t.float32, device=dev)
        dv = t.empty(tuple(vb.shape), dtype=t.float32, device=dev)
        a = SaGpuAttnBwd()
        lib.sa_gpu_attn_bwd_default(ctypes.byref(a))
        a.shape = s
        a.q, a.k, a.v, a.o, a.lse, a.d_o = (x.data_ptr() for x in (qb, kb, vb, ob, lse_c, dob))
        a.lists = SaTileLists(ind.data_ptr(), cnt.data_ptr() if cnt is not None else None,
                              list_heads, max_blocks)
        a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        a.validate = flag("validate", validate)
        a.allow_empty_rows = flag("allow_empty_rows", allow_empty_rows)
        a.causal = flag("causal", causal)
        a.allow_future_blocks = flag("allow_future_blocks", allow_future_blocks)
        a.stream = stream_ptr()
        a.dq_pass = DQ_PASSES[dq_pass]
        if verdict is not None:
            from ._gpu import Verdict
            if not isinstance(verdict, Verdict):
                raise TypeError("verdict must be a sparseattn.Verdict, got %r" % (verdict,))
            a.verdict = verdict.handle
        size = c_size_t(0)
        check(lib.sa_gpu_backward_workspace_size(ctypes.byref(a), ctypes.byref(size)),
              "sa_gpu_backward_workspace_size")
        # The caching allocator keeps the block for this stream until the queued work is done.
        ws = t.empty(max(size.value, 1), dtype=t.uint8, device=dev)
        a.workspace, a.workspace_bytes = ws.data_ptr(), size.value
        check(lib.sa_gpu_tile_sparse_backward(ctypes.byref(a)), "sa_gpu_tile_sparse_backward")
    if layout == "bshd":
        return tuple(x.transpose(1, 2).contiguous() for x in (dq, dk, dv))
    return dq, dk, dv
