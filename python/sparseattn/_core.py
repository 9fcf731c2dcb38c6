"""The loaded library (opened and ABI-checked once, at import) and the status check."""
import numpy as np

from . import _capi
from ._errors import SparseAttnError

lib, library_path, abi_sizes = _capi.open_library()


def strerror(code):
    """sa_strerror's sentence for a status code."""
    return lib.sa_strerror(int(code)).decode()


def check(rc, function, detail=None):
    """Raise SparseAttnError for a negative status; return rc otherwise."""
    if rc < 0:
        raise SparseAttnError(rc, function, strerror(rc), detail)
    return rc


def flag(name, x):
    """A bool option as the C library's 0/1 flag."""
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, int) and x in (0, 1)):
        return int(bool(x))
    raise TypeError("%s must be True or False, got %r" % (name, x))

