/*
 * The exact CPU reference, per-query path: sa_ref_query_sparse, sa_ref_query_partials and
 * sa_ref_combine (the ground truth of the KV-centric kernels).
 *
 * Queries of one tile may select different blocks, so nothing is shared across a tile. Instead
 * K and V of one (batch, KV head) are converted to FP32 once, and each query works on its blocks
 * in place (a block is 128 contiguous rows, so it is a plain sgemm operand): the G = Hq / Hkv
 * query heads of the GQA group form the rows of each product, which shares every K/V read
 * across the group.
 *
 * Causal: all heads of the group share the query position, so a block's visible keys are one
 * prefix of it for the whole group (ref_causal_block_len): a query reads that prefix, and a
 * block wholly after its last visible key is not read at all. No logit is ever masked.
 */
#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "ref_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"
#include "sa_omp.h"

typedef struct query_job {
    const sa_shape *s;
    const uint16_t *q, *k, *v;
    const float *kf, *vf; /* (Skv, D) FP32 K and V of the current (b, hkv) */
    const int32_t *indices, *counts;
    int max_blocks;
    int causal; /* 1: query i sees keys j <= i + (len_kv - len_q) only */
    int b, hkv;
    const sa_outputs *out;          /* full attention, or */
    float *part_o, *part_lse;       /* one partial per slot */
} query_job;

typedef struct query_scratch {
    float *qg; /* (G, D) the group's query rows */
    float *s;  /* (G, keys) logits, then weights */
    float *og; /* (G, D) unnormalised P V */
    double *sum, *lse; /* (G) per-row softmax sums and LSEs */
} query_scratch;

static int scratch_alloc(query_scratch *t, int group, size_t keys, int d)
{
    t->qg = sa_sz_malloc(sa_sz_mul(group, d), sizeof(float));
    t->s = sa_sz_malloc(sa_sz_mul(group, (int64_t)keys), sizeof(float));
    t->og = sa_sz_malloc(sa_sz_mul(group, d), sizeof(float));
    t->sum = sa_sz_malloc(group, sizeof(double));
    t->lse = sa_sz_malloc(group, sizeof(double));
    return t->qg && t->s && t->og && t->sum && t->lse ? SA_OK : SA_ERR_NOMEM;
}

static void scratch_free(query_scratch *t)
{
    free(t->qg);
    free(t->s);
    free(t->og);
    free(t->sum);
    free(t->lse);
}

/* Loads the G query rows (heads hkv*G .. hkv*G+G-1, query i) as FP32 (G, D). */
static void load_group(const query_job *job, float *qg, int i)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    for (int g = 0; g < group; g++) {
        size_t row = ((size_t)job->b * s->heads_q + (size_t)job->hkv * group + g) * s->len_q + i;
        ref_bf16_to_f32(qg + (size_t)g * d, job->q + row * d, (size_t)d);
    }
}

/* Keys of block blk that query i reads: all its valid keys, or with causal the prefix up to
 * the query's last visible key (0 for a block wholly after it). */
static int query_block_len(const query_job *job, int blk, int i)
{
    int len = sa_block_len(job->s, blk);
    return job->causal ? ref_causal_block_len(blk, len, sa_geo_last_key(job->s, i)) : len;
}

/* Full attention of query i for its group: one softmax over all keys of its blocks (with causal
 * the keys it sees). The row's blocks are indices[(b, hkv, i)][0..count); S is (G, nk), O is
 * (G, D). */
