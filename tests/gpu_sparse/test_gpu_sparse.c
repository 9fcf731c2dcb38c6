/* Every stage of the registry with SA_ROLE_SPARSE (block_sparse, gqa_pairs, ...) against the CPU
 * reference sa_ref_tile_sparse, all run on the same inputs: fresh random Q/K/V and lists every
 * run (the seed is printed on failure, SA_SEED replays it), O and LSE poisoned with NaN before
 * every launch. Cases: independent and pairwise-identical lists, per-head and group-shared lists,
 * GQA ratios 1/2/4/16 (and an odd group of 3), variable counts including 0 (O = 0, LSE = -inf),
 * every block selected (must equal sa_ref_dense), a partial final KV block and a partial last Q
 * tile, the persistent benchmark shape; bad metadata (each validation error) and unsupported
 * arguments, which must return their code; a stage without SA_ROLE_GPU_VERDICT must also leave
 * O and LSE untouched on bad metadata (one with it checks inside its kernel and writes NaN rows;
 * its own tests are elsewhere). SA_SMALL=1 runs only the smallest case and the error paths (for
 * compute-sanitizer). Without a sparse stage in the registry the test is skipped (exit 77). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_gpu.h"

/* Pattern beyond the generator's two: every block of the sequence, in a shuffled order. */
#define LISTS_ALL 2

/* The n-th registered stage with SA_ROLE_SPARSE, NULL past the last: every test loops
 * `for (int si = 0; (st = sparse_stage(si)); si++)`. */
static const sa_stage *sparse_stage(int n)
{
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if ((st->roles & SA_ROLE_SPARSE) && n-- == 0)
            return st;
    }
    return NULL;
}

static sa_gpu_attn args_for(const sa_shape *s, const sa_test_dev *d, int list_heads, int k,
                            int with_counts)
{
    sa_gpu_attn a = sa_test_dev_args(s, d);
    a.lists.indices = d->idx;
    a.lists.counts = with_counts ? d->cnt : NULL;
    a.lists.list_heads = list_heads;
    a.lists.max_blocks = k;
    return a;
}

typedef struct case_spec {
    int batch, hq, hkv, len_q, len_kv;
    int per_head;   /* 1: list_heads = hq, else hkv */
    int k;          /* max_blocks (ignored for LISTS_ALL: every block) */
    int pattern;    /* SA_LISTS_INDEPENDENT, SA_LISTS_PAIRED or LISTS_ALL */
    int var_counts; /* 1: counts in [0, k], some rows empty, neighbours different */
    int force_last; /* 1: every full row contains the last (partial) block, at a random slot */
    int validate;
    float q_scale;
} case_spec;

static void describe(char *buf, size_t n, const case_spec *c)
{
    snprintf(buf, n, "B%d Hq%d Hkv%d Sq%d Skv%d %s lists k=%d pattern %d%s%s%s qscale %.1f",
             c->batch, c->hq, c->hkv, c->len_q, c->len_kv, c->per_head ? "per-head" : "group",
             c->k, c->pattern, c->var_counts ? " var-counts" : "",
             c->force_last ? " last-block" : "", c->validate ? "" : " no-validate", c->q_scale);
}

