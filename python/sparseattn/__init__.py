"""sparseattn: Python face of libsparseattn (block-sparse attention), through ctypes.

    import sparseattn as sa
    o, lse = sa.block_sparse_attention(q, k, v, indices, counts)   # numpy, CPU or CUDA tensors

The library is found through $SPARSEATTN_LIB (the .so, or its directory), else the build/
directory of the checkout this package sits in, else the system (ldconfig, the loader's path,
meson's default prefix). At import the package checks that every C struct it mirrors has the
library's size and field offsets (sa_abi_sizeof / sa_abi_offsetof) and raises AbiMismatchError
otherwise. docs/python.md describes the API."""
from ._errors import AbiMismatchError, LibraryNotFoundError, SparseAttnError
from ._core import abi_sizes, library_path, strerror
from ._capi import (SA_ROLE_DEFAULT_DENSE, SA_ROLE_DEFAULT_TILE, SA_ROLE_GPU_VERDICT,
                    SA_ROLE_ROW_MASKS, SA_ROLE_SPARSE, STATUS_NAMES, TILE)
from ._gpu import Stage, Verdict, gpu_available, stage_with, stages
from ._attention import (attention_backward, block_sparse_attention, dense_attention,
                         query_sparse_attention)
from ._backward_gpu import block_sparse_attention_backward
from ._bf16 import bf16_bits, bf16_round, bf16_to_float32
from ._selectors import Selector, Workload, select, selectors, workload, workloads

__version__ = "0.1.0"

__all__ = [
    "AbiMismatchError", "LibraryNotFoundError", "SparseAttnError", "abi_sizes", "library_path",
    "strerror", "SA_ROLE_DEFAULT_DENSE", "SA_ROLE_DEFAULT_TILE", "SA_ROLE_GPU_VERDICT",
    "SA_ROLE_ROW_MASKS", "SA_ROLE_SPARSE", "STATUS_NAMES", "TILE", "Stage", "Verdict",
    "gpu_available", "stage_with", "stages", "block_sparse_attention", "dense_attention",
    "query_sparse_attention", "attention_backward", "block_sparse_attention_backward", "bf16_bits",
    "bf16_round", "bf16_to_float32", "Selector", "Workload", "select", "selectors", "workload",
    "workloads",
]
