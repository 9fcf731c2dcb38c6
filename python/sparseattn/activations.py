"""Activation files: per-layer Q, K, V of a real model in one safetensors file
(docs/activations.md).

    from sparseattn import activations as act
    act.write("x.safetensors", {3: (q, k, v)}, {"heads_q": "9", ...})   # BHSD float32 or BF16 bits
    layers, meta = act.read("x.safetensors")                             # numpy alone
    layers, info = act.read_with_library("x.safetensors")                # the C reader

The writer and the numpy reader need numpy alone and never load libsparseattn, so the capture
script (tools/capture_activations.py) loads this file by its path, without the package (and this
file loads _checks.py, the package's int check, by its path too). The C reader is
selectors/activations.c (include/sa_activations.h)."""
import ctypes
import importlib.util
import json
import math
import os
import struct

import numpy as np

FORMAT = "sparseattn.activations"
FORMAT_VERSION = "1"
MAX_HEADER = 100_000_000  # the safetensors limit
MAX_LAYER = 999_999  # the largest layer index the C reader takes (ACT_MAX_LAYER)

if __package__:
    from ._checks import integer
else:  # loaded by its path, outside the package: its sibling _checks.py (numpy alone) the same way
    _spec = importlib.util.spec_from_file_location(
        "sa_activations_checks", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "_checks.py"))
    _checks = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_checks)
    integer = _checks.integer


def bf16_bits(x):
    """float32 -> uint16 BF16 bits, round to nearest even (NaN stays a quiet NaN), in numpy."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_to_float32(bits):
    """uint16 BF16 bits -> float32 (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _as_bf16(name, x):
    x = np.asarray(x)
    if x.ndim not in (3, 4):
        raise ValueError("%s: rank %d, expected 4 (B, H, S, D) or 3 (H, S, D)" % (name, x.ndim))
    if x.dtype == np.uint16:
        return np.ascontiguousarray(x)
    if x.dtype.kind != "f":
        raise TypeError("%s: dtype %s, expected a float array or uint16 BF16 bits"
                        % (name, x.dtype))
    return bf16_bits(x.astype(np.float32))  # float64: cast to float32 first (two roundings)


def write(path, layers, metadata=None):
    """Writes {layer index: (q, k, v)} as tensors layers.<L>.q/k/v, BF16 little-endian.

    q is (B, Hq, Sq, D), k and v (B, Hkv, Skv, D) (or rank 3 without B), float arrays (cast to
    float32, then rounded to BF16, nearest even) or uint16 BF16 bits; layer indices ints in 0 ..
    MAX_LAYER (the C reader's range; another type is a TypeError, another int a ValueError).
    metadata: string -> string (numbers, numpy's included, and booleans, as 1 or 0, are turned
    into strings; a None value leaves its key out, as a model config's "no sliding window");
    "format" is set, and "heads_q", "heads_kv", "head_dim" are filled in from the first layer's
    tensors when absent ("layers.<L>.<key>" for a layer that differs). Returns the number of
    bytes written."""
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise TypeError("metadata keys are strings, got %r" % (key,))
        if value is not None:
            meta[key] = value if isinstance(value, str) else _meta_str(value)
    meta["format"] = FORMAT
    header, blobs, offset = {}, [], 0
    # Every key judged before any is sorted (mixed types would not sort).
    for layer, key in sorted((integer("layer index", key, 0, MAX_LAYER), key) for key in layers):
        q, k, v = layers[key]
        arrays = [_as_bf16("layers.%d.%s" % (layer, w), x) for w, x in zip("qkv", (q, k, v))]
        q4, k4 = (a.reshape((1,) + a.shape) if a.ndim == 3 else a for a in arrays[:2])
        if arrays[1].shape != arrays[2].shape:
            raise ValueError("layer %d: k %s and v %s differ" % (layer, arrays[1].shape,
                                                                  arrays[2].shape))
        if q4.shape[0] != k4.shape[0] or q4.shape[3] != k4.shape[3] or q4.shape[1] % k4.shape[1]:
            raise ValueError("layer %d: q %s and k %s do not fit (batch, head_dim, GQA)"
                             % (layer, q4.shape, k4.shape))
        # File-wide from the first layer unless given; a layer that differs gets its own key.
        for key, value in (("heads_q", q4.shape[1]), ("heads_kv", k4.shape[1]),
                           ("head_dim", q4.shape[3])):
            meta.setdefault(key, str(value))
            if meta[key] != str(value):
                meta.setdefault("layers.%d.%s" % (layer, key), str(value))
        for w, a in zip("qkv", arrays):
            raw = a.astype("<u2", copy=False).tobytes()
            header["layers.%d.%s" % (layer, w)] = {
                "dtype": "BF16", "shape": list(a.shape),
                "data_offsets": [offset, offset + len(raw)]}
            blobs.append(raw)
            offset += len(raw)
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # as safetensors pads: data starts 8-byte aligned
    if len(text) > MAX_HEADER:
        raise ValueError("header of %d bytes exceeds the format's limit" % len(text))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    return 8 + len(text) + offset


def _meta_str(value):
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))  # numpy 2's repr of np.float64 names the type
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_meta_str(v) for v in value)
    if value is None:
        return ""
    return str(value)


