"""The C library: where it is found, the ctypes mirror of its public structs, the ABI check
against the library's own sizes and offsets (sa_abi_sizeof / sa_abi_offsetof), and the
prototypes of the functions this package calls.

Nothing here knows numpy or torch; the modules above it do."""
import ctypes
import ctypes.util
import os
import sysconfig

from ._errors import AbiMismatchError, LibraryNotFoundError

ENV_LIB = "SPARSEATTN_LIB"
LIB_NAME = "libsparseattn.so"

TILE = 128  # SA_TILE: tokens per query tile and per KV block
INT32_MAX = 2**31 - 1
INT32_MIN = -2**31
UINT64_MAX = 2**64 - 1
SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1

# SA_ROLE_* (sparseattn.h): what a stage is for.
SA_ROLE_SPARSE = 1 << 0
SA_ROLE_DEFAULT_DENSE = 1 << 1
SA_ROLE_DEFAULT_TILE = 1 << 2
SA_ROLE_GPU_VERDICT = 1 << 3
SA_ROLE_ROW_MASKS = 1 << 4

SA_LISTS_INDEPENDENT, SA_LISTS_PAIRED = 0, 1
SA_KV_PARTIAL_F32, SA_KV_PARTIAL_BF16 = 0, 1
SA_KV_SCHEDULE_KV, SA_KV_SCHEDULE_HYBRID = 0, 1  # sa_kv_params.schedule
# SA_HEAD_LISTS_* (sa_selectors.h): sa_select_params.head_lists; sa_selector.head_lists holds
# bit (1 << mode) for each mode a selector's CPU function takes.
SA_HEAD_LISTS_GROUP, SA_HEAD_LISTS_PER_HEAD, SA_HEAD_LISTS_POOLED = 0, 1, 2
SA_MAX_INDEX_DIM = 1024  # sa_selectors.h: the largest sa_select_params.index_dim

# sa_status (sparseattn.h). The texts come from the library's sa_strerror.
STATUS_NAMES = {
    0: "SA_OK",
    -1: "SA_ERR_NULL",
    -2: "SA_ERR_SHAPE",
    -3: "SA_ERR_GQA",
    -4: "SA_ERR_HEAD_DIM",
    -5: "SA_ERR_INDEX",
    -6: "SA_ERR_DUPLICATE",
    -7: "SA_ERR_COUNT",
    -8: "SA_ERR_EMPTY_ROW",
    -9: "SA_ERR_LIST_HEADS",
    -10: "SA_ERR_MAX_BLOCKS",
    -11: "SA_ERR_ARG",
    -12: "SA_ERR_NOMEM",
    -13: "SA_ERR_UNSUPPORTED",
    -14: "SA_ERR_NO_DEVICE",
    -15: "SA_ERR_CUDA",
    -16: "SA_ERR_NOT_BUILT",
    -17: "SA_ERR_UNKNOWN",
    -18: "SA_ERR_FUTURE_BLOCK",
}
globals().update({name: code for code, name in STATUS_NAMES.items()})

c_int, c_uint, c_void_p, c_char_p, c_size_t = (ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                                                ctypes.c_char_p, ctypes.c_size_t)


# ---------------------------------------------------------------- the mirror of sparseattn.h
class SaShape(ctypes.Structure):
    _fields_ = [("batch", c_int), ("heads_q", c_int), ("heads_kv", c_int), ("len_q", c_int),
                ("len_kv", c_int), ("head_dim", c_int)]


class SaTileLists(ctypes.Structure):
    _fields_ = [("indices", c_void_p), ("counts", c_void_p), ("list_heads", c_int),
                ("max_blocks", c_int)]


class SaQueryLists(ctypes.Structure):
    _fields_ = [("indices", c_void_p), ("counts", c_void_p), ("max_blocks", c_int)]


class SaRng(ctypes.Structure):
    _fields_ = [("s", ctypes.c_uint64 * 4)]


class SaOutputs(ctypes.Structure):
    _fields_ = [("o", c_void_p), ("o_f32", c_void_p), ("lse", c_void_p)]


class SaAttnOpts(ctypes.Structure):
    _fields_ = [("allow_empty_rows", c_int), ("validate", c_int), ("causal", c_int),
                ("allow_future_blocks", c_int)]


class SaGpuAttn(ctypes.Structure):
    _fields_ = [("shape", SaShape), ("q", c_void_p), ("k", c_void_p), ("v", c_void_p),
                ("lists", SaTileLists), ("o", c_void_p), ("lse", c_void_p),
                ("validate", c_int), ("allow_empty_rows", c_int), ("stream", c_void_p),
                ("verdict", c_void_p), ("causal", c_int), ("allow_future_blocks", c_int),
                ("row_masks", c_void_p)]


STAGE_FN = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(SaGpuAttn))


class SaStage(ctypes.Structure):
    _fields_ = [("id", c_int), ("name", c_char_p), ("summary", c_char_p), ("roles", c_uint),
                ("check", STAGE_FN), ("launch", STAGE_FN)]