static void query_item(const query_job *job, query_scratch *sc, int i)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    const float scale = ref_softmax_scale(d);
    size_t row = ((size_t)job->b * s->heads_kv + job->hkv) * s->len_q + i;
    const int32_t *idx = job->indices + row * (size_t)job->max_blocks;
    int count = job->counts ? job->counts[row] : job->max_blocks;
    size_t out_row0 = ((size_t)job->b * s->heads_q + (size_t)job->hkv * group) * s->len_q + i;

    size_t nk = 0;
    for (int j = 0; j < count; j++)
        nk += (size_t)query_block_len(job, idx[j], i);
    if (nk == 0) { /* no selected key: O = 0, LSE = -inf */
        for (int g = 0; g < group; g++)
            ref_store_row(job->out, out_row0 + (size_t)g * s->len_q, d, sc->og, 0.0, 0.0);
        return;
    }
    load_group(job, sc->qg, i);
    /* S[:, col .. col+len) = scale * Q_g K_blk^T, block by block, straight from the FP32 K. */
    size_t col = 0;
    for (int j = 0; j < count; j++) {
        int len = query_block_len(job, idx[j], i);
        if (len == 0)
            continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, len, d, scale, sc->qg, d,
                    job->kf + (size_t)idx[j] * SA_TILE * d, d, 0.0f, sc->s + col, (int)nk);
        col += (size_t)len;
    }
    ref_softmax_rows(sc->s, group, nk, sc->sum, sc->lse);
    /* O_g = sum over blocks of P[:, block] V_blk (beta = 1 accumulates after the first). */
    col = 0;
    for (int j = 0; j < count; j++) {
        int len = query_block_len(job, idx[j], i);
        if (len == 0)
            continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, group, d, len, 1.0f, sc->s + col,
                    (int)nk, job->vf + (size_t)idx[j] * SA_TILE * d, d, col ? 1.0f : 0.0f,
                    sc->og, d);
        col += (size_t)len;
    }
    for (int g = 0; g < group; g++)
        ref_store_row(job->out, out_row0 + (size_t)g * s->len_q, d, sc->og + (size_t)g * d,
                      sc->sum[g], sc->lse[g]);
}

/* Partials of query i: slot j is the attention over block indices[row][j] alone (with causal
 * over the keys of it the query sees), FP32, with its own LSE; slots at or past the row's count,
 * and with causal slots whose block lies wholly after the query's last visible key, get O = 0,
 * LSE = -inf. */
static void partial_item(const query_job *job, query_scratch *sc, int i)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv, mb = job->max_blocks;
    const float scale = ref_softmax_scale(d);
    size_t row = ((size_t)job->b * s->heads_kv + job->hkv) * s->len_q + i;
    const int32_t *idx = job->indices + row * (size_t)mb;
    int count = job->counts ? job->counts[row] : mb;
    size_t out_row0 = ((size_t)job->b * s->heads_q + (size_t)job->hkv * group) * s->len_q + i;

    if (count > 0)
        load_group(job, sc->qg, i);
    for (int j = 0; j < mb; j++) {
        int len = j < count ? query_block_len(job, idx[j], i) : 0;
        if (len) {
            size_t kv = (size_t)idx[j] * SA_TILE * d;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, len, d, scale, sc->qg, d,
                        job->kf + kv, d, 0.0f, sc->s, len);
            ref_softmax_rows(sc->s, group, (size_t)len, sc->sum, sc->lse);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, group, d, len, 1.0f, sc->s,
                        len, job->vf + kv, d, 0.0f, sc->og, d);
            for (int g = 0; g < group; g++) {
                size_t p = (out_row0 + (size_t)g * s->len_q) * mb + j;
                for (int c = 0; c < d; c++)
                    job->part_o[p * d + c] = (float)(sc->og[(size_t)g * d + c] / sc->sum[g]);
                job->part_lse[p] = (float)sc->lse[g];
            }
        } else {
            for (int g = 0; g < group; g++) {
                size_t p = (out_row0 + (size_t)g * s->len_q) * mb + j;
                memset(job->part_o + p * d, 0, (size_t)d * sizeof(float));
                job->part_lse[p] = -INFINITY;
            }
        }
    }
}

/* Converts K and V of each (b, hkv) once, then runs every query of it across OpenMP threads,
 * OpenBLAS held single-threaded (the parallelism is ours). */
static int run_queries(query_job *job, size_t max_keys, int partials)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    /* sgemm takes int sizes: a row's keys are the leading dimension of its logits. Only a row
     * with duplicate blocks and opts->validate = 0 can gather more than len_kv keys. */
    if (max_keys > (size_t)INT_MAX)
        return SA_ERR_UNSUPPORTED;
    const size_t kv_elems = (size_t)sa_sz_mul(s->len_kv, d);
    float *kf = sa_sz_malloc((int64_t)kv_elems, sizeof *kf);
    float *vf = sa_sz_malloc((int64_t)kv_elems, sizeof *vf);
    if (!kf || !vf) {
        free(kf);
        free(vf);
        return SA_ERR_NOMEM;
    }
    const uint16_t *k = job->k, *v = job->v;
    job->kf = kf;
    job->vf = vf;
    int oom = 0;
    ref_blas_single_begin();
