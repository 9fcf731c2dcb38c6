/*
 * The exact CPU reference, backward: the gradients of masked softmax attention with respect to
 * Q, K and V, for every mask the forward reference takes (dense, tile lists, per-query lists,
 * causal or not): sa_ref_dense_backward, sa_ref_tile_sparse_backward,
 * sa_ref_query_sparse_backward.
 *
 * For one query row i (one head) over its key set K(i), with the forward's O_i and LSE_i:
 *   D_i   = sum_e dO_ie O_ie
 *   P_ij  = exp(scale q_i . k_j - LSE_i)            j in K(i), else 0
 *   dV_j += P_ij dO_i
 *   dP_ij = dO_i . v_j
 *   dS_ij = P_ij (dP_ij - D_i)
 *   dQ_i  = scale sum_j dS_ij k_j
 *   dK_j += scale dS_ij q_i
 * Every (i, j) term needs only row i's LSE and D, never the rest of the row, so the work splits
 * in two passes that each own what they write (no two threads add into one value, and the
 * summation order does not depend on the thread count):
 *   1. dQ, query-centric like the forward: per (batch, query head, tile) for tile lists and
 *      dense, per (batch, KV head, query) with the G heads of the GQA group as rows for
 *      per-query lists; S and dP over the row's blocks, dS, then dQ = scale dS K.
 *   2. dK and dV, key-centric: per (batch, KV head, KV block), over every query row of the
 *      group whose list names the block (a reverse index of the lists; dense needs none), in
 *      chunks of rows: S, P, dV += P^T dO, dP, dS, dK += scale dS^T Q. So dK and dV of a KV head
 *      are summed over the query heads of its group.
 * K and V are converted to FP32 once (the blocks are then sgemm operands in place); Q and dO rows
 * are converted as they are loaded. A key is used exactly when the forward uses it: keys past
 * len_kv do not exist, blocks a row does not list are not visited, a causal row's keys past its
 * last visible key weigh 0, and a block wholly after it is not visited (with validate = 0 a
 * duplicated block counts twice, as in the forward).
 */
#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"

enum { BWD_TILE = 0, BWD_QUERY = 1 };

/* What one call computes. kind BWD_TILE with indices NULL is dense: every row lists blocks
 * 0, 1, ... (with causal, those holding a key its tile sees). */
typedef struct bwd_job {
    const sa_shape *s;
    const uint16_t *q, *d_o; /* BF16 (B, Hq, Sq, D) */
    const float *lse;        /* (B, Hq, Sq), the forward's */
    const float *kf, *vf;    /* (B, Hkv, Skv, D) FP32 copies of K and V */
    const float *dsum;       /* (B, Hq, Sq): D_i = rowsum(dO_i * O_i) */
    float *dq, *dk, *dv;
    int kind;
    const int32_t *indices, *counts;
    int list_heads, max_blocks;
    int causal;
    size_t max_keys; /* most keys a row uses: sizes the scratch */
    /* Reverse index of the lists: bucket (b, hkv, kb) holds the list rows that use block kb,
     * entries ent[start[bk] .. start[bk + 1]): lh * q_tiles + t (tile lists) or the query i
     * (per-query lists), once per time the row names the block. NULL for dense. */
    int64_t *start;
    int32_t *ent;
} bwd_job;

/* Per-thread scratch, allocated before anything is written. rows_cap rows of at most keys_cap
 * keys: pass 1 holds one row set over all its keys, pass 2 a chunk of rows over one block. */
typedef struct bwd_scratch {
    float *qf, *dof;   /* (rows_cap, D) query rows and their dO, FP32 */
    float *p, *ds;     /* (rows_cap, keys_cap): S then P; dP then dS */
    float *acc;        /* (rows_cap, D) dQ of pass 1 */
    float *dk, *dv;    /* (SA_TILE, D) one block's accumulators in pass 2 */
    float *lse, *dsum; /* (rows_cap) */
    int *last;         /* (rows_cap) last visible key of each row, INT_MAX without causal */
    size_t *rid;       /* (rows_cap) row index into (B, Hq, Sq) */
} bwd_scratch;

