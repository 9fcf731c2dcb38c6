/* Exact dense attention mass per KV block, and the recall of block lists against it. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

#define ROW_CHUNK 512 /* query rows per GEMM */

int sa_block_mass(const sa_shape *s, const uint16_t *q, const uint16_t *k, float *mass)
{
    if (!s || !q || !k || !mass)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
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
                float m = -INFINITY;
                for (int j = 0; j < s->len_kv; j++)
                    m = srow[j] > m ? srow[j] : m;
                double total = 0.0;
                for (int blk = 0; blk < n; blk++) {
                    int len = sa_block_len(s, blk);
                    double acc = 0.0;
                    for (int j = 0; j < len; j++)
                        acc += expf(srow[blk * SA_TILE + j] - m);
                    out[blk] = (float)acc;
                    total += acc;
                }
                for (int blk = 0; blk < n; blk++)
                    out[blk] = (float)(out[blk] / total);
            }
        }
    }
    free(qf);
    free(kf);
    free(sc);
    return err;
}

int sa_lists_recall(const sa_shape *s, const float *mass, int per_query, const int32_t *indices,
                    int k, float *recall)
{
    if (!s || !mass || !indices || !recall)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    const int n = sa_kv_blocks(s), tiles = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    if (k <= 0 || k > n || !sa_flag_ok(per_query))
        return SA_ERR_ARG;
    const size_t queries = sa_lse_elems(s);
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (size_t r = 0; r < queries; r++) {
        size_t i = r % (size_t)s->len_q, bh = r / (size_t)s->len_q;
        size_t b = bh / (size_t)s->heads_q, hkv = (bh % (size_t)s->heads_q) / (size_t)group;
        size_t row = per_query ? (b * s->heads_kv + hkv) * s->len_q + i
                               : (b * s->heads_kv + hkv) * tiles + i / SA_TILE;
        const int32_t *list = indices + row * (size_t)k;
        double acc = 0.0;
        for (int j = 0; j < k; j++) {
            if (list[j] < 0 || list[j] >= n) {
                bad = 1;
                break;
            }
            acc += mass[r * n + list[j]];
        }
        recall[r] = (float)acc;
    }
    return bad ? SA_ERR_INDEX : SA_OK;
}
