/* Shared between the selector test files: brute-force references written independently of
 * selectors/ (double precision, plain loops) and the list checker. */
#ifndef SEL_TEST_H
#define SEL_TEST_H

#include "sa_test.h"

/* Brute-force score of every (b, hkv, row, block); rows are tiles, or queries for per-query
 * selectors. Returns a malloc'ed array of rows * kv_blocks doubles. q/k are the scored vectors
 * (attention Q/K or index vectors) of length dim; qa/ka are the attention Q/K (oracle). */
double *bf_scores(const char *name, const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  int dim);
/* The same with causal = 1: query i and key j pair only when j <= i + (len_kv - len_q) (nvfp4
 * maxima and the oracle's softmax; r1/r4 score whole blocks, causal or not, as documented). */
double *bf_scores_causal(const char *name, const sa_shape *s, const uint16_t *q,
                         const uint16_t *k, int dim, int causal);

/* Checks one output row against brute-force scores: sorted, distinct, in range, forced blocks
 * present, and every chosen unforced block scores at least every unchosen one minus a band
 * (relative 1e-4 of the row's largest |score|): exact equality unless scores nearly tie.
 * Returns NULL when fine, else a static message. */
const char *bf_check_row(const double *score, int n, int k, int diag, int sink,
                         const int32_t *row);

/* Checks pooled lists (SA_HEAD_LISTS_POOLED: rows (B, Hq, q_tiles, cap) with counts) against
 * per-head brute-force scores sc, rows (B, Hq, q_tiles, kv_blocks) (bf_scores of a group of one:
 * K copied to one KV head per query head), under p's k, causal, keep_diagonal and keep_sink. Per
 * (batch, group, tile): rows sorted, distinct, visible, -1 past the count, holding their forced
 * blocks; a head at most min(cap, n) blocks and the group H * min(k, n); and no block left out
 * of a head with room scoring above a chosen unforced one of the group (a band of 1e-4 of the
 * group's largest |score|), the exchange rule of the greedy. NULL when fine, else a static
 * message; *moved += the rows holding other than min(k, n) blocks. */
const char *bf_check_pooled(const sa_shape *s, const double *sc, const sa_select_params *p,
                            const int32_t *idx, const int32_t *cnt, int cap, int *moved);

/* The test's own NVFP4 quantizer: nearest representable value by enumeration, ties to the even
 * code. Fills values/scales like sa_nvfp4_quantize_f32 and returns the tensor scale. */
float bf_nvfp4_quantize(const float *x, size_t n, uint8_t *values, uint8_t *scales);
double bf_e2m1(uint8_t code);
double bf_e4m3(uint8_t code);

/* K (B, Hkv, Skv, D) -> (B, Hq, Skv, D), query head h's KV head copied to head h: a group of
 * one per query head, whose group lists and scores are the per-head ones (malloc'ed). */
uint16_t *bf_kv_per_head(const sa_shape *s, const uint16_t *k);

/* Random BF16 N(0, 1) * scale. */
uint16_t *bf_random_bf16(sa_rng *r, size_t n, float scale);

TCase *tc_nvfp4(void);
TCase *tc_workloads(void);
TCase *tc_causal(void);

#endif
