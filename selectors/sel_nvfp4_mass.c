/* nvfp4_mass: the oracle's ranking computed from NVFP4 index vectors. A tile's score for a block
 * is the sum, over the tile's valid queries and the list's scored heads (sel_list_qheads), of the
 * softmax probability that falls in the block, where the softmax runs over the query's visible
 * keys with scores q'.k' / sqrt(dim) of the NVFP4-dequantized vectors (tensor scales included).
 *
 * Why: nvfp4 ranks a block by its single largest score, the oracle by its mass. On real
 * activations the two disagree where a block holds many moderately attended keys (docs/quality.md):
 * this selector asks how much of the oracle's advantage survives 4-bit index vectors. It does
 * the scorer's dot products plus one exp per (query, visible key), so it costs about what the
 * QK^T and softmax of dense attention cost in the index geometry; with a few index heads (MSA's
 * geometry) that is a fraction of the attention's own heads. On the GPU too: nvfp4's quantizer
 * and scorer, the scorer's GEMMs run twice (sel_nvfp4.cu, nvfp4_mass_cuda).
 *
 * nvfp4_mass_q8 asks the same question of every 8th query of a tile only (the tile's last query
 * and every 8th before it: 16 of 128), for an eighth of the cost: a tile's list serves all its
 * queries, and the block masses of neighbouring queries are close, so a sample may rank the
 * blocks nearly as the whole tile does (docs/quality.md measures how nearly).
 *
 * Precision: the dequantized values in FP32 (E2M1 * E4M3 is exact there, the tensor scale rounds
 * once), dots by cblas_sgemm, the softmax and the block sums in double. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "ref_internal.h" /* ref_blas_single_begin / _end */
#include "sa_checked.h"
#include "sel_cuda.h"
#include "sel_internal.h"

/* x (n BF16) -> NVFP4 -> FP32 values with the tensor scale (malloc'ed), or NULL. *err says why. */
static float *nvfp4_values(const uint16_t *x, size_t n, int *err)
{
    sa_nvfp4 z = {malloc(n / 2), malloc(n / 16), 0.0f, 0};
    float *out = sa_sz_malloc((int64_t)n, sizeof *out);
    *err = z.values && z.scales && out ? SA_OK : SA_ERR_NOMEM;
    if (!*err)
        *err = sa_nvfp4_quantize_bf16(x, n, &z);
    if (!*err)
        *err = sa_nvfp4_dequantize(&z, out);
    free(z.values);
    free(z.scales);
    if (*err) {
        free(out);
        return NULL;
    }
    return out;
}

/* nvfp4_mass_q8's sample: the tile's queries m - 1, m - 1 - 8, ... (m valid ones). */
#define SEL_MASS_SAMPLE_STRIDE 8

/* The mass over the queries i = m - 1 - stride u of each tile (stride 1: every query). */
static int mass_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                    const sa_select_params *p, int32_t *indices, int32_t *counts, int stride)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, SEL_MODES_MASS, &c);
    if (err)
        return err;
    const int n = c.kv_blocks, dim = c.dim;
    float *qf = nvfp4_values(c.q, (size_t)s->batch * c.qh * s->len_q * dim, &err);
    float *kf = err ? NULL : nvfp4_values(c.k, (size_t)s->batch * c.kh * s->len_kv * dim, &err);
    if (err) {
        free(qf);
        return err;
    }
    const double scale = 1.0 / sqrt((double)dim);
    const long long off = (long long)s->len_kv - s->len_q; /* causal: keys j <= i + off */
    if ((err = sel_pool_begin(&c))) {
        free(qf);
        free(kf);
        return err;
    }
    const int rows = s->batch * c.list_heads * c.q_tiles;
    int oom = 0;
    ref_blas_single_begin(); /* the rows run in parallel: OpenBLAS's own pool would oversubscribe */
