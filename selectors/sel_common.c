/* Validation, conversion and top-k shared by the CPU selectors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sa_omp.h"
#include "sel_internal.h"

int sel_head_layout(const sa_shape *s, const sa_select_params *p, unsigned modes,
                    int *list_heads, int *row_width)
{
    sa_select_params def;
    if (!p) {
        sa_select_params_default(&def);
        p = &def;
    }
    const int n = sa_kv_blocks(s);
    if (p->head_lists < SA_HEAD_LISTS_GROUP || p->head_lists > SA_HEAD_LISTS_POOLED)
        return SA_ERR_ARG;
    const int pooled = p->head_lists == SA_HEAD_LISTS_POOLED;
    if (pooled ? p->pool_cap != 0 && (p->pool_cap < p->k || p->pool_cap > n) : p->pool_cap != 0)
        return SA_ERR_ARG;
    if (!(modes & SA_HEAD_LISTS_BIT(p->head_lists)))
        return SA_ERR_UNSUPPORTED;
    *list_heads = p->head_lists == SA_HEAD_LISTS_GROUP ? s->heads_kv : s->heads_q;
    /* The default cap lets a head take twice its even share: enough for the heads that need
     * more, while the attention's rows stay short. */
    const int cap = p->pool_cap ? p->pool_cap : (p->k <= n / 2 ? 2 * p->k : n);
    *row_width = pooled ? cap : p->k;
    return SA_OK;
}

int sel_begin(const sa_shape *s, const uint16_t *q, const uint16_t *k, const sa_select_params *p,
              const int32_t *indices, int needs_qk, int use_index, unsigned modes, sel_ctx *c)
{
    sa_select_params def;
    if (!p) {
        sa_select_params_default(&def);
        p = &def;
    }
    if (!s || !indices || !c)
        return SA_ERR_NULL;
    if (needs_qk && (!q || !k))
        return SA_ERR_NULL;
    if ((p->q_index == NULL) != (p->k_index == NULL)) /* index vectors come in pairs */
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    memset(c, 0, sizeof *c);
    c->s = *s;
    c->q_tiles = sa_q_tiles(s);
    c->kv_blocks = sa_kv_blocks(s);
    c->group = s->heads_q / s->heads_kv;
    if (p->k <= 0 || p->k > c->kv_blocks)
        return SA_ERR_ARG;
    if (!sa_flag_ok(p->keep_diagonal) || !sa_flag_ok(p->keep_sink) || !sa_flag_ok(p->causal))
        return SA_ERR_ARG; /* the option rule */
    if (p->keep_diagonal && s->len_q != s->len_kv)
        return SA_ERR_ARG;
    /* With both options every tile but the first forces two distinct blocks. */
    if (p->keep_diagonal && p->keep_sink && c->q_tiles > 1 && p->k < 2)
        return SA_ERR_ARG;
    /* Causal always keeps the diagonal block: with the sink that is two forced blocks for every
     * row whose diagonal is not block 0, which the last row's is (block kv_blocks - 1). */
    if (p->causal && p->keep_sink && c->kv_blocks > 1 && p->k < 2)
        return SA_ERR_ARG;
    /* keep_local: the row's own position must be a key, so len_q <= len_kv. The last row's
     * local block is the last block, so with the sink that is two forced blocks. */
    if (!sa_flag_ok(p->keep_local))
        return SA_ERR_ARG;
    if (p->keep_local && s->len_q > s->len_kv)
        return SA_ERR_ARG;
    if (p->keep_local && p->keep_sink && c->kv_blocks > 1 && p->k < 2)
        return SA_ERR_ARG;
    int qh = s->heads_q, kh = s->heads_kv;
    if (p->q_index) {
        if (p->index_dim <= 0 || p->index_dim % 16 || p->index_dim > SA_MAX_INDEX_DIM)
            return SA_ERR_ARG;
        if (sel_index_heads(s, p->index_heads, &qh, &kh))
            return SA_ERR_ARG;
        /* Index vectors are tensors too: at most SA_MAX_ELEMS elements (sparseattn.h). */
        if (!sa_sz_within(sa_sz_mul4(s->batch, qh, s->len_q, p->index_dim), SA_MAX_ELEMS) ||
            !sa_sz_within(sa_sz_mul4(s->batch, kh, s->len_kv, p->index_dim), SA_MAX_ELEMS))
            return SA_ERR_ARG;
    } else if (p->index_dim != 0 || p->index_heads != 0) {
        return SA_ERR_ARG;
    }
    /* The head-list mode last: its SA_ERR_ARG cases, then SA_ERR_UNSUPPORTED for a mode this
     * selector does not take (docs/api.md's order). */
    if ((err = sel_head_layout(s, p, modes, &c->list_heads, &c->row_width)))
        return err;
    c->head_lists = p->head_lists;
    c->k_sel = p->k;
    c->keep_diagonal = p->keep_diagonal;
    c->keep_sink = p->keep_sink;
    c->causal = p->causal;
    /* With len_q == len_kv the local block is the diagonal block (tile t: block t; query i:
     * block i / 128), so one option carries both and the GPU functions take it as it is. */
    if (p->keep_local && s->len_q == s->len_kv)
        c->keep_diagonal = 1;
    else
        c->keep_local = p->keep_local;
    if (p->q_index && use_index) {
        c->q = p->q_index;
        c->k = p->k_index;
        c->dim = p->index_dim;
        c->qh = qh;
        c->kh = kh;
        c->index_heads = p->index_heads;
    } else {
        c->q = q;
        c->k = k;
        c->dim = s->head_dim;
        c->qh = s->heads_q;
        c->kh = s->heads_kv;
    }
    return SA_OK;
}

