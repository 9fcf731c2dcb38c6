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
    return sa_geo_last_key(s, i);
}

int sa_causal_query_blocks(const sa_shape *s, int i)
{
    if (sa_shape_check(s) || i < 0 || i >= s->len_q)
        return 0;
    return sa_geo_blocks(sa_geo_last_key(s, i));
}

int sa_causal_tile_blocks(const sa_shape *s, int t)
{
    if (sa_shape_check(s) || t < 0 || t >= sa_q_tiles(s))
        return 0;
    return sa_geo_blocks(sa_geo_last_key(s, sa_geo_tile_last_row(s, t)));
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
    return sa_list_rows_check(s, l->indices, l->counts, sa_tile_rows(s, l), l->max_blocks,
                              o.allow_empty_rows, 1, sa_q_tiles(s), 1, o.allow_future_blocks);
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
    return sa_list_rows_check(s, l->indices, l->counts, sa_query_rows(s), l->max_blocks,
                              o.allow_empty_rows, 1, s->len_q, 0, o.allow_future_blocks);
}

/* The list checks of a sparse entry point, forward and backward alike, after its pointers, shape
 * and options (*o resolved): the list's own arguments (list_heads, max_blocks, the array's size)
 * and, when o->validate, its rows under *o; then the bounds of every count and index, which the
 * reference reads through even unvalidated, with the most keys a row gathers (*max_keys, which
 * sizes the scratch). Shapes as sa_tile_lists_check_opts. */
int ref_tile_lists_ready(const sa_shape *s, const sa_tile_lists *l, const sa_attn_opts *o,
                         size_t *max_keys)
{
    int err = sa_tile_lists_check_args(s, l);
    if (err || (o->validate && (err = sa_tile_lists_check_opts(s, l, o))))
        return err;
    return ref_scan_rows(s, l->indices, l->counts, sa_tile_rows(s, l), l->max_blocks, max_keys);
}

/* As ref_tile_lists_ready for per-query lists; shapes as sa_query_lists_check_opts. */
int ref_query_lists_ready(const sa_shape *s, const sa_query_lists *l, const sa_attn_opts *o,
                          size_t *max_keys)
{
    int err = sa_query_lists_check_args(s, l);
    if (err || (o->validate && (err = sa_query_lists_check_opts(s, l, o))))
        return err;
    return ref_scan_rows(s, l->indices, l->counts, sa_query_rows(s), l->max_blocks, max_keys);
}