#pragma omp parallel
    {
        double *acc = malloc((size_t)n * sizeof *acc);
        double *part = malloc((size_t)n * sizeof *part); /* one query's unnormalized block sums */
        float *sc = sa_sz_malloc(sa_sz_mul(SA_TILE, s->len_kv), sizeof *sc);
        float *qs = sa_sz_malloc(sa_sz_mul(SA_TILE, dim), sizeof *qs); /* the sampled rows */
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, !acc || !part || !sc || !qs);
#pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < rows; r++) {
            if (failed)
                continue;
            const int t = r % c.q_tiles, bh = r / c.q_tiles;
            const int b = bh / c.list_heads, lh = bh % c.list_heads;
            const int i0 = t * SA_TILE, m = s->len_q - i0 < SA_TILE ? s->len_q - i0 : SA_TILE;
            for (int blk = 0; blk < n; blk++)
                acc[blk] = 0.0;
            int h0;
            const int nh = sel_list_qheads(&c, lh, &h0);
            const int ms = (m + stride - 1) / stride; /* sampled rows: i = m - 1 - stride u */
            for (int j = 0; j < nh; j++) {
                const int h = h0 + j, hk = sel_khead_of(&c, h);
                const float *qt = qf + (((size_t)b * c.qh + h) * s->len_q + i0) * dim;
                const float *kt = kf + ((size_t)b * c.kh + hk) * s->len_kv * dim;
                if (stride > 1) {
                    for (int u = 0; u < ms; u++)
                        for (int d = 0; d < dim; d++)
                            qs[(size_t)u * dim + d] = qt[(size_t)(m - 1 - stride * u) * dim + d];
                    qt = qs;
                }
                /* sc (ms x len_kv) = Q_rows K^T, one thread's GEMM (the rows run in parallel) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ms, s->len_kv, dim, 1.0f,
                            qt, dim, kt, dim, 0.0f, sc, s->len_kv);
                for (int u = 0; u < ms; u++) {
                    const int i = stride > 1 ? m - 1 - stride * u : u;
                    const long long lim = c.causal ? i0 + i + off + 1 : s->len_kv;
                    const int nk = lim < 0 ? 0 : lim > s->len_kv ? s->len_kv : (int)lim;
                    if (nk == 0)
                        continue; /* sees no key: no mass */
                    const float *row = sc + (size_t)u * s->len_kv;
                    double mx = -INFINITY, z = 0.0;
                    for (int key = 0; key < nk; key++)
                        mx = row[key] * scale > mx ? row[key] * scale : mx;
                    /* One exp per key: the block sums and their total, then one division per
                     * block. */
                    const int nbk = (nk + SA_TILE - 1) / SA_TILE;
                    for (int blk = 0; blk < nbk; blk++) {
                        const int k1 = (blk + 1) * SA_TILE < nk ? (blk + 1) * SA_TILE : nk;
                        double e = 0.0;
                        for (int key = blk * SA_TILE; key < k1; key++)
                            e += exp(row[key] * scale - mx);
                        part[blk] = e;
                        z += e;
                    }
                    for (int blk = 0; blk < nbk; blk++)
                        acc[blk] += part[blk] / z;
                }
            }
            for (int blk = 0; blk < n; blk++)
                w.score[blk] = (float)acc[blk];
            sel_row_emit(&w, &c, 0, t, (size_t)r, indices, counts);
        }
        free(acc);
        free(part);
        free(sc);
        free(qs);
        sel_row_free(&w);
    }
    ref_blas_single_end();
    free(qf);
    free(kf);
    return sel_pool_end(&c, oom ? SA_ERR_NOMEM : SA_OK, indices, counts);
}

static int nvfp4_mass_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                          const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return mass_cpu(s, q, k, p, indices, counts, 1);
}

static int nvfp4_mass_q8_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                             const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return mass_cpu(s, q, k, p, indices, counts, SEL_MASS_SAMPLE_STRIDE);
}

const sa_selector sa_selector_nvfp4_mass = {
    .name = "nvfp4_mass",
    .description = "blocks of largest softmax mass from NVFP4 index vectors (the oracle's "
                   "ranking at 4 bits; dense QK^T + softmax cost in the index geometry)",
    .per_query = 0,
    .cpu = nvfp4_mass_cpu,
    .cuda = SEL_CUDA(sel_nvfp4_mass_cuda),
    .head_lists = SEL_MODES_MASS,
    .cuda_head_lists = SEL_CUDA_MODES(SEL_MODES_MASS),
};

const sa_selector sa_selector_nvfp4_mass_q8 = {
    .name = "nvfp4_mass_q8",
    .description = "nvfp4_mass over every 8th query of a tile (16 of 128, the last one "
                   "included): an eighth of its cost",
    .per_query = 0,
    .cpu = nvfp4_mass_q8_cpu,
    .cuda = NULL,
    .head_lists = SEL_MODES_MASS,
};
