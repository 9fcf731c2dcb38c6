/* An independent double-precision attention loop for checking the CPU reference. It shares
 * nothing with reference/ beyond the exact BF16 -> FP32 conversion. */
#ifndef SA_NAIVE_H
#define SA_NAIVE_H

#include <inttypes.h>

#include "sa_test.h"

/* Inputs of one case: BF16 tensors and exact double copies. */
typedef struct nv_case {
    sa_shape s;
    uint16_t *q, *k, *v;
    double *qd, *kd, *vd;
} nv_case;
/* q, k, v drawn N(0, 1) * qk_scale (q and k) and N(0, 1) (v). */
void nv_case_init(nv_case *c, sa_shape s, sa_rng *r, float qk_scale);
void nv_case_free(nv_case *c);

/* Which blocks each query reads. */
enum { NV_DENSE, NV_TILE, NV_QUERY };
typedef struct nv_rows {
    int kind;
    const int32_t *indices, *counts; /* counts NULL: every row uses max_blocks */
    int list_heads, max_blocks;      /* list_heads for NV_TILE only */
    /* 1: causal, bottom-right aligned: query i reads only the keys j <= i + (len_kv - len_q) of
     * its blocks (written here from the definition, not from the reference's helpers). */
    int causal;
} nv_rows;

/* The blocks query (b, hq, i) reads under `rows` (as docs/reference.md states them): *count of
 * them, listed in the returned row (NULL: blocks 0, 1, ...). */
const int32_t *nv_blocks_of(const sa_shape *s, const nv_rows *rows, int b, int hq, int i,
                            int *count);

/* The exact answer, in double: o (B, Hq, Sq, D), lse (B, Hq, Sq; -inf for an empty row), the
 * largest |logit| seen, the largest |o| and the largest |v|. */
typedef struct nv_result {
    double *o, *lse;
    double logit_max, o_max, v_max;
} nv_result;
void nv_attention(const nv_case *c, const nv_rows *rows, nv_result *r);
void nv_result_free(nv_result *r);

/* Reference outputs, all three allocated and poisoned with NaN by nv_out_poison. */
typedef struct nv_out {
    uint16_t *o;
    float *of, *lse;
    sa_outputs out;
} nv_out;
void nv_out_alloc(nv_out *o, const sa_shape *s);
void nv_out_poison(nv_out *o, const sa_shape *s);
void nv_out_free(nv_out *o);
/* 1 if every output value is still NaN (nothing was written). */
int nv_out_untouched(const nv_out *o, const sa_shape *s);

/* Compares the reference's FP32 O, BF16 O and LSE against the exact result. Tolerances scale with
 * it: |O err| <= NV_TOL_REL * o_max + NV_TOL_LOGIT * eps32 * logit_max * v_max (FP32 logits carry
 * an absolute error ~ eps32 * |logit|, which moves the weights by that much), LSE likewise; empty
 * rows must give exactly O = 0 and LSE = -inf; the BF16 O must be the FP32 O rounded. Returns NULL
 * when it passes, else a message naming the first failure. */
#define NV_TOL_REL 1e-5
#define NV_TOL_LOGIT 2.0
const char *nv_check(const nv_case *c, const nv_result *r, const float *of, const uint16_t *o,
                     const float *lse);

/* The partials of per-query lists (idx, counts: k slots per row), po (B, Hq, Sq, k, D) and pl
 * (B, Hq, Sq, k), slot by slot: slot j of every query against the exact attention over the one
 * block in that slot (none past the row's count), causal or not, with nv_check. Returns NULL
 * when every slot passes, else the first failure's message; *bad_slot is its slot. */
const char *nv_check_partials(const nv_case *c, const int32_t *idx, const int32_t *counts, int k,
                              int causal, const float *po, const float *pl, int *bad_slot);

/* The partials po, pl of per-query lists ql under opts (NULL: not causal), then their merge: slot
 * by slot with nv_check_partials, then sa_ref_combine of them and sa_ref_query_sparse on ql
 * under opts, each against the exact attention over the whole rows. Failures name the check,
 * the shape (#_i, the loop index of the calling test) and the seed. */
void nv_check_partials_combine(const nv_case *c, const sa_query_lists *ql,
                               const sa_attn_opts *opts, const float *po, const float *pl, int _i);

/* A random stream of its own for test `test` and shape `i`, derived from the run's seed (each
 * test file passes its own salt, so two files' streams differ). */
sa_rng nv_rng_for(uint64_t salt, int test, int i);

/* nv_check on a reference call's outputs inside a loop over shapes (loop index _i), naming the
 * call, the head dim, the shape and the seed on failure. */
#define NV_CHECK_OUT(c, res, out, what)                                                          \
    do {                                                                                         \
        const char *m_ = nv_check(c, res, (out)->of, (out)->o, (out)->lse);                      \
        ck_assert_msg(!m_, "%s, D %d, shape #%d, seed %" PRIu64 ": %s", what, (c)->s.head_dim,  \
                      _i, sa_test_seed(), m_);                                                   \
    } while (0)

/* Random helpers. */
void nv_shuffle_rows(sa_rng *r, int32_t *indices, size_t rows, int max_blocks);
/* counts in [0, max_blocks], about one row in six empty. */
void nv_random_counts(sa_rng *r, int32_t *counts, size_t rows, int max_blocks);
void *nv_malloc(size_t bytes);

/* Causal geometry from the definition (not from the library's helpers): query i's last visible
 * key, the blocks [0, n) a last key makes visible, the blocks tile t's last valid row sees, and
 * the rows of tile lists with lh list heads. */
long long nv_last_key(const sa_shape *s, int i);
int nv_visible_blocks(long long last);
int nv_tile_visible(const sa_shape *s, int t);
size_t nv_tile_rows(const sa_shape *s, int lh);

/* Random list rows of k slots, `per` rows per (batch, head) (tiles when `tiles`, else queries):
 * a count in [0, min(k, usable)], usable = every block, or with causal the row's visible ones
 * (about one row in six empty, and with last_empty the last row when there are several);
 * distinct blocks in random order, -1 past the count. With `future` (causal), a row that has
 * room and lies before the last block also gets one block wholly after its last visible key, at
 * a random slot. */
void nv_fill_rows(sa_rng *r, const sa_shape *s, int32_t *idx, int32_t *counts, size_t rows,
                  int per, int tiles, int k, int causal, int future, int last_empty);
/* 1 when some row of such lists names a block past its visible prefix (causally). */
int nv_has_future(const sa_shape *s, const int32_t *idx, const int32_t *counts, size_t rows,
                  int per, int tiles, int k);

/* Shapes every entry point must reject, with the code: fields of a valid shape (1 x 4 / 2 heads
 * x 130 x 300 x 64) broken one at a time, and shapes whose element counts wrap 64 bits or pass
 * the size limits (sparseattn.h). */
typedef struct nv_bad_shape {
    sa_shape s;
    int code;
} nv_bad_shape;
extern const nv_bad_shape nv_bad_shapes[];
extern const int nv_nbad;

/* Valid lists for the error tests, which break one entry at a time: tile lists with list_heads =
 * Hkv (*tidx of *trows rows) and per-query lists (*qidx of *qrows rows), k distinct blocks a row
 * drawn from r, every count (*tcnt, *qcnt) k. */
void nv_full_lists(sa_rng *r, const sa_shape *s, int k, int32_t **tidx, int32_t **tcnt,
                   size_t *trows, int32_t **qidx, int32_t **qcnt, size_t *qrows);

#endif