static void scratch_free(bwd_scratch *t)
{
    free(t->qf);
    free(t->dof);
    free(t->p);
    free(t->ds);
    free(t->acc);
    free(t->dk);
    free(t->dv);
    free(t->lse);
    free(t->dsum);
    free(t->last);
    free(t->rid);
}

static int scratch_alloc(bwd_scratch *t, int64_t rows_cap, int64_t keys_cap, int d)
{
    const int64_t rd = sa_sz_mul(rows_cap, d), rk = sa_sz_mul(rows_cap, keys_cap);
    t->qf = sa_sz_malloc(rd, sizeof(float));
    t->dof = sa_sz_malloc(rd, sizeof(float));
    t->p = sa_sz_malloc(rk, sizeof(float));
    t->ds = sa_sz_malloc(rk, sizeof(float));
    t->acc = sa_sz_malloc(rd, sizeof(float));
    t->dk = sa_sz_malloc(sa_sz_mul(SA_TILE, d), sizeof(float));
    t->dv = sa_sz_malloc(sa_sz_mul(SA_TILE, d), sizeof(float));
    t->lse = sa_sz_malloc(rows_cap, sizeof(float));
    t->dsum = sa_sz_malloc(rows_cap, sizeof(float));
    t->last = sa_sz_malloc(rows_cap, sizeof(int));
    t->rid = sa_sz_malloc(rows_cap, sizeof(size_t));
    return t->qf && t->dof && t->p && t->ds && t->acc && t->dk && t->dv && t->lse && t->dsum &&
                   t->last && t->rid
               ? SA_OK
               : SA_ERR_NOMEM;
}

/* Rows of the GQA group per KV head, and the most rows one chunk of pass 2 holds: a unit of
 * rows (a tile of one head, or one query of the group's G heads) never straddles two chunks. */
static int group_of(const sa_shape *s) { return s->heads_q / s->heads_kv; }
static int64_t chunk_rows(const sa_shape *s)
{
    return group_of(s) > SA_TILE ? group_of(s) : SA_TILE;
}

/* Last visible key of query i: the causal one, or INT_MAX (every key) without causal. */
static int row_last(const bwd_job *job, int i)
{
    return job->causal ? sa_geo_last_key(job->s, i) : INT_MAX;
}

/* Keys of block blk a row set uses, `last` the largest last visible key of its rows: all the
 * block's valid keys, or with causal the prefix up to `last` (0: the block is not visited). */
static int used_len(const sa_shape *s, int blk, int last)
{
    return ref_causal_block_len(blk, sa_block_len(s, blk), last);
}

/* The list row of the (batch b, tile t) or (batch b, query i) row set and its count; dense:
 * NULL and the number of blocks the row may use. `head` is the list head (tile) or the KV head
 * (per-query lists). */
static const int32_t *list_row(const bwd_job *job, int b, int head, int x, int last, int *count)
{
    const sa_shape *s = job->s;
    if (!job->indices) {
        *count = job->causal ? sa_geo_blocks(last) : sa_kv_blocks(s);
        return NULL;
    }
    size_t row = job->kind == BWD_TILE
                     ? ((size_t)b * job->list_heads + head) * sa_q_tiles(s) + x
                     : ((size_t)b * s->heads_kv + head) * s->len_q + x;
    *count = job->counts ? job->counts[row] : job->max_blocks;
    return job->indices + row * (size_t)job->max_blocks;
}

/* Loads rows rid[0..n) of (B, Hq, Sq): Q and dO as FP32 (n, D), LSE, D_i and last visible key. */
static void load_rows(const bwd_job *job, bwd_scratch *sc, int n)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim;
    for (int r = 0; r < n; r++) {
        size_t row = sc->rid[r];
        ref_bf16_to_f32(sc->qf + (size_t)r * d, job->q + row * d, (size_t)d);
        ref_bf16_to_f32(sc->dof + (size_t)r * d, job->d_o + row * d, (size_t)d);
        sc->lse[r] = job->lse[row];
        sc->dsum[r] = job->dsum[row];
        sc->last[r] = row_last(job, (int)(row % (size_t)s->len_q));
    }
}