int sel_index_heads(const sa_shape *s, int index_heads, int *qh, int *kh)
{
    if (index_heads == 0) {
        *qh = s->heads_q;
        *kh = s->heads_kv;
        return SA_OK;
    }
    /* Hi divides Hq, and divides Hkv or is a multiple of it. */
    if (index_heads < 0 || s->heads_q % index_heads ||
        (s->heads_kv % index_heads && index_heads % s->heads_kv))
        return SA_ERR_ARG;
    *qh = *kh = index_heads;
    return SA_OK;
}

int sel_begin_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p, const int32_t *indices, const int32_t *counts,
                  int needs_qk, int use_index, unsigned modes, sel_ctx *c)
{
    int err = sel_begin(s, q, k, p, indices, needs_qk, use_index, modes, c);
    /* Causal rows may hold fewer than k blocks, pooled ones any number up to the cap. */
    if (!err && (c->causal || c->head_lists == SA_HEAD_LISTS_POOLED) && !counts)
        err = SA_ERR_NULL;
    return err;
}

float *sel_to_f32(const uint16_t *x, size_t n)
{
    float *f = n <= (size_t)INT64_MAX ? sa_sz_malloc((int64_t)n, sizeof *f) : NULL;
    if (!f)
        return NULL;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        f[i] = sa_bf16_to_f32(x[i]);
    return f;
}

/* a (visited later, so a higher index) beats b only with a strictly larger score; a number
 * beats NaN. */
static int beats(float a, float b) { return a > b || (isnan(b) && !isnan(a)); }

void sel_pick_row(const float *score, int n, int k, int diag, int sink, unsigned char *mark,
                  int32_t *top, int32_t *out)
{
    memset(mark, 0, (size_t)n);
    int forced = 0;
    if (diag >= 0 && diag < n) {
        mark[diag] = 1;
        forced++;
    }
    if (sink && !mark[0]) {
        mark[0] = 1;
        forced++;
    }
    int need = k - forced, have = 0;
    /* top[0..have) holds the best unforced blocks so far, best first. */
    for (int b = 0; b < n && need > 0; b++) {
        if (mark[b])
            continue;
        if (have == need && !beats(score[b], score[top[have - 1]]))
            continue;
        int j = have < need ? have++ : need - 1;
        while (j > 0 && beats(score[b], score[top[j - 1]])) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = b;
    }
    for (int j = 0; j < have; j++)
        mark[top[j]] = 1;
    for (int b = 0, j = 0; b < n; b++)
        if (mark[b])
            out[j++] = b;
}