class SaSelectParams(ctypes.Structure):
    _fields_ = [("k", c_int), ("keep_diagonal", c_int), ("keep_sink", c_int),
                ("q_index", c_void_p), ("k_index", c_void_p), ("index_dim", c_int),
                ("stream", c_void_p), ("seed", ctypes.c_uint64), ("causal", c_int),
                ("index_heads", c_int), ("keep_local", c_int), ("verdict", c_void_p),
                ("head_lists", c_int), ("pool_cap", c_int)]


SELECT_FN = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(SaShape), c_void_p, c_void_p,
                             ctypes.POINTER(SaSelectParams), c_void_p, c_void_p)


class SaSelector(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("description", c_char_p), ("per_query", c_int),
                ("cpu", SELECT_FN), ("cuda", SELECT_FN), ("head_lists", c_uint),
                ("cuda_head_lists", c_uint), ("ignores_index", c_int)]


class SaWorkload(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("description", c_char_p), ("knob", c_char_p),
                ("default_strength", ctypes.c_double)]


class SaKvParams(ctypes.Structure):
    _fields_ = [("shape", SaShape), ("q", c_void_p), ("k", c_void_p), ("v", c_void_p),
                ("lists", SaQueryLists), ("o", c_void_p), ("o_f32", c_void_p), ("lse", c_void_p),
                ("partial_format", c_int), ("validate", c_int), ("allow_empty_rows", c_int),
                ("workspace", c_void_p), ("workspace_bytes", c_size_t), ("stream", c_void_p),
                ("causal", c_int), ("allow_future_blocks", c_int),
                ("attend", c_int), ("schedule", c_int), ("hybrid_share", c_int)]


# C name -> mirror; every one is checked against the library at import.
MIRRORS = {
    "sa_shape": SaShape,
    "sa_tile_lists": SaTileLists,
    "sa_query_lists": SaQueryLists,
    "sa_rng": SaRng,
    "sa_outputs": SaOutputs,
    "sa_attn_opts": SaAttnOpts,
    "sa_gpu_attn": SaGpuAttn,
    "sa_stage": SaStage,
    "sa_select_params": SaSelectParams,
    "sa_selector": SaSelector,
    "sa_workload": SaWorkload,
    "sa_kv_params": SaKvParams,
}

P = ctypes.POINTER
# name: (restype, argtypes). Buffers are c_void_p (numpy .ctypes.data or torch .data_ptr()).
PROTOTYPES = {
    "sa_abi_sizeof": (c_size_t, [c_char_p]),
    "sa_abi_offsetof": (c_size_t, [c_char_p, c_char_p]),
    "sa_strerror": (c_char_p, [c_int]),
    "sa_shape_check": (c_int, [P(SaShape)]),
    "sa_bf16_from_f32_array": (None, [c_void_p, c_void_p, c_size_t]),
    "sa_bf16_to_f32_array": (None, [c_void_p, c_void_p, c_size_t]),
    "sa_attn_opts_default": (None, [P(SaAttnOpts)]),
    "sa_random_tile_lists": (c_int, [P(SaShape), c_int, c_int, c_int, ctypes.c_uint64,
                                     c_void_p]),
    "sa_random_query_lists": (c_int, [P(SaShape), c_int, ctypes.c_uint64, c_void_p]),
    "sa_ref_dense": (c_int, [P(SaShape), c_void_p, c_void_p, c_void_p, P(SaOutputs)]),
    "sa_ref_dense_opts": (c_int, [P(SaShape), c_void_p, c_void_p, c_void_p, P(SaAttnOpts),
                                  P(SaOutputs)]),
    "sa_ref_tile_sparse": (c_int, [P(SaShape), c_void_p, c_void_p, c_void_p, P(SaTileLists),
                                   P(SaAttnOpts), P(SaOutputs)]),
    "sa_ref_query_sparse": (c_int, [P(SaShape), c_void_p, c_void_p, c_void_p, P(SaQueryLists),
                                    P(SaAttnOpts), P(SaOutputs)]),
    "sa_gpu_available": (c_int, []),
    "sa_gpu_attn_default": (None, [P(SaGpuAttn)]),
    "sa_gpu_verdict_create": (c_int, [P(c_void_p)]),
    "sa_gpu_verdict_read": (c_int, [c_void_p, c_void_p]),
    "sa_gpu_verdict_destroy": (None, [c_void_p]),
    "sa_stage_count": (c_int, []),
    "sa_stage_at": (P(SaStage), [c_int]),
    "sa_stage_with": (P(SaStage), [c_uint]),
    "sa_select_params_default": (None, [P(SaSelectParams)]),
    "sa_selector_count": (c_int, []),
    "sa_selector_at": (P(SaSelector), [c_int]),
    "sa_selector_by_name": (P(SaSelector), [c_char_p]),
    "sa_selector_list_len": (c_size_t, [P(SaSelector), P(SaShape), c_int]),
    "sa_select_layout": (c_int, [P(SaSelector), P(SaShape), P(SaSelectParams), P(c_int),
                                 P(c_int), P(c_int)]),
    "sa_select_cpu": (c_int, [c_char_p, P(SaShape), c_void_p, c_void_p, P(SaSelectParams),
                              c_void_p, c_void_p]),
    "sa_workload_count": (c_int, []),
    "sa_workload_at": (P(SaWorkload), [c_int]),
    "sa_workload_generate": (c_int, [c_char_p, P(SaShape), ctypes.c_uint64, ctypes.c_double,
                                     c_void_p, c_void_p, c_void_p]),
    "sa_kv_params_default": (None, [P(SaKvParams)]),
    "sa_kv_workspace_size": (c_int, [P(SaKvParams), P(c_size_t)]),
    "sa_kvcentric_attention": (c_int, [P(SaKvParams)]),
}


