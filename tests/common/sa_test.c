#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test.h"

uint64_t sa_test_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *e = getenv("SA_SEED");
        seed = e ? strtoull(e, NULL, 0) : sa_fresh_seed();
        have = 1;
    }
    return seed;
}

void sa_test_require_gpu(void)
{
    if (!sa_gpu_available()) {
        printf("no CUDA device of sm_90: skipped\n");
        exit(77);
    }
}

int sa_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    /* No fork: compute-sanitizer and ASan see the whole run, and a crash is a failure. */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed)
        fprintf(stderr, "FAILED with SA_SEED=%" PRIu64 " (rerun with that seed to replay)\n",
                sa_test_seed());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

sa_cmp sa_compare(const float *x, const float *ref, size_t n)
{
    sa_cmp c = {0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], d = (double)x[i] - r;
        if (!isfinite(x[i]) && isfinite(ref[i])) {
            if (!c.nonfinite)
                c.first_bad = i;
            c.nonfinite++;
            continue;
        }
        if (!isfinite(ref[i]))
            continue;
        num += d * d;
        den += r * r;
        if (fabs(d) > c.max_abs) {
            c.max_abs = fabs(d);
            if (!c.nonfinite)
                c.first_bad = i;
        }
        if (fabs(r) > c.ref_max)
            c.ref_max = fabs(r);
    }
    c.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return c;
}

sa_cmp sa_compare_bf16(const uint16_t *x, const uint16_t *ref, size_t n)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    ck_assert_msg(a && b, "out of memory");
    sa_bf16_to_f32_array(a, x, n);
    sa_bf16_to_f32_array(b, ref, n);
    sa_cmp c = sa_compare(a, b, n);
    free(a);
    free(b);
    return c;
}

int sa_cmp_ok(const sa_cmp *c)
{
    return c->nonfinite == 0 && c->rel_l2 <= 1e-2 && c->max_abs <= 3e-2 * c->ref_max + 1e-3;
}

double sa_lse_maxdiff(const float *x, const float *ref, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(x[i])) {
            if (!(isinf(ref[i]) && isinf(x[i]) && (ref[i] < 0) == (x[i] < 0)))
                return INFINITY;
            continue;
        }
        if (isnan(x[i]) || isnan(ref[i]))
            return INFINITY;
        double d = fabs((double)x[i] - ref[i]);
        if (d > worst)
            worst = d;
    }
    return worst;
}

void sa_poison_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

void sa_poison_bf16(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = 0x7fc0; /* BF16 quiet NaN */
}
