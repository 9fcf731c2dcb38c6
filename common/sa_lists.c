/* Validation and generation of block lists (both formats). */
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sa_internal.h"

static int list_heads_ok(const sa_shape *s, int list_heads)
{
    return list_heads == s->heads_kv || list_heads == s->heads_q;
}

size_t sa_tile_rows(const sa_shape *s, const sa_tile_lists *l)
{
    if (!l || sa_shape_check(s) || !list_heads_ok(s, l->list_heads))
        return 0;
    return (size_t)sa_sz_mul3(s->batch, l->list_heads, sa_sz_q_tiles(s));
}

size_t sa_query_rows(const sa_shape *s)
{
    return sa_shape_check(s) ? 0 : (size_t)sa_sz_mul3(s->batch, s->heads_kv, s->len_q);
}

/* sa_list_rows_check (sa_internal.h). `seen` is a bitmap of kv_blocks bits; a row sets the bits
 * of its blocks and clears them again when it is done, so a duplicate test costs O(count) per
 * row and the scratch is kv_blocks / 8 bytes. Without causal every row sees every block, so the
 * future test never fires and no row is exempt from the empty-row rule. */
int sa_list_rows_check(const sa_shape *s, const int32_t *idx, const int32_t *counts, size_t rows,
                       int max_blocks, int allow_empty, int causal, int per, int tile_rows,
                       int allow_future)
{
    const int kv_blocks = sa_kv_blocks(s);
    const int64_t words = sa_sz_ceil_div(kv_blocks, 64);
    uint64_t *seen = sa_sz_malloc(words, sizeof *seen);
    if (!seen)
        return SA_ERR_NOMEM;
    memset(seen, 0, (size_t)words * sizeof *seen);
    int err = SA_OK;
    for (size_t r = 0; r < rows && !err; r++) {
        int visible = kv_blocks;
        if (causal) {
            const int x = (int)(r % (size_t)per);
            visible = sa_geo_blocks(sa_geo_last_key(s, tile_rows ? sa_geo_tile_last_row(s, x) : x));
        }
        int c = counts ? counts[r] : max_blocks;
        if (c < 0 || c > max_blocks) {
            err = SA_ERR_COUNT;
            break;
        }
        if (c == 0 && !allow_empty && visible > 0) {
            err = SA_ERR_EMPTY_ROW;
            break;
        }
        const int32_t *row = idx + r * (size_t)max_blocks;
        int set = 0; /* entries of this row whose bits are set */
        for (int j = 0; j < c; j++, set++) {
            int32_t b = row[j];
            if (b < 0 || b >= kv_blocks) {
                err = SA_ERR_INDEX;
                break;
            }
            uint64_t bit = (uint64_t)1 << (b & 63);
            if (seen[b >> 6] & bit) {
                err = SA_ERR_DUPLICATE;
                break;
            }
            if (b >= visible && !allow_future) {
                err = SA_ERR_FUTURE_BLOCK;
                break;
            }
            seen[b >> 6] |= bit;
        }
        for (int j = 0; j < set; j++)
            seen[row[j] >> 6] = 0;
    }
    free(seen);
    return err;
}

/* rows * max_blocks entries, the limit of every list array (sparseattn.h). */
static int list_size_ok(int64_t rows, int max_blocks)
{
    return sa_sz_within(sa_sz_mul(rows, max_blocks), SA_MAX_ELEMS);
}

/* The arguments of either list format (s and the lists non-NULL), so that the same fault gives
 * the same error in both. Query lists have a list head per KV head, which always passes. `rows`
 * (sa_tile_rows, sa_query_rows) is 0 for a shape or list heads that fail, and is read only after
 * both have passed. */
static int lists_args_check(const sa_shape *s, const int32_t *indices, int list_heads,
                            size_t rows, int max_blocks)
{
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!indices)
        return SA_ERR_NULL;
    if (!list_heads_ok(s, list_heads))
        return SA_ERR_LIST_HEADS;
    if (max_blocks <= 0 || !list_size_ok((int64_t)rows, max_blocks))
        return SA_ERR_MAX_BLOCKS;
    return SA_OK;
}

int sa_tile_lists_check_args(const sa_shape *s, const sa_tile_lists *l)
{
    if (!s || !l)
        return SA_ERR_NULL;
    return lists_args_check(s, l->indices, l->list_heads, sa_tile_rows(s, l), l->max_blocks);
}

