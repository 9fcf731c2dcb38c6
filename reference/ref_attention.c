/*
 * The exact CPU reference, query-tile path: sa_ref_dense(_opts) and sa_ref_tile_sparse.
 * Every GPU stage is tested against these, so they favour clarity and FP32-exact arithmetic over
 * speed, but stay fast enough (OpenBLAS sgemm, OpenMP) to check full-size benchmark shapes.
 *
 * Per work item (batch, list head, 128-query tile):
 *   1. gather the valid keys of the row's blocks into contiguous FP32 K and V (BF16 -> FP32 is
 *      exact; the conversion rides along with the copy the gather needs anyway, so K/V are never
 *      converted as a whole),
 *   2. for each query head reading that list: S = scale * Q K^T (sgemm),
 *   3. row softmax over all gathered keys at once (max subtraction, double row sum),
 *   4. O = P V (sgemm), divided by the row sum; LSE = max + log(sum).
 * With list_heads = heads_kv a GQA group shares one list, so one gather serves the whole group.
 * Causal (docs/api.md, "Causal attention"): a tile does not gather the blocks wholly after its
 * last valid row's last visible key, and before step 3 each query's logits past its own last
 * visible key become -inf (weight exactly 0), so the diagonal block is masked per query.
 */
#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "ref_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"
#include "sa_omp.h"

/* The exp loop runs 4 floats wide on the x86-64 baseline; clones for AVX2 and AVX-512, picked at
 * load time, run it 2-4x faster. Same operations per element in every clone (no FMA contraction
 * in ISO C mode), so the weights do not depend on the clone. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REF_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define REF_CLONES
#endif

/* The clones are static: GCC 12 exports the ifunc resolver of an extern target_clones function
 * (a weak symbol of default visibility) whatever -fvisibility says, which would leak from the
 * library's hidden-visibility build; a static one's resolver stays local. */
REF_CLONES static void softmax_rows_cloned(float *s, int rows, size_t n, double *sum,
                                           double *lse)
{
    for (int r = 0; r < rows; r++)
        lse[r] = ref_softmax_row(s + (size_t)r * n, n, &sum[r]);
}

void ref_softmax_rows(float *s, int rows, size_t n, double *sum, double *lse)
{
    softmax_rows_cloned(s, rows, n, sum, lse);
}

int ref_check_outputs(const sa_outputs *out)
{
    if (!out || !out->o)
        return SA_ERR_NULL;
    return SA_OK;
}

int ref_resolve_opts(const sa_attn_opts *opts, sa_attn_opts *res)
{
    sa_attn_opts_default(res);
    if (!opts)
        return SA_OK;
    int err = sa_attn_opts_check(opts);
    if (err)
        return err;
    *res = *opts;
    return SA_OK;
}

int ref_check_call(const sa_shape *s, const sa_outputs *out, const sa_attn_opts *opts,
                   sa_attn_opts *res)
{
    int err = ref_check_outputs(out);
    if (!err)
        err = sa_shape_check(s);
    return err ? err : ref_resolve_opts(opts, res);
}

int ref_scan_rows(const sa_shape *s, const int32_t *indices, const int32_t *counts, size_t rows,
                  int max_blocks, size_t *max_keys)
{
    int nb = sa_kv_blocks(s);
    size_t most = 0;
    for (size_t r = 0; r < rows; r++) {
        int c = counts ? counts[r] : max_blocks;
        if (c < 0 || c > max_blocks)
            return SA_ERR_COUNT;
        const int32_t *row = indices + r * (size_t)max_blocks;
        size_t keys = 0;
        for (int j = 0; j < c; j++) {
            if (row[j] < 0 || row[j] >= nb)
                return SA_ERR_INDEX;
            keys += (size_t)sa_block_len(s, row[j]);
        }
        most = keys > most ? keys : most;
    }
    *max_keys = most;
    return SA_OK;
}

