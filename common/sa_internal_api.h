/* SA_INTERNAL_API: what libsparseattn exports for the project's own tools, tests and benches
 * (tools/, tests/, bench/), beyond the public API of include/. NOT part of the public API: such
 * functions are declared only in internal headers in the source folders (this one,
 * selectors/sel_cuda.h, ...), which are never installed, and may change or leave the library
 * without notice. (The GPU timing harness is not among them: it lives in tools/.) The library is built
 * with hidden visibility: a function is exported only when its declaration carries SA_API
 * (public, include/sparseattn.h) or SA_INTERNAL_API (this). docs/api.md, "Public and internal". */
#ifndef SA_INTERNAL_API_H
#define SA_INTERNAL_API_H
#include "sparseattn.h"
#define SA_INTERNAL_API SA_API
#endif
