/* Validation, conversion and top-k shared by the CPU selectors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sel_internal.h"

int sel_begin(const sa_shape *s, const uint16_t *q, const uint16_t *k, const sa_select_params *p,
              const int32_t *indices, int needs_qk, int use_index, sel_ctx *c)
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
    if ((p->q_index == NULL) != (p->k_index == NULL))
        return SA_ERR_NULL;
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
                  int needs_qk, int use_index, sel_ctx *c)
{
    int err = sel_begin(s, q, k, p, indices, needs_qk, use_index, c);
    if (!err && c->causal && !counts)
        err = SA_ERR_NULL; /* causal rows may hold fewer than k blocks */
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

int sel_row_init(sel_row *w, int n, int k)
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

void sel_row_pick(sel_row *w, int k, int diag, int sink, int32_t *out)
{
    sel_pick_row(w->score, w->n, k, diag, sink, w->mark, w->top, out);
}

int sel_row_choose(sel_row *w, const sel_ctx *c, int per_query, int x, int32_t *out)
{
    const int n = sel_row_visible(c, per_query, x);
    const int k = c->k_sel < n ? c->k_sel : n;
    /* Causal: the block holding the row's last visible key; else keep_local's block, the one
     * holding the row's own position (the same block: causal's last visible key is that
     * position); else keep_diagonal's block. */
    const int local = !c->keep_local ? -1
                      : per_query    ? sa_causal_query_blocks(&c->s, x) - 1
                                     : sa_causal_tile_blocks(&c->s, x) - 1;
    const int diag = c->causal       ? n - 1
                     : c->keep_local ? local
                                     : sel_diag_of_tile(c, per_query ? x / SA_TILE : x);
    if (k > 0)
        sel_pick_row(w->score, n, k, diag, c->keep_sink, w->mark, w->top, out);
    for (int j = k; j < c->k_sel; j++)
        out[j] = -1;
    return k;
}
