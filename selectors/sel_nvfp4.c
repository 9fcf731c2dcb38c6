/* nvfp4 / nvfp4_query: the scorer after MiniMax's MSA indexer. Index vectors (by default the
 * attention's own Q and K; with index_heads, Hi index heads of their own) are quantized to NVFP4
 * (nvfp4.c), and a query scores a block by the largest dot product of the dequantized vectors
 * with the block's valid keys, computed exactly (block_max_scores: a double GEMM through
 * OpenBLAS of the values without their tensor scales). "nvfp4" shares one list per (tile, KV
 * head): max over the tile's valid queries and the group's heads (or the index heads they map
 * to). "nvfp4_query" keeps a list per (query, KV head): max over the same heads. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sel_cuda.h"
#include "sel_internal.h"

/* Exact scoring. The unscaled decoded value of an element, E2M1(code) * E4M3(scale), is a * c *
 * 2^-10 with integers |a| <= 12 (E2M1 = a/2) and 0 <= c <= 448 * 512 (E4M3 = c/512; the quantizer
 * never writes the NaN code), so |value| <= 2688 and it is exact in float and in double. The
 * product of a Q and a K element is an integer multiple of 2^-20 of magnitude <= 2688^2, so every
 * partial sum of a dot of D such products is a multiple of 2^-20 of magnitude <= D * 2688^2: exact
 * in double (integers times 2^-20 up to 2^53 * 2^-20) while D <= 2^33 / 2688^2 = 1188.9. The dims
 * scored are head_dim (64, 128 or 256, sa_shape_check) or index_dim <= SA_MAX_INDEX_DIM = 1024, so
 * cblas_dgemm returns the exact dot whatever kernel, blocking, FMA or thread split OpenBLAS picks
 * for a column: equal vectors give bit-equal scores. The two tensor scales come last, once per
 * score, as on the GPU (sel_nvfp4.cu): score = (float)dot * (ts_q * ts_k) in FP32. */
_Static_assert((unsigned long long)SA_MAX_INDEX_DIM * 2688 * 2688 <= 1ULL << 33,
               "NVFP4 dots of SA_MAX_INDEX_DIM products would not be exact in double");

#define ROW_CHUNK 256 /* query rows per GEMM: bounds the score buffer to 256 x len_kv doubles */

/* x (n BF16) -> NVFP4 codes and scales (malloc'ed into *q) and its tensor scale. */
static int nvfp4_codes(const uint16_t *x, size_t n, sa_nvfp4 *q)
{
    q->values = malloc(n / 2);
    q->scales = malloc(n / 16);
    if (!q->values || !q->scales)
        return SA_ERR_NOMEM;
    return sa_nvfp4_quantize_bf16(x, n, q);
}

/* Elements [i0, i0 + n) of q, decoded without the tensor scale: E2M1(code) * E4M3(scale), exact
 * (see above). i0 and n are multiples of 16 (whole vectors of a dim that is one). */
static void decode_unscaled(const sa_nvfp4 *q, size_t i0, size_t n, double *out)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        size_t e = i0 + i;
        uint8_t byte = q->values[e / 2];
        out[i] = (double)sa_e2m1_to_f32(e % 2 ? byte >> 4 : byte & 0xF) *
                 (double)sa_e4m3_to_f32(q->scales[e / 16]);
    }
}

/* bmax is (B, c->qh, Sq, kv_blocks): for each query of each scored query head (a query head, or
 * an index head), the max dot product with the keys of its key head (sel_khead_of) over each
 * block; with c->causal over the keys of the block the query sees (-inf for a block wholly after
 * its last visible key), so no invisible key ever raises a score. */
