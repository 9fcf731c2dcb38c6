/* Selection quality as library functions (sa_selectors.h, "selection quality"): the summary of a
 * list's recall over queries, the overlap with reference (oracle) lists, and the output error of
 * attention over the lists against dense attention. `sparseattn select-eval` and `sparseattn run`
 * print what these return. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sel_internal.h"

/* Ascending; NaN before every number, so that the order is total. */
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    if (isnan(x) || isnan(y))
        return !isnan(x) - !isnan(y);
    return (x > y) - (x < y);
}

/* Query r of (B, Hq, Sq) sees at least one key (always without causal). */
static int sees_a_key(const sa_shape *s, int causal, size_t r)
{
    return !causal || (long long)(r % (size_t)s->len_q) + s->len_kv - s->len_q >= 0;
}

/* The arguments the recall summaries share, in their order: shape, options, percentile. */
static int summary_args(const sa_shape *s, const sa_attn_opts *opts, double percentile)
{
    const int err = sel_shape_opts_check(s, opts);
    if (err)
        return err;
    return percentile >= 0.0 && percentile <= 1.0 ? SA_OK : SA_ERR_ARG; /* NaN: SA_ERR_ARG */
}

int sa_recall_summarize(const sa_shape *s, const float *recall, const sa_attn_opts *opts,
                        double percentile, double *mean, double *low, size_t *queries)
{
    if (!s || !recall || !mean || !low)
        return SA_ERR_NULL;
    int err = summary_args(s, opts, percentile);
    if (err)
        return err;
    const int causal = opts ? opts->causal : 0;
    const size_t all = sa_lse_elems(s);
    float *x = sa_sz_malloc((int64_t)all, sizeof *x);
    if (!x)
        return SA_ERR_NOMEM;
    size_t n = 0;
    for (size_t r = 0; r < all; r++)
        if (sees_a_key(s, causal, r))
            x[n++] = recall[r];
    *mean = *low = NAN;
    if (n) {
        double acc = 0; /* in query order */
        for (size_t i = 0; i < n; i++)
            acc += x[i];
        *mean = acc / (double)n;
        qsort(x, n, sizeof *x, cmp_float);
        *low = x[(size_t)(percentile * (double)(n - 1))];
    }
    if (queries)
        *queries = n;
    free(x);
    return SA_OK;
}

int sa_lists_recall_stats(const sa_shape *s, const float *mass, int per_query,
                          const int32_t *indices, const int32_t *counts, int k,
                          const sa_attn_opts *opts, double percentile, double *mean, double *low,
                          size_t *queries)
{
    if (!s || !mass || !indices || !mean || !low)
        return SA_ERR_NULL;
    int err = summary_args(s, opts, percentile);
    if (err)
        return err;
    if ((err = sel_recall_args(s, per_query, k))) /* before the allocation */
        return err;
    float *recall = sa_sz_malloc((int64_t)sa_lse_elems(s), sizeof *recall);
    if (!recall)
        return SA_ERR_NOMEM;
    err = sa_lists_recall_counts(s, mass, per_query, indices, counts, k, recall);
    if (!err)
        err = sa_recall_summarize(s, recall, opts, percentile, mean, low, queries);
    free(recall);
    return err;
}

int sa_lists_overlap(const sa_shape *s, int per_query, const int32_t *indices,
                     const int32_t *counts, int k, const int32_t *ref, const int32_t *ref_counts,
                     int ref_k, double *overlap)
{
    if (!s || !indices || !ref || !overlap)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    const int n = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    if (!sa_flag_ok(per_query) || k <= 0 || k > n || ref_k <= 0 || ref_k > n)
        return SA_ERR_ARG;
    const size_t per = per_query ? (size_t)s->len_q : (size_t)tiles;
    const size_t rows = (size_t)s->batch * s->heads_kv * per;
    const size_t ref_rows = (size_t)s->batch * s->heads_kv * tiles;
    /* Every count and entry that will be read, first: a bad list changes no output. */
    if ((err = sel_rows_check(ref, ref_counts, ref_k, ref_rows, n)) ||
        (err = sel_rows_check(indices, counts, k, rows, n)))
        return err;
    unsigned char *mark = calloc((size_t)n, 1);
    if (!mark)
        return SA_ERR_NOMEM;
    double acc = 0; /* in row order */
    size_t used = 0;
    for (size_t r = 0; r < rows; r++) {
        const size_t bh = r / per, x = r % per;
        const size_t orow_i = bh * tiles + (per_query ? x / SA_TILE : x);
        const int32_t *orow = ref + orow_i * ref_k, *row = indices + r * k;
        const int c = counts ? counts[r] : k, oc = ref_counts ? ref_counts[orow_i] : ref_k;
        if (c <= 0)
            continue;
        for (int j = 0; j < oc; j++)
            mark[orow[j]] = 1;
        int both = 0;
        for (int j = 0; j < c; j++)
            both += mark[row[j]];
        for (int j = 0; j < oc; j++)
            mark[orow[j]] = 0;
        acc += (double)both / c;
        used++;
    }
    free(mark);
    *overlap = used ? acc / (double)used : NAN;
    return SA_OK;
}

