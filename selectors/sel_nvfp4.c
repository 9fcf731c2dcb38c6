/* nvfp4 / nvfp4_query: the scorer after MiniMax's MSA indexer. Index vectors (by default the
 * attention's own Q and K) are quantized to NVFP4 (nvfp4.c), dequantized to FP32, and a query
 * scores a block by the largest dot product with the block's valid keys (FP32 GEMM through
 * OpenBLAS). "nvfp4" shares one list per (tile, KV head): max over the tile's valid queries and
 * the group's heads. "nvfp4_query" keeps a list per (query, KV head): max over the group's heads. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sel_cuda.h"
#include "sel_internal.h"

#define ROW_CHUNK 512 /* query rows per GEMM: bounds the score buffer to 512 x len_kv floats */

/* x (n BF16) -> quantize -> dequantize, as FP32 (malloc'ed into *out). */
static int nvfp4_roundtrip(const uint16_t *x, size_t n, float **out)
{
    sa_nvfp4 qz = {.values = malloc(n / 2), .scales = malloc(n / 16)};
    float *f = malloc(n * sizeof *f);
    int err = SA_ERR_NOMEM;
    if (qz.values && qz.scales && f) {
        err = sa_nvfp4_quantize_bf16(x, n, &qz);
        if (!err)
            err = sa_nvfp4_dequantize(&qz, f);
    }
    free(qz.values);
    free(qz.scales);
    if (err) {
        free(f);
        f = NULL;
    }
    *out = f;
    return err;
}

/* bmax is (B, Hq, Sq, kv_blocks): for each query, the max dot product over each block's keys. */
static int block_max_scores(const sel_ctx *c, float *bmax)
{
    const sa_shape *s = &c->s;
    const int dim = c->dim, n = c->kv_blocks;
    float *qd = NULL, *kd = NULL;
    int err = nvfp4_roundtrip(c->q, (size_t)s->batch * s->heads_q * s->len_q * dim, &qd);
    if (!err)
        err = nvfp4_roundtrip(c->k, (size_t)s->batch * s->heads_kv * s->len_kv * dim, &kd);
    int rows_max = s->len_q < ROW_CHUNK ? s->len_q : ROW_CHUNK;
    float *sc = err ? NULL : malloc((size_t)rows_max * s->len_kv * sizeof *sc);
    if (!err && !sc)
        err = SA_ERR_NOMEM;
    for (int bh = 0; !err && bh < s->batch * s->heads_q; bh++) {
        int b = bh / s->heads_q, hkv = (bh % s->heads_q) / c->group;
        const float *kb = kd + ((size_t)b * s->heads_kv + hkv) * s->len_kv * dim;
        for (int r0 = 0; r0 < s->len_q; r0 += ROW_CHUNK) {
            int rows = s->len_q - r0 < ROW_CHUNK ? s->len_q - r0 : ROW_CHUNK;
            const float *qb = qd + ((size_t)bh * s->len_q + r0) * dim;
            /* sc (rows x len_kv) = qb (rows x dim) . kb^T; OpenBLAS threads it internally. */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, s->len_kv, dim, 1.0f, qb,
                        dim, kb, dim, 0.0f, sc, s->len_kv);
#pragma omp parallel for schedule(static)
            for (int i = 0; i < rows; i++) {
                const float *srow = sc + (size_t)i * s->len_kv;
                float *out = bmax + ((size_t)bh * s->len_q + r0 + i) * n;
                for (int blk = 0; blk < n; blk++) {
                    int len = sa_block_len(s, blk);
                    float m = -INFINITY;
                    for (int j = 0; j < len; j++)
                        m = srow[blk * SA_TILE + j] > m ? srow[blk * SA_TILE + j] : m;
                    out[blk] = m;
                }
            }
        }
    }
    free(sc);
    free(qd);
    free(kd);
    return err;
}

static int nvfp4_select(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                        const sa_select_params *p, int per_query, int32_t *indices,
                        int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin(s, q, k, p, indices, 1, 1, &c);
    if (err)
        return err;
    const int n = c.kv_blocks, kk = c.k_sel;
    float *bmax = malloc((size_t)s->batch * s->heads_q * s->len_q * n * sizeof *bmax);
    if (!bmax)
        return SA_ERR_NOMEM;
    err = block_max_scores(&c, bmax);
    if (err) {
        free(bmax);
        return err;
    }
    /* A row is one (b, hkv, tile) or one (b, hkv, query); it spans queries [i0, i1). */
    const int per_bh = per_query ? s->len_q : c.q_tiles;
    const int rows = s->batch * s->heads_kv * per_bh;
    int oom = 0;
#pragma omp parallel reduction(| : oom)
    {
        sel_row w;
        const int w_oom = sel_row_init(&w, n, kk);
        float *score = w.score;
        if (w_oom)
            oom = 1;
#pragma omp for schedule(dynamic, 16)
        for (int r = 0; r < rows; r++) {
            if (oom)
                continue;
            int bh = r / per_bh, x = r % per_bh;
            int b = bh / s->heads_kv, hkv = bh % s->heads_kv;
            int i0 = per_query ? x : x * SA_TILE;
            int i1 = per_query ? x + 1 : (i0 + SA_TILE < s->len_q ? i0 + SA_TILE : s->len_q);
            for (int blk = 0; blk < n; blk++)
                score[blk] = -INFINITY;
            for (int j = 0; j < c.group; j++) {
                size_t hq = (size_t)b * s->heads_q + (size_t)hkv * c.group + j;
                for (int i = i0; i < i1; i++) {
                    const float *src = bmax + (hq * s->len_q + i) * n;
                    for (int blk = 0; blk < n; blk++)
                        score[blk] = src[blk] > score[blk] ? src[blk] : score[blk];
                }
            }
            int tile = per_query ? x / SA_TILE : x;
            sel_row_pick(&w, kk, sel_diag_of_tile(&c, tile), c.keep_sink,
                         indices + (size_t)r * kk);
        }
        sel_row_free(&w);
    }
    free(bmax);
    if (oom)
        return SA_ERR_NOMEM;
    sel_fill_counts(counts, (size_t)rows, kk);
    return SA_OK;
}

static int nvfp4_tile_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                          const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_select(s, q, k, p, 0, indices, counts);
}

static int nvfp4_query_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_select(s, q, k, p, 1, indices, counts);
}

const sa_selector sa_selector_nvfp4 = {
    .name = "nvfp4",
    .description = "NVFP4 index vectors, max dot over a block's keys, max over tile and heads",
    .per_query = 0,
    .cpu = nvfp4_tile_cpu,
    .cuda = SEL_CUDA(sel_nvfp4_cuda),
};

const sa_selector sa_selector_nvfp4_query = {
    .name = "nvfp4_query",
    .description = "NVFP4 scorer with a list per query (MSA's choice), max over the group's heads",
    .per_query = 1,
    .cpu = nvfp4_query_cpu,
    .cuda = SEL_CUDA(sel_nvfp4_query_cuda),
};
