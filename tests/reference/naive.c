#include <float.h>
#include <stdio.h>
#include <stdlib.h>

#include "naive.h"

sa_rng nv_rng_for(uint64_t salt, int test, int i)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ ((uint64_t)(test * 64 + i + 1) * salt));
    return r;
}

void *nv_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_msg(p, "out of memory (%zu bytes)", bytes);
    return p;
}

static void fill(sa_rng *r, uint16_t **bf, double **d, size_t n, float scale)
{
    *bf = nv_malloc(n * sizeof **bf);
    *d = nv_malloc(n * sizeof **d);
    sa_rng_fill_bf16(r, *bf, n, scale);
    for (size_t i = 0; i < n; i++)
        (*d)[i] = sa_bf16_to_f32((*bf)[i]);
}

void nv_case_init(nv_case *c, sa_shape s, sa_rng *r, float qk_scale)
{
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    c->s = s;
    fill(r, &c->q, &c->qd, sa_q_elems(&s), qk_scale);
    fill(r, &c->k, &c->kd, sa_kv_elems(&s), qk_scale);
    fill(r, &c->v, &c->vd, sa_kv_elems(&s), 1.0f);
}

void nv_case_free(nv_case *c)
{
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->qd);
    free(c->kd);
    free(c->vd);
}

const int32_t *nv_blocks_of(const sa_shape *s, const nv_rows *rows, int b, int hq, int i,
                            int *count)
{
    size_t row;
    if (rows->kind == NV_DENSE) {
        *count = (s->len_kv + 127) / 128;
        return NULL;
    }
    if (rows->kind == NV_TILE) {
        int lh = hq / (s->heads_q / rows->list_heads);
        row = ((size_t)b * rows->list_heads + lh) * ((s->len_q + 127) / 128) + i / 128;
    } else {
        int hkv = hq / (s->heads_q / s->heads_kv);
        row = ((size_t)b * s->heads_kv + hkv) * s->len_q + i;
    }
    *count = rows->counts ? rows->counts[row] : rows->max_blocks;
    return rows->indices + row * rows->max_blocks;
}

void nv_attention(const nv_case *c, const nv_rows *rows, nv_result *r)
{
    const sa_shape *s = &c->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    const double scale = 1.0 / sqrt((double)d);
    r->o = nv_malloc(sa_q_elems(s) * sizeof *r->o);
    r->lse = nv_malloc(sa_lse_elems(s) * sizeof *r->lse);
    r->logit_max = r->o_max = r->v_max = 0;
    for (size_t i = 0; i < sa_kv_elems(s); i++)
        r->v_max = fmax(r->v_max, fabs(c->vd[i]));
    /* Room for every key of a row, duplicates included. */
    int most = (s->len_kv + 127) / 128;
    if (rows->kind != NV_DENSE && rows->max_blocks > most)
        most = rows->max_blocks;
    double *logit = nv_malloc((size_t)most * 128 * sizeof *logit);
    int *key = nv_malloc((size_t)most * 128 * sizeof *key);

    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->heads_q; hq++)
            for (int i = 0; i < s->len_q; i++) {
                size_t qrow = ((size_t)b * s->heads_q + hq) * s->len_q + i;
                size_t kvh = ((size_t)b * s->heads_kv + hq / group) * s->len_kv;
                const double *qv = c->qd + qrow * d;
                int count;
                const int32_t *list = nv_blocks_of(s, rows, b, hq, i, &count);
                /* Causal: key t is visible when t <= i + (len_kv - len_q). */
                const long long last = rows->causal ? (long long)i + s->len_kv - s->len_q
                                                    : (long long)s->len_kv;
                int n = 0;
                for (int j = 0; j < count; j++) {
                    int blk = list ? list[j] : j;
                    for (int t = blk * 128; t < blk * 128 + 128 && t < s->len_kv && t <= last;
                         t++) {
                        const double *kv = c->kd + (kvh + t) * d;
                        double dot = 0;
                        for (int e = 0; e < d; e++)
                            dot += qv[e] * kv[e];
                        logit[n] = dot * scale;
                        key[n++] = t;
                    }
                }
                double *o = r->o + qrow * d;
                for (int e = 0; e < d; e++)
                    o[e] = 0;
                if (n == 0) {
                    r->lse[qrow] = -INFINITY;
                    continue;
                }
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    m = fmax(m, logit[j]);
                    r->logit_max = fmax(r->logit_max, fabs(logit[j]));
                }
                for (int j = 0; j < n; j++) {
                    double w = exp(logit[j] - m);
                    sum += w;
                    const double *vv = c->vd + (kvh + key[j]) * d;
                    for (int e = 0; e < d; e++)
                        o[e] += w * vv[e];
                }
                for (int e = 0; e < d; e++) {
                    o[e] /= sum;
                    r->o_max = fmax(r->o_max, fabs(o[e]));
                }
                r->lse[qrow] = m + log(sum);
            }
    free(logit);
    free(key);
}

