/*
 * Causal geometry and the option-aware list validators (docs/api.md, "Causal attention").
 *
 * Bottom-right alignment: query i (0-based within len_q) sees key j only when
 * j <= i + (len_kv - len_q). What a query sees is therefore a prefix of the keys, and what a
 * row of a block list may usefully name is a prefix of the blocks: blocks [0, n) where n is
 * the number of blocks holding a key at or before the row's last visible key. A tile's row uses
 * the last visible key of its last valid query row, so a block is "future" for a tile only when
 * no query of the tile sees any of its keys.
 */
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"

int sa_causal_last_key(const sa_shape *s, int i)
{
    if (sa_shape_check(s) || i < 0 || i >= s->len_q)
        return -1;
    return ref_causal_last_key(s, i);
}

int sa_causal_query_blocks(const sa_shape *s, int i)
{
    if (sa_shape_check(s) || i < 0 || i >= s->len_q)
        return 0;
    return ref_causal_blocks(ref_causal_last_key(s, i));
}

int sa_causal_tile_blocks(const sa_shape *s, int t)
{
    if (sa_shape_check(s) || t < 0 || t >= sa_q_tiles(s))
        return 0;
    return ref_causal_blocks(ref_causal_last_key(s, ref_tile_last_row(s, t)));
}

/* The causal row checks: n rows of max_blocks entries, row r of a (batch, head) being tile or
 * query r % per. Per row, in this order: the count (SA_ERR_COUNT); an empty row where none is
 * allowed (SA_ERR_EMPTY_ROW), except a row that sees no key at all, which cannot list anything
 * useful; then per entry the index (SA_ERR_INDEX), a duplicate (SA_ERR_DUPLICATE) and a block
 * wholly after the row's last visible key (SA_ERR_FUTURE_BLOCK, unless allow_future). `seen` is
 * a bitmap of kv_blocks bits, set and cleared per row as in the non-causal validator. */
static int causal_rows(const sa_shape *s, const int32_t *idx, const int32_t *counts, size_t rows,
                       int max_blocks, int per, int tile_rows, int allow_empty, int allow_future)
{
    const int kv_blocks = sa_kv_blocks(s);
    const int64_t words = sa_sz_ceil_div(kv_blocks, 64);
    uint64_t *seen = sa_sz_malloc(words, sizeof *seen);
    if (!seen)
        return SA_ERR_NOMEM;
    memset(seen, 0, (size_t)words * sizeof *seen);
    int err = SA_OK;
    for (size_t r = 0; r < rows && !err; r++) {
        const int x = (int)(r % (size_t)per);
        const int visible = ref_causal_blocks(
            ref_causal_last_key(s, tile_rows ? ref_tile_last_row(s, x) : x));
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

/* Tile lists under opts (NULL: defaults). Shape contract as sa_tile_lists_check: indices
 * (B, list_heads, q_tiles, max_blocks), counts (B, list_heads, q_tiles) or NULL. opts->validate
 * is not read (calling a validator is validating); allow_empty_rows is the allow_empty of
 * sa_tile_lists_check; with causal = 0 this is exactly sa_tile_lists_check. */
int sa_tile_lists_check_opts(const sa_shape *s, const sa_tile_lists *l, const sa_attn_opts *opts)
{
    int err = sa_tile_lists_check_args(s, l);
    if (err)
        return err;
    sa_attn_opts o;
    if ((err = ref_resolve_opts(opts, &o)))
        return err;
    if (!o.causal)
        return sa_tile_lists_check(s, l, o.allow_empty_rows);
    return causal_rows(s, l->indices, l->counts, sa_tile_rows(s, l), l->max_blocks,
                       sa_q_tiles(s), 1, o.allow_empty_rows, o.allow_future_blocks);
}

/* Per-query lists under opts; as sa_tile_lists_check_opts, shapes as sa_query_lists_check:
 * indices (B, Hkv, Sq, max_blocks), counts (B, Hkv, Sq) or NULL. */
int sa_query_lists_check_opts(const sa_shape *s, const sa_query_lists *l,
                              const sa_attn_opts *opts)
{
    int err = sa_query_lists_check_args(s, l);
    if (err)
        return err;
    sa_attn_opts o;
    if ((err = ref_resolve_opts(opts, &o)))
        return err;
    if (!o.causal)
        return sa_query_lists_check(s, l, o.allow_empty_rows);
    return causal_rows(s, l->indices, l->counts, sa_query_rows(s), l->max_blocks, s->len_q, 0,
                       o.allow_empty_rows, o.allow_future_blocks);
}