#pragma omp parallel
    {
        query_scratch sc;
        const int failed = sa_omp_any_failed(
            &oom, scratch_alloc(&sc, group, partials ? SA_TILE : max_keys, d) != SA_OK);
        for (int bh = 0; !failed && bh < s->batch * s->heads_kv; bh++) { /* failed: uniform */
            size_t base = (size_t)bh * kv_elems;
            /* The implicit barriers of these two loops keep the conversion and the queries of
             * one (b, hkv) apart. */
#pragma omp for schedule(static)
            for (int r = 0; r < s->len_kv; r++) {
                ref_bf16_to_f32(kf + (size_t)r * d, k + base + (size_t)r * d, (size_t)d);
                ref_bf16_to_f32(vf + (size_t)r * d, v + base + (size_t)r * d, (size_t)d);
            }
#pragma omp single
            {
                job->b = bh / s->heads_kv;
                job->hkv = bh % s->heads_kv;
            }
#pragma omp for schedule(dynamic, 16)
            for (int i = 0; i < s->len_q; i++) {
                if (partials)
                    partial_item(job, &sc, i);
                else
                    query_item(job, &sc, i);
            }
        }
        scratch_free(&sc);
    }
    ref_blas_single_end();
    free(kf);
    free(vf);
    return oom ? SA_ERR_NOMEM : SA_OK;
}

/* Pointer checks shared by the two per-query entry points. */
static int check_query_call(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                            const uint16_t *v, const sa_query_lists *l)
{
    if (!s || !q || !k || !v || !l || !l->indices)
        return SA_ERR_NULL;
    return SA_OK;
}

/* Block-sparse attention with one block list per (batch, KV head, query).
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D); outputs as in sa_ref_dense.
 *   l->indices is (B, Hkv, Sq, max_blocks), l->counts (B, Hkv, Sq) or NULL. All G query heads of
 *   a KV head share its query's list. Softmax, empty rows and opts as in sa_ref_tile_sparse;
 *   with opts->causal a future block is one wholly after the query's own last visible key.
 *   Scratch: K and V of one (b, hkv) in FP32, plus G * (most keys of a row) floats per thread. */
int sa_ref_query_sparse(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                        const sa_query_lists *l, const sa_attn_opts *opts, const sa_outputs *out)
{
    sa_attn_opts o;
    int err = check_query_call(s, q, k, v, l);
    if (err || (err = ref_check_call(s, out, opts, &o)))
        return err;
    size_t max_keys;
    if ((err = ref_query_lists_ready(s, l, &o, &max_keys)))
        return err;
    query_job job = {.s = s, .q = q, .k = k, .v = v,
                     .indices = l->indices, .counts = l->counts, .max_blocks = l->max_blocks,
                     .causal = o.causal, .out = out};
    return run_queries(&job, max_keys, 0);
}

/* Partials for the KV-centric split: see sparseattn.h.
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D); lists as in sa_ref_query_sparse.
 *   part_o is (B, Hq, Sq, max_blocks, D) FP32, part_lse (B, Hq, Sq, max_blocks).
 *   opts NULL means defaults: validated, empty rows allowed, not causal. opts as in
 *   sa_ref_query_sparse: validate = 0 skips the duplicate, empty-row and future-block checks
 *   (counts and indices are bounds-checked regardless); causal masks each slot's block to the
 *   query's visible keys, a slot left with none gets O = 0, LSE = -inf. */
