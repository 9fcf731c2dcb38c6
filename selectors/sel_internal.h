/* Pieces shared by the CPU selectors (not installed): validation, input conversion, top-k. */
#ifndef SA_SEL_INTERNAL_H
#define SA_SEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sa_internal_api.h" /* SA_INTERNAL_API; includes sparseattn.h */

/* What a selector works on, filled by sel_begin after validation. */
typedef struct sel_ctx {
    sa_shape s;
    const uint16_t *q, *k; /* scored vectors: the index vectors when given, else Q and K */
    int dim;               /* their length */
    int qh, kh;            /* their heads per batch: (Hq, Hkv), or (Hi, Hi) with index_heads */
    int q_tiles, kv_blocks;
    int group;             /* heads_q / heads_kv */
    int k_sel;             /* blocks per row */
    int keep_diagonal, keep_sink;
    int keep_local;        /* 1 only where len_q < len_kv: with len_q == len_kv sel_begin turns
                            * it into keep_diagonal, which names the same blocks */
    int causal;            /* rows pick among their visible blocks only */
    int index_heads;       /* sa_select_params.index_heads when the scored vectors are index
                            * vectors, else 0 */
    int head_lists;        /* SA_HEAD_LISTS_* */
    int list_heads;        /* heads per batch of the written lists: Hkv, or Hq per head / pooled */
    int row_width;         /* entries per written row: k_sel, or the pool cap */
    float *pool;           /* pooled mode, between sel_pool_begin and sel_pool_end: every row's
                            * scores, (B, list_heads, q_tiles, kv_blocks) */
} sel_ctx;

/* head_lists modes a selector's CPU function takes (sa_selector.head_lists): a per-query
 * selector the group's lists only; a tile selector with max-style scores one list per head too;
 * one whose scores are attention mass (comparable across heads) pooled lists as well. */
#define SEL_MODES_GROUP SA_HEAD_LISTS_BIT(SA_HEAD_LISTS_GROUP)
#define SEL_MODES_HEADS (SEL_MODES_GROUP | SA_HEAD_LISTS_BIT(SA_HEAD_LISTS_PER_HEAD))
#define SEL_MODES_MASS (SEL_MODES_HEADS | SA_HEAD_LISTS_BIT(SA_HEAD_LISTS_POOLED))

/* The scored query heads of list head lh (a KV head, or a query head with per-head and pooled
 * lists): *first and the returned count, the heads whose scores the list combines (the GQA group
 * with the attention's layout, its one head per head; with index heads the index heads the
 * list's query heads map to). */
static inline int sel_list_qheads(const sel_ctx *c, int lh, int *first)
{
    const int n = c->list_heads;
    *first = (int)((long long)lh * c->qh / n);
    return c->qh >= n ? c->qh / n : 1;
}

/* The scored key head that scored query head h pairs with. */
static inline int sel_khead_of(const sel_ctx *c, int h)
{
    return (int)((long long)h * c->kh / c->qh);
}

/* Validates every argument (rules in sa_selectors.h). needs_qk = 0 lets q and k be NULL.
 * use_index = 0 scores the attention's Q and K even when index vectors are given (the oracle).
 * modes: the head_lists modes the caller takes (SEL_MODES_*; SA_ERR_UNSUPPORTED for another). */
int sel_begin(const sa_shape *s, const uint16_t *q, const uint16_t *k, const sa_select_params *p,
              const int32_t *indices, int needs_qk, int use_index, unsigned modes, sel_ctx *c);

/* sel_begin for a CPU function: also counts non-NULL when causal or pooled (SA_ERR_NULL). */
int sel_begin_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p, const int32_t *indices, const int32_t *counts,
                  int needs_qk, int use_index, unsigned modes, sel_ctx *c);

/* The head_lists and pool_cap rules (sa_select_params) for shape s, k blocks per row and a
 * selector taking `modes`: *list_heads and *row_width of the lists, or SA_ERR_ARG /
 * SA_ERR_UNSUPPORTED. p NULL: defaults. */
int sel_head_layout(const sa_shape *s, const sa_select_params *p, unsigned modes,
                    int *list_heads, int *row_width);

/* The blocks [0, n) row x may pick (x a tile, or with per_query a query): every block without
 * causal, else the ones it can see. */
static inline int sel_row_visible(const sel_ctx *c, int per_query, int x)
{
    if (!c->causal)
        return c->kv_blocks;
    return per_query ? sa_causal_query_blocks(&c->s, x) : sa_causal_tile_blocks(&c->s, x);
}

/* The shape, then the options when given (NULL stands for the defaults): the first one's code.
 * The block mass and the quality functions check their arguments in this order. */
static inline int sel_shape_opts_check(const sa_shape *s, const sa_attn_opts *opts)
{
    const int err = sa_shape_check(s);
    return err || !opts ? err : sa_attn_opts_check(opts);
}

/* BF16 -> freshly malloc'ed FP32 array (NULL on failure). */
float *sel_to_f32(const uint16_t *x, size_t n);

/* The diagonal block of tile t (or of the block holding position pos): -1 when not kept. */
static inline int sel_diag_of_tile(const sel_ctx *c, int t) { return c->keep_diagonal ? t : -1; }

