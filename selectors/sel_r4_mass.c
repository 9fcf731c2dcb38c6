/* r4_mass: r4's representatives, the oracle's aggregation, and one outlier per key group. Queries
 * and keys are cut into groups of 32 tokens. A query group is represented by its mean; a key group
 * by two vectors: its outlier (the key farthest from the group's mean) and the mean of its other
 * keys. For every query group a of a tile and every scored head of the list, a softmax runs over
 * the representatives of every key group the group can see: logit sc * qbar_a . r, each
 * representative weighted by the number of keys it stands for that the group's queries see on
 * average (1 for the outlier, up to 31 for the rest; fewer at the causal diagonal or in a partial
 * final group). A block's score is the probability mass of its key groups' representatives,
 * summed over the tile's query groups (each weighted by its number of queries) and the scored
 * heads: the oracle's sum of per-query softmax mass, with 32-token summaries in place of tokens.
 *
 * Why: r4 ranks a block by its single best (query group, key group) dot product; the oracle by how
 * much of each query's softmax it holds. On real activations the aggregation matters (nvfp4, the
 * max of exact-ish scores, falls far below the oracle at long context while nvfp4_mass, their
 * mass, matches it: docs/quality.md), and so do single tokens: the attention sink and other keys
 * that draw far more attention than their neighbours are exactly the keys a mean hides. Mass over
 * means alone measured no better than r4 on SmolLM2 (docs/quality.md); with the outlier it came
 * within 0.02 of the oracle. Cost: twice r4's dot products (each query group against two vectors
 * per key group) plus two exps per pair, and one pass over K for the outliers. CPU only.
 *
 * Precision: the key groups' means and the outlier search in double (so that the choice does not
 * hang on rounding), the representatives and the dots in FP32, the softmax and the sums in double. */
#include <math.h>
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

#define RM_SPAN 32 /* tokens per representative: r4's */

/* How many (query, key) pairs of query group [i0, i1) and key group [j0, j1) are visible
 * (causal: key j is visible to query i when j <= i + off; every pair without causal). Divided by
 * i1 - i0 it is the number of keys a query of the group sees on average. */
static long long visible_pairs(long long i0, long long i1, long long j0, long long j1,
                               long long off, int causal)
{
    if (!causal || j1 - 1 <= i0 + off)
        return (i1 - i0) * (j1 - j0);
    if (j0 > i1 - 1 + off)
        return 0;
    long long sum = 0;
    for (long long i = i0; i < i1; i++) {
        const long long lim = i + off + 1 < j1 ? i + off + 1 : j1; /* keys [j0, lim) */
        sum += lim > j0 ? lim - j0 : 0;
    }
    return sum;
}

/* Per key group of (heads, len, dim) BF16 x: the key farthest from the group's mean (mean and
 * squared distance in double, so that the choice does not hang on rounding; ties: the first), as
 * FP32 in out_key, its position in the sequence in pos, and the mean of the group's other keys in
 * rest (the outlier itself where it is alone). SA_ERR_NOMEM when a thread's scratch cannot be
 * allocated. */
static int key_outliers(const uint16_t *x, int heads, int len, int dim, int span, float *out_key,
                        float *rest, int *pos)
{
    const int groups = (len + span - 1) / span;
    int oom = 0;
#pragma omp parallel reduction(| : oom)
    {
        double *dm = malloc((size_t)dim * sizeof *dm);
        if (!dm)
            oom = 1;
#pragma omp for collapse(2) schedule(static)
        for (int h = 0; h < heads; h++)
            for (int g = 0; g < groups; g++) {
                if (!dm)
                    continue;
                const int n = len - g * span < span ? len - g * span : span;
                const uint16_t *src = x + ((size_t)h * len + (size_t)g * span) * dim;
                const size_t at = ((size_t)h * groups + g) * dim;
                for (int d = 0; d < dim; d++) {
                    double acc = 0.0;
                    for (int i = 0; i < n; i++)
                        acc += sa_bf16_to_f32(src[(size_t)i * dim + d]);
                    dm[d] = acc / n;
                }
                int best = 0;
                double far = -1.0;
                for (int i = 0; i < n; i++) {
                    double d2 = 0.0;
                    for (int d = 0; d < dim; d++) {
                        const double e = sa_bf16_to_f32(src[(size_t)i * dim + d]) - dm[d];
                        d2 += e * e;
                    }
                    if (d2 > far) {
                        far = d2;
                        best = i;
                    }
                }
                for (int d = 0; d < dim; d++) {
                    const float o = sa_bf16_to_f32(src[(size_t)best * dim + d]);
                    out_key[at + d] = o;
                    rest[at + d] = n > 1 ? (float)((n * dm[d] - o) / (n - 1)) : o;
                }
                pos[(size_t)h * groups + g] = g * span + best;
            }
        free(dm);
    }
    return oom ? SA_ERR_NOMEM : SA_OK;
}

