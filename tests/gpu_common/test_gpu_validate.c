/* The GPU list validator agrees with the host validator: on valid random lists, and on each
 * single fault (bad index, duplicate, bad count, empty row) planted at a random row. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_gpu.h"


typedef struct fixture {
    sa_shape s;
    int max_blocks;
    size_t rows;
    int32_t *idx, *cnt;     /* host */
    int32_t *d_idx, *d_cnt; /* device */
} fixture;

static void setup(fixture *f, sa_shape s, int max_blocks, int per_query)
{
    f->s = s;
    f->max_blocks = max_blocks;
    f->rows = per_query ? sa_query_rows(&s) : (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
    f->idx = malloc(f->rows * max_blocks * sizeof(int32_t));
    f->cnt = malloc(f->rows * sizeof(int32_t));
    ck_assert(f->idx && f->cnt);
    int err = per_query ? sa_random_query_lists(&s, max_blocks, sa_test_seed(), f->idx)
                        : sa_random_tile_lists(&s, s.heads_kv, max_blocks, SA_LISTS_INDEPENDENT,
                                               sa_test_seed(), f->idx);
    ck_assert_int_eq(err, SA_OK);
    for (size_t r = 0; r < f->rows; r++)
        f->cnt[r] = max_blocks;
    CK_CUDA(cudaMalloc((void **)&f->d_idx, f->rows * max_blocks * sizeof(int32_t)));
    CK_CUDA(cudaMalloc((void **)&f->d_cnt, f->rows * sizeof(int32_t)));
}

static void upload(fixture *f)
{
    CK_CUDA(cudaMemcpy(f->d_idx, f->idx, f->rows * f->max_blocks * sizeof(int32_t),
                       cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(f->d_cnt, f->cnt, f->rows * sizeof(int32_t), cudaMemcpyHostToDevice));
}

static void teardown(fixture *f)
{
    free(f->idx);
    free(f->cnt);
    CK_CUDA(cudaFree(f->d_idx));
    CK_CUDA(cudaFree(f->d_cnt));
}

/* Host and device verdicts on the current lists, with and without counts. */
static void agree(fixture *f, int per_query, int allow_empty, int expect)
{
    upload(f);
    int host, dev;
    if (per_query) {
        sa_query_lists h = {f->idx, f->cnt, f->max_blocks}, d = {f->d_idx, f->d_cnt, f->max_blocks};
        host = sa_query_lists_check(&f->s, &h, allow_empty);
        dev = sa_gpu_query_lists_check(&f->s, &d, allow_empty, NULL);
    } else {
        sa_tile_lists h = {f->idx, f->cnt, f->s.heads_kv, f->max_blocks};
        sa_tile_lists d = {f->d_idx, f->d_cnt, f->s.heads_kv, f->max_blocks};
        host = sa_tile_lists_check(&f->s, &h, allow_empty);
        dev = sa_gpu_tile_lists_check(&f->s, &d, allow_empty, NULL);
    }
    ck_assert_msg(host == expect && dev == expect,
                  "expected %d, host %d, device %d (seed %llu)", expect, host, dev,
                  (unsigned long long)sa_test_seed());
}

static void faults(int per_query, sa_shape s, int max_blocks)
{
    fixture f;
    setup(&f, s, max_blocks, per_query);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 77);
    agree(&f, per_query, 0, SA_OK);
    size_t row = sa_rng_below(&r, (uint32_t)f.rows);
    int slot = (int)sa_rng_below(&r, (uint32_t)max_blocks);
    int32_t *e = &f.idx[row * max_blocks + slot], saved = *e;
    *e = sa_kv_blocks(&s);
    agree(&f, per_query, 0, SA_ERR_INDEX);
    *e = -1;
    agree(&f, per_query, 0, SA_ERR_INDEX);
    *e = f.idx[row * max_blocks + (slot + 1) % max_blocks];
    agree(&f, per_query, 0, SA_ERR_DUPLICATE);
    *e = saved;
    f.cnt[row] = max_blocks + 1;
    agree(&f, per_query, 0, SA_ERR_COUNT);
    f.cnt[row] = -3;
    agree(&f, per_query, 0, SA_ERR_COUNT);
    f.cnt[row] = 0;
    agree(&f, per_query, 0, SA_ERR_EMPTY_ROW);
    agree(&f, per_query, 1, SA_OK);
    teardown(&f);
}

START_TEST(test_tile_lists)
{
    faults(0, (sa_shape){2, 16, 1, 4096, 16384, 128}, 16);
    if (!sa_test_small()) {
        faults(0, (sa_shape){1, 4, 4, 1000, 130000, 128}, 64); /* 1016 blocks, partial last */
        faults(0, (sa_shape){3, 2, 2, 128, 300, 64}, 3);
    }
}
END_TEST

START_TEST(test_query_lists)
{
    faults(1, (sa_shape){1, 16, 1, 512, 4096, 128}, 16);
    if (!sa_test_small())
        faults(1, (sa_shape){2, 4, 2, 1000, 20000, 128}, 32);
}
END_TEST

START_TEST(test_argument_errors)
{
    sa_shape s = {1, 1, 1, 128, 128, 128};
    int32_t *d;
    CK_CUDA(cudaMalloc((void **)&d, 4));
    sa_tile_lists l = {d, NULL, 1, 1};
    ck_assert_int_eq(sa_gpu_tile_lists_check(NULL, &l, 1, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_gpu_tile_lists_check(&s, NULL, 1, NULL), SA_ERR_NULL);
    l.list_heads = 2;
    ck_assert_int_eq(sa_gpu_tile_lists_check(&s, &l, 1, NULL), SA_ERR_LIST_HEADS);
    l.list_heads = 1;
    l.max_blocks = 0;
    ck_assert_int_eq(sa_gpu_tile_lists_check(&s, &l, 1, NULL), SA_ERR_MAX_BLOCKS);
    s.heads_kv = 0;
    ck_assert_int_eq(sa_gpu_tile_lists_check(&s, &l, 1, NULL), SA_ERR_SHAPE);
    CK_CUDA(cudaFree(d));
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    Suite *s = suite_create("gpu_validate");
    TCase *tc = tcase_create("lists");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_tile_lists);
    tcase_add_test(tc, test_query_lists);
    tcase_add_test(tc, test_argument_errors);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