void nv_result_free(nv_result *r)
{
    free(r->o);
    free(r->lse);
}

void nv_out_alloc(nv_out *o, const sa_shape *s)
{
    o->o = nv_malloc(sa_q_elems(s) * sizeof *o->o);
    o->of = nv_malloc(sa_q_elems(s) * sizeof *o->of);
    o->lse = nv_malloc(sa_lse_elems(s) * sizeof *o->lse);
    o->out = (sa_outputs){.o = o->o, .o_f32 = o->of, .lse = o->lse};
    nv_out_poison(o, s);
}

void nv_out_poison(nv_out *o, const sa_shape *s)
{
    sa_poison_bf16(o->o, sa_q_elems(s));
    sa_poison_f32(o->of, sa_q_elems(s));
    sa_poison_f32(o->lse, sa_lse_elems(s));
}

void nv_out_free(nv_out *o)
{
    free(o->o);
    free(o->of);
    free(o->lse);
}

int nv_out_untouched(const nv_out *o, const sa_shape *s)
{
    for (size_t i = 0; i < sa_q_elems(s); i++)
        if (!isnan(sa_bf16_to_f32(o->o[i])) || !isnan(o->of[i]))
            return 0;
    for (size_t i = 0; i < sa_lse_elems(s); i++)
        if (!isnan(o->lse[i]))
            return 0;
    return 1;
}

const char *nv_check(const nv_case *c, const nv_result *r, const float *of, const uint16_t *o,
                     const float *lse)
{
    static char msg[512];
    const sa_shape *s = &c->s;
    const int d = s->head_dim;
    const double logit_err = NV_TOL_LOGIT * FLT_EPSILON * r->logit_max;
    const double tol_o = NV_TOL_REL * r->o_max + logit_err * r->v_max;
    double worst_o = 0, worst_lse = 0; /* largest error / tolerance, printed with NV_VERBOSE */
    for (size_t row = 0; row < sa_lse_elems(s); row++) {
        double want = r->lse[row];
        if (want == -INFINITY) {
            if (lse[row] != -INFINITY) {
                snprintf(msg, sizeof msg, "row %zu is empty but LSE = %g", row, lse[row]);
                return msg;
            }
        } else {
            double tol = NV_TOL_REL * fmax(1.0, fabs(want)) + logit_err;
            worst_lse = fmax(worst_lse, fabs(lse[row] - want) / tol);
            if (!(fabs(lse[row] - want) <= tol)) {
                snprintf(msg, sizeof msg, "row %zu: LSE %.9g, exact %.9g (tol %.3g)", row,
                         lse[row], want, tol);
                return msg;
            }
        }
        for (int e = 0; e < d; e++) {
            size_t i = row * d + e;
            double exact = r->o[i];
            if (want == -INFINITY && (of[i] != 0.0f || o[i] != 0)) {
                snprintf(msg, sizeof msg, "row %zu is empty but O[%zu] = %g", row, i, of[i]);
                return msg;
            }
            worst_o = fmax(worst_o, fabs(of[i] - exact) / tol_o);
            if (!(fabs(of[i] - exact) <= tol_o)) {
                snprintf(msg, sizeof msg,
                         "O[%zu] (row %zu): %.9g, exact %.9g (|err| %.3g > tol %.3g)", i, row,
                         of[i], exact, fabs(of[i] - exact), tol_o);
                return msg;
            }
            if (o[i] != sa_bf16_from_f32(of[i])) {
                snprintf(msg, sizeof msg, "BF16 O[%zu] = 0x%04x is not the FP32 O %.9g rounded", i,
                         o[i], of[i]);
                return msg;
            }
        }
    }
    if (getenv("NV_VERBOSE"))
        printf("  error/tolerance: O %.3f, LSE %.3f (logit_max %.3g, tol_o %.3g)\n", worst_o,
               worst_lse, r->logit_max, tol_o);
    return NULL;
}

