/* Helpers shared by the Check tests: seeds, comparisons, poisoning. */
#ifndef SA_TEST_H
#define SA_TEST_H

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h"

/* The seed of this run: $SA_SEED if set (to replay a failure), else fresh. Printed on failure by
 * the ck_assert messages that include it. */
uint64_t sa_test_seed(void);

/* Exit 77 (skipped) unless a GPU is present; call first in a gpu-suite main(). */
void sa_test_require_gpu(void);

/* Run one suite; returns the process exit code. */
int sa_test_run(Suite *s);

/* Comparison of a result against a reference, over n values (float32). */
typedef struct sa_cmp {
    double rel_l2;   /* ||x - ref|| / ||ref|| */
    double max_abs;  /* max |x - ref| */
    double ref_max;  /* max |ref| */
    size_t nonfinite; /* values of x that are NaN or inf where ref is finite */
    size_t first_bad; /* index of the first non-finite or largest error */
} sa_cmp;
sa_cmp sa_compare(const float *x, const float *ref, size_t n);
sa_cmp sa_compare_bf16(const uint16_t *x, const uint16_t *ref, size_t n);
/* The stage-14 tolerance: rel_l2 <= 1e-2 and max_abs <= 3e-2 * ref_max + 1e-3, all finite. */
int sa_cmp_ok(const sa_cmp *c);
/* LSE: same -inf pattern, finite values within tol absolute. Returns the worst error (inf if the
 * pattern differs). */
double sa_lse_maxdiff(const float *x, const float *ref, size_t n);

/* Fill with NaN so unwritten outputs show. */
void sa_poison_f32(float *p, size_t n);
void sa_poison_bf16(uint16_t *p, size_t n);

#endif