/* Validates index_heads against the shape (rules at sa_select_params.index_heads) and gives the
 * head counts of q_index and k_index: SA_OK or SA_ERR_ARG. index_heads 0 gives (Hq, Hkv). */
SA_INTERNAL_API int sel_index_heads(const sa_shape *s, int index_heads, int *qh, int *kh);

/* One row: forced blocks (diag >= 0, block 0 if sink), then the best of score[0..n) until k are
 * chosen (higher score first, NaN last, ties to the lower index); writes out[0..k) sorted by
 * block index. Scratch: mark holds n bytes, top k ints. */
void sel_pick_row(const float *score, int n, int k, int diag, int sink, unsigned char *mark,
                  int32_t *top, int32_t *out);

/* Per-thread scratch of one row's pick: the n block scores a selector fills, and what
 * sel_pick_row needs beside them (sel_row_start takes it, sel_row_free gives it back). */
typedef struct sel_row {
    float *score; /* n */
    unsigned char *mark;
    int32_t *top;
    int n;
} sel_row;
void sel_row_free(sel_row *w);
/* The start of a row loop's parallel region, called by every thread of it (it holds a barrier)
 * once the thread has tried its other scratch (other_failed: some of it is missing): the
 * thread's row for c (kv_blocks scores, k_sel picks), then sa_omp_any_failed on *oom. Nonzero in
 * every thread when any thread is short, and then no thread may write a row, so that a call out
 * of memory writes nothing. The row is safe to free either way. */
int sel_row_start(sel_row *w, const sel_ctx *c, int *oom, int other_failed);
/* The pick of row x (a tile, or with per_query a query) over w->score, under every option of c:
 * without causal sel_pick_row (k blocks); with causal only the row's n visible blocks compete,
 * the diagonal block n - 1 is forced, and min(k, n) blocks are written, then -1 up to k.
 * Returns the row's count. */
int sel_row_choose(sel_row *w, const sel_ctx *c, int per_query, int x, int32_t *out);

/* The recall (B, Hq, Sq) of lists of list_heads heads (tile rows, or with per_query per-query
 * rows of Hkv heads), k entries per row and counts (NULL: k each): each query's mass inside its
 * row's first count blocks. The caller checked the shape and k; SA_ERR_COUNT or SA_ERR_INDEX for
 * a count or entry out of range, the first bad row's (its count before its entries), and then
 * nothing is written (sa_lists_recall_counts, sa_tile_lists_recall). */
int sel_lists_recall(const sa_shape *s, const float *mass, int per_query, int list_heads,
                     const int32_t *indices, const int32_t *counts, int k, float *recall);
/* Lists as a selector writes them, rows of k entries and counts (NULL: k each): SA_OK, or for
 * the first bad row SA_ERR_COUNT (a count outside [0, k]) before SA_ERR_INDEX (an entry within
 * its count outside [0, n)). Entries past a row's count are not read. */
int sel_rows_check(const int32_t *indices, const int32_t *counts, int k, size_t rows, int n);
/* The arguments of sa_lists_recall_counts past the shape: k in [1, kv_blocks], per_query a
 * flag. SA_OK or SA_ERR_ARG. */
int sel_recall_args(const sa_shape *s, int per_query, int k);

/* Pooled lists (SA_HEAD_LISTS_POOLED) are picked per GQA group once every head's scores are
 * known: a selector calls sel_pool_begin before its row loop (c->pool is then allocated, NULL in
 * the other modes), hands each row's scores to sel_row_emit, and calls sel_pool_end after the
 * loop, which writes the pooled lists (when err is SA_OK) and frees c->pool. sel_pool_begin:
 * SA_OK or SA_ERR_NOMEM; sel_pool_end returns err, or SA_ERR_NOMEM from its own scratch. */
int sel_pool_begin(sel_ctx *c);
int sel_pool_end(sel_ctx *c, int err, int32_t *indices, int32_t *counts);
/* Row r (x its tile, or its query with per_query) is done scoring in w->score: pooled, its
 * scores are kept for sel_pool_end; else sel_row_choose writes the row and its count. */
void sel_row_emit(sel_row *w, const sel_ctx *c, int per_query, int x, size_t r, int32_t *indices,
                  int32_t *counts);

/* Representative scoring shared by r1, r4 and gauss: group means of `span` tokens (128 or 32),
 * a block's score the max over (query group, key group) pairs and over the GQA group's heads;
 * gauss = 1 scores with the key groups' per-channel variances too (sel_reps.c, gauss_score). */
int sel_rep_select(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                   const sa_select_params *p, int span, int gauss, int32_t *indices,
                   int32_t *counts);
/* The FP32 dot product of the representative selectors (r1, r4, gauss, r4_mass), summed in order. */
static inline float sel_dot(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}
/* x is (heads, len, dim) BF16; out (heads, ceil(len / span), dim) gets the mean of each group of
 * span tokens (a final partial group averages only the tokens it has); var, when not NULL,
 * (heads, groups, 2 dim) gets per channel the doubled upper and lower semivariances (sel_reps.c). */
void sel_group_means(const uint16_t *x, int heads, int len, int dim, int span, float *out,
                     float *var);

#endif
