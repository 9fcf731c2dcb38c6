"""The package's check of an int option, with numpy alone: activations.py, which the capture
script loads by its path without the package or the library, uses it as the rest of the
package does."""
import numbers

import numpy as np


def integer(name, x, lo, hi, *, interval=None, optional=False):
    """x as an int in [lo, hi]: TypeError for anything but an int (bool is not taken for one,
    numpy integers are), ValueError outside [lo, hi] (docs/python.md, "Errors"). [lo, hi] is the
    range of the C parameter it fills, where ctypes would wrap a value outside it silently, or
    narrower where the bounds derive from other arguments; `interval` then names them in the
    ValueError in place of "[lo, hi]" ("[topk, kv_blocks] = [2, 8]"). optional: None is taken
    too, and returned as it is."""
    if optional and x is None:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError("%s must be an int%s, got %r" % (name, " or None" if optional else "", x))
    if not lo <= x <= hi:
        raise ValueError("%s must lie in %s, got %d"
                         % (name, interval or "[%d, %d]" % (lo, hi), x))
    return int(x)