/* One block's columns col .. col + len of n rows (leading dimension ld), keys 128 blk + c:
 * S becomes P = exp(S - LSE) and dP becomes dS = P (dP - D). A key past the row's last visible
 * key, and every key of a row whose LSE is -inf (the forward's mark of a row with no key), get
 * P = dS = 0. */
static void weights(bwd_scratch *sc, int n, size_t ld, size_t col, int blk, int len)
{
    const int64_t k0 = (int64_t)blk * SA_TILE;
    for (int r = 0; r < n; r++) {
        float *p = sc->p + (size_t)r * ld + col, *ds = sc->ds + (size_t)r * ld + col;
        const float lse = sc->lse[r], dsum = sc->dsum[r];
        int64_t seen = (int64_t)sc->last[r] - k0 + 1; /* keys of the block the row sees */
        int vis = lse == -INFINITY || seen <= 0 ? 0 : seen < len ? (int)seen : len;
        for (int c = 0; c < vis; c++) {
            p[c] = ref_exp_nonpos(p[c] - lse);
            ds[c] = p[c] * (ds[c] - dsum);
        }
        for (int c = vis; c < len; c++)
            p[c] = ds[c] = 0.0f;
    }
}

/* Pass 1: dQ of the n rows rid[0..n) (loaded), which all read the KV head at float offset kvh
 * and the blocks idx[0..count) (NULL: 0, 1, ...); `last` is the largest last visible key of the
 * rows. Shapes: Q, dO (n, D); S, dP (n, nk) over the used keys of the blocks, in list order;
 * dQ (n, D) = scale dS K, written to job->dq. */
static void rows_dq(const bwd_job *job, bwd_scratch *sc, int n, size_t kvh, const int32_t *idx,
                    int count, int last)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim;
    const float scale = ref_softmax_scale(d);
    size_t nk = 0;
    for (int j = 0; j < count; j++)
        nk += (size_t)used_len(s, idx ? idx[j] : j, last);
    if (nk == 0) {
        for (int r = 0; r < n; r++)
            memset(job->dq + sc->rid[r] * d, 0, (size_t)d * sizeof(float));
        return;
    }
    load_rows(job, sc, n);
    size_t col = 0;
    for (int j = 0; j < count; j++) {
        int blk = idx ? idx[j] : j, len = used_len(s, blk, last);
        if (len == 0)
            continue;
        const float *kb = job->kf + kvh + (size_t)blk * SA_TILE * d;
        const float *vb = job->vf + kvh + (size_t)blk * SA_TILE * d;
        /* S = scale Q K_blk^T and dP = dO V_blk^T: (n, D) x (len, D)^T -> (n, len). */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, d, scale, sc->qf, d, kb, d,
                    0.0f, sc->p + col, (int)nk);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, d, 1.0f, sc->dof, d, vb, d,
                    0.0f, sc->ds + col, (int)nk);
        weights(sc, n, nk, col, blk, len);
        /* dQ += scale dS_blk K_blk: (n, len) x (len, D) -> (n, D). */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, len, scale, sc->ds + col,
                    (int)nk, kb, d, col ? 1.0f : 0.0f, sc->acc, d);
        col += (size_t)len;
    }
    for (int r = 0; r < n; r++)
        memcpy(job->dq + sc->rid[r] * d, sc->acc + (size_t)r * d, (size_t)d * sizeof(float));
}

/* Pass 1 work item w. Tile lists and dense: (b, hq, tile t), the m valid rows of the tile, whose
 * largest last visible key is its last row's. Per-query lists: (b, hkv, query i), the G heads of
 * the group at query i. */
