/* The host half of "sparseattn bench longctx" (bench_longctx.h): the list structures, the
 * per-tile union, the work counts and the exact per-row reference. No GPU needed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_longctx.h"
#include "shapes.h" /* bench/shapes.h: the tolerances */

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Appends to row[*n] blocks drawn uniformly from [0, nb) that are not yet marked, until *n ==
 * want; marks them. Rejection sampling: the lists are short next to nb (nb >= want). */
static void draw_unmarked(sa_rng *g, int nb, unsigned char *mark, int32_t *row, int *n, int want)
{
    while (*n < want) {
        const int32_t b = (int32_t)sa_rng_below(g, (uint32_t)nb);
        if (!mark[b]) {
            mark[b] = 1;
            row[(*n)++] = b;
        }
    }
}

/* The structures (docs/benchmarks.md, "bench longctx", says the same):
 *   overlap r: per (b, hkv, 128-query tile) 16 distinct base blocks uniformly at random; each
 *     query of the tile keeps a uniformly random subset of r of them and draws its other 16 - r
 *     uniformly from the blocks not already in its list (any block, the tile's other base
 *     blocks included), all distinct. r = 16: every query of a tile has the same list.
 *   local: each query's 16 consecutive blocks [start, start + 16) around its own block
 *     c = p / 128 (p = q + len_kv - len_q, its position among the keys, clamped to the keys):
 *     start = c - 7 + j with j uniform in {-2, ..., 2} per query, moved to stay inside
 *     [0, kv_blocks). So c is always in the list (7 - j blocks after the start unless moved),
 *     and the queries of a tile disagree on up to 2 blocks at each end: a union of at most 20
 *     blocks when len_q = len_kv (a tile's queries then sit in one block).
 * One sa_rng stream from the seed; rows sorted ascending. */
int lc_make_lists(const sa_shape *s, int structure, uint64_t seed, int32_t *idx)
{
    const int nb = sa_kv_blocks(s), k = LC_TOPK;
    if (!idx || nb < k || structure < LC_LOCAL || structure > k)
        return SA_ERR_ARG;
    unsigned char *mark = calloc((size_t)nb, 1);
    if (!mark)
        return SA_ERR_NOMEM;
    sa_rng g;
    sa_rng_seed(&g, seed);
    const int tiles = sa_q_tiles(s);
    for (int bh = 0; bh < s->batch * s->heads_kv; bh++)
        for (int t = 0; t < tiles; t++) {
            int32_t base[LC_TOPK];
            int nbase = 0;
            if (structure != LC_LOCAL) {
                draw_unmarked(&g, nb, mark, base, &nbase, k);
                for (int j = 0; j < k; j++)
                    mark[base[j]] = 0;
            }
            const int q1 = (t + 1) * SA_TILE < s->len_q ? (t + 1) * SA_TILE : s->len_q;
            for (int q = t * SA_TILE; q < q1; q++) {
                int32_t *row = idx + ((size_t)bh * s->len_q + q) * k;
                if (structure == LC_LOCAL) {
                    long p = (long)q + s->len_kv - s->len_q;
                    p = p < 0 ? 0 : p >= s->len_kv ? s->len_kv - 1 : p;
                    const int c = (int)(p / SA_TILE);
                    const int j = (int)sa_rng_below(&g, 2 * LC_LOCAL_JITTER + 1) - LC_LOCAL_JITTER;
                    int start = c - (k / 2 - 1) + j;
                    start = start < 0 ? 0 : start > nb - k ? nb - k : start;
                    for (int i = 0; i < k; i++)
                        row[i] = start + i;
                    continue;
                }
                int32_t pick[LC_TOPK];
                memcpy(pick, base, sizeof pick);
                int n = 0;
                for (; n < structure; n++) { /* a random r-subset: partial Fisher-Yates */
                    const int m = n + (int)sa_rng_below(&g, (uint32_t)(k - n));
                    const int32_t tmp = pick[n];
                    pick[n] = pick[m];
                    pick[m] = tmp;
                    row[n] = pick[n];
                    mark[row[n]] = 1;
                }
                draw_unmarked(&g, nb, mark, row, &n, k);
                for (int i = 0; i < k; i++)
                    mark[row[i]] = 0;
                qsort(row, (size_t)k, sizeof *row, cmp_i32);
            }
        }
    free(mark);
    return SA_OK;
}