# ---------------------------------------------------------------- finding the library
def _checkout_root():
    """The source checkout this package sits in (python/sparseattn/ of it), or None when it is
    installed elsewhere."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.isfile(os.path.join(root, "meson.build")) and \
            os.path.isfile(os.path.join(root, "include", "sparseattn.h")):
        return root
    return None


def candidates():
    """[(where, path or name)] in the order they are tried. $SPARSEATTN_LIB, when set, is the
    only candidate (a file, or a directory holding libsparseattn.so): a wrong setting is an
    error, never a silent fallback to another copy."""
    env = os.environ.get(ENV_LIB)
    if env:
        path = os.path.join(env, LIB_NAME) if os.path.isdir(env) else env
        return [("$" + ENV_LIB, path)]
    out = []
    root = _checkout_root()
    if root:
        out.append(("the checkout's build directory", os.path.join(root, "build", LIB_NAME)))
    found = ctypes.util.find_library("sparseattn")
    if found:
        out.append(("the system (ldconfig)", found))
    out.append(("the dynamic loader's path", LIB_NAME))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for d in ([os.path.join("/usr/local/lib", multiarch)] if multiarch else []) + \
            ["/usr/local/lib64", "/usr/local/lib"]:
        out.append(("meson's default install prefix", os.path.join(d, LIB_NAME)))
    return out


def load_library():
    """(ctypes.CDLL, path) of the first candidate that loads; LibraryNotFoundError naming every
    place tried otherwise."""
    tried = []
    for where, path in candidates():
        is_path = os.sep in path
        if is_path and not os.path.isfile(path):
            tried.append("%s: %s (no such file)" % (where, path))
            continue
        try:
            dll = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (where, path, e))
            continue
        return dll, _loaded_path(dll, path)
    raise LibraryNotFoundError(
        "libsparseattn.so not found. Build it (meson setup build && ninja -C build) and set %s "
        "to the file (or its directory), or install it (meson install -C build). Tried:\n  %s"
        % (ENV_LIB, "\n  ".join(tried)))


def _loaded_path(dll, fallback):
    """The file the loader mapped, for messages: the candidate itself when it is a path, else
    what /proc/self/maps names."""
    if os.sep in fallback:
        return os.path.realpath(fallback)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if os.path.basename(p).startswith("libsparseattn.so"):
                    return p
    except OSError:
        pass
    return fallback


def bind(dll, path):
    """Set restype/argtypes of every function in PROTOTYPES; a missing symbol means a library
    from another version (AbiMismatchError)."""
    missing = []
    for name, (res, args) in PROTOTYPES.items():
        try:
            f = getattr(dll, name)
        except AttributeError:
            missing.append(name)
            continue
        f.restype = res
        f.argtypes = args
    if missing:
        raise AbiMismatchError(
            "%s lacks %s: it is older (or newer) than this sparseattn package; rebuild the "
            "library from the same checkout as the package" % (path, ", ".join(missing)))


def check_abi(dll, path, mirrors=None):
    """Compare every mirrored struct's size and field offsets with the library's
    (sa_abi_sizeof, sa_abi_offsetof). Returns {C name: size}; AbiMismatchError listing every
    difference otherwise."""
    mirrors = MIRRORS if mirrors is None else mirrors
    problems, sizes = [], {}
    for cname, cls in mirrors.items():
        n = dll.sa_abi_sizeof(cname.encode())
        sizes[cname] = n
        if n == 0:
            problems.append("%s: the library does not know this struct" % cname)
            continue
        if n != ctypes.sizeof(cls):
            problems.append("sizeof(%s) is %d in the library, %d in the mirror"
                            % (cname, n, ctypes.sizeof(cls)))
        for fname, _ in ((f[0], f[1]) for f in cls._fields_):
            off = dll.sa_abi_offsetof(cname.encode(), fname.encode())
            mine = getattr(cls, fname).offset
            if off == SIZE_MAX:
                problems.append("%s.%s: no such field in the library" % (cname, fname))
            elif off != mine:
                problems.append("offsetof(%s, %s) is %d in the library, %d in the mirror"
                                % (cname, fname, off, mine))
    if problems:
        raise AbiMismatchError(
            "%s does not match the struct mirror of this sparseattn package "
            "(python/sparseattn/_capi.py); the library and the package come from different "
            "versions:\n  %s" % (path, "\n  ".join(problems)))
    return sizes


def open_library():
    dll, path = load_library()
    bind(dll, path)
    sizes = check_abi(dll, path)
    return dll, path, sizes