def read(path):
    """(layers, metadata) with layers {L: (q, k, v)} as uint16 BF16 bits in the shapes stored
    (F32 tensors are rounded to BF16), metadata a dict of strings. Numpy alone."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            raise ValueError("%s: header length %d past the limit" % (path, n))
        header = json.loads(f.read(n).decode())
        base = 8 + n
        meta = header.pop("__metadata__", {})
        if meta.get("format") != FORMAT:
            raise ValueError("%s: metadata format is %r, expected %r"
                             % (path, meta.get("format"), FORMAT))
        parts = {}
        for name, t in header.items():
            bits = name.split(".")
            if len(bits) != 3 or bits[0] != "layers" or not bits[1].isdigit() or bits[2] not in (
                    "q", "k", "v"):
                continue
            dtype = {"BF16": "<u2", "F32": "<f4"}.get(t["dtype"])
            if dtype is None:
                raise ValueError("%s: %s has dtype %s" % (path, name, t["dtype"]))
            b0, b1 = t["data_offsets"]
            f.seek(base + b0)
            a = np.frombuffer(f.read(b1 - b0), dtype=dtype).reshape(t["shape"])
            a = a.astype(np.uint16) if dtype == "<u2" else bf16_bits(a)
            parts.setdefault(int(bits[1]), {})[bits[2]] = a
    layers = {}
    for layer, p in sorted(parts.items()):
        missing = [w for w in "qkv" if w not in p]
        if missing:
            raise ValueError("%s: layer %d lacks %s" % (path, layer, ", ".join(missing)))
        layers[layer] = (p["q"], p["k"], p["v"])
    return layers, meta


# ------------------------------------------------------------------ the C reader, through ctypes
class _ActLayer(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_int), ("shape", ctypes.c_int * 6), ("scale", ctypes.c_double),
                ("causal", ctypes.c_int), ("sliding_window", ctypes.c_int),
                ("rope_theta", ctypes.c_double)]


def _library():
    from ._core import check, lib  # loads libsparseattn only here
    if not getattr(lib, "_sa_act_declared", False):
        P = ctypes.c_void_p
        lib.sa_act_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_char_p,
                                    ctypes.c_size_t]
        lib.sa_act_open.restype = ctypes.c_int
        lib.sa_act_close.argtypes = [P]
        lib.sa_act_close.restype = None
        lib.sa_act_layer_count.argtypes = [P]
        lib.sa_act_layer_count.restype = ctypes.c_int
        lib.sa_act_layer_info.argtypes = [P, ctypes.c_int, ctypes.POINTER(_ActLayer)]
        lib.sa_act_layer_info.restype = ctypes.c_int
        lib.sa_act_read.argtypes = [P, ctypes.c_int, P, P, P]
        lib.sa_act_read.restype = ctypes.c_int
        lib.sa_act_meta_count.argtypes = [P]
        lib.sa_act_meta_count.restype = ctypes.c_int
        lib.sa_act_meta_key.argtypes = [P, ctypes.c_int]
        lib.sa_act_meta_key.restype = ctypes.c_char_p
        lib.sa_act_meta.argtypes = [P, ctypes.c_char_p]
        lib.sa_act_meta.restype = ctypes.c_char_p
        lib._sa_act_declared = True
    return lib, check


def read_with_library(path):
    """The same file through libsparseattn's reader (sa_act_open ...): (layers, info, meta) with
    layers {L: (q, k, v)} as uint16 BHSD arrays, info {L: dict(shape, scale, causal,
    sliding_window, rope_theta)} and the metadata. Raises SparseAttnError with the reader's
    message when the file is refused."""
    lib, check = _library()
    handle = ctypes.c_void_p()
    err = ctypes.create_string_buffer(512)
    rc = lib.sa_act_open(os.fsencode(path), ctypes.byref(handle), err, len(err))
    check(rc, "sa_act_open", err.value.decode(errors="replace"))
    try:
        meta = {}
        for i in range(lib.sa_act_meta_count(handle)):
            key = lib.sa_act_meta_key(handle, i)
            meta[key.decode()] = lib.sa_act_meta(handle, key).decode()
        layers, info = {}, {}
        for i in range(lib.sa_act_layer_count(handle)):
            li = _ActLayer()
            check(lib.sa_act_layer_info(handle, i, ctypes.byref(li)), "sa_act_layer_info")
            b, hq, hkv, sq, skv, d = list(li.shape)
            q = np.empty((b, hq, sq, d), np.uint16)
            k = np.empty((b, hkv, skv, d), np.uint16)
            v = np.empty((b, hkv, skv, d), np.uint16)
            check(lib.sa_act_read(handle, i, q.ctypes.data, k.ctypes.data, v.ctypes.data),
                  "sa_act_read")
            layers[li.layer] = (q, k, v)
            info[li.layer] = dict(shape=(b, hq, hkv, sq, skv, d), scale=li.scale,
                                  causal=bool(li.causal), sliding_window=li.sliding_window,
                                  rope_theta=li.rope_theta)
        return layers, info, meta
    finally:
        lib.sa_act_close(handle)


def default_scale(head_dim):
    return 1.0 / math.sqrt(head_dim)