int lc_tile_union(const sa_shape *s, const int32_t *qidx, int k, int32_t *tidx, int32_t *tcnt,
                  int *max_count, double *mean, int *exact)
{
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    unsigned char *mark = calloc((size_t)nb, 1);
    if (!mark)
        return SA_ERR_NOMEM;
    const int stride = tidx ? *max_count : 0;
    int most = 0, all_equal = 1;
    double sum = 0;
    for (int bh = 0; bh < s->batch * s->heads_kv; bh++)
        for (int t = 0; t < tiles; t++) {
            const int q1 = (t + 1) * SA_TILE < s->len_q ? (t + 1) * SA_TILE : s->len_q;
            for (int q = t * SA_TILE; q < q1; q++)
                for (int j = 0; j < k; j++)
                    mark[qidx[((size_t)bh * s->len_q + q) * k + j]] = 1;
            const size_t row = (size_t)bh * tiles + t;
            int c = 0;
            for (int b = 0; b < nb; b++)
                if (mark[b]) {
                    mark[b] = 0;
                    if (tidx && c < stride)
                        tidx[row * stride + c] = b;
                    c++;
                }
            for (int j = c; tidx && j < stride; j++)
                tidx[row * stride + j] = 0;
            if (tcnt)
                tcnt[row] = c;
            most = c > most ? c : most;
            all_equal &= c == k; /* k distinct blocks per query, all inside the union */
            sum += c;
        }
    free(mark);
    if (!tidx)
        *max_count = most;
    if (mean)
        *mean = sum / ((double)s->batch * s->heads_kv * tiles);
    if (exact)
        *exact = all_equal;
    return tidx && most > stride ? SA_ERR_ARG : SA_OK;
}

double lc_query_flops(const sa_shape *s, const int32_t *qidx, int k)
{
    const int group = s->heads_q / s->heads_kv;
    double keys = 0;
    for (size_t r = 0; r < sa_query_rows(s); r++)
        for (int j = 0; j < k; j++)
            keys += sa_block_len(s, qidx[r * k + j]);
    return 4.0 * s->head_dim * group * keys;
}

double lc_tile_flops(const sa_shape *s, const int32_t *tidx, const int32_t *tcnt, int stride)
{
    const int tiles = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    double pairs = 0;
    for (int bh = 0; bh < s->batch * s->heads_kv; bh++)
        for (int t = 0; t < tiles; t++) {
            const size_t row = (size_t)bh * tiles + t;
            const int rows_q = s->len_q - t * SA_TILE < SA_TILE ? s->len_q - t * SA_TILE : SA_TILE;
            long keys = 0;
            for (int j = 0; j < tcnt[row]; j++)
                keys += sa_block_len(s, tidx[row * stride + j]);
            pairs += (double)keys * rows_q;
        }
    return 4.0 * s->head_dim * group * pairs;
}

int lc_rows_init(lc_rows *r, const sa_shape *s, int n, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    const size_t d = (size_t)s->head_dim;
    r->n = n;
    r->b = malloc((size_t)n * sizeof *r->b);
    r->h = malloc((size_t)n * sizeof *r->h);
    r->q = malloc((size_t)n * sizeof *r->q);
    r->qv = malloc((size_t)n * d * sizeof *r->qv);
    r->k = malloc(sa_kv_elems(s) * sizeof *r->k);
    r->v = malloc(sa_kv_elems(s) * sizeof *r->v);
    r->dense_o = malloc((size_t)n * d * sizeof *r->dense_o);
    r->dense_lse = malloc((size_t)n * sizeof *r->dense_lse);
    if (!r->b || !r->h || !r->q || !r->qv || !r->k || !r->v || !r->dense_o || !r->dense_lse) {
        lc_rows_free(r);
        return SA_ERR_NOMEM;
    }
    sa_rng g;
    sa_rng_seed(&g, seed);
    for (int i = 0; i < n; i++) {
        const int last = i == 1;
        r->b[i] = i < 2 ? (last ? s->batch - 1 : 0) : (int)sa_rng_below(&g, (uint32_t)s->batch);
        r->h[i] = i < 2 ? (last ? s->heads_q - 1 : 0) : (int)sa_rng_below(&g, (uint32_t)s->heads_q);
        r->q[i] = i < 2 ? (last ? s->len_q - 1 : 0) : (int)sa_rng_below(&g, (uint32_t)s->len_q);
    }
    return SA_OK;
}