static int r4_mass_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                       const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, SEL_MODES_MASS, &c);
    if (err)
        return err;
    const int dim = c.dim, n = c.kv_blocks, per = SA_TILE / RM_SPAN;
    const int qg = (s->len_q + RM_SPAN - 1) / RM_SPAN, kg = (s->len_kv + RM_SPAN - 1) / RM_SPAN;
    const int64_t kvecs = sa_sz_mul4(s->batch, c.kh, kg, dim);
    float *qr = sa_sz_malloc(sa_sz_mul4(s->batch, c.qh, qg, dim), sizeof *qr);
    float *ko = sa_sz_malloc(kvecs, sizeof *ko);       /* the key groups' outliers */
    float *krest = sa_sz_malloc(kvecs, sizeof *krest); /* the means of the other keys */
    int *kpos = sa_sz_malloc(sa_sz_mul4(s->batch, c.kh, kg, 1), sizeof *kpos);
    err = qr && ko && krest && kpos ? SA_OK : SA_ERR_NOMEM;
    if (!err) {
        sel_group_means(c.q, s->batch * c.qh, s->len_q, dim, RM_SPAN, qr, NULL);
        err = key_outliers(c.k, s->batch * c.kh, s->len_kv, dim, RM_SPAN, ko, krest, kpos);
    }
    const double sc = 1.0 / sqrt((double)dim); /* the softmax scale of the scored vectors */
    const long long off = (long long)s->len_kv - s->len_q;
    if (!err)
        err = sel_pool_begin(&c);
    const int rows = err ? 0 : s->batch * c.list_heads * c.q_tiles;
    int oom = 0;
#pragma omp parallel if (rows > 0)
    {
        double *acc = malloc((size_t)n * sizeof *acc);
        /* per key group: the rest's logit and weight, the outlier's logit and weight */
        double *lr = malloc((size_t)kg * 4 * sizeof *lr);
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, !acc || !lr);
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < rows; r++) {
            if (failed)
                continue;
            double *wr = lr + kg, *lo = wr + kg, *wo = lo + kg;
            const int t = r % c.q_tiles, bh = r / c.q_tiles; /* bh = b * list_heads + lh */
            const int b = bh / c.list_heads, lh = bh % c.list_heads;
            for (int blk = 0; blk < n; blk++)
                acc[blk] = 0.0;
            int h0;
            const int nh = sel_list_qheads(&c, lh, &h0); /* the list's heads, or index heads */
            for (int j = 0; j < nh; j++) {
                const int h = h0 + j;
                const size_t kh0 = ((size_t)b * c.kh + sel_khead_of(&c, h)) * kg;
                const float *rbase = krest + kh0 * dim, *obase = ko + kh0 * dim;
                for (int a = t * per; a < (t + 1) * per && a < qg; a++) {
                    const long long i0 = (long long)a * RM_SPAN;
                    const long long i1 = i0 + RM_SPAN < s->len_q ? i0 + RM_SPAN : s->len_q;
                    const float *qa = qr + (((size_t)b * c.qh + h) * qg + a) * dim;
                    double mx = -INFINITY;
                    for (int e = 0; e < kg; e++) {
                        const long long j0 = (long long)e * RM_SPAN;
                        const long long j1 = j0 + RM_SPAN < s->len_kv ? j0 + RM_SPAN : s->len_kv;
                        const long long jo = kpos[kh0 + e];
                        const long long po = visible_pairs(i0, i1, jo, jo + 1, off, c.causal);
                        const long long pg = visible_pairs(i0, i1, j0, j1, off, c.causal);
                        wo[e] = (double)po / (double)(i1 - i0);
                        wr[e] = (double)(pg - po) / (double)(i1 - i0);
                        if (wr[e] > 0.0) {
                            lr[e] = sc * sel_dot(qa, rbase + (size_t)e * dim, dim);
                            mx = lr[e] > mx ? lr[e] : mx;
                        }
                        if (wo[e] > 0.0) {
                            lo[e] = sc * sel_dot(qa, obase + (size_t)e * dim, dim);
                            mx = lo[e] > mx ? lo[e] : mx;
                        }
                    }
                    if (!(mx > -INFINITY))
                        continue; /* the group sees no key (or a NaN): no mass */
                    double z = 0.0;
                    for (int e = 0; e < kg; e++) {
                        /* the group's unnormalized mass, kept in wr for the second pass */
                        wr[e] = (wr[e] > 0.0 ? wr[e] * exp(lr[e] - mx) : 0.0) +
                                (wo[e] > 0.0 ? wo[e] * exp(lo[e] - mx) : 0.0);
                        z += wr[e];
                    }
                    for (int e = 0; e < kg; e++)
                        acc[e / per] += (double)(i1 - i0) * wr[e] / z;
                }
            }
            for (int blk = 0; blk < n; blk++)
                w.score[blk] = (float)acc[blk];
            sel_row_emit(&w, &c, 0, t, (size_t)r, indices, counts);
        }
        free(acc);
        free(lr);
        sel_row_free(&w);
    }
    free(qr);
    free(ko);
    free(krest);
    free(kpos);
    return sel_pool_end(&c, err ? err : oom ? SA_ERR_NOMEM : SA_OK, indices, counts);
}

const sa_selector sa_selector_r4_mass = {
    .name = "r4_mass",
    .description = "per 32 tokens a query mean; per 32 keys their outlier and the mean of the "
                   "rest; blocks ranked by softmax mass summed over the tile (the oracle's "
                   "aggregation at about twice r4's cost)",
    .per_query = 0,
    .cpu = r4_mass_cpu,
    .cuda = NULL,
    .head_lists = SEL_MODES_MASS,
};