/* Nonzero when out of memory (the row is then still safe to free). */
static int sel_row_init(sel_row *w, int n, int k)
{
    w->n = n;
    w->score = sa_sz_malloc(n, sizeof *w->score);
    w->mark = sa_sz_malloc(n, 1);
    w->top = sa_sz_malloc(k, sizeof *w->top);
    return !w->score || !w->mark || !w->top;
}

void sel_row_free(sel_row *w)
{
    free(w->score);
    free(w->mark);
    free(w->top);
}

int sel_row_start(sel_row *w, const sel_ctx *c, int *oom, int other_failed)
{
    const int w_oom = sel_row_init(w, c->kv_blocks, c->k_sel);
    return sa_omp_any_failed(oom, other_failed || w_oom);
}

/* The block row x (n visible blocks) always keeps beside the sink, or -1. Causal: the block
 * holding the row's last visible key; else keep_local's block, the one holding the row's own
 * position (the same block: causal's last visible key is that position); else keep_diagonal's
 * block. */
static int row_forced(const sel_ctx *c, int per_query, int x, int n)
{
    const int local = !c->keep_local ? -1
                      : per_query    ? sa_causal_query_blocks(&c->s, x) - 1
                                     : sa_causal_tile_blocks(&c->s, x) - 1;
    return c->causal       ? n - 1
           : c->keep_local ? local
                           : sel_diag_of_tile(c, per_query ? x / SA_TILE : x);
}

int sel_row_choose(sel_row *w, const sel_ctx *c, int per_query, int x, int32_t *out)
{
    const int n = sel_row_visible(c, per_query, x);
    const int k = c->k_sel < n ? c->k_sel : n;
    const int diag = row_forced(c, per_query, x, n);
    if (k > 0)
        sel_pick_row(w->score, n, k, diag, c->keep_sink, w->mark, w->top, out);
    for (int j = k; j < c->k_sel; j++)
        out[j] = -1;
    return k;
}

void sel_row_emit(sel_row *w, const sel_ctx *c, int per_query, int x, size_t r, int32_t *indices,
                  int32_t *counts)
{
    if (c->pool) {
        memcpy(c->pool + r * (size_t)w->n, w->score, (size_t)w->n * sizeof *w->score);
        return;
    }
    const int cnt = sel_row_choose(w, c, per_query, x, indices + r * (size_t)c->k_sel);
    if (counts)
        counts[r] = cnt;
}

int sel_pool_begin(sel_ctx *c)
{
    c->pool = NULL;
    if (c->head_lists != SA_HEAD_LISTS_POOLED)
        return SA_OK;
    const int64_t rows = sa_sz_mul((int64_t)c->s.batch * c->list_heads, c->q_tiles);
    c->pool = sa_sz_malloc(sa_sz_mul(rows, c->kv_blocks), sizeof *c->pool);
    return c->pool ? SA_OK : SA_ERR_NOMEM;
}

/* A candidate of the pool: head j of the group, its block and score. */
typedef struct pool_cand {
    float score;
    int head, block;
} pool_cand;

/* Higher score first, NaN last; then the lower head, then the lower block. */
static int pool_order(const void *pa, const void *pb)
{
    const pool_cand *a = pa, *b = pb;
    if (beats(a->score, b->score))
        return -1;
    if (beats(b->score, a->score))
        return 1;
    if (a->head != b->head)
        return a->head < b->head ? -1 : 1;
    return (a->block > b->block) - (a->block < b->block);
}