double sa_rel_l2(const float *x, const float *ref, size_t n)
{
    if (!x || !ref)
        return NAN;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* sa_lists_output_error with the tile lists' head layout: tile list_heads (per_query 0). */
static int output_error(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                        const uint16_t *v, int per_query, int list_heads, const int32_t *indices,
                        const int32_t *counts, int max_blocks, const sa_attn_opts *opts,
                        const float *dense_f32, double *err_out)
{
    if (!s || !q || !k || !v || !indices || !err_out)
        return SA_ERR_NULL;
    /* Options before the flag: both bad is SA_ERR_ARG either way. */
    int err = sel_shape_opts_check(s, opts);
    if (err)
        return err;
    if (!sa_flag_ok(per_query))
        return SA_ERR_ARG;
    /* The lists' codes before any allocation (the reference checks them again; cheap). */
    const sa_query_lists ql = {indices, counts, max_blocks};
    const sa_tile_lists tl = {indices, counts, list_heads, max_blocks};
    if (!opts || opts->validate) {
        sa_attn_opts o_def;
        sa_attn_opts_default(&o_def);
        const sa_attn_opts *vo = opts ? opts : &o_def;
        if ((err = per_query ? sa_query_lists_check_opts(s, &ql, vo)
                             : sa_tile_lists_check_opts(s, &tl, vo)))
            return err;
    }
    const size_t nq = sa_q_elems(s);
    uint16_t *o = sa_sz_malloc((int64_t)nq, sizeof *o);
    float *of = sa_sz_malloc((int64_t)nq, sizeof *of);
    float *dense = dense_f32 ? NULL : sa_sz_malloc((int64_t)nq, sizeof *dense);
    if (!o || !of || (!dense_f32 && !dense))
        err = SA_ERR_NOMEM;
    sa_outputs so = {o, of, NULL};
    if (!err)
        err = per_query ? sa_ref_query_sparse(s, q, k, v, &ql, opts, &so)
                        : sa_ref_tile_sparse(s, q, k, v, &tl, opts, &so);
    if (!err && !dense_f32) {
        sa_outputs dout = {o, dense, NULL}; /* o is no longer needed: reuse it */
        err = sa_ref_dense_opts(s, q, k, v, opts, &dout);
    }
    if (!err)
        *err_out = sa_rel_l2(of, dense_f32 ? dense_f32 : dense, nq);
    free(o);
    free(of);
    free(dense);
    return err;
}

int sa_lists_output_error(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, int per_query, const int32_t *indices,
                          const int32_t *counts, int max_blocks, const sa_attn_opts *opts,
                          const float *dense_f32, double *err_out)
{
    return output_error(s, q, k, v, per_query, s ? s->heads_kv : 0, indices, counts, max_blocks,
                        opts, dense_f32, err_out);
}

int sa_tile_lists_output_error(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, const sa_tile_lists *l,
                               const sa_attn_opts *opts, const float *dense_f32, double *err_out)
{
    if (!l)
        return SA_ERR_NULL;
    return output_error(s, q, k, v, 0, l->list_heads, l->indices, l->counts, l->max_blocks, opts,
                        dense_f32, err_out);
}

int sa_tile_lists_recall(const sa_shape *s, const float *mass, const sa_tile_lists *l,
                         float *recall)
{
    if (!s || !mass || !l || !l->indices || !recall)
        return SA_ERR_NULL;
    int err = sa_tile_lists_check(s, l, 1);
    if (err)
        return err;
    return sel_lists_recall(s, mass, 0, l->list_heads, l->indices, l->counts, l->max_blocks,
                            recall);
}