/* Random lists for the spec on the host; returns k actually used. */
static int make_lists(const case_spec *c, const sa_shape *s, int list_heads, sa_rng *r,
                      int32_t **idx_out, int32_t **cnt_out, size_t *rows_out)
{
    const int nb = sa_kv_blocks(s);
    const int k = c->pattern == LISTS_ALL ? nb : c->k;
    ck_assert_int_le(k, nb);
    sa_tile_lists shape_only = {NULL, NULL, list_heads, k};
    const size_t rows = sa_tile_rows(s, &shape_only);
    int32_t *idx = malloc(rows * k * 4), *cnt = malloc(rows * 4);
    ck_assert(idx && cnt);
    if (c->pattern == LISTS_ALL) {
        for (size_t row = 0; row < rows; row++) {
            int32_t *x = idx + row * k;
            for (int j = 0; j < k; j++)
                x[j] = j;
            for (int j = k - 1; j > 0; j--) { /* the kernel must not care about the order */
                int o = (int)sa_rng_below(r, (uint32_t)j + 1);
                int32_t t = x[j];
                x[j] = x[o];
                x[o] = t;
            }
        }
    } else {
        ck_assert_int_eq(sa_random_tile_lists(s, list_heads, k, c->pattern, sa_rng_u64(r), idx),
                         SA_OK);
    }
    if (c->force_last) {
        for (size_t row = 0; row < rows; row++) {
            int32_t *x = idx + row * k;
            int has = 0;
            for (int j = 0; j < k; j++)
                has |= x[j] == nb - 1;
            if (!has)
                x[sa_rng_below(r, (uint32_t)k)] = nb - 1;
        }
    }
    for (size_t row = 0; row < rows; row++)
        cnt[row] = k;
    if (c->var_counts) {
        for (size_t row = 0; row < rows; row++)
            cnt[row] = (int32_t)sa_rng_below(r, (uint32_t)k + 1);
        cnt[0] = 0; /* an empty row in the first item, next to a non-empty one */
        if (rows > 1)
            cnt[1] = k;
        if (rows > 3)
            cnt[2] = cnt[3] = 0; /* a whole item without work (block_sparse's items of 2 tiles) */
    }
    *idx_out = idx;
    *cnt_out = cnt;
    *rows_out = rows;
    return k;
}

static void run_case(const case_spec *c, uint64_t salt)
{
    char what[200];
    describe(what, sizeof what, c);
    sa_shape s = {c->batch, c->hq, c->hkv, c->len_q, c->len_kv, 128};
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    const int list_heads = c->per_head ? c->hq : c->hkv;
    size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *lse_gpu = malloc(nl * 4);
    float *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    ck_assert(q && k && v && o_ref && o_gpu && lse_ref && lse_gpu && of_ref && of_gpu);

    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ (salt * 0x9e3779b97f4a7c15ull));
    sa_rng_fill_bf16(&r, q, nq, c->q_scale);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    int32_t *idx, *cnt;
    size_t rows;
    const int kk = make_lists(c, &s, list_heads, &r, &idx, &cnt, &rows);
    const int with_counts = c->var_counts;
    sa_tile_lists l = {idx, with_counts ? cnt : NULL, list_heads, kk};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    opts.allow_empty_rows = 1;

    sa_outputs ref = {o_ref, NULL, lse_ref};
    sa_poison_bf16(o_ref, nq);
    sa_poison_f32(lse_ref, nl);
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, k, v, &l, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);
    if (c->pattern == LISTS_ALL) {
        /* Every block selected is dense attention: the sparse reference must agree first. */
        uint16_t *o_dense = malloc(nq * 2);
        float *lse_dense = malloc(nl * 4), *of_dense = malloc(nq * 4);
        ck_assert(o_dense && lse_dense && of_dense);
        sa_outputs dref = {o_dense, NULL, lse_dense};
        ck_assert_int_eq(sa_ref_dense(&s, q, k, v, &dref), SA_OK);
        sa_bf16_to_f32_array(of_dense, o_dense, nq);
        sa_cmp cd = sa_compare(of_ref, of_dense, nq);
        ck_assert_msg(sa_cmp_ok(&cd) && sa_lse_maxdiff(lse_ref, lse_dense, nl) <= 1e-3,
                      "%s: tile-sparse reference with every block != dense reference", what);
        memcpy(of_ref, of_dense, nq * 4); /* the GPU is compared with the dense one */
        memcpy(lse_ref, lse_dense, nl * 4);
        free(o_dense), free(lse_dense), free(of_dense);
    }

    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * kk, rows);
    sa_test_dev_upload(&d, &s, q, k, v, idx, rows * kk, cnt, rows);
    const sa_stage *st;
    for (int si = 0; (st = sparse_stage(si)); si++) {
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
        sa_gpu_attn a = args_for(&s, &d, list_heads, kk, with_counts);
        a.validate = c->validate;
        a.allow_empty_rows = 1;
        ck_assert_msg(st->check(&a) == SA_OK, "stage %d %s: check: %s (seed %llu)", st->id, what,
                      sa_strerror(st->check(&a)), (unsigned long long)sa_test_seed());
        int rc = st->launch(&a);
        ck_assert_msg(rc == SA_OK, "stage %d %s: launch: %s (seed %llu)", st->id, what,
                      sa_strerror(rc), (unsigned long long)sa_test_seed());
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
        CK_CUDA(cudaMemcpy(o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(lse_gpu, d.lse, nl * 4, cudaMemcpyDeviceToHost));
        sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
        sa_cmp cmp = sa_compare(of_gpu, of_ref, nq);
        double lse_err = sa_lse_maxdiff(lse_gpu, lse_ref, nl);
        ck_assert_msg(sa_cmp_ok(&cmp) && lse_err <= 1e-2,
                      "stage %d %s: O rel_l2 %.3g max_abs %.3g (ref max %.3g, %zu non-finite, "
                      "first bad %zu), LSE max diff %.3g (seed %llu)",
                      st->id, what, cmp.rel_l2, cmp.max_abs, cmp.ref_max, cmp.nonfinite,
                      cmp.first_bad, lse_err, (unsigned long long)sa_test_seed());
        if (c->var_counts) {
            /* Empty rows: exactly zero output (the tolerance above would pass small noise). */
            const int tiles = sa_q_tiles(&s), per_list = s.heads_q / list_heads;
            for (int b = 0; b < s.batch; b++)
                for (int h = 0; h < s.heads_q; h++)
                    for (int t = 0; t < tiles; t++) {
                        size_t row = ((size_t)b * list_heads + h / per_list) * tiles + t;
                        if (cnt[row] != 0)
                            continue;
                        size_t q0 = ((size_t)b * s.heads_q + h) * s.len_q + (size_t)t * 128;
                        size_t q1 = q0 + 128 < ((size_t)b * s.heads_q + h + 1) * s.len_q
                                        ? q0 + 128
                                        : ((size_t)b * s.heads_q + h + 1) * s.len_q;
                        for (size_t i = q0 * 128; i < q1 * 128; i++)
                            ck_assert_msg(o_gpu[i] == 0, "stage %d %s: empty row, O[%zu] = %#x "
                                          "(seed %llu)", st->id, what, i, o_gpu[i],
                                          (unsigned long long)sa_test_seed());
                    }
        }
    }
    sa_test_dev_free(&d);
    free(q), free(k), free(v), free(o_ref), free(o_gpu), free(lse_ref), free(lse_gpu);
    free(of_ref), free(of_gpu), free(idx), free(cnt);
}