/* What one call computes. indices == NULL means dense: every row lists all blocks in order. */
typedef struct tile_job {
    const sa_shape *s;
    const uint16_t *q, *k, *v;
    const int32_t *indices, *counts;
    int list_heads, max_blocks;
    int causal;      /* 1: query i sees keys j <= i + (len_kv - len_q) only */
    size_t max_keys; /* most keys any row gathers: sizes the scratch */
    const sa_outputs *out;
} tile_job;

/* Per-thread scratch, sized once per call. */
typedef struct tile_scratch {
    float *kf, *vf; /* (max_keys, D) gathered keys and values */
    float *qf;      /* (128, D) one query tile */
    float *s;       /* (128, max_keys) logits, then weights */
    float *of;      /* (128, D) unnormalised P V */
} tile_scratch;

static int scratch_alloc(tile_scratch *t, size_t max_keys, int d)
{
    /* max_keys <= INT_MAX (run_tiles), so none of these products can overflow int64. */
    const int64_t kd = sa_sz_mul((int64_t)max_keys, d), td = sa_sz_mul(SA_TILE, d);
    t->kf = sa_sz_malloc(kd, sizeof(float));
    t->vf = sa_sz_malloc(kd, sizeof(float));
    t->qf = sa_sz_malloc(td, sizeof(float));
    t->s = sa_sz_malloc(sa_sz_mul(SA_TILE, (int64_t)max_keys), sizeof(float));
    t->of = sa_sz_malloc(td, sizeof(float));
    return t->kf && t->vf && t->qf && t->s && t->of ? SA_OK : SA_ERR_NOMEM;
}

static void scratch_free(tile_scratch *t)
{
    free(t->kf);
    free(t->vf);
    free(t->qf);
    free(t->s);
    free(t->of);
}

/* Causal mask of one tile's logits S (m, nk), gathered from the blocks idx[0..count) (NULL:
 * 0, 1, ...) that are not wholly future (blk < visible), in that order. Query row i (position
 * q0 + i) keeps the keys up to its last visible key and gets -inf past it; a row that keeps no
 * key is set to 0 (so its softmax stays finite) and marked in empty[i]. */
static void causal_mask(const sa_shape *s, const int32_t *idx, int count, int visible, int q0,
                        int m, size_t nk, float *S, unsigned char *empty)
{
    for (int i = 0; i < m; i++) {
        const int last = sa_geo_last_key(s, q0 + i);
        float *row = S + (size_t)i * nk;
        size_t col = 0, kept = 0;
        for (int j = 0; j < count; j++) {
            int blk = idx ? idx[j] : j;
            if (blk >= visible)
                continue;
            int len = sa_block_len(s, blk), f = ref_causal_block_len(blk, len, last);
            for (int c = f; c < len; c++)
                row[col + (size_t)c] = -INFINITY;
            kept += (size_t)f;
            col += (size_t)len;
        }
        empty[i] = kept == 0;
        if (kept == 0)
            for (size_t c = 0; c < nk; c++)
                row[c] = 0.0f;
    }
}

/* One (batch b, list head lh, query tile t). Shapes:
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D); the row's blocks are indices[row][0..count).
 *   Query heads hq in [lh * hpl, (lh + 1) * hpl) read this row, hpl = Hq / list_heads.
 *   With job->causal the tile's last visible key is that of its last valid row, q0 + m - 1:
 *   blocks past it (blk >= visible) are skipped whole, the others masked per query row. */
