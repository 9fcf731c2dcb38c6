"""The GPU side: the stage registry, verdicts, and the GPU paths of the attention functions
(torch CUDA tensors, device pointers passed straight to the library on torch's current
stream)."""
import ctypes

import numpy as np

from ._capi import (SA_ERR_NO_DEVICE, SA_ERR_NOT_BUILT, SA_KV_PARTIAL_BF16, SA_KV_SCHEDULE_HYBRID,
                    SA_KV_SCHEDULE_KV,
                    SA_KV_PARTIAL_F32, SA_ROLE_DEFAULT_DENSE, SA_ROLE_DEFAULT_TILE,
                    SA_ROLE_GPU_VERDICT, SA_ROLE_SPARSE, SaGpuAttn, SaKvParams, SaQueryLists,
                    SaTileLists)
from ._capi import (INT32_MAX, INT32_MIN, SA_LISTS_INDEPENDENT, TILE, UINT64_MAX,
                    SaShape)  # random_tile_lists
from ._checks import integer
from ._core import check, lib, strerror
from ._errors import SparseAttnError
from ._tensors import cuda_bf16, cuda_int32, kv_blocks, ptr, q_tiles, torch_mod


def gpu_available():
    """True when the library was built with CUDA and a usable (sm_90) GPU is present."""
    return bool(lib.sa_gpu_available())


def require_gpu():
    if lib.sa_gpu_available():
        return
    code = SA_ERR_NOT_BUILT if lib.sa_stage_count() == 0 else SA_ERR_NO_DEVICE
    raise SparseAttnError(code, "sa_gpu_available", strerror(code))


# ---------------------------------------------------------------- the stage registry
class Stage:
    """One entry of the stage registry (sa_stage): id, name, summary, roles."""

    def __init__(self, c_stage):
        self._c = c_stage
        self.id = c_stage.id
        self.name = c_stage.name.decode()
        self.summary = c_stage.summary.decode()
        self.roles = c_stage.roles

    sparse = property(lambda self: bool(self.roles & SA_ROLE_SPARSE),
                      doc="consumes tile lists (SA_ROLE_SPARSE)")
    default_dense = property(lambda self: bool(self.roles & SA_ROLE_DEFAULT_DENSE))
    default_tile = property(lambda self: bool(self.roles & SA_ROLE_DEFAULT_TILE))
    gpu_verdict = property(lambda self: bool(self.roles & SA_ROLE_GPU_VERDICT),
                           doc="validates inside its kernel and honours a verdict")

    def check(self, a):
        """The stage's check() on an SaGpuAttn: SA_OK or why it cannot run it."""
        return self._c.check(ctypes.byref(a))

    def launch(self, a):
        return check(self._c.launch(ctypes.byref(a)), "stage %d (%s)" % (self.id, self.name))

    def launcher(self, a):
        """A function of no argument that launches this stage on `a` (an SaGpuAttn, which
        the function keeps alive) and raises SparseAttnError for a negative status: the
        per-call path of a benchmark, with the pointer to `a`, the stage's launch function and
        the error's wording fixed once, outside the timed calls."""
        ref = ctypes.byref(a)  # holds a reference to a
        fn = self._c.launch
        where = "stage %d (%s)" % (self.id, self.name)

        def run():
            rc = fn(ref)
            if rc:
                check(rc, where)
            return rc
        return run

    def __eq__(self, other):
        return isinstance(other, Stage) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return "Stage(id=%d, name=%r, roles=%#x)" % (self.id, self.name, self.roles)


def stages():
    """Every registered GPU stage, in registry order (empty without CUDA)."""
    out = []
    for i in range(lib.sa_stage_count()):
        p = lib.sa_stage_at(i)
        if p:
            out.append(Stage(p.contents))
    return out


def stage_with(roles):
    """The first stage with every bit of `roles` (sa_stage_with), or None."""
    p = lib.sa_stage_with(roles)
    return Stage(p.contents) if p else None


def stage_table():
    """[{"id", "name", "sparse", "roles"}] of every registered stage, in registry order: the
    registry as the benchmarks record it in their JSON (empty without CUDA)."""
    return [{"id": s.id, "name": s.name, "sparse": s.sparse, "roles": int(s.roles)}
            for s in stages()]