void nv_shuffle_rows(sa_rng *r, int32_t *indices, size_t rows, int max_blocks)
{
    for (size_t row = 0; row < rows; row++) {
        int32_t *x = indices + row * max_blocks;
        for (int i = max_blocks - 1; i > 0; i--) {
            int j = (int)sa_rng_below(r, (uint32_t)i + 1);
            int32_t t = x[i];
            x[i] = x[j];
            x[j] = t;
        }
    }
}

void nv_random_counts(sa_rng *r, int32_t *counts, size_t rows, int max_blocks)
{
    for (size_t row = 0; row < rows; row++)
        counts[row] = sa_rng_below(r, 6) == 0 ? 0 : 1 + (int)sa_rng_below(r, (uint32_t)max_blocks);
}

const char *nv_check_partials(const nv_case *c, const int32_t *idx, const int32_t *counts, int k,
                              int causal, const float *po, const float *pl, int *bad_slot)
{
    const sa_shape *s = &c->s;
    const int d = s->head_dim;
    const size_t qrows = sa_query_rows(s), nq = sa_lse_elems(s);
    int32_t *one = nv_malloc(qrows * sizeof *one), *has = nv_malloc(qrows * sizeof *has);
    nv_out slot;
    nv_out_alloc(&slot, s);
    const char *msg = NULL;
    for (int j = 0; j < k && !msg; j++) {
        for (size_t q = 0; q < qrows; q++) {
            one[q] = idx[q * k + j];
            has[q] = j < counts[q];
        }
        nv_result res;
        nv_attention(c, &(nv_rows){NV_QUERY, one, has, 0, 1, causal}, &res);
        for (size_t q = 0; q < nq; q++) {
            slot.lse[q] = pl[q * k + j];
            for (int e = 0; e < d; e++)
                slot.of[q * d + e] = po[(q * k + j) * d + e];
        }
        sa_bf16_from_f32_array(slot.o, slot.of, sa_q_elems(s));
        msg = nv_check(c, &res, slot.of, slot.o, slot.lse);
        *bad_slot = j;
        nv_result_free(&res);
    }
    nv_out_free(&slot);
    free(one);
    free(has);
    return msg;
}

void nv_check_partials_combine(const nv_case *c, const sa_query_lists *ql,
                               const sa_attn_opts *opts, const float *po, const float *pl, int _i)
{
    const sa_shape *s = &c->s;
    const int causal = opts && opts->causal, k = ql->max_blocks;
    const char *how = causal ? "causal " : "";
    int j;
    const char *m = nv_check_partials(c, ql->indices, ql->counts, k, causal, po, pl, &j);
    ck_assert_msg(!m, "%spartial slot %d, shape #%d, seed %" PRIu64 ": %s", how, j, _i,
                  sa_test_seed(), m);

    nv_out out, direct;
    nv_out_alloc(&out, s);
    nv_out_alloc(&direct, s);
    ck_assert_int_eq(sa_ref_combine(s, k, po, pl, &out.out), SA_OK);
    nv_result res;
    nv_attention(c, &(nv_rows){NV_QUERY, ql->indices, ql->counts, 0, k, causal}, &res);
    char what[64];
    snprintf(what, sizeof what, "combined %spartials", how);
    NV_CHECK_OUT(c, &res, &out, what);
    ck_assert_int_eq(sa_ref_query_sparse(s, c->q, c->k, c->v, ql, opts, &direct.out), SA_OK);
    snprintf(what, sizeof what, "direct %sper-query attention", how);
    NV_CHECK_OUT(c, &res, &direct, what);
    nv_result_free(&res);
    nv_out_free(&out);
    nv_out_free(&direct);
}

long long nv_last_key(const sa_shape *s, int i) { return (long long)i + s->len_kv - s->len_q; }

int nv_visible_blocks(long long last) { return last < 0 ? 0 : (int)(last / 128) + 1; }

int nv_tile_visible(const sa_shape *s, int t)
{
    int row = t * 128 + 127 < s->len_q ? t * 128 + 127 : s->len_q - 1; /* last valid row */
    return nv_visible_blocks(nv_last_key(s, row));
}

size_t nv_tile_rows(const sa_shape *s, int lh) { return (size_t)s->batch * lh * sa_q_tiles(s); }