int sa_query_lists_check_args(const sa_shape *s, const sa_query_lists *l)
{
    if (!s || !l)
        return SA_ERR_NULL;
    return lists_args_check(s, l->indices, s->heads_kv, sa_query_rows(s), l->max_blocks);
}

int sa_tile_lists_check(const sa_shape *s, const sa_tile_lists *l, int allow_empty)
{
    int err = sa_tile_lists_check_args(s, l);
    if (err)
        return err;
    if (!sa_flag_ok(allow_empty))
        return SA_ERR_ARG;
    return sa_list_rows_check(s, l->indices, l->counts, sa_tile_rows(s, l), l->max_blocks,
                              allow_empty, 0, 1, 1, 0);
}

int sa_query_lists_check(const sa_shape *s, const sa_query_lists *l, int allow_empty)
{
    int err = sa_query_lists_check_args(s, l);
    if (err)
        return err;
    if (!sa_flag_ok(allow_empty))
        return SA_ERR_ARG;
    return sa_list_rows_check(s, l->indices, l->counts, sa_query_rows(s), l->max_blocks,
                              allow_empty, 0, 1, 0, 0);
}

/* k distinct blocks of [0, n), sorted: a partial Fisher-Yates over `perm`, then a counting pass
 * over a mark array keeps the row sorted without a comparison sort. */
static void draw_row(sa_rng *r, int n, int k, int32_t *perm, unsigned char *mark, int32_t *out)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = 0; i < k; i++) {
        int j = i + (int)sa_rng_below(r, (uint32_t)(n - i));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memset(mark, 0, (size_t)(unsigned)n);
    for (int i = 0; i < k; i++)
        mark[perm[i]] = 1;
    for (int b = 0, j = 0; b < n; b++)
        if (mark[b])
            out[j++] = b;
}

/* Scratch for draw_rows: a permutation and a mark per KV block. */
typedef struct draw_scratch {
    int32_t *perm;
    unsigned char *mark;
} draw_scratch;

/* k checked against the blocks and the scratch allocated, before any list is written. */
static int draw_begin(const sa_shape *s, int k, draw_scratch *d)
{
    const int n = sa_kv_blocks(s);
    d->perm = NULL;
    d->mark = NULL;
    if (k <= 0 || k > n)
        return SA_ERR_ARG;
    d->perm = sa_sz_malloc(n, sizeof *d->perm);
    d->mark = sa_sz_malloc(n, 1);
    if (!d->perm || !d->mark) {
        free(d->perm);
        free(d->mark);
        return SA_ERR_NOMEM;
    }
    return SA_OK;
}

static void draw_rows(const sa_shape *s, size_t rows, int k, int pair_len, uint64_t seed,
                      const draw_scratch *d, int32_t *indices)
{
    const int n = sa_kv_blocks(s);
    sa_rng r;
    sa_rng_seed(&r, seed);
    for (size_t row = 0; row < rows; row++) {
        int32_t *out = indices + row * (size_t)k;
        if (pair_len > 1 && row % (size_t)pair_len)
            memcpy(out, out - k, (size_t)k * sizeof *out);
        else
            draw_row(&r, n, k, d->perm, d->mark, out);
    }
}

int sa_random_tile_lists(const sa_shape *s, int list_heads, int k, int pattern, uint64_t seed,
                         int32_t *indices)
{
    if (!s || !indices)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!list_heads_ok(s, list_heads))
        return SA_ERR_LIST_HEADS;
    if (!sa_enum_ok(pattern, SA_LISTS_PAIRED + 1))
        return SA_ERR_ARG;
    draw_scratch d;
    if ((err = draw_begin(s, k, &d)))
        return err;
    int tiles = sa_q_tiles(s);
    /* Pairs never straddle a (batch, head): draw per head so an odd tile count stays independent. */
    size_t heads = (size_t)s->batch * list_heads;
    for (size_t h = 0; h < heads; h++) {
        int32_t *base = indices + h * (size_t)tiles * k;
        int pair = pattern == SA_LISTS_PAIRED ? 2 : 1;
        draw_rows(s, (size_t)tiles, k, pair, seed + h * 0x9e3779b97f4a7c15ull, &d, base);
    }
    free(d.perm);
    free(d.mark);
    return SA_OK;
}

int sa_random_query_lists(const sa_shape *s, int k, uint64_t seed, int32_t *indices)
{
    if (!s || !indices)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    draw_scratch d;
    if ((err = draw_begin(s, k, &d)))
        return err;
    draw_rows(s, sa_query_rows(s), k, 1, seed, &d, indices);
    free(d.perm);
    free(d.mark);
    return SA_OK;
}