def gpu_attn_default():
    """A new SaGpuAttn as sa_gpu_attn_default fills it (every pointer NULL, validate and
    allow_empty_rows 1, the rest 0), for callers that set its fields themselves."""
    a = SaGpuAttn()
    lib.sa_gpu_attn_default(ctypes.byref(a))
    return a


def random_tile_lists(shape, list_heads, max_blocks, pattern=SA_LISTS_INDEPENDENT, seed=0):
    """sa_random_tile_lists: int32 (B, list_heads, q_tiles, max_blocks) numpy array of
    max_blocks distinct blocks per row, ascending, drawn from the library's RNG with `seed`
    (the lists the GPU benchmarks feed the stages). pattern SA_LISTS_INDEPENDENT (0) draws each
    row alone, SA_LISTS_PAIRED (1) gives the Q tiles 2i and 2i + 1 the same row. shape is an
    SaShape or (batch, heads_q, heads_kv, len_q, len_kv, head_dim). Runs without a GPU.
    The ints must fit their C parameters (int; the seed uint64_t), else TypeError / ValueError
    as integer() says: ctypes would wrap them, and the buffer and C would disagree; within
    those ranges the library judges them (SA_ERR_SHAPE, _LIST_HEADS, _ARG) before it writes."""
    s = shape
    if not isinstance(s, SaShape):
        names = ("batch", "heads_q", "heads_kv", "len_q", "len_kv", "head_dim")
        if len(s) != len(names):
            raise ValueError("shape must be an SaShape or (%s), got %r" % (", ".join(names), s))
        s = SaShape(*(integer(n, x, INT32_MIN, INT32_MAX) for n, x in zip(names, s)))
    list_heads = integer("list_heads", list_heads, INT32_MIN, INT32_MAX)
    max_blocks = integer("max_blocks", max_blocks, INT32_MIN, INT32_MAX)
    pattern = integer("pattern", pattern, INT32_MIN, INT32_MAX)
    seed = integer("seed", seed, 0, UINT64_MAX)
    dims = tuple(max(0, x) for x in (s.batch, list_heads, (s.len_q + TILE - 1) // TILE,
                                     max_blocks))
    out = np.zeros(dims, dtype=np.int32)
    check(lib.sa_random_tile_lists(ctypes.byref(s), list_heads, max_blocks, pattern, seed,
                                   out.ctypes.data), "sa_random_tile_lists")
    return out


def resolve_stage(stage):
    """A Stage from a Stage, an id (int) or a name (str)."""
    if isinstance(stage, Stage):
        return stage
    all_stages = stages()
    for s in all_stages:
        if (isinstance(stage, int) and not isinstance(stage, bool) and s.id == stage) or \
                (isinstance(stage, str) and s.name == stage):
            return s
    if not isinstance(stage, (int, str)) or isinstance(stage, bool):
        raise TypeError("stage must be a Stage, a stage id or a stage name, got %r" % (stage,))
    raise ValueError("no stage %r in the registry; stages: %s"
                     % (stage, ", ".join("%d %s" % (s.id, s.name) for s in all_stages) or
                        "none (the library was built without CUDA)"))


def _first_accepting(candidates, a, what):
    first_rc, first = None, None
    for st in candidates:
        rc = st.check(a)
        if rc == 0:
            return st
        if first_rc is None:
            first_rc, first = rc, st
    if first is None:
        raise SparseAttnError(SA_ERR_NOT_BUILT, "sa_stage_with", strerror(SA_ERR_NOT_BUILT),
                              "no %s stage in the registry" % what)
    raise SparseAttnError(first_rc, "stage %d (%s) check" % (first.id, first.name),
                          strerror(first_rc), "no %s stage accepts these arguments" % what)


def pick_sparse(stage, a):
    """The stage to run tile lists: `stage` when given (it must accept `a`), else the
    SA_ROLE_DEFAULT_TILE stage when its check accepts `a`, else the first sparse stage that
    does (the rule the tools follow)."""
    if stage is not None:
        st = resolve_stage(stage)
        if not st.sparse:
            raise ValueError("stage %d (%s) is dense: it does not read tile lists"
                             % (st.id, st.name))
        check(st.check(a), "stage %d (%s) check" % (st.id, st.name))
        return st
    default = stage_with(SA_ROLE_DEFAULT_TILE)
    order = ([default] if default else []) + [s for s in stages() if s.sparse and s != default]
    return _first_accepting(order, a, "sparse")


