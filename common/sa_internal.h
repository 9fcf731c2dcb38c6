/* Library-internal helpers shared by the C and CUDA sources; not part of the public API. */
#ifndef SA_INTERNAL_H
#define SA_INTERNAL_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
/* The checks of a list validator that need no look at the rows: pointers, shape, list_heads,
 * max_blocks. Shared by the host validators and the GPU one, so both give the same codes. */
int sa_tile_lists_check_args(const sa_shape *s, const sa_tile_lists *l);
int sa_query_lists_check_args(const sa_shape *s, const sa_query_lists *l);
#ifdef __cplusplus
}
#endif
#endif