void nv_fill_rows(sa_rng *r, const sa_shape *s, int32_t *idx, int32_t *counts, size_t rows,
                  int per, int tiles, int k, int causal, int future, int last_empty)
{
    const int nb = sa_kv_blocks(s);
    int32_t *perm = nv_malloc((size_t)nb * sizeof *perm);
    for (size_t row = 0; row < rows; row++) {
        int x = (int)(row % (size_t)per);
        int vis = !causal  ? nb
                  : tiles ? nv_tile_visible(s, x)
                          : nv_visible_blocks(nv_last_key(s, x));
        int most = k < vis ? k : vis;
        int c = most == 0 || (last_empty && rows > 1 && row == rows - 1) || sa_rng_below(r, 6) == 0
                    ? 0
                    : 1 + (int)sa_rng_below(r, (uint32_t)most);
        for (int b = 0; b < vis; b++)
            perm[b] = b;
        for (int j = 0; j < c; j++) {
            int m = j + (int)sa_rng_below(r, (uint32_t)(vis - j));
            int32_t t = perm[j];
            perm[j] = perm[m];
            perm[m] = t;
        }
        int32_t *out = idx + row * (size_t)k;
        for (int j = 0; j < k; j++)
            out[j] = j < c ? perm[j] : -1;
        if (future && c < k && vis < nb) {
            int at = (int)sa_rng_below(r, (uint32_t)c + 1);
            out[c] = out[at];
            out[at] = vis + (int)sa_rng_below(r, (uint32_t)(nb - vis));
            c++;
        }
        counts[row] = c;
    }
    free(perm);
}

int nv_has_future(const sa_shape *s, const int32_t *idx, const int32_t *counts, size_t rows,
                  int per, int tiles, int k)
{
    for (size_t row = 0; row < rows; row++) {
        int x = (int)(row % (size_t)per);
        int vis = tiles ? nv_tile_visible(s, x) : nv_visible_blocks(nv_last_key(s, x));
        for (int j = 0; j < counts[row]; j++)
            if (idx[row * k + j] >= vis)
                return 1;
    }
    return 0;
}

void nv_full_lists(sa_rng *r, const sa_shape *s, int k, int32_t **tidx, int32_t **tcnt,
                   size_t *trows, int32_t **qidx, int32_t **qcnt, size_t *qrows)
{
    *trows = nv_tile_rows(s, s->heads_kv);
    *qrows = sa_query_rows(s);
    *tidx = nv_malloc(*trows * k * sizeof **tidx);
    *tcnt = nv_malloc(*trows * sizeof **tcnt);
    *qidx = nv_malloc(*qrows * k * sizeof **qidx);
    *qcnt = nv_malloc(*qrows * sizeof **qcnt);
    ck_assert_int_eq(sa_random_tile_lists(s, s->heads_kv, k, 0, sa_rng_u64(r), *tidx), 0);
    ck_assert_int_eq(sa_random_query_lists(s, k, sa_rng_u64(r), *qidx), 0);
    for (size_t i = 0; i < *trows; i++)
        (*tcnt)[i] = k;
    for (size_t i = 0; i < *qrows; i++)
        (*qcnt)[i] = k;
}

const nv_bad_shape nv_bad_shapes[] = {
    {{0, 4, 2, 130, 300, 64}, SA_ERR_SHAPE},   {{1, 0, 2, 130, 300, 64}, SA_ERR_SHAPE},
    {{1, 4, 0, 130, 300, 64}, SA_ERR_SHAPE},   {{1, 4, 2, -1, 300, 64}, SA_ERR_SHAPE},
    {{1, 4, 2, 130, 0, 64}, SA_ERR_SHAPE},     {{1, 4, 2, 130, 300, 0}, SA_ERR_SHAPE},
    {{1, 3, 2, 130, 300, 64}, SA_ERR_GQA},     {{1, 4, 2, 130, 300, 96}, SA_ERR_HEAD_DIM},
    {{1, 4, 2, 130, 300, 512}, SA_ERR_HEAD_DIM},
    {{1 << 30, 1 << 30, 1 << 30, 16, 16, 64}, SA_ERR_SHAPE},
    {{1, 1, 1, INT32_MAX, 128, 64}, SA_ERR_SHAPE},
    {{1, 1, 1, 128, 16777215 * 128 + 1, 64}, SA_ERR_SHAPE},
};
const int nv_nbad = (int)(sizeof nv_bad_shapes / sizeof nv_bad_shapes[0]);