static void item_dq(const bwd_job *job, bwd_scratch *sc, long long w)
{
    const sa_shape *s = job->s;
    const int group = group_of(s), d = s->head_dim;
    if (job->kind == BWD_TILE) {
        const int tiles = sa_q_tiles(s), t = (int)(w % tiles);
        const int hq = (int)(w / tiles % s->heads_q), b = (int)(w / tiles / s->heads_q);
        const int q0 = t * SA_TILE, m = s->len_q - q0 < SA_TILE ? s->len_q - q0 : SA_TILE;
        const int last = row_last(job, q0 + m - 1);
        const int lh = hq / (s->heads_q / job->list_heads);
        int count;
        const int32_t *idx = list_row(job, b, lh, t, last, &count);
        for (int r = 0; r < m; r++)
            sc->rid[r] = ((size_t)b * s->heads_q + hq) * s->len_q + q0 + r;
        size_t kvh = ((size_t)b * s->heads_kv + hq / group) * s->len_kv * d;
        rows_dq(job, sc, m, kvh, idx, count, last);
    } else {
        const int i = (int)(w % s->len_q), hkv = (int)(w / s->len_q % s->heads_kv);
        const int b = (int)(w / s->len_q / s->heads_kv);
        int count;
        const int32_t *idx = list_row(job, b, hkv, i, row_last(job, i), &count);
        for (int g = 0; g < group; g++)
            sc->rid[g] = ((size_t)b * s->heads_q + (size_t)hkv * group + g) * s->len_q + i;
        size_t kvh = ((size_t)b * s->heads_kv + hkv) * s->len_kv * d;
        rows_dq(job, sc, group, kvh, idx, count, row_last(job, i));
    }
}

/* Pass 2: adds the n rows rid[0..n) (not yet loaded) into the accumulators of block blk (len
 * keys at kb, vb): S, dP (n, len); dV += P^T dO, dK += scale dS^T Q, both (len, D). */
static void chunk_dkdv(const bwd_job *job, bwd_scratch *sc, int n, const float *kb,
                       const float *vb, int blk, int len)
{
    if (n == 0)
        return;
    const int d = job->s->head_dim;
    const float scale = ref_softmax_scale(d);
    load_rows(job, sc, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, d, scale, sc->qf, d, kb, d,
                0.0f, sc->p, len);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, d, 1.0f, sc->dof, d, vb, d,
                0.0f, sc->ds, len);
    weights(sc, n, (size_t)len, 0, blk, len);
    /* (n, len)^T x (n, D) -> (len, D), accumulated. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, len, d, n, 1.0f, sc->p, len, sc->dof, d,
                1.0f, sc->dv, d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, len, d, n, scale, sc->ds, len, sc->qf, d,
                1.0f, sc->dk, d);
}

/* Pass 2 work item w = (b, hkv, block kb): dK and dV of the block's valid keys, summed over
 * every row of the group that uses the block, in the order of the lists (dense: tiles in order,
 * the group's heads within a tile). Rows are collected in chunks of at most chunk_rows. */
