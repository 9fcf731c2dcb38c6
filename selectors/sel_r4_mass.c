/* r4_mass: r4's representatives with the oracle's aggregation. Queries and keys are cut into
 * groups of 32 tokens and each group is replaced by its mean (r4's representatives). For every
 * query group a of a tile and every scored head of the list, a softmax runs over all the key
 * groups e the group can see: logit sc * qbar_a . kbar_e, each key group weighted by the number of
 * its keys the group's queries see on average (32, fewer at the causal diagonal or in a partial
 * final group). A block's score is the probability mass of its key groups, summed over the tile's
 * query groups (each weighted by its number of queries) and the scored heads: the oracle's sum of
 * per-query softmax mass, with 32-token means in place of the tokens.
 *
 * Why: r4 ranks a block by its single best (query group, key group) dot product; the oracle by how
 * much of each query's softmax it holds. On real activations nvfp4 (the max of exact-ish scores)
 * falls far below the oracle at long context while nvfp4_mass (their mass) matches it
 * (docs/quality.md): the aggregation, not the precision, made the difference. This selector asks
 * how much of that the cheap representatives keep. Its dot products are r4's (4 query groups per
 * tile against every key group, per scored head); it adds one exp per product. CPU only.
 *
 * Precision: means in FP32 (sel_group_means), dots in FP32, the softmax and the sums in double. */
#include <math.h>
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

#define RM_SPAN 32 /* tokens per representative: r4's */

/* How many keys of group [j0, j1) the queries of group [i0, i1) see on average (causal: key j is
 * visible to query i when j <= i + off); j1 - j0 without causal. */
static double visible_keys(long long i0, long long i1, long long j0, long long j1, long long off,
                           int causal)
{
    if (!causal || j1 - 1 <= i0 + off)
        return (double)(j1 - j0);
    if (j0 > i1 - 1 + off)
        return 0.0;
    double sum = 0.0;
    for (long long i = i0; i < i1; i++) {
        const long long lim = i + off + 1 < j1 ? i + off + 1 : j1; /* keys [j0, lim) */
        sum += lim > j0 ? (double)(lim - j0) : 0.0;
    }
    return sum / (double)(i1 - i0);
}

static float dotf(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static int r4_mass_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                       const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, &c);
    if (err)
        return err;
    const int dim = c.dim, n = c.kv_blocks, kk = c.k_sel, per = SA_TILE / RM_SPAN;
    const int qg = (s->len_q + RM_SPAN - 1) / RM_SPAN, kg = (s->len_kv + RM_SPAN - 1) / RM_SPAN;
    float *qr = sa_sz_malloc(sa_sz_mul4(s->batch, c.qh, qg, dim), sizeof *qr);
    float *kr = sa_sz_malloc(sa_sz_mul4(s->batch, c.kh, kg, dim), sizeof *kr);
    if (!qr || !kr) {
        free(qr);
        free(kr);
        return SA_ERR_NOMEM;
    }
    sel_group_means(c.q, s->batch * c.qh, s->len_q, dim, RM_SPAN, qr, NULL);
    sel_group_means(c.k, s->batch * c.kh, s->len_kv, dim, RM_SPAN, kr, NULL);
    const double sc = 1.0 / sqrt((double)dim); /* the softmax scale of the scored vectors */
    const long long off = (long long)s->len_kv - s->len_q;
    const int rows = s->batch * s->heads_kv * c.q_tiles;
    int oom = 0;
#pragma omp parallel reduction(| : oom)
    {
        double *acc = malloc((size_t)n * sizeof *acc);
        double *lg = malloc((size_t)kg * sizeof *lg), *wt = malloc((size_t)kg * sizeof *wt);
        sel_row w;
        const int w_oom = sel_row_init(&w, n, kk);
        if (!acc || !lg || !wt || w_oom)
            oom = 1;
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < rows; r++) {
            if (oom)
                continue;
            const int t = r % c.q_tiles, bh = r / c.q_tiles; /* bh = b * Hkv + hkv */
            const int b = bh / s->heads_kv, hkv = bh % s->heads_kv;
            for (int blk = 0; blk < n; blk++)
                acc[blk] = 0.0;
            int h0;
            const int nh = sel_list_qheads(&c, hkv, &h0); /* the group's heads, or index heads */
            for (int j = 0; j < nh; j++) {
                const int h = h0 + j;
                const float *kbase = kr + ((size_t)b * c.kh + sel_khead_of(&c, h)) * kg * dim;
                for (int a = t * per; a < (t + 1) * per && a < qg; a++) {
                    const long long i0 = (long long)a * RM_SPAN;
                    const long long i1 = i0 + RM_SPAN < s->len_q ? i0 + RM_SPAN : s->len_q;
                    const float *qa = qr + (((size_t)b * c.qh + h) * qg + a) * dim;
                    double mx = -INFINITY;
                    for (int e = 0; e < kg; e++) {
                        const long long j0 = (long long)e * RM_SPAN;
                        const long long j1 = j0 + RM_SPAN < s->len_kv ? j0 + RM_SPAN : s->len_kv;
                        wt[e] = visible_keys(i0, i1, j0, j1, off, c.causal);
                        if (wt[e] > 0.0) {
                            lg[e] = sc * dotf(qa, kbase + (size_t)e * dim, dim);
                            mx = lg[e] > mx ? lg[e] : mx;
                        }
                    }
                    if (!(mx > -INFINITY))
                        continue; /* the group sees no key (or a NaN): no mass */
                    double z = 0.0;
                    for (int e = 0; e < kg; e++)
                        if (wt[e] > 0.0)
                            z += wt[e] * exp(lg[e] - mx);
                    for (int e = 0; e < kg; e++)
                        if (wt[e] > 0.0)
                            acc[e / per] += (double)(i1 - i0) * wt[e] * exp(lg[e] - mx) / z;
                }
            }
            for (int blk = 0; blk < n; blk++)
                w.score[blk] = (float)acc[blk];
            const int cnt = sel_row_choose(&w, &c, 0, t, indices + (size_t)r * kk);
            if (counts)
                counts[r] = cnt;
        }
        free(acc);
        free(lg);
        free(wt);
        sel_row_free(&w);
    }
    free(qr);
    free(kr);
    return oom ? SA_ERR_NOMEM : SA_OK;
}

const sa_selector sa_selector_r4_mass = {
    .name = "r4_mass",
    .description = "r4's 32-token means, blocks ranked by softmax mass summed over the tile's "
                   "query groups (the oracle's aggregation at r4's cost plus one exp per product)",
    .per_query = 0,
    .cpu = r4_mass_cpu,
    .cuda = NULL,
};
