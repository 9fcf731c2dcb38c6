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

/* Causal geometry (docs/api.md, "Causal attention") for a shape that passed sa_shape_check (the
 * public sa_causal_* check it first). Query i's last visible key is i + (len_kv - len_q): at
 * most len_kv - 1, negative when the query sees no key (len_q > len_kv). A tile's last valid row
 * is min(128 t + 127, len_q - 1). A last key `last` makes blocks [0, sa_geo_blocks(last))
 * visible. Every value fits int. Host and device functions under nvcc, so the GPU list check
 * (cuda/sa_validate.cu) computes a row's visible blocks as the host validators do. */
#ifdef __CUDACC__
#define SA_GEO_FN static inline __host__ __device__
#else
#define SA_GEO_FN static inline
#endif
SA_GEO_FN int sa_geo_last_key(const sa_shape *s, int i)
{
    return (int)((int64_t)i + s->len_kv - s->len_q);
}
SA_GEO_FN int sa_geo_tile_last_row(const sa_shape *s, int t)
{
    int64_t row = (int64_t)t * SA_TILE + SA_TILE - 1;
    return row < s->len_q ? (int)row : s->len_q - 1;
}
SA_GEO_FN int sa_geo_blocks(int last)
{
    return last < 0 ? 0 : last / SA_TILE + 1;
}

/* The host validators' row check (common/sa_lists.c): `rows` rows of max_blocks entries, counts
 * NULL = max_blocks each. Per row, in this order: the count (SA_ERR_COUNT); an empty row where
 * none is allowed (SA_ERR_EMPTY_ROW); then per entry the index (SA_ERR_INDEX), a duplicate
 * (SA_ERR_DUPLICATE) and, with causal, a block wholly after the row's last visible key
 * (SA_ERR_FUTURE_BLOCK unless allow_future). Causally row r is tile (tile_rows) or query
 * r % per of its (batch, head), and a row that sees no key may be empty. The first bad row wins. */
int sa_list_rows_check(const sa_shape *s, const int32_t *idx, const int32_t *counts, size_t rows,
                       int max_blocks, int allow_empty, int causal, int per, int tile_rows,
                       int allow_future);
#ifdef __cplusplus
}
#endif
#endif