static void tile_item(const tile_job *job, tile_scratch *sc, int b, int lh, int t)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, tiles = sa_q_tiles(s), nb = sa_kv_blocks(s);
    const int hpl = s->heads_q / job->list_heads, group = s->heads_q / s->heads_kv;
    const int hkv = lh * hpl / group;
    const int q0 = t * SA_TILE, m = s->len_q - q0 < SA_TILE ? s->len_q - q0 : SA_TILE;
    const float scale = ref_softmax_scale(d);

    /* Blocks [0, visible) hold a key some query of the tile sees (all of them without causal). */
    const int visible = job->causal ? sa_geo_blocks(sa_geo_last_key(s, q0 + m - 1)) : nb;
    size_t row = ((size_t)b * job->list_heads + lh) * tiles + t;
    const int32_t *idx = job->indices ? job->indices + row * (size_t)job->max_blocks : NULL;
    int count = !job->indices ? visible : job->counts ? job->counts[row] : job->max_blocks;

    /* 1. Gather: only a block's valid keys, so a partial final block's padding never exists. */
    const size_t kv_head = ((size_t)b * s->heads_kv + hkv) * s->len_kv * d;
    size_t nk = 0;
    for (int j = 0; j < count; j++) {
        int blk = idx ? idx[j] : j;
        if (blk >= visible) /* causal: wholly after every query's last visible key */
            continue;
        size_t len = (size_t)sa_block_len(s, blk), src = kv_head + (size_t)blk * SA_TILE * d;
        ref_bf16_to_f32(sc->kf + nk * d, job->k + src, len * d);
        ref_bf16_to_f32(sc->vf + nk * d, job->v + src, len * d);
        nk += len;
    }

    for (int hq = lh * hpl; hq < (lh + 1) * hpl; hq++) {
        size_t qrow = ((size_t)b * s->heads_q + hq) * s->len_q + q0;
        if (nk == 0) { /* no selected key: O = 0, LSE = -inf */
            for (int i = 0; i < m; i++)
                ref_store_row(job->out, qrow + i, d, sc->of, 0.0, 0.0);
            continue;
        }
        ref_bf16_to_f32(sc->qf, job->q + qrow * d, (size_t)m * d);
        /* 2. S = scale * Q K^T: (m, D) x (nk, D)^T -> (m, nk). */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)nk, d, scale, sc->qf, d,
                    sc->kf, d, 0.0f, sc->s, (int)nk);
        unsigned char empty[SA_TILE] = {0};
        if (job->causal)
            causal_mask(s, idx, count, visible, q0, m, nk, sc->s, empty);
        /* 3. One softmax per query over every selected key (masked keys weigh exactly 0). */
        double sum[SA_TILE], lse[SA_TILE];
        ref_softmax_rows(sc->s, m, nk, sum, lse);
        for (int i = 0; i < m; i++)
            if (empty[i]) /* causal: no visible key in the row's blocks: O = 0, LSE = -inf */
                sum[i] = 0.0;
        /* 4. O = P V: (m, nk) x (nk, D) -> (m, D), normalised row by row on the way out. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, (int)nk, 1.0f, sc->s,
                    (int)nk, sc->vf, d, 0.0f, sc->of, d);
        for (int i = 0; i < m; i++)
            ref_store_row(job->out, qrow + i, d, sc->of + (size_t)i * d, sum[i], lse[i]);
    }
}

static atomic_flag blas_lock = ATOMIC_FLAG_INIT;
static int blas_users, blas_saved_threads;

static void blas_lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&blas_lock, memory_order_acquire))
        ;
}

void ref_blas_single_begin(void)
{
    blas_lock_take();
    if (blas_users++ == 0) {
        blas_saved_threads = openblas_get_num_threads();
        openblas_set_num_threads(1);
    }
    atomic_flag_clear_explicit(&blas_lock, memory_order_release);
}

void ref_blas_single_end(void)
{
    blas_lock_take();
    if (--blas_users == 0)
        openblas_set_num_threads(blas_saved_threads);
    atomic_flag_clear_explicit(&blas_lock, memory_order_release);
}

/* Runs every (b, list head, tile) item across OpenMP threads. OpenBLAS is held single-threaded
 * meanwhile: the parallelism is ours, and its own pool would oversubscribe the cores. */