static void item_dkdv(const bwd_job *job, bwd_scratch *sc, long long w)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = group_of(s), nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    const int kb = (int)(w % nb), hkv = (int)(w / nb % s->heads_kv), b = (int)(w / nb / s->heads_kv);
    const int len = sa_block_len(s, kb);
    const int64_t cap = chunk_rows(s);
    const size_t base = (((size_t)b * s->heads_kv + hkv) * s->len_kv + (size_t)kb * SA_TILE) * d;
    const float *kbp = job->kf + base, *vbp = job->vf + base;
    memset(sc->dk, 0, (size_t)len * d * sizeof(float));
    memset(sc->dv, 0, (size_t)len * d * sizeof(float));
    int n = 0;
    if (job->kind == BWD_TILE) {
        /* Entries (list head lh, tile t); each reading head of lh adds the tile's m rows. */
        const int hpl = s->heads_q / job->list_heads;
        int64_t e0 = 0, e1 = tiles;
        if (job->start) {
            size_t bk = ((size_t)b * s->heads_kv + hkv) * nb + kb;
            e0 = job->start[bk];
            e1 = job->start[bk + 1];
        }
        for (int64_t e = e0; e < e1; e++) {
            int lh, t;
            if (job->start) {
                lh = job->ent[e] / tiles;
                t = job->ent[e] % tiles;
            } else { /* dense: the group's one list head hkv, every tile that sees the block */
                lh = (int)((int64_t)hkv * job->list_heads / s->heads_kv);
                t = (int)e;
                if (job->causal && used_len(s, kb, row_last(job, sa_geo_tile_last_row(s, t))) == 0)
                    continue;
            }
            const int q0 = t * SA_TILE, m = s->len_q - q0 < SA_TILE ? s->len_q - q0 : SA_TILE;
            for (int hq = lh * hpl; hq < (lh + 1) * hpl; hq++) {
                if (n + m > cap) {
                    chunk_dkdv(job, sc, n, kbp, vbp, kb, len);
                    n = 0;
                }
                for (int r = 0; r < m; r++)
                    sc->rid[n++] = ((size_t)b * s->heads_q + hq) * s->len_q + q0 + r;
            }
        }
    } else {
        size_t bk = ((size_t)b * s->heads_kv + hkv) * nb + kb;
        for (int64_t e = job->start[bk]; e < job->start[bk + 1]; e++) {
            const int i = job->ent[e];
            if (n + group > cap) {
                chunk_dkdv(job, sc, n, kbp, vbp, kb, len);
                n = 0;
            }
            for (int g = 0; g < group; g++)
                sc->rid[n++] = ((size_t)b * s->heads_q + (size_t)hkv * group + g) * s->len_q + i;
        }
    }
    chunk_dkdv(job, sc, n, kbp, vbp, kb, len);
    memcpy(job->dk + base, sc->dk, (size_t)len * d * sizeof(float));
    memcpy(job->dv + base, sc->dv, (size_t)len * d * sizeof(float));
}

/* The reverse index of the lists: for every list row and each of its entries that the row uses
 * (with causal: not wholly after the row's last visible key), the row joins the bucket
 * (b, hkv, block). Counted, prefix-summed, then filled in row order. SA_ERR_NOMEM on failure. */
static int build_index(bwd_job *job)
{
    const sa_shape *s = job->s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    const int tile = job->kind == BWD_TILE;
    const int heads = tile ? job->list_heads : s->heads_kv, per = tile ? tiles : s->len_q;
    const size_t rows = (size_t)s->batch * heads * per;
    const size_t buckets = (size_t)s->batch * s->heads_kv * nb;
    job->start = sa_sz_malloc(sa_sz_add((int64_t)buckets, 1), sizeof(int64_t));
    if (!job->start)
        return SA_ERR_NOMEM;
    memset(job->start, 0, (buckets + 1) * sizeof(int64_t));
    for (int pass = 0; pass < 2; pass++) {
        for (size_t row = 0; row < rows; row++) {
            const int x = (int)(row % (size_t)per), head = (int)(row / per % (size_t)heads);
            const int b = (int)(row / per / (size_t)heads);
            const int hkv = tile ? (int)((int64_t)head * s->heads_kv / heads) : head;
            const int last = row_last(job, tile ? sa_geo_tile_last_row(s, x) : x);
            int count;
            const int32_t *idx = list_row(job, b, head, x, last, &count);
            for (int j = 0; j < count; j++) {
                if (used_len(s, idx[j], last) == 0)
                    continue;
                size_t bk = ((size_t)b * s->heads_kv + hkv) * nb + idx[j];
                if (pass == 0)
                    job->start[bk + 1]++;
                else
                    job->ent[job->start[bk]++] = tile ? head * tiles + x : x;
            }
        }
        if (pass == 0) {
            for (size_t bk = 0; bk < buckets; bk++)
                job->start[bk + 1] += job->start[bk];
            job->ent = sa_sz_malloc(job->start[buckets], sizeof(int32_t));
            if (!job->ent)
                return SA_ERR_NOMEM;
        }
    }
    /* Filling advanced each start to the next bucket's: shift back. */
    for (size_t bk = buckets; bk > 0; bk--)
        job->start[bk] = job->start[bk - 1];
    job->start[0] = 0;
    return SA_OK;
}

