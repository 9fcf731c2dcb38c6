/* Exact dense attention mass per KV block (optionally causal), and the recall of block lists
 * against it. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

#define ROW_CHUNK 512 /* query rows per GEMM */

/* mass is (B, Hq, Sq, kv_blocks); q (B, Hq, Sq, D), k (B, Hkv, Skv, D). Causal: query i's
 * softmax runs over keys j <= i + (len_kv - len_q) only (all zeros when there are none). */
int sa_block_mass_opts(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                       const sa_attn_opts *opts, float *mass)
{
    if (!s || !q || !k || !mass)
        return SA_ERR_NULL;
    int err = sel_shape_opts_check(s, opts);
    if (err)
        return err;
    const int causal = opts ? opts->causal : 0;
    const int dim = s->head_dim, n = sa_kv_blocks(s), group = s->heads_q / s->heads_kv;
    const float scale = 1.0f / sqrtf((float)dim);
    float *qf = sel_to_f32(q, sa_q_elems(s));
    float *kf = sel_to_f32(k, sa_kv_elems(s));
    int rows_max = s->len_q < ROW_CHUNK ? s->len_q : ROW_CHUNK;
    float *sc = sa_sz_malloc(sa_sz_mul(rows_max, s->len_kv), sizeof *sc);
    if (!qf || !kf || !sc)
        err = SA_ERR_NOMEM;
    for (int bh = 0; !err && bh < s->batch * s->heads_q; bh++) {
        int b = bh / s->heads_q, hkv = (bh % s->heads_q) / group;
        const float *kb = kf + ((size_t)b * s->heads_kv + hkv) * s->len_kv * dim;
        for (int r0 = 0; r0 < s->len_q; r0 += ROW_CHUNK) {
            int rows = s->len_q - r0 < ROW_CHUNK ? s->len_q - r0 : ROW_CHUNK;
            /* Products of BF16 values are exact in FP32; only the sums round. */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, s->len_kv, dim, scale,
                        qf + ((size_t)bh * s->len_q + r0) * dim, dim, kb, dim, 0.0f, sc,
                        s->len_kv);
#pragma omp parallel for schedule(static)
            for (int i = 0; i < rows; i++) {
                const float *srow = sc + (size_t)i * s->len_kv;
                float *out = mass + ((size_t)bh * s->len_q + r0 + i) * n;
                /* The keys the query sees: [0, nk), all of them without causal. */
                long long last = (long long)r0 + i + s->len_kv - s->len_q;
                int nk = !causal ? s->len_kv : last < 0 ? 0 : (int)last + 1;
                float m = -INFINITY;
                for (int j = 0; j < nk; j++)
                    m = srow[j] > m ? srow[j] : m;
                double total = 0.0;
                for (int blk = 0; blk < n; blk++) {
                    int len = sa_block_len(s, blk), j0 = blk * SA_TILE;
                    len = nk - j0 < len ? (nk - j0 > 0 ? nk - j0 : 0) : len;
                    double acc = 0.0;
                    for (int j = 0; j < len; j++)
                        acc += expf(srow[j0 + j] - m);
                    out[blk] = (float)acc;
                    total += acc;
                }
                for (int blk = 0; blk < n; blk++)
                    out[blk] = total > 0 ? (float)(out[blk] / total) : 0.0f;
            }
        }
    }
    free(qf);
    free(kf);
    free(sc);
    return err;
}

int sa_block_mass(const sa_shape *s, const uint16_t *q, const uint16_t *k, float *mass)
{
    return sa_block_mass_opts(s, q, k, NULL, mass);
}

int sa_lists_recall(const sa_shape *s, const float *mass, int per_query, const int32_t *indices,
                    int k, float *recall)
{
    return sa_lists_recall_counts(s, mass, per_query, indices, NULL, k, recall);
}

int sel_lists_recall(const sa_shape *s, const float *mass, int per_query, int list_heads,
                     const int32_t *indices, const int32_t *counts, int k, float *recall)
{
    const int n = sa_kv_blocks(s), tiles = sa_q_tiles(s), per = s->heads_q / list_heads;
    const size_t queries = sa_lse_elems(s);
    /* Every row first, in order: the first bad row's code (its count, then its entries, as the
     * list validators), and a call that fails writes nothing. Each row serves some query, so
     * these are exactly the rows the loop below reads. */
    const size_t rows = (size_t)s->batch * list_heads * (size_t)(per_query ? s->len_q : tiles);
    const int err = sel_rows_check(indices, counts, k, rows, n);
    if (err)
        return err;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < queries; r++) {
        /* r = (b * Hq + h) * Sq + i reads the row of list head h / (Hq / list_heads) */
        size_t i = r % (size_t)s->len_q, bh = r / (size_t)s->len_q;
        size_t b = bh / (size_t)s->heads_q, lh = (bh % (size_t)s->heads_q) / (size_t)per;
        size_t row = per_query ? (b * list_heads + lh) * s->len_q + i
                               : (b * list_heads + lh) * tiles + i / SA_TILE;
        const int32_t *list = indices + row * (size_t)k;
        const int c = counts ? counts[row] : k;
        double acc = 0.0;
        for (int j = 0; j < c; j++)
            acc += mass[r * n + list[j]];
        recall[r] = (float)acc;
    }
    return SA_OK;
}

int sel_rows_check(const int32_t *indices, const int32_t *counts, int k, size_t rows, int n)
{
    for (size_t row = 0; row < rows; row++) {
        const int c = counts ? counts[row] : k;
        if (c < 0 || c > k)
            return SA_ERR_COUNT;
        for (int j = 0; j < c; j++)
            if (indices[row * (size_t)k + j] < 0 || indices[row * (size_t)k + j] >= n)
                return SA_ERR_INDEX;
    }
    return SA_OK;
}

int sel_recall_args(const sa_shape *s, int per_query, int k)
{
    return k <= 0 || k > sa_kv_blocks(s) || !sa_flag_ok(per_query) ? SA_ERR_ARG : SA_OK;
}

/* indices (rows, k) and counts (rows) or NULL, rows as a selector writes them; recall
 * (B, Hq, Sq). A row's entries past its count are not read. */
int sa_lists_recall_counts(const sa_shape *s, const float *mass, int per_query,
                           const int32_t *indices, const int32_t *counts, int k, float *recall)
{
    if (!s || !mass || !indices || !recall)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if ((err = sel_recall_args(s, per_query, k)))
        return err;
    return sel_lists_recall(s, mass, per_query, s->heads_kv, indices, counts, k, recall);
}