/* The pooled rows of one (batch, KV group, tile t): rows row0 + j * q_tiles for the group's
 * heads j < h (sa_selectors.h, SA_HEAD_LISTS_POOLED). Scratch: mark h * kv_blocks bytes, have h
 * ints, cand h * kv_blocks entries. */
static void pool_tile(const sel_ctx *c, int t, size_t row0, int h, unsigned char *mark, int *have,
                      pool_cand *cand, int32_t *indices, int32_t *counts)
{
    const int nb = c->kv_blocks, n = sel_row_visible(c, 0, t), cap = c->row_width;
    const int kq = c->k_sel < n ? c->k_sel : n, hi = cap < n ? cap : n;
    const int diag = row_forced(c, 0, t, n);
    int left = h * kq, nc = 0;
    memset(mark, 0, (size_t)h * nb);
    for (int j = 0; j < h && kq > 0; j++) {
        unsigned char *m = mark + (size_t)j * nb;
        have[j] = 0;
        if (diag >= 0 && diag < n) {
            m[diag] = 1;
            have[j]++;
        }
        if (c->keep_sink && !m[0]) {
            m[0] = 1;
            have[j]++;
        }
        const float *sc = c->pool + (row0 + (size_t)j * c->q_tiles) * nb;
        if (!have[j]) { /* nothing forced: the head's best block, so that no head goes empty */
            int best = 0;
            for (int b = 1; b < n; b++)
                best = beats(sc[b], sc[best]) ? b : best;
            m[best] = 1;
            have[j] = 1;
        }
        left -= have[j];
        for (int b = 0; b < n; b++)
            if (!m[b])
                cand[nc++] = (pool_cand){sc[b], j, b};
    }
    qsort(cand, (size_t)nc, sizeof *cand, pool_order);
    for (int i = 0; i < nc && left > 0; i++) {
        const int j = cand[i].head;
        if (have[j] >= hi)
            continue;
        mark[(size_t)j * nb + cand[i].block] = 1;
        have[j]++;
        left--;
    }
    for (int j = 0; j < h; j++) {
        const size_t r = row0 + (size_t)j * c->q_tiles;
        int32_t *out = indices + r * cap;
        int w = 0;
        for (int b = 0; b < n && kq > 0; b++)
            if (mark[(size_t)j * nb + b])
                out[w++] = b;
        counts[r] = w;
        for (; w < cap; w++)
            out[w] = -1;
    }
}

int sel_pool_end(sel_ctx *c, int err, int32_t *indices, int32_t *counts)
{
    if (!c->pool)
        return err;
    const int h = c->list_heads / c->s.heads_kv, nb = c->kv_blocks;
    const int groups = c->s.batch * c->s.heads_kv * c->q_tiles;
    int oom = 0;
#pragma omp parallel if (!err)
    {
        unsigned char *mark = sa_sz_malloc(sa_sz_mul(h, nb), 1);
        int *have = malloc((size_t)h * sizeof *have);
        pool_cand *cand = sa_sz_malloc(sa_sz_mul(h, nb), sizeof *cand);
        const int failed = sa_omp_any_failed(&oom, !mark || !have || !cand);
#pragma omp for schedule(dynamic, 4)
        for (int g = 0; g < groups; g++) {
            if (failed || err)
                continue;
            /* g = (b * Hkv + kv head) * q_tiles + t; the group's first row is that of query
             * head kv_head * h. */
            const int t = g % c->q_tiles, bg = g / c->q_tiles;
            const size_t row0 = (size_t)bg * h * c->q_tiles + t;
            pool_tile(c, t, row0, h, mark, have, cand, indices, counts);
        }
        free(mark);
        free(have);
        free(cand);
    }
    free(c->pool);
    c->pool = NULL;
    return err ? err : oom ? SA_ERR_NOMEM : SA_OK;
}
