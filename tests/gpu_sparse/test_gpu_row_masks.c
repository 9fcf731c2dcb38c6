/* Tile lists with row masks (sa_gpu_attn.row_masks, stage 17 version 7) against the CPU
 * reference of the per-query lists they stand for: query q of tile t lists the entries of its
 * tile's row whose mask has bit q % 128. Every registered sparse stage with SA_ROLE_ROW_MASKS is
 * run; the others must refuse row masks with SA_ERR_UNSUPPORTED. Fresh random inputs every run
 * (the seed is printed on failure, SA_SEED replays it); O and LSE poisoned before each launch.
 * Masks: random with a per-case density, plus entries with every row, entries with no row, and
 * rows left out of every entry (O = 0, LSE = -inf). Cases: partial tiles and blocks, GQA 1/4/16,
 * empty rows, causal (len_q = len_kv and len_q < len_kv), validation on and off, and the call
 * repeated bit for bit; and stage 17's gate (version 12). SA_SMALL=1 runs the two small cases and
 * the gate. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_stage_entries.h"
#include "sa_test_gpu.h"

#define SEED (unsigned long long)sa_test_seed()

typedef struct mask_case {
    int batch, hq, hkv, len_q, len_kv;
    int k;          /* max_blocks */
    int density;    /* percent of the random mask bits set */
    int causal;
    int empty;      /* 1: some list rows have count 0 */
    int validate;
} mask_case;

/* Distinct random blocks per tile row (causally among those the tile's last row sees), and a
 * mask per entry: entry 0 every row, entry 1 no row, the others random at the case's density;
 * rows 5 and 77 of every tile are in no mask at all. */
static void make_lists(const mask_case *c, const sa_shape *s, sa_rng *r, int32_t *idx,
                       int32_t *cnt, uint32_t *masks, size_t rows)
{
    const int tiles = sa_q_tiles(s), nb = sa_kv_blocks(s);
    int *perm = malloc(nb * sizeof *perm);
    ck_assert(perm);
    for (size_t row = 0; row < rows; row++) {
        const int t = (int)(row % (size_t)tiles);
        const int vis = c->causal ? sa_causal_tile_blocks(s, t) : nb;
        for (int b = 0; b < vis; b++)
            perm[b] = b;
        int n = vis < c->k ? vis : c->k;
        for (int j = 0; j < n; j++) {
            int o = j + (int)sa_rng_below(r, (uint32_t)(vis - j)), tmp = perm[j];
            perm[j] = perm[o], perm[o] = tmp;
        }
        for (int j = 0; j < c->k; j++) {
            idx[row * c->k + j] = j < n ? perm[j] : 0;
            uint32_t *m = masks + (row * c->k + j) * 4;
            for (int w = 0; w < 4; w++) {
                uint32_t bits = 0;
                for (int b = 0; b < 32; b++)
                    bits |= (uint32_t)((int)sa_rng_below(r, 100) < c->density) << b;
                m[w] = j == 0 ? ~0u : j == 1 ? 0u : bits;
            }
            m[0] &= ~(1u << 5);
            m[2] &= ~(1u << (77 - 64));
        }
        if (c->empty && sa_rng_below(r, 6) == 0)
            n = 0;
        cnt[row] = n;
    }
    free(perm);
}

/* The per-query lists of the masked tile lists: list row (b, hkv, t) -> (b, hkv, q) for each q of
 * tile t, the entries whose mask has q's bit, in list order. */
static void to_query_lists(const sa_shape *s, int k, const int32_t *idx, const int32_t *cnt,
                           const uint32_t *masks, int32_t *qidx, int32_t *qcnt)
{
    const int tiles = sa_q_tiles(s);
    for (size_t bh = 0; bh < (size_t)s->batch * s->heads_kv; bh++) {
        for (int q = 0; q < s->len_q; q++) {
            const size_t trow = bh * tiles + q / SA_TILE, qrow = bh * s->len_q + q;
            const int bit = q % SA_TILE;
            int n = 0;
            for (int j = 0; j < cnt[trow]; j++)
                if ((masks[(trow * k + j) * 4 + bit / 32] >> (bit % 32)) & 1u)
                    qidx[qrow * k + n++] = idx[trow * k + j];
            for (int j = n; j < k; j++)
                qidx[qrow * k + j] = -1;
            qcnt[qrow] = n;
        }
    }
}

