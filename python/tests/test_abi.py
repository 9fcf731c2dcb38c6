"""Loading the library and the ABI check at import."""
import ctypes
import os
import subprocess
import sys

import pytest

import sparseattn as sa
from sparseattn import _capi, _core

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)


def test_loaded_and_checked():
    assert os.path.isfile(sa.library_path) or "libsparseattn" in sa.library_path
    assert set(sa.abi_sizes) == set(_capi.MIRRORS)
    for name, cls in _capi.MIRRORS.items():
        assert sa.abi_sizes[name] == ctypes.sizeof(cls), name


def test_abi_functions_answer_unknown_names():
    lib = _core.lib
    assert lib.sa_abi_sizeof(b"sa_no_such_struct") == 0
    assert lib.sa_abi_sizeof(None) == 0
    assert lib.sa_abi_offsetof(b"sa_shape", b"nope") == _capi.SIZE_MAX
    assert lib.sa_abi_offsetof(b"sa_gpu_attn", b"verdict") == _capi.SaGpuAttn.verdict.offset


def test_size_mismatch_is_reported():
    class ShortGpuAttn(ctypes.Structure):  # sa_gpu_attn as it was before the verdict and causal
        _fields_ = [f for f in _capi.SaGpuAttn._fields_
                    if f[0] not in ("verdict", "causal", "allow_future_blocks")]

    with pytest.raises(sa.AbiMismatchError, match=r"sizeof\(sa_gpu_attn\) is \d+ in the library"):
        _capi.check_abi(_core.lib, "libX", {"sa_gpu_attn": ShortGpuAttn})


def test_field_mismatch_is_reported():
    class Swapped(ctypes.Structure):  # same size, two fields swapped
        _fields_ = [("allow_empty_rows", ctypes.c_int), ("validate", ctypes.c_int),
                    ("allow_future_blocks", ctypes.c_int), ("causal", ctypes.c_int)]

    class Renamed(ctypes.Structure):
        _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("heads_kv", ctypes.c_int),
                    ("len_q", ctypes.c_int), ("len_kv", ctypes.c_int), ("head_dim", ctypes.c_int)]

    with pytest.raises(sa.AbiMismatchError) as e:
        _capi.check_abi(_core.lib, "libX", {"sa_attn_opts": Swapped, "sa_shape": Renamed,
                                            "sa_nonexistent": Renamed})
    text = str(e.value)
    assert "offsetof(sa_attn_opts, causal)" in text
    assert "sa_shape.heads: no such field" in text
    assert "sa_nonexistent: the library does not know" in text


def test_status_names_match_the_library():
    seen = set()
    for code, name in sa.STATUS_NAMES.items():
        text = sa.strerror(code)
        assert text != sa.strerror(-1000), name  # the library knows every code we name
        seen.add(text)
    assert len(seen) == len(sa.STATUS_NAMES)
    # and we name every code the library knows
    assert sa.strerror(min(sa.STATUS_NAMES) - 1) == sa.strerror(-1000)


def _import_with(env_value):
    env = dict(os.environ, SPARSEATTN_LIB=env_value, PYTHONPATH=PKG_ROOT)
    return subprocess.run([sys.executable, "-c", "import sparseattn"], env=env,
                          capture_output=True, text=True)


def test_missing_library_is_a_clear_import_error(tmp_path):
    r = _import_with(str(tmp_path / "nope.so"))
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "SPARSEATTN_LIB" in r.stderr
    assert "nope.so (no such file)" in r.stderr


def test_library_directory_in_env(tmp_path):
    r = _import_with(os.path.dirname(sa.library_path))
    assert r.returncode == 0, r.stderr


def test_not_a_library_is_a_clear_import_error(tmp_path):
    bad = tmp_path / "libsparseattn.so"
    bad.write_text("not an ELF file")
    r = _import_with(str(bad))
    assert r.returncode != 0 and "LibraryNotFoundError" in r.stderr