# ---------------------------------------------------------------- verdicts
def stream_ptr(stream=None):
    """A cudaStream_t as an int: torch's current stream for None (NULL when torch's CUDA is not
    initialized), a torch.cuda.Stream's handle, or an int as given."""
    if stream is None:
        t = torch_mod()
        if t is not None and t.cuda.is_available() and t.cuda.is_initialized():
            return t.cuda.current_stream().cuda_stream or None
        return None
    if isinstance(stream, int):
        return stream or None
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError("stream must be None, a torch.cuda.Stream or a cudaStream_t (int), got %r"
                        % (stream,))
    return handle or None


class Verdict:
    """A device word where validated GPU calls record bad metadata without waiting
    (sa_gpu_verdict_create / read / destroy).

        v = sparseattn.Verdict()
        o, lse = sparseattn.block_sparse_attention(q, k, v_, indices, verdict=v)
        v.read()    # waits for the stream, returns the worst code since the last read (0: OK)
        v.check()   # the same, raising SparseAttnError for a bad code

    With a verdict, a stage with the role SA_ROLE_GPU_VERDICT returns at once (no host
    synchronization; the call can be captured in a CUDA graph) and writes NaN into the rows
    whose lists are bad; other stages check synchronously and also record here. One verdict may
    serve many calls. Usable as a context manager; close() frees it."""

    def __init__(self):
        require_gpu()
        h = ctypes.c_void_p()
        check(lib.sa_gpu_verdict_create(ctypes.byref(h)), "sa_gpu_verdict_create")
        self._h = h

    @property
    def handle(self):
        if self._h is None:
            raise ValueError("this Verdict is closed")
        return self._h

    def read(self, stream=None):
        """Wait for the work queued on `stream` (default: torch's current stream), return the
        recorded code (0 when none) and reset the verdict."""
        return lib.sa_gpu_verdict_read(self.handle, stream_ptr(stream))

    def check(self, stream=None):
        """read(), raising SparseAttnError when the code is negative."""
        return check(self.read(stream), "verdict")

    def close(self):
        if getattr(self, "_h", None) is not None:
            lib.sa_gpu_verdict_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


# ---------------------------------------------------------------- the GPU paths
def _attn(s, q, k, v, o, lse, validate, allow_empty_rows, causal, allow_future_blocks):
    a = SaGpuAttn()
    lib.sa_gpu_attn_default(ctypes.byref(a))
    a.shape = s
    a.q, a.k, a.v, a.o, a.lse = ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse)
    a.validate, a.allow_empty_rows = validate, allow_empty_rows
    a.causal, a.allow_future_blocks = causal, allow_future_blocks
    a.stream = stream_ptr()
    return a


def _inputs(q, k, v, layout):
    return cuda_bf16("q", q, layout), cuda_bf16("k", k, layout), cuda_bf16("v", v, layout)


def _outputs(t, s, device):
    o = t.empty((s.batch, s.heads_q, s.len_q, s.head_dim), dtype=t.bfloat16, device=device)
    lse = t.empty((s.batch, s.heads_q, s.len_q), dtype=t.float32, device=device)
    return o, lse


def _result(o, lse, layout):
    return (o.transpose(1, 2).contiguous() if layout == "bshd" else o), lse


def tile_lists(indices, counts, s, list_heads, max_blocks, dev):
    """Tile lists on dev, checked (int32, contiguous, aligned, shaped): (indices, counts or None)."""
    tiles = q_tiles(s)
    ind = cuda_int32("indices", indices, dev, (s.batch, list_heads, tiles, max_blocks),
                     "(B, list_heads, q_tiles, max_blocks)")
    cnt = cuda_int32("counts", counts, dev, (s.batch, list_heads, tiles),
                     "(B, list_heads, q_tiles)")
    return ind, cnt