/* Everything after validation: the FP32 K and V, D_i, the reverse index and every thread's
 * scratch are allocated first (SA_ERR_NOMEM writes nothing), then the two passes run across
 * OpenMP threads with OpenBLAS held single-threaded (the parallelism is ours). */
static int run_backward(bwd_job *job, const uint16_t *k, const uint16_t *v, const float *o,
                        int lists)
{
    const sa_shape *s = job->s;
    const int d = s->head_dim, group = group_of(s);
    /* sgemm takes int sizes: a row's used keys are the leading dimension of S. Only a row with
     * duplicate blocks and validate = 0 can use more than len_kv keys. */
    if (job->max_keys > (size_t)INT_MAX)
        return SA_ERR_UNSUPPORTED;
    const int64_t kv = (int64_t)sa_kv_elems(s), nrows = (int64_t)sa_lse_elems(s);
    const int64_t rows1 = job->kind == BWD_TILE ? SA_TILE : group, cap = chunk_rows(s);
    const int64_t rows_cap = rows1 > cap ? rows1 : cap;
    const int64_t keys_cap = (int64_t)job->max_keys > SA_TILE ? (int64_t)job->max_keys : SA_TILE;
    const int threads = omp_get_max_threads();
    float *kf = sa_sz_malloc(kv, sizeof(float)), *vf = sa_sz_malloc(kv, sizeof(float));
    float *dsum = sa_sz_malloc(nrows, sizeof(float));
    bwd_scratch *sc = calloc((size_t)threads, sizeof *sc);
    int err = kf && vf && dsum && sc ? SA_OK : SA_ERR_NOMEM;
    for (int t = 0; t < threads && !err; t++)
        err = scratch_alloc(&sc[t], rows_cap, keys_cap, d);
    if (!err && lists)
        err = build_index(job);
    if (err)
        goto done;
    job->kf = kf;
    job->vf = vf;
    job->dsum = dsum;

    const long long items1 = job->kind == BWD_TILE
                                 ? (long long)s->batch * s->heads_q * sa_q_tiles(s)
                                 : (long long)s->batch * s->heads_kv * s->len_q;
    const long long items2 = (long long)s->batch * s->heads_kv * sa_kv_blocks(s);
    ref_blas_single_begin();
#pragma omp parallel num_threads(threads)
    {
        bwd_scratch *my = &sc[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < kv / d; r++) {
            ref_bf16_to_f32(kf + r * d, k + r * d, (size_t)d);
            ref_bf16_to_f32(vf + r * d, v + r * d, (size_t)d);
        }
        /* D_i = rowsum(dO_i * O_i), in double. */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nrows; r++) {
            float g[REF_MAX_HEAD_DIM];
            ref_bf16_to_f32(g, job->d_o + r * d, (size_t)d);
            double acc = 0;
            for (int e = 0; e < d; e++)
                acc += (double)g[e] * o[r * d + e];
            dsum[r] = (float)acc;
        }
#pragma omp for schedule(dynamic, 1)
        for (long long w = 0; w < items1; w++)
            item_dq(job, my, w);
#pragma omp for schedule(dynamic, 1)
        for (long long w = 0; w < items2; w++)
            item_dkdv(job, my, w);
    }
    ref_blas_single_end();
done:
    if (sc)
        for (int t = 0; t < threads; t++)
            scratch_free(&sc[t]);
    free(sc);
    free(kf);
    free(vf);
    free(dsum);
    free(job->start);
    free(job->ent);
    return err;
}

/* The checks every backward entry point starts with, in the forward's order: the pointers
 * (SA_ERR_NULL), the shape, the options (resolved into *op). */
static int check_common(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                        const uint16_t *v, const sa_attn_opts *opts, const float *o,
                        const float *lse, const uint16_t *d_o, const float *dq, const float *dk,
                        const float *dv, sa_attn_opts *op)
{
    if (!s || !q || !k || !v || !o || !lse || !d_o || !dq || !dk || !dv)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    return err ? err : ref_resolve_opts(opts, op);
}

