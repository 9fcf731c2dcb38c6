/* Representative scoring, shared by r1 (one mean per 128 tokens), r4 (one per 32) and gauss (r1
 * plus each block's per-channel key variance). Means and variances are taken once per (batch,
 * head, group of `span` tokens), never per (tile, block) pair. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

/* x is (heads, len, dim) BF16; out is (heads, ceil(len / span), dim): the mean of each group's
 * valid tokens (a final partial group averages only the tokens it has); var, when not NULL, is
 * (heads, groups, 2 dim): per channel the upper and then the lower semivariance over those
 * tokens, each doubled (2 mean((x - m)+^2), 2 mean((x - m)-^2): for a symmetric spread both equal
 * the variance). */
void sel_group_means(const uint16_t *x, int heads, int len, int dim, int span, float *out,
                     float *var)
{
    int groups = (len + span - 1) / span;
#pragma omp parallel for collapse(2) schedule(static)
    for (int h = 0; h < heads; h++)
        for (int g = 0; g < groups; g++) {
            int n = len - g * span < span ? len - g * span : span;
            const uint16_t *src = x + ((size_t)h * len + (size_t)g * span) * dim;
            float *dst = out + ((size_t)h * groups + g) * dim;
            for (int d = 0; d < dim; d++)
                dst[d] = 0.0f;
            for (int i = 0; i < n; i++)
                for (int d = 0; d < dim; d++)
                    dst[d] += sa_bf16_to_f32(src[(size_t)i * dim + d]);
            for (int d = 0; d < dim; d++)
                dst[d] /= (float)n;
            if (!var)
                continue;
            float *up = var + ((size_t)h * groups + g) * 2 * dim, *dn = up + dim;
            for (int d = 0; d < dim; d++)
                up[d] = dn[d] = 0.0f;
            for (int i = 0; i < n; i++)
                for (int d = 0; d < dim; d++) {
                    const float e = sa_bf16_to_f32(src[(size_t)i * dim + d]) - dst[d];
                    if (e > 0.0f)
                        up[d] += e * e;
                    else
                        dn[d] += e * e;
                }
            for (int d = 0; d < dim; d++) {
                up[d] *= 2.0f / (float)n;
                dn[d] *= 2.0f / (float)n;
            }
        }
}

/* gauss's block score in dot-product units: the log of a block's softmax mass for query mean q,
 * divided by the softmax scale sc, if each channel of its keys spread around the mean m as a
 * split normal (the upper semivariance v[d] above the mean, the lower v[dim + d] below):
 * log sum_i exp(sc q.k_i) ~ sc q.m + sc^2 sum_d q_d^2 v_side / 2 + log n, v_side the half on q_d's
 * side. Only the spread toward q counts: a key far out on the other side lowers the score. */
static float gauss_score(const float *q, const float *m, const float *v, int dim, float sc,
                         int n)
{
    float mean = 0.0f, spread = 0.0f;
    for (int d = 0; d < dim; d++) {
        mean += q[d] * m[d];
        spread += q[d] * q[d] * (q[d] > 0.0f ? v[d] : v[dim + d]);
    }
    return mean + 0.5f * sc * spread + logf((float)n) / sc;
}

int sel_rep_select(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                   const sa_select_params *p, int span, int gauss, int32_t *indices,
                   int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, SEL_MODES_HEADS, &c);
    if (err)
        return err;
    const int per = SA_TILE / span; /* groups per tile or block */
    const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
    const int dim = c.dim, n = c.kv_blocks;
    /* Scored heads: the attention's (Hq, Hkv), or the index heads (Hi, Hi). */
    float *qr = sa_sz_malloc(sa_sz_mul4(s->batch, c.qh, qg, dim), sizeof *qr);
    float *kr = sa_sz_malloc(sa_sz_mul4(s->batch, c.kh, kg, dim), sizeof *kr);
    float *kv = gauss ? sa_sz_malloc(sa_sz_mul4(s->batch, c.kh, kg, 2 * (size_t)dim), sizeof *kv)
                      : NULL;
    if (!qr || !kr || (gauss && !kv)) {
        free(qr);
        free(kr);
        free(kv);
        return SA_ERR_NOMEM;
    }
    sel_group_means(c.q, s->batch * c.qh, s->len_q, dim, span, qr, NULL);
    sel_group_means(c.k, s->batch * c.kh, s->len_kv, dim, span, kr, kv);
    const float sc = 1.0f / sqrtf((float)dim); /* the softmax scale of the scored vectors */

    const int rows = s->batch * c.list_heads * c.q_tiles;
    int oom = 0;
#pragma omp parallel
    {
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, 0);
        float *score = w.score;
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < rows; r++) {
            if (failed)
                continue;
            int t = r % c.q_tiles, bh = r / c.q_tiles; /* bh = b * list_heads + lh */
            int b = bh / c.list_heads, lh = bh % c.list_heads;
            int h0;
            const int nh = sel_list_qheads(&c, lh, &h0); /* the list's heads, or index heads */
            for (int blk = 0; blk < n; blk++) {
                float best = -INFINITY;
                for (int j = 0; j < nh; j++) {
                    int hq = h0 + j;
                    const float *qbase = qr + ((size_t)b * c.qh + hq) * qg * dim;
                    const size_t koff = ((size_t)b * c.kh + sel_khead_of(&c, hq)) * kg * dim;
                    const float *kbase = kr + koff;
                    for (int a = t * per; a < (t + 1) * per && a < qg; a++)
                        for (int e = blk * per; e < (blk + 1) * per && e < kg; e++) {
                            const int keys = s->len_kv - e * span < span ? s->len_kv - e * span
                                                                         : span;
                            float v = gauss ? gauss_score(qbase + (size_t)a * dim,
                                                          kbase + (size_t)e * dim,
                                                          kv + 2 * (koff + (size_t)e * dim), dim, sc,
                                                          keys)
                                            : sel_dot(qbase + (size_t)a * dim, kbase + (size_t)e * dim,
                                                  dim);
                            if (v > best || isnan(v))
                                best = isnan(best) ? best : v;
                        }
                }
                score[blk] = best;
            }
            sel_row_emit(&w, &c, 0, t, (size_t)r, indices, counts);
        }
        sel_row_free(&w);
    }
    free(qr);
    free(kr);
    free(kv);
    return oom ? SA_ERR_NOMEM : SA_OK;
}