void lc_rows_free(lc_rows *r)
{
    free(r->b), free(r->h), free(r->q), free(r->qv), free(r->k), free(r->v);
    free(r->dense_o), free(r->dense_lse);
    memset(r, 0, sizeof *r);
}

void lc_ref_row(const sa_shape *s, const lc_rows *r, int i, const int32_t *blocks, int nblk,
                double *o, double *lse)
{
    const int d = s->head_dim, nb = nblk < 0 ? sa_kv_blocks(s) : nblk;
    const size_t kvh = (size_t)r->b[i] * s->heads_kv + r->h[i] / (s->heads_q / s->heads_kv);
    const float *qv = r->qv + (size_t)i * d;
    const float *K = r->k + kvh * s->len_kv * d, *V = r->v + kvh * s->len_kv * d;
    const double scale = 1.0 / sqrt((double)d);
    double *sc = malloc((size_t)nb * SA_TILE * sizeof *sc);
    double mx = -INFINITY;
    size_t n = 0;
    for (int j = 0; sc && j < nb; j++) { /* scores, in list order */
        const int blk = nblk < 0 ? j : blocks[j], len = sa_block_len(s, blk);
        for (int t = 0; t < len; t++, n++) {
            const float *kr = K + ((size_t)blk * SA_TILE + t) * d;
            double dot = 0;
            for (int x = 0; x < d; x++)
                dot += (double)qv[x] * kr[x];
            sc[n] = dot * scale;
            mx = sc[n] > mx ? sc[n] : mx;
        }
    }
    for (int x = 0; x < d; x++)
        o[x] = 0;
    double sum = 0;
    n = 0;
    for (int j = 0; sc && j < nb; j++) {
        const int blk = nblk < 0 ? j : blocks[j], len = sa_block_len(s, blk);
        for (int t = 0; t < len; t++, n++) {
            const double p = exp(sc[n] - mx);
            const float *vr = V + ((size_t)blk * SA_TILE + t) * d;
            sum += p;
            for (int x = 0; x < d; x++)
                o[x] += p * vr[x];
        }
    }
    for (int x = 0; x < d; x++)
        o[x] = sc && sum > 0 ? o[x] / sum : NAN;
    *lse = sc && sum > 0 ? mx + log(sum) : NAN; /* NaN if out of memory: the check then fails */
    free(sc);
}

void lc_ref_rows(const sa_shape *s, const lc_rows *r, const int32_t *qidx, int k, double *o,
                 double *lse)
{
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < r->n; i++) {
        const size_t row =
            ((size_t)r->b[i] * s->heads_kv + r->h[i] / (s->heads_q / s->heads_kv)) * s->len_q +
            r->q[i];
        lc_ref_row(s, r, i, qidx ? qidx + row * k : NULL, qidx ? k : -1,
                   o + (size_t)i * s->head_dim, lse + i);
    }
}

lc_err lc_compare(const lc_rows *r, int head_dim, const uint16_t *o, const float *lse,
                  const double *ref_o, const double *ref_lse)
{
    lc_err e = {0};
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)r->n * head_dim; i++) {
        const double x = sa_bf16_to_f32(o[i]), d = x - ref_o[i];
        if (!isfinite(x) || !isfinite(ref_o[i])) {
            e.nonfinite++;
            continue;
        }
        num += d * d;
        den += ref_o[i] * ref_o[i];
        e.max_abs = fabs(d) > e.max_abs ? fabs(d) : e.max_abs;
        e.ref_max = fabs(ref_o[i]) > e.ref_max ? fabs(ref_o[i]) : e.ref_max;
    }
    for (int i = 0; i < r->n; i++) {
        if (!isfinite(lse[i]) || !isfinite(ref_lse[i])) {
            e.nonfinite++;
            continue;
        }
        const double d = fabs(lse[i] - ref_lse[i]);
        e.lse_max_abs = d > e.lse_max_abs ? d : e.lse_max_abs;
    }
    e.rel_l2 = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
    e.pass = e.nonfinite == 0 && e.rel_l2 <= SA_BENCH_REL_L2_TOL &&
             e.max_abs <= SA_BENCH_MAX_ABS_TOL * e.ref_max + SA_BENCH_MAX_ABS_FLOOR &&
             e.lse_max_abs <= SA_BENCH_LSE_TOL;
    return e;
}