/* Backward of dense attention (sa_ref_dense_opts), all keys or with opts->causal each query's
 * visible keys.
 *   q is (B, Hq, Sq, D); k, v are (B, Hkv, Skv, D), BF16; query head h reads KV head
 *   h / (Hq / Hkv).
 *   o (B, Hq, Sq, D) and lse (B, Hq, Sq) are the forward's FP32 outputs (o_f32, lse) on the
 *   same inputs and options; d_o (B, Hq, Sq, D) is the gradient of the loss with respect to O,
 *   BF16 like the forward's O.
 *   dq (B, Hq, Sq, D), dk and dv (B, Hkv, Skv, D) get the gradients in FP32, every element
 *   written; dk and dv of a KV head are summed over the query heads of its group. A query that
 *   sees no key (LSE -inf) gets dQ = 0 and adds nothing to dK, dV.
 *   opts as in sa_ref_dense_opts: only causal is read, the other fields must be flags. */
int sa_ref_dense_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                          const uint16_t *v, const sa_attn_opts *opts, const float *o,
                          const float *lse, const uint16_t *d_o, float *dq, float *dk, float *dv)
{
    sa_attn_opts op;
    int err = check_common(s, q, k, v, opts, o, lse, d_o, dq, dk, dv, &op);
    if (err)
        return err;
    bwd_job job = {.s = s, .q = q, .d_o = d_o, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                   .kind = BWD_TILE, .list_heads = s->heads_kv, .causal = op.causal,
                   .max_keys = (size_t)s->len_kv};
    return run_backward(&job, k, v, o, 0);
}

/* Backward of sa_ref_tile_sparse: shapes, formats and outputs as sa_ref_dense_backward; lists
 * and opts as the forward (validation with sa_tile_lists_check_opts when opts->validate, counts
 * and indices bounds-checked regardless; rows of count 0 give dQ = 0; with causal, per-query
 * masking and future blocks as the forward). */
int sa_ref_tile_sparse_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const sa_tile_lists *l,
                                const sa_attn_opts *opts, const float *o, const float *lse,
                                const uint16_t *d_o, float *dq, float *dk, float *dv)
{
    if (!l || !l->indices)
        return SA_ERR_NULL;
    sa_attn_opts op;
    int err = check_common(s, q, k, v, opts, o, lse, d_o, dq, dk, dv, &op);
    if (err)
        return err;
    bwd_job job = {.s = s, .q = q, .d_o = d_o, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                   .kind = BWD_TILE, .indices = l->indices, .counts = l->counts,
                   .list_heads = l->list_heads, .max_blocks = l->max_blocks, .causal = op.causal};
    if ((err = ref_tile_lists_ready(s, l, &op, &job.max_keys)))
        return err;
    return run_backward(&job, k, v, o, 1);
}

/* Backward of sa_ref_query_sparse: shapes, formats and outputs as sa_ref_dense_backward; lists
 * (B, Hkv, Sq, max_blocks), counts (B, Hkv, Sq) or NULL, and opts as the forward. */
int sa_ref_query_sparse_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, const sa_query_lists *l,
                                 const sa_attn_opts *opts, const float *o, const float *lse,
                                 const uint16_t *d_o, float *dq, float *dk, float *dv)
{
    if (!l || !l->indices)
        return SA_ERR_NULL;
    sa_attn_opts op;
    int err = check_common(s, q, k, v, opts, o, lse, d_o, dq, dk, dv, &op);
    if (err)
        return err;
    bwd_job job = {.s = s, .q = q, .d_o = d_o, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                   .kind = BWD_QUERY, .indices = l->indices, .counts = l->counts,
                   .max_blocks = l->max_blocks, .causal = op.causal};
    if ((err = ref_query_lists_ready(s, l, &op, &job.max_keys)))
        return err;
    return run_backward(&job, k, v, o, 1);
}