static void run_case(const mask_case *c, uint64_t salt)
{
    char what[160];
    snprintf(what, sizeof what, "B%d Hq%d Hkv%d Sq%d Skv%d k=%d density %d%%%s%s%s", c->batch,
             c->hq, c->hkv, c->len_q, c->len_kv, c->k, c->density, c->causal ? " causal" : "",
             c->empty ? " empty rows" : "", c->validate ? "" : " unvalidated");
    sa_shape s = {c->batch, c->hq, c->hkv, c->len_q, c->len_kv, 128};
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    const size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    sa_tile_lists shape_only = {NULL, NULL, c->hkv, c->k};
    const size_t rows = sa_tile_rows(&s, &shape_only), qrows = sa_query_rows(&s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2), *o_again = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *lse_gpu = malloc(nl * 4), *lse_again = malloc(nl * 4);
    float *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    int32_t *idx = malloc(rows * c->k * 4), *cnt = malloc(rows * 4);
    int32_t *qidx = malloc(qrows * c->k * 4), *qcnt = malloc(qrows * 4);
    uint32_t *masks = malloc(rows * c->k * 16);
    ck_assert(q && k && v && o_ref && o_gpu && o_again && lse_ref && lse_gpu && lse_again &&
              of_ref && of_gpu && idx && cnt && qidx && qcnt && masks);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ (salt * 0x9e3779b97f4a7c15ull));
    sa_rng_fill_bf16(&r, q, nq, 4.0f);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    make_lists(c, &s, &r, idx, cnt, masks, rows);
    to_query_lists(&s, c->k, idx, cnt, masks, qidx, qcnt);

    sa_query_lists ql = {qidx, qcnt, c->k};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    opts.causal = c->causal;
    opts.allow_future_blocks = 1; /* a block the tile sees may lie after one of its queries */
    sa_outputs ref = {o_ref, NULL, lse_ref};
    sa_poison_bf16(o_ref, nq);
    sa_poison_f32(lse_ref, nl);
    ck_assert_int_eq(sa_ref_query_sparse(&s, q, k, v, &ql, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);

    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * c->k, rows);
    uint32_t *d_masks = NULL;
    CK_CUDA(cudaMalloc((void **)&d_masks, rows * c->k * 16));
    sa_test_dev_upload(&d, &s, q, k, v, idx, rows * c->k, cnt, rows);
    CK_CUDA(cudaMemcpy(d_masks, masks, rows * c->k * 16, cudaMemcpyHostToDevice));
    int tested = 0;
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if (!(st->roles & SA_ROLE_SPARSE))
            continue;
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        a.lists = (sa_tile_lists){d.idx, d.cnt, c->hkv, c->k};
        a.row_masks = d_masks;
        a.causal = c->causal;
        a.validate = c->validate;
        if (!(st->roles & SA_ROLE_ROW_MASKS)) {
            ck_assert_int_eq(st->launch(&a), SA_ERR_UNSUPPORTED);
            continue;
        }
        /* Row masks are read 16 bytes at a time. */
        sa_gpu_attn bad = a;
        bad.row_masks = d_masks + 1;
        ck_assert_int_eq(st->check(&bad), SA_ERR_UNSUPPORTED);
        tested++;
        for (int rep = 0; rep < 2; rep++) {
            CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
            CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
            int rc = st->launch(&a);
            ck_assert_msg(rc == SA_OK, "stage %d %s: launch: %s (seed %llu)", st->id, what,
                          sa_strerror(rc), SEED);
            CK_CUDA(cudaDeviceSynchronize());
            CK_CUDA(cudaMemcpy(rep ? o_again : o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
            CK_CUDA(cudaMemcpy(rep ? lse_again : lse_gpu, d.lse, nl * 4, cudaMemcpyDeviceToHost));
        }
        ck_assert_msg(!memcmp(o_gpu, o_again, nq * 2) && !memcmp(lse_gpu, lse_again, nl * 4),
                      "stage %d %s: a second call differs from the first (seed %llu)", st->id,
                      what, SEED);
        sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
        sa_cmp cmp = sa_compare(of_gpu, of_ref, nq);
        const double lse_err = sa_lse_maxdiff(lse_gpu, lse_ref, nl);
        ck_assert_msg(sa_cmp_ok(&cmp) && lse_err <= 1e-2,
                      "stage %d %s: O rel_l2 %.3g max_abs %.3g (%zu non-finite, first bad %zu), "
                      "LSE max diff %.3g (seed %llu)",
                      st->id, what, cmp.rel_l2, cmp.max_abs, cmp.nonfinite, cmp.first_bad,
                      lse_err, SEED);
        /* Rows in no mask (and empty rows): exactly zero, LSE -inf (the reference says which). */
        size_t masked_out = 0;
        for (size_t row = 0; row < nl; row++) {
            if (!(isinf(lse_ref[row]) && lse_ref[row] < 0))
                continue;
            masked_out++;
            ck_assert_msg(isinf(lse_gpu[row]) && lse_gpu[row] < 0,
                          "stage %d %s: LSE[%zu] = %g in a row that sees no key (seed %llu)",
                          st->id, what, row, lse_gpu[row], SEED);
            for (size_t e = row * (size_t)s.head_dim; e < (row + 1) * (size_t)s.head_dim; e++)
                ck_assert_msg(o_gpu[e] == 0 || o_gpu[e] == 0x8000,
                              "stage %d %s: O[%zu] = %#x in a row that sees no key (seed %llu)",
                              st->id, what, e, o_gpu[e], SEED);
        }
        ck_assert_msg(masked_out > 0, "%s: no row was masked out: the case tests nothing", what);
    }
    ck_assert_msg(tested > 0, "no registered sparse stage takes row masks");
    CK_CUDA(cudaFree(d_masks));
    sa_test_dev_free(&d);
    free(q), free(k), free(v), free(o_ref), free(o_gpu), free(o_again), free(lse_ref);
    free(lse_gpu), free(lse_again), free(of_ref), free(of_gpu), free(idx), free(cnt);
    free(qidx), free(qcnt), free(masks);
}