/* The sanitizer case: an odd tile count, a partial final block, empty rows and tiles of one item
 * with different counts (block_sparse's padding turns), group-shared lists (gqa_pairs's pairs). */
START_TEST(small_mixed)
{
    case_spec c = {1, 2, 1, 384, 600, 0, 3, SA_LISTS_INDEPENDENT, 1, 1, 1, 4.0f};
    run_case(&c, 1);
}
END_TEST

START_TEST(independent_gqa_ratios)
{
    if (sa_test_small())
        return;
    /* GQA ratios 1, 2, 4, 16 (and an odd 3), group-shared and per-head lists. */
    static const int shapes[][3] = {{1, 2, 2}, {2, 4, 2}, {1, 8, 2}, {1, 16, 1}, {1, 6, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int per_head = 0; per_head < 2; per_head++) {
            case_spec c = {shapes[i][0], shapes[i][1], shapes[i][2], 1024, 2048, per_head, 8,
                           SA_LISTS_INDEPENDENT, 0, 0, 1, 4.0f};
            run_case(&c, 10 + i * 2 + per_head);
        }
}
END_TEST

START_TEST(paired_lists)
{
    if (sa_test_small())
        return;
    case_spec c = {2, 8, 2, 1024, 4096, 0, 16, SA_LISTS_PAIRED, 0, 0, 1, 6.0f};
    run_case(&c, 30);
    c.per_head = 1;
    c.hkv = 8; /* MHA, per-head = group lists: gqa_pairs pairs neighbouring tiles */
    run_case(&c, 31);
}
END_TEST

START_TEST(variable_counts)
{
    if (sa_test_small())
        return;
    for (int pattern = 0; pattern < 2; pattern++)
        for (int per_head = 0; per_head < 2; per_head++) {
            case_spec c = {2, 4, 2, 768, 1536, per_head, 6, pattern, 1, 0, 1, 4.0f};
            run_case(&c, 40 + pattern * 2 + per_head);
        }
}
END_TEST

START_TEST(all_blocks_equal_dense)
{
    if (sa_test_small())
        return;
    case_spec c = {1, 4, 1, 512, 1024, 0, 0, LISTS_ALL, 0, 0, 1, 4.0f};
    run_case(&c, 50);
    c.len_kv = 1000; /* partial final block, all selected */
    c.len_q = 384;
    run_case(&c, 51);
}
END_TEST

START_TEST(partial_tiles)
{
    if (sa_test_small())
        return;
    /* A partial final KV block in every row (at a random slot) and a partial last Q tile. */
    case_spec c = {1, 4, 2, 200, 1000, 0, 4, SA_LISTS_INDEPENDENT, 0, 1, 1, 4.0f};
    run_case(&c, 60);
    c.len_kv = 129; /* the last block holds one key */
    c.k = 2;
    c.per_head = 1;
    run_case(&c, 61);
    c.len_q = 1000;
    c.len_kv = 3000;
    c.k = 7;
    c.var_counts = 1;
    run_case(&c, 62);
}
END_TEST

/* The benchmark's shape (8K keys), more items than SMs, validation off. */
START_TEST(study_shape)
{
    if (sa_test_small())
        return;
    case_spec c = {2, 16, 1, 4096, 8192, 0, 16, SA_LISTS_INDEPENDENT, 0, 0, 0, 2.0f};
    run_case(&c, 70);
    c.pattern = SA_LISTS_PAIRED;
    c.validate = 1;
    run_case(&c, 71);
}
END_TEST

/* Bad metadata: the validator's code from launch() (synchronous: no verdict), and for a stage
 * without SA_ROLE_GPU_VERDICT, O and LSE keep their poison. A stage with that role checks the
 * lists inside its kernel: it still returns the code, but writes the rows whose lists are valid
 * and NaN into the others, so only the code is asserted here. */
START_TEST(bad_metadata_rejected)
{
    sa_shape s = {1, 2, 1, 256, 512, 128};
    const int k = 2, nb = sa_kv_blocks(&s);
    sa_tile_lists shape_only = {NULL, NULL, 1, k};
    const size_t rows = sa_tile_rows(&s, &shape_only), nq = sa_q_elems(&s), nl = sa_lse_elems(&s);
    int32_t *idx = malloc(rows * k * 4), *cnt = malloc(rows * 4);
    uint16_t *o = malloc(nq * 2);
    float *lse = malloc(nl * 4);
    ck_assert(idx && cnt && o && lse);
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * k, rows);
    /* Zero inputs: a stage without SA_ROLE_GPU_VERDICT only checks the lists and never reads them;
     * one with it attends over them in the rows whose lists are valid. */
    CK_CUDA(cudaMemset(d.q, 0, nq * 2));
    CK_CUDA(cudaMemset(d.k, 0, sa_kv_elems(&s) * 2));
    CK_CUDA(cudaMemset(d.v, 0, sa_kv_elems(&s) * 2));
    enum { BAD_INDEX, BAD_NEG_INDEX, BAD_DUP, BAD_COUNT_HIGH, BAD_COUNT_NEG, BAD_EMPTY, NBAD };
    static const int expect[NBAD] = {SA_ERR_INDEX,     SA_ERR_INDEX, SA_ERR_DUPLICATE,
                                     SA_ERR_COUNT,     SA_ERR_COUNT, SA_ERR_EMPTY_ROW};
    const sa_stage *st;
    for (int si = 0; (st = sparse_stage(si)); si++) {
        const int untouched = !(st->roles & SA_ROLE_GPU_VERDICT);
        for (int bad = 0; bad < NBAD; bad++) {
            ck_assert_int_eq(sa_random_tile_lists(&s, 1, k, SA_LISTS_INDEPENDENT, 7 + bad, idx),
                             SA_OK);
            for (size_t r = 0; r < rows; r++)
                cnt[r] = k;
            const size_t row = rows - 1; /* the last row: the whole list must be scanned */
            if (bad == BAD_INDEX)
                idx[row * k + 1] = nb;
            else if (bad == BAD_NEG_INDEX)
                idx[row * k] = -1;
            else if (bad == BAD_DUP)
                idx[row * k + 1] = idx[row * k];
            else if (bad == BAD_COUNT_HIGH)
                cnt[row] = k + 1;
            else if (bad == BAD_COUNT_NEG)
                cnt[row] = -1;
            else
                cnt[row] = 0;
            CK_CUDA(cudaMemcpy(d.idx, idx, rows * k * 4, cudaMemcpyHostToDevice));
            CK_CUDA(cudaMemcpy(d.cnt, cnt, rows * 4, cudaMemcpyHostToDevice));
            CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
            CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
            sa_gpu_attn a = args_for(&s, &d, 1, k, 1);
            a.allow_empty_rows = bad == BAD_EMPTY ? 0 : 1;
            ck_assert_int_eq(st->check(&a), SA_OK); /* check() does not read device lists */
            int rc = st->launch(&a);
            ck_assert_msg(rc == expect[bad], "stage %d, bad metadata %d: got %d (%s), want %d",
                          st->id, bad, rc, sa_strerror(rc), expect[bad]);
            CK_CUDA(cudaDeviceSynchronize());
            CK_CUDA(cudaGetLastError());
            if (!untouched)
                continue;
            CK_CUDA(cudaMemcpy(o, d.o, nq * 2, cudaMemcpyDeviceToHost));
            CK_CUDA(cudaMemcpy(lse, d.lse, nl * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < nq; i++)
                ck_assert_msg(o[i] == 0xFFFF, "stage %d, bad metadata %d: O[%zu] written",
                              st->id, bad, i);
            for (size_t i = 0; i < nl; i++) {
                uint32_t bits;
                memcpy(&bits, &lse[i], 4);
                ck_assert_msg(bits == 0xFFFFFFFFu, "stage %d, bad metadata %d: LSE[%zu] written",
                              st->id, bad, i);
            }
        }
        /* The same empty row is fine when empty rows are allowed: O = 0, LSE = -inf there. */
        cnt[rows - 1] = 0;
        CK_CUDA(cudaMemcpy(d.cnt, cnt, rows * 4, cudaMemcpyHostToDevice));
        ck_assert_int_eq(sa_random_tile_lists(&s, 1, k, SA_LISTS_INDEPENDENT, 99, idx), SA_OK);
        CK_CUDA(cudaMemcpy(d.idx, idx, rows * k * 4, cudaMemcpyHostToDevice));
        sa_gpu_attn a = args_for(&s, &d, 1, k, 1);
        ck_assert_int_eq(st->launch(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
    }
    sa_test_dev_free(&d);
    free(idx), free(cnt), free(o), free(lse);
}
END_TEST

/* Argument errors and unsupported shapes: the code from check() and launch(), no launch. */
START_TEST(unsupported_and_null)
{
    sa_shape s = {1, 2, 1, 256, 512, 128};
    const int k = 2;
    sa_tile_lists shape_only = {NULL, NULL, 1, k};
    const size_t rows = sa_tile_rows(&s, &shape_only), nq = sa_q_elems(&s);
    int32_t *idx = malloc(rows * k * 4);
    uint16_t *o = malloc(nq * 2);
    ck_assert(idx && o);
    ck_assert_int_eq(sa_random_tile_lists(&s, 1, k, SA_LISTS_INDEPENDENT, 5, idx), SA_OK);
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * k, rows);
    CK_CUDA(cudaMemcpy(d.idx, idx, rows * k * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemset(d.o, 0x3c, nq * 2)); /* a finite sentinel a launch would overwrite */
    const sa_stage *st;
    for (int si = 0; (st = sparse_stage(si)); si++) {
        const sa_gpu_attn good = args_for(&s, &d, 1, k, 0);
        ck_assert_int_eq(st->check(&good), SA_OK);
        ck_assert_int_eq(st->check(NULL), SA_ERR_NULL);
        ck_assert_int_eq(st->launch(NULL), SA_ERR_NULL);
        for (int i = 0; i < 12; i++) {
            sa_gpu_attn a = good;
            int want;
            switch (i) {
            case 0: a.q = NULL; want = SA_ERR_NULL; break;
            case 1: a.k = NULL; want = SA_ERR_NULL; break;
            case 2: a.v = NULL; want = SA_ERR_NULL; break;
            case 3: a.o = NULL; want = SA_ERR_NULL; break;
            case 4: a.lists.indices = NULL; want = SA_ERR_NULL; break;
            case 5: a.lists.list_heads = 3; want = SA_ERR_LIST_HEADS; break;
            case 6: a.lists.max_blocks = 0; want = SA_ERR_MAX_BLOCKS; break;
            case 7: a.shape.head_dim = 64; want = SA_ERR_UNSUPPORTED; break;
            case 8: a.q = (const uint16_t *)((const char *)good.q + 2); want = SA_ERR_UNSUPPORTED;
                    break; /* TMA needs 16-byte aligned tensors */
            case 9: a.shape.heads_q = 3; a.shape.heads_kv = 2; want = SA_ERR_GQA; break;
            case 10: a.shape.batch = 0; want = SA_ERR_SHAPE; break;
            default: a.validate = 0; a.lists.max_blocks = -1; want = SA_ERR_MAX_BLOCKS; break;
            }
            ck_assert_msg(st->check(&a) == want, "stage %d case %d: check %d, want %d", st->id,
                          i, st->check(&a), want);
            ck_assert_msg(st->launch(&a) == want, "stage %d case %d: launch %d, want %d",
                          st->id, i, st->launch(&a), want);
        }
    }
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(o, d.o, nq * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nq; i++)
        ck_assert_msg(o[i] == 0x3c3c, "a rejected call wrote O[%zu]", i);
    sa_test_dev_free(&d);
    free(idx), free(o);
}
END_TEST

/* A valid launch without LSE writes every O. */
START_TEST(lse_optional)
{
    if (sa_test_small())
        return;
    sa_shape s = {1, 4, 2, 512, 1024, 128};
    const int k = 3;
    sa_tile_lists shape_only = {NULL, NULL, 2, k};
    const size_t rows = sa_tile_rows(&s, &shape_only), nq = sa_q_elems(&s);
    int32_t *idx = malloc(rows * k * 4);
    uint16_t *h = malloc(sa_kv_elems(&s) * 2 > nq * 2 ? sa_kv_elems(&s) * 2 : nq * 2);
    ck_assert(idx && h);
    ck_assert_int_eq(sa_random_tile_lists(&s, 2, k, SA_LISTS_INDEPENDENT, sa_test_seed(), idx),
                     SA_OK);
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * k, rows);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 77);
    sa_rng_fill_bf16(&r, h, nq, 1.0f);
    CK_CUDA(cudaMemcpy(d.q, h, nq * 2, cudaMemcpyHostToDevice));
    sa_rng_fill_bf16(&r, h, sa_kv_elems(&s), 1.0f);
    CK_CUDA(cudaMemcpy(d.k, h, sa_kv_elems(&s) * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.v, h, sa_kv_elems(&s) * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.idx, idx, rows * k * 4, cudaMemcpyHostToDevice));
    const sa_stage *st;
    for (int si = 0; (st = sparse_stage(si)); si++) {
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        sa_gpu_attn a = args_for(&s, &d, 2, k, 0);
        a.lse = NULL;
        ck_assert_int_eq(st->launch(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(h, d.o, nq * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nq; i++)
            ck_assert_msg((h[i] & 0x7f80) != 0x7f80, "stage %d: O[%zu] not written (seed %llu)",
                          st->id, i, (unsigned long long)sa_test_seed());
    }
    sa_test_dev_free(&d);
    free(idx), free(h);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    if (!sparse_stage(0)) {
        printf("no stage with SA_ROLE_SPARSE in the registry: nothing to test\n");
        return 77;
    }
    for (int si = 0; sparse_stage(si); si++)
        printf("sparse stage %d (%s)%s\n", sparse_stage(si)->id, sparse_stage(si)->name,
               sparse_stage(si)->roles & SA_ROLE_GPU_VERDICT ? ", GPU verdict" : "");
    Suite *s = suite_create("gpu_sparse");
    TCase *tc = tcase_create("sparse_stages");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, small_mixed);
    tcase_add_test(tc, bad_metadata_rejected);
    tcase_add_test(tc, unsupported_and_null);
    tcase_add_test(tc, independent_gqa_ratios);
    tcase_add_test(tc, paired_lists);
    tcase_add_test(tc, variable_counts);
    tcase_add_test(tc, all_blocks_equal_dense);
    tcase_add_test(tc, partial_tiles);
    tcase_add_test(tc, lse_optional);
    tcase_add_test(tc, study_shape);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
