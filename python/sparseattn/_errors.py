"""The exceptions of the package."""


class LibraryNotFoundError(ImportError):
    """libsparseattn.so was not found, or did not load (raised by `import sparseattn`)."""


class AbiMismatchError(ImportError):
    """The library's structs differ from this package's ctypes mirror (raised by
    `import sparseattn`): the two come from different versions."""


class SparseAttnError(RuntimeError):
    """A C entry point returned a negative sa_status.

    code: the sa_status value (e.g. -5); name: its enum name ("SA_ERR_INDEX"); message:
    sa_strerror's sentence; function: the C function that returned it."""

    def __init__(self, code, function, message, detail=None):
        from ._capi import STATUS_NAMES
        self.code = code
        self.name = STATUS_NAMES.get(code, "unknown status")
        self.function = function
        self.message = message
        self.detail = detail
        text = "%s: %s (%s = %d)" % (function, message, self.name, code)
        if detail:
            text += "; " + detail
        super().__init__(text)