START_TEST(row_masks)
{
    /* Small enough for compute-sanitizer: a partial final block (step 4's mask) and whole
     * blocks (since version 8 a row-masked block without a causal or padding mask takes the loop
     * without step 4). */
    const mask_case small[] = {
        {1, 4, 1, 300, 1300, 5, 60, 0, 1, 1},
        {1, 4, 1, 200, 1024, 6, 40, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        run_case(&small[i], 1 + 10 * i);
    if (sa_test_small())
        return;
    const mask_case cases[] = {
        {2, 16, 1, 1000, 3000, 8, 85, 0, 0, 1}, /* GQA 16, mostly shared */
        {1, 4, 4, 700, 1300, 6, 30, 0, 1, 0},   /* GQA 1, sparse masks, unvalidated */
        {1, 8, 2, 1024, 1024, 6, 70, 1, 0, 1},  /* causal, square */
        {2, 16, 4, 500, 1500, 5, 50, 1, 1, 1},  /* causal, len_q < len_kv, GQA 4 */
        {1, 16, 1, 900, 2048, 10, 75, 0, 0, 0}, /* whole blocks, GQA 16, unvalidated */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], 2 + i);
}
END_TEST

/* Stage 17's gate (version 12, sa_stage17_launch_gated, the KV-centric hybrid's): a launch runs
 * only when (*gate != 0) equals (want != 0); one that is not wanted touches nothing (O stays
 * poisoned); calls that need step 4's mask (causal, a partial final block) refuse a gate. */
START_TEST(gate)
{
    sa_shape s = {1, 4, 1, 256, 1024, 128};
    const int k = 3;
    sa_tile_lists shape_only = {NULL, NULL, 1, k};
    const size_t rows = sa_tile_rows(&s, &shape_only), nq = sa_q_elems(&s);
    const size_t nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    uint16_t *q = malloc(nq * 2), *kh = malloc(nkv * 2), *vh = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    int32_t idx[2 * 3], cnt[2] = {3, 2};
    ck_assert(q && kh && vh && o_ref && o_gpu && lse_ref && of_ref && of_gpu && rows == 2);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x6a7e);
    sa_rng_fill_bf16(&r, q, nq, 4.0f);
    sa_rng_fill_bf16(&r, kh, nkv, 1.0f);
    sa_rng_fill_bf16(&r, vh, nkv, 1.0f);
    idx[0] = 3, idx[1] = 0, idx[2] = 6, idx[3] = 7, idx[4] = 1, idx[5] = 0;
    sa_tile_lists l = {idx, cnt, 1, k};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    sa_outputs ref = {o_ref, NULL, lse_ref};
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, kh, vh, &l, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * k, rows);
    sa_test_dev_upload(&d, &s, q, kh, vh, idx, rows * k, cnt, rows);
    int *word;
    CK_CUDA(cudaMalloc((void **)&word, sizeof *word));
    sa_gpu_attn a = sa_test_dev_args(&s, &d);
    a.lists = (sa_tile_lists){d.idx, d.cnt, 1, k};
    a.validate = 0;
    /* {word, want, runs}. A library built with -DSA_STAGE17_MASK_SPECIALIZE=0 has no build
     * that takes a gate: every gated launch is refused and runs nothing. */
    static const int cases[][3] = {{0, 1, 0}, {0, 0, 1}, {7, 1, 1}, {7, 0, 0}};
    const int gated = sa_stage17_gate_builds();
    for (int c = 0; c < 4; c++) {
        CK_CUDA(cudaMemcpy(word, &cases[c][0], sizeof *word, cudaMemcpyHostToDevice));
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaDeviceSynchronize());
        ck_assert_int_eq(sa_stage17_launch_gated(&a, word, cases[c][1]),
                         gated ? SA_OK : SA_ERR_UNSUPPORTED);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
        if (gated && cases[c][2]) {
            sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
            sa_cmp cmp = sa_compare(of_gpu, of_ref, nq);
            ck_assert_msg(sa_cmp_ok(&cmp), "gate %d want %d: O rel_l2 %.3g (seed %llu)",
                          cases[c][0], cases[c][1], cmp.rel_l2, SEED);
        } else {
            for (size_t e = 0; e < nq; e++)
                ck_assert_msg(o_gpu[e] == (uint16_t)(SA_POISON_BYTE * 0x101),
                              "gate %d want %d: O[%zu] written by a launch that should not run",
                              cases[c][0], cases[c][1], e);
        }
    }
    a.causal = 1;
    ck_assert_int_eq(sa_stage17_launch_gated(&a, word, 0), SA_ERR_UNSUPPORTED);
    a.causal = 0;
    a.shape.len_kv = 1000; /* a partial final block: step 4's mask */
    ck_assert_int_eq(sa_stage17_launch_gated(&a, word, 0), SA_ERR_UNSUPPORTED);
    cudaFree(word);
    sa_test_dev_free(&d);
    free(q), free(kh), free(vh), free(o_ref), free(o_gpu), free(lse_ref), free(of_ref),
        free(of_gpu);
}
END_TEST

int main(void)
{
    if (!sa_gpu_available())
        return 77;
    Suite *su = suite_create("gpu_row_masks");
    TCase *tc = tcase_create("row_masks");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, row_masks);
    tcase_add_test(tc, gate);
    suite_add_tcase(su, tc);
    return sa_test_run(su);
}