static int run_tiles(const tile_job *job)
{
    const sa_shape *s = job->s;
    const int tiles = sa_q_tiles(s);
    const long long items = (long long)s->batch * job->list_heads * tiles;
    /* sgemm takes int sizes: a row's keys are one of its dimensions. Only a row with duplicate
     * blocks and opts->validate = 0 can gather more (a valid row holds at most len_kv keys). */
    if (job->max_keys > (size_t)INT_MAX)
        return SA_ERR_UNSUPPORTED;
    int oom = 0;
    ref_blas_single_begin();
#pragma omp parallel
    {
        tile_scratch sc;
        const int failed =
            sa_omp_any_failed(&oom, scratch_alloc(&sc, job->max_keys, s->head_dim) != SA_OK);
        if (!failed) { /* the same branch in every thread */
#pragma omp for schedule(dynamic, 1)
            for (long long w = 0; w < items; w++) {
                int t = (int)(w % tiles);
                long long bh = w / tiles;
                tile_item(job, &sc, (int)(bh / job->list_heads), (int)(bh % job->list_heads), t);
            }
        }
        scratch_free(&sc);
    }
    ref_blas_single_end();
    return oom ? SA_ERR_NOMEM : SA_OK;
}

/* Dense attention over all len_kv keys, or with opts->causal over each query's visible keys.
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D); out->o (B, Hq, Sq, D) BF16, out->o_f32
 *   (B, Hq, Sq, D) and out->lse (B, Hq, Sq) optional. Query head h reads KV head h / (Hq / Hkv).
 *   opts NULL means defaults (not causal); only opts->causal is read, the other fields must be
 *   flags (SA_ERR_ARG). Causal: query i sees keys j <= i + (len_kv - len_q); a query that sees
 *   none (len_q > len_kv) gives O = 0, LSE = -inf. Each tile gathers only the blocks up to its
 *   last row's last visible key. Scratch per thread: about len_kv * (2 D + 128) floats. */
int sa_ref_dense_opts(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                      const sa_attn_opts *opts, const sa_outputs *out)
{
    if (!s || !q || !k || !v)
        return SA_ERR_NULL;
    sa_attn_opts o;
    int err = ref_check_call(s, out, opts, &o);
    if (err)
        return err;
    tile_job job = {.s = s, .q = q, .k = k, .v = v, .list_heads = s->heads_kv,
                    .causal = o.causal, .max_keys = (size_t)s->len_kv, .out = out};
    return run_tiles(&job);
}

/* sa_ref_dense_opts with the defaults: attention over all len_kv keys. */
int sa_ref_dense(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                 const sa_outputs *out)
{
    return sa_ref_dense_opts(s, q, k, v, NULL, out);
}

/* Block-sparse attention with one block list per (batch, list head, query tile).
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D); outputs as in sa_ref_dense.
 *   l->indices is (B, list_heads, q_tiles, max_blocks), l->counts (B, list_heads, q_tiles) or
 *   NULL (every row uses max_blocks). Query head h uses list head h / (Hq / list_heads).
 *   Each query's softmax runs once over all keys of its row's blocks; rows of count 0 give
 *   O = 0, LSE = -inf (or SA_ERR_EMPTY_ROW when opts->allow_empty_rows = 0).
 *   opts->causal: each query sees only the keys of its row's blocks up to its last visible key
 *   (a query left with none gives O = 0, LSE = -inf); validation (sa_tile_lists_check_opts)
 *   then also reports a block wholly after the tile's last row's last visible key
 *   (SA_ERR_FUTURE_BLOCK) unless opts->allow_future_blocks; such a block contributes nothing.
 *   opts->validate = 0 skips the duplicate, empty-row and future-block checks (a duplicate block
 *   then counts twice); counts and indices are bounds-checked regardless. */
int sa_ref_tile_sparse(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                       const sa_tile_lists *l, const sa_attn_opts *opts, const sa_outputs *out)
{
    if (!s || !q || !k || !v || !l || !l->indices)
        return SA_ERR_NULL;
    sa_attn_opts o;
    int err = ref_check_call(s, out, opts, &o);
    if (err)
        return err;
    tile_job job = {.s = s, .q = q, .k = k, .v = v, .indices = l->indices, .counts = l->counts,
                    .list_heads = l->list_heads, .max_blocks = l->max_blocks,
                    .causal = o.causal, .out = out};
    if ((err = ref_tile_lists_ready(s, l, &o, &job.max_keys)))
        return err;
    return run_tiles(&job);
}