int sa_ref_query_partials_opts(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, const sa_query_lists *l,
                               const sa_attn_opts *opts, float *part_o, float *part_lse)
{
    int err = check_query_call(s, q, k, v, l);
    if (err)
        return err;
    if (!part_o || !part_lse)
        return SA_ERR_NULL;
    if ((err = sa_shape_check(s)))
        return err;
    if ((err = sa_query_lists_check_args(s, l)))
        return err;
    /* part_o holds B*Hq*Sq*max_blocks*D floats: the list's limit does not bound it (a GQA group
     * multiplies it), so it gets its own (sparseattn.h). */
    if (!sa_sz_within(sa_sz_mul3(sa_sz_lse_elems(s), l->max_blocks, s->head_dim), SA_MAX_ELEMS))
        return SA_ERR_MAX_BLOCKS;
    sa_attn_opts o;
    if ((err = ref_resolve_opts(opts, &o)))
        return err;
    if (o.validate && (err = sa_query_lists_check_opts(s, l, &o)))
        return err;
    /* Bounds of counts and indices, read even without validation (the keys are not needed: a
     * partial holds one block). */
    size_t max_keys;
    if (!o.validate && (err = ref_scan_rows(s, l->indices, l->counts, sa_query_rows(s),
                                            l->max_blocks, &max_keys)))
        return err;
    query_job job = {.s = s, .q = q, .k = k, .v = v,
                     .indices = l->indices, .counts = l->counts, .max_blocks = l->max_blocks,
                     .causal = o.causal, .part_o = part_o, .part_lse = part_lse};
    return run_queries(&job, SA_TILE, 1);
}

/* sa_ref_query_partials_opts with the defaults (validated, empty rows allowed, not causal). */
int sa_ref_query_partials(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const sa_query_lists *l, float *part_o,
                          float *part_lse)
{
    return sa_ref_query_partials_opts(s, q, k, v, l, NULL, part_o, part_lse);
}

/* Merges `slots` partials per (b, hq, query) by their LSE weights (see sparseattn.h). It needs no
 * causal flag: causal partials already carry LSE -inf for the slots a query does not see. Exact:
 * partial j holds o_j = sum_{keys of j} e^{s - lse_j} v, so e^{lse_j - lse} o_j re-weights it to
 * the softmax over the union of keys. Computed in double; slots of LSE -inf are skipped (their
 * O is not read). All -inf gives O = 0, LSE = -inf.
 *   part_o is (B, Hq, Sq, slots, D), part_lse (B, Hq, Sq, slots); outputs as in sa_ref_dense. */
int sa_ref_combine(const sa_shape *s, int slots, const float *part_o, const float *part_lse,
                   const sa_outputs *out)
{
    if (!s || !part_o || !part_lse)
        return SA_ERR_NULL;
    int err = ref_check_outputs(out);
    if (err || (err = sa_shape_check(s)))
        return err;
    /* part_o holds B*Hq*Sq*slots*D floats, held to SA_MAX_ELEMS like every buffer. */
    if (slots <= 0 || !sa_sz_within(sa_sz_mul(sa_sz_q_elems(s), slots), SA_MAX_ELEMS))
        return SA_ERR_ARG;
    const int d = s->head_dim;
    const long long rows = (long long)sa_lse_elems(s);
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < rows; r++) {
        const float *pl = part_lse + (size_t)r * slots;
        const float *po = part_o + (size_t)r * slots * d;
        float m = -INFINITY;
        for (int j = 0; j < slots; j++)
            m = pl[j] > m ? pl[j] : m;
        float o[REF_MAX_HEAD_DIM];
        if (m == -INFINITY) {
            ref_store_row(out, (size_t)r, d, o, 0.0, 0.0);
            continue;
        }
        double sum = 0;
        for (int j = 0; j < slots; j++)
            if (pl[j] != -INFINITY)
                sum += exp((double)pl[j] - m);
        double lse = m + log(sum), acc[REF_MAX_HEAD_DIM] = {0};
        for (int j = 0; j < slots; j++) {
            if (pl[j] == -INFINITY)
                continue;
            double w = exp((double)pl[j] - lse);
            for (int c = 0; c < d; c++)
                acc[c] += w * po[(size_t)j * d + c];
        }
        for (int c = 0; c < d; c++)
            o[c] = (float)acc[c];
        ref_store_row(out, (size_t)r, d, o, 1.0, lse);
    }
    return SA_OK;
}