def tile_sparse(q, k, v, indices, counts, s, list_heads, max_blocks, layout, validate,
                allow_empty_rows, causal, allow_future_blocks, stage, verdict):
    t = torch_mod()
    require_gpu()
    if verdict is not None and not isinstance(verdict, Verdict):
        raise TypeError("verdict must be a sparseattn.Verdict, got %s" % type(verdict).__name__)
    dev = q.device
    ind, cnt = tile_lists(indices, counts, s, list_heads, max_blocks, dev)
    with t.cuda.device(dev):
        q, k, v = _inputs(q, k, v, layout)
        o, lse = _outputs(t, s, dev)
        a = _attn(s, q, k, v, o, lse, validate, allow_empty_rows, causal, allow_future_blocks)
        a.lists = SaTileLists(ptr(ind), ptr(cnt), list_heads, max_blocks)
        a.verdict = verdict.handle if verdict is not None else None
        pick_sparse(stage, a).launch(a)
    return _result(o, lse, layout)


def dense(q, k, v, s, layout, causal, stage):
    """A dense stage (the SA_ROLE_DEFAULT_DENSE one first) when one accepts the arguments,
    else a sparse stage on lists of every block (for what no dense stage takes: causal)."""
    t = torch_mod()
    require_gpu()
    dev = q.device
    with t.cuda.device(dev):
        q, k, v = _inputs(q, k, v, layout)
        o, lse = _outputs(t, s, dev)
        a = _attn(s, q, k, v, o, lse, 1, 1, causal, 0)
        st = resolve_stage(stage) if stage is not None else None
        if st is None:
            default = stage_with(SA_ROLE_DEFAULT_DENSE)
            order = ([default] if default else []) + \
                [x for x in stages() if not x.sparse and x != default]
            st = next((x for x in order if x.check(a) == 0), None)
        elif not st.sparse:
            check(st.check(a), "stage %d (%s) check" % (st.id, st.name))
        full = None
        if st is None or st.sparse:
            nb = kv_blocks(s)
            full = t.arange(nb, dtype=t.int32, device=dev).expand(
                s.batch, s.heads_kv, q_tiles(s), nb).contiguous()
            a.lists = SaTileLists(full.data_ptr(), None, s.heads_kv, nb)
            a.validate = 0  # every block once: valid by construction
            a.allow_future_blocks = causal
            st = pick_sparse(st, a)
        st.launch(a)
    return _result(o, lse, layout)


def query_sparse(q, k, v, indices, counts, s, max_blocks, layout, validate, allow_empty_rows,
                 causal, allow_future_blocks, partial_format, schedule, hybrid_share=None):
    """The KV-centric GPU entry point (sa_kvcentric_attention), workspace from torch's
    allocator."""
    t = torch_mod()
    require_gpu()
    dev = q.device
    ind = cuda_int32("indices", indices, dev, (s.batch, s.heads_kv, s.len_q, max_blocks),
                     "(B, heads_kv, len_q, max_blocks)")
    cnt = cuda_int32("counts", counts, dev, (s.batch, s.heads_kv, s.len_q), "(B, heads_kv, len_q)")
    with t.cuda.device(dev):
        q, k, v = _inputs(q, k, v, layout)
        o, lse = _outputs(t, s, dev)
        p = SaKvParams()
        lib.sa_kv_params_default(ctypes.byref(p))
        p.shape = s
        p.q, p.k, p.v, p.o, p.lse = ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse)
        p.lists = SaQueryLists(ptr(ind), ptr(cnt), max_blocks)
        p.partial_format = {"f32": SA_KV_PARTIAL_F32, "bf16": SA_KV_PARTIAL_BF16}[partial_format]
        p.validate, p.allow_empty_rows = validate, allow_empty_rows
        p.causal, p.allow_future_blocks = causal, allow_future_blocks
        p.schedule = {"kv": SA_KV_SCHEDULE_KV, "hybrid": SA_KV_SCHEDULE_HYBRID}[schedule]
        if hybrid_share is not None:  # else sa_kv_params_default's
            p.hybrid_share = hybrid_share
        p.stream = stream_ptr()
        size = ctypes.c_size_t(0)
        rc = lib.sa_kv_workspace_size(ctypes.byref(p), ctypes.byref(size))
        check(rc, "sa_kv_workspace_size")
        # The caching allocator keeps this block for the current stream until the queued work
        # is done with it, so it may go out of scope on return.
        ws = t.empty(max(size.value, 1), dtype=t.uint8, device=dev)
        p.workspace, p.workspace_bytes = ws.data_ptr(), size.value
        rc = lib.sa_kvcentric_attention(ctypes.byref(p))
        check(rc, "sa_kvcentric_attention")
    return _result(o, lse, layout)