static int block_max_scores(const sel_ctx *c, float *bmax)
{
    const sa_shape *s = &c->s;
    const int dim = c->dim, n = c->kv_blocks;
    sa_nvfp4 qz = {0}, kz = {0};
    int err = nvfp4_codes(c->q, (size_t)s->batch * c->qh * s->len_q * dim, &qz);
    if (!err)
        err = nvfp4_codes(c->k, (size_t)s->batch * c->kh * s->len_kv * dim, &kz);
    /* One rounding: the exact dot (max over a block's keys) to FP32, times this FP32 product. */
    const float scale = qz.tensor_scale * kz.tensor_scale;
    const int rows_max = s->len_q < ROW_CHUNK ? s->len_q : ROW_CHUNK;
    double *kd = NULL, *qd = NULL, *sc = NULL;
    if (!err) {
        kd = malloc((size_t)s->len_kv * dim * sizeof *kd);
        qd = malloc((size_t)rows_max * dim * sizeof *qd);
        sc = malloc((size_t)rows_max * s->len_kv * sizeof *sc);
        if (!kd || !qd || !sc)
            err = SA_ERR_NOMEM;
    }
    /* The scored query heads that pair with key head hk: [hk * per, (hk + 1) * per). */
    const int per = c->qh / c->kh;
    for (int bkv = 0; !err && bkv < s->batch * c->kh; bkv++) {
        int b = bkv / c->kh, hk = bkv % c->kh;
        decode_unscaled(&kz, (size_t)bkv * s->len_kv * dim, (size_t)s->len_kv * dim, kd);
        for (int j = 0; j < per; j++) {
            int bh = b * c->qh + hk * per + j;
            for (int r0 = 0; r0 < s->len_q; r0 += ROW_CHUNK) {
                int rows = s->len_q - r0 < ROW_CHUNK ? s->len_q - r0 : ROW_CHUNK;
                decode_unscaled(&qz, ((size_t)bh * s->len_q + r0) * dim, (size_t)rows * dim, qd);
                /* sc (rows x len_kv) = qd (rows x dim) . kd^T, exact; OpenBLAS threads it. */
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, s->len_kv, dim, 1.0,
                            qd, dim, kd, dim, 0.0, sc, s->len_kv);
#pragma omp parallel for schedule(static)
                for (int i = 0; i < rows; i++) {
                    const double *srow = sc + (size_t)i * s->len_kv;
                    float *out = bmax + ((size_t)bh * s->len_q + r0 + i) * n;
                    /* Causal: keys j <= last; without, every key. */
                    const long long last = c->causal ? (long long)r0 + i + s->len_kv - s->len_q
                                                     : (long long)s->len_kv;
                    for (int blk = 0; blk < n; blk++) {
                        long long vis = last - (long long)blk * SA_TILE + 1;
                        int len = sa_block_len(s, blk);
                        len = vis < len ? (vis > 0 ? (int)vis : 0) : len;
                        double m = -INFINITY;
                        for (int t = 0; t < len; t++)
                            m = srow[blk * SA_TILE + t] > m ? srow[blk * SA_TILE + t] : m;
                        /* Rounding is monotone, so the max may come before it. */
                        out[blk] = len ? (float)m * scale : -INFINITY;
                    }
                }
            }
        }
    }
    free(sc);
    free(qd);
    free(kd);
    free(qz.values);
    free(qz.scales);
    free(kz.values);
    free(kz.scales);
    return err;
}

static int nvfp4_select(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                        const sa_select_params *p, int per_query, int32_t *indices,
                        int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1,
                            per_query ? SEL_MODES_GROUP : SEL_MODES_HEADS, &c);
    if (err)
        return err;
    const int n = c.kv_blocks;
    float *bmax = malloc((size_t)s->batch * c.qh * s->len_q * n * sizeof *bmax);
    if (!bmax)
        return SA_ERR_NOMEM;
    err = block_max_scores(&c, bmax);
    if (err) {
        free(bmax);
        return err;
    }
    /* A row is one (b, hkv, tile) or one (b, hkv, query); it spans queries [i0, i1). */
    const int per_bh = per_query ? s->len_q : c.q_tiles;
    const int rows = s->batch * c.list_heads * per_bh;
    int oom = 0;
#pragma omp parallel
    {
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, 0);
        float *score = w.score;
#pragma omp for schedule(dynamic, 16)
        for (int r = 0; r < rows; r++) {
            if (failed)
                continue;
            int bh = r / per_bh, x = r % per_bh;
            int b = bh / c.list_heads, lh = bh % c.list_heads;
            int i0 = per_query ? x : x * SA_TILE;
            int i1 = per_query ? x + 1 : (i0 + SA_TILE < s->len_q ? i0 + SA_TILE : s->len_q);
            for (int blk = 0; blk < n; blk++)
                score[blk] = -INFINITY;
            /* The list's query heads, or the index heads they map to. */
            int h0;
            const int nh = sel_list_qheads(&c, lh, &h0);
            for (int j = 0; j < nh; j++) {
                size_t hq = (size_t)b * c.qh + (size_t)h0 + j;
                for (int i = i0; i < i1; i++) {
                    const float *src = bmax + (hq * s->len_q + i) * n;
                    for (int blk = 0; blk < n; blk++)
                        score[blk] = src[blk] > score[blk] ? src[blk] : score[blk];
                }
            }
            sel_row_emit(&w, &c, per_query, x, (size_t)r, indices, counts);
        }
        sel_row_free(&w);
    }
    free(bmax);
    return oom ? SA_ERR_NOMEM : SA_OK;
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
    .head_lists = SEL_MODES_HEADS,
    .cuda_head_lists = SEL_CUDA_MODES(SEL_MODES_HEADS),
};

const sa_selector sa_selector_nvfp4_query = {
    .name = "nvfp4_query",
    .description = "NVFP4 scorer with a list per query (MSA's choice), max over the group's heads",
    .per_query = 1,
    .cpu = nvfp4_query_cpu,
    .cuda = SEL_CUDA(sel_nvfp4_query_cuda),
    .head_lists = SEL_MODES_GROUP,
    .cuda_head_lists = SEL_CUDA_MODES(SEL_MODES_GROUP),
};
