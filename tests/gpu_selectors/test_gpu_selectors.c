/* GPU selectors against the CPU selectors (the registry's .cuda against .cpu), on fresh random
 * inputs: the lists must be identical, except where two blocks' scores at the k-th boundary are
 * within rounding of each other (the GPU sums in another order); the test recomputes every
 * score in double to tell. Also: the GPU NVFP4 quantizer is bit-identical to the CPU's, options,
 * GQA 1/4/16, partial final blocks and tiles, index vectors, NaN scores, and the error codes.
 * Every selector of the registry with a `.cuda` function is tested, with no list here: r1, r4
 * and the nvfp4 scorers have double references of their own below; any other takes the brute
 * force of tests/selectors/sel_brute.c (bf_scores, which every selector needs for the CPU tests).
 * SA_SMALL=1 runs the smallest case of each test only (for compute-sanitizer). */
#include <stdint.h>

#include "../selectors/sel_test.h"
#include "sel_cuda.h"
#include "sel_test_util.h"

/* The n-th registered selector with a GPU function, NULL past the last. */
static const sa_selector *gpu_selector(int n)
{
    for (int i = 0; i < sa_selector_count(); i++)
        if (sa_selector_at(i)->cuda && n-- == 0)
            return sa_selector_at(i);
    return NULL;
}

static int is_reps(const char *name) { return !strcmp(name, "r1") || !strcmp(name, "r4"); }
static int is_nvfp4(const char *name) { return !strncmp(name, "nvfp4", 5); }
/* The nvfp4 scorers that rank by maxima (nvfp4_mass ranks by mass: the brute force's). */
static int is_nvfp4_max(const char *name)
{
    return !strcmp(name, "nvfp4") || !strcmp(name, "nvfp4_query");
}

/* Relative band (of the row's largest |score|) inside which two scores count as tied. */
#define TIE_REL_REPS 1e-5  /* FP32 means and dots, another summation order */
#define TIE_REL_NVFP4 1e-4 /* FP32 tensor-core accumulation of D products; also the default */

static int small(void) { return getenv("SA_SMALL") != NULL; }

/* ------------------------------------------------------------------ reference scores (double) */

/* x is (heads, len, dim) BF16; out (heads, ceil(len / span), dim): means of valid tokens. */
static double *means(const uint16_t *x, int heads, int len, int dim, int span)
{
    int groups = (len + span - 1) / span;
    double *out = calloc((size_t)heads * groups * dim, sizeof *out);
    ck_assert(out);
    for (int h = 0; h < heads; h++)
        for (int g = 0; g < groups; g++) {
            int n = len - g * span < span ? len - g * span : span;
            double *o = out + ((size_t)h * groups + g) * dim;
            for (int i = 0; i < n; i++)
                for (int d = 0; d < dim; d++)
                    o[d] += sa_bf16_to_f32(x[((size_t)h * len + (size_t)g * span + i) * dim + d]);
            for (int d = 0; d < dim; d++)
                o[d] /= n;
        }
    return out;
}

/* NaN-keeping max, as the CPU's representative scoring. */
static double nanmax(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

/* Scores (rows, kv_blocks) the selector ranks, in double. With p->causal a query's nvfp4
 * maximum runs over the keys it sees only (j <= i + len_kv - len_q); r1/r4 score whole blocks
 * either way (docs/selectors.md, "Causal lists"), and only a row's visible prefix is ranked. */
static double *ref_scores(const char *name, const sa_shape *s, const uint16_t *q,
                          const uint16_t *k, const sa_select_params *p)
{
    const int n = sa_kv_blocks(s), qt = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    const uint16_t *qv = p->q_index ? p->q_index : q, *kv = p->k_index ? p->k_index : k;
    const int dim = p->q_index ? p->index_dim : s->head_dim;
    if (!is_reps(name) && !is_nvfp4_max(name)) { /* the CPU tests' brute force */
        if (!p->index_heads)
            return bf_scores_causal(name, s, qv, kv, dim, p->causal);
        /* Index heads: each index head alone (a group of one), then the mass of the index heads
         * list hkv takes, [hkv Hi / Hkv, + max(1, Hi / Hkv)), summed. */
        const int hi = p->index_heads, qt_ = sa_q_tiles(s), nb = sa_kv_blocks(s);
        const sa_shape one = {s->batch, hi, hi, s->len_q, s->len_kv, s->head_dim};
        double *per = bf_scores_causal(name, &one, qv, kv, dim, p->causal);
        const int nh = hi >= s->heads_kv ? hi / s->heads_kv : 1;
        double *S = calloc((size_t)s->batch * s->heads_kv * qt_ * nb, sizeof *S);
        ck_assert(S);
        for (int b = 0; b < s->batch; b++)
            for (int hkv = 0; hkv < s->heads_kv; hkv++)
                for (int j = 0; j < nh; j++)
                    for (size_t e = 0; e < (size_t)qt_ * nb; e++)
                        S[((size_t)b * s->heads_kv + hkv) * qt_ * nb + e] +=
                            per[((size_t)b * hi + hkv * hi / s->heads_kv + j) * qt_ * nb + e];
        free(per);
        return S;
    }
    const int per_query = sa_selector_by_name(name)->per_query;
    const size_t rows = (size_t)s->batch * s->heads_kv * (per_query ? s->len_q : qt);
    double *S = malloc(rows * n * sizeof *S);
    ck_assert(S);
    if (is_reps(name)) {
        const int span = name[1] == '1' ? 128 : 32, P = 128 / span;
        const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
        double *qm = means(qv, s->batch * s->heads_q, s->len_q, dim, span);
        double *km = means(kv, s->batch * s->heads_kv, s->len_kv, dim, span);
#pragma omp parallel for schedule(dynamic)
        for (size_t r = 0; r < rows; r++) {
            int t = (int)(r % qt), bh = (int)(r / qt), b = bh / s->heads_kv, hkv = bh % s->heads_kv;
            for (int blk = 0; blk < n; blk++) {
                double best = -INFINITY;
                for (int j = 0; j < group; j++)
                    for (int a = t * P; a < (t + 1) * P && a < qg; a++)
                        for (int e = blk * P; e < (blk + 1) * P && e < kg; e++) {
                            const double *x =
                                qm + (((size_t)b * s->heads_q + hkv * group + j) * qg + a) * dim;
                            const double *y = km + ((size_t)bh * kg + e) * dim;
                            double acc = 0;
                            for (int d = 0; d < dim; d++)
                                acc += x[d] * y[d];
                            best = nanmax(best, acc);
                        }
                S[r * n + blk] = best;
            }
        }
        free(qm);
        free(km);
        return S;
    }
    /* nvfp4: the CPU quantizer's dequantized values, max dot over a block's valid keys. With
     * index heads (sa_select_params.index_heads, the rule written there): qh = kh = Hi scored
     * heads, list hkv takes the heads [hkv qh / Hkv, + max(1, qh / Hkv)), head h pairs with key
     * head h kh / qh. */
    const int qh = p->index_heads ? p->index_heads : s->heads_q;
    const int kh = p->index_heads ? p->index_heads : s->heads_kv;
    const int nheads = qh >= s->heads_kv ? qh / s->heads_kv : 1;
    const size_t nq = (size_t)s->batch * qh * s->len_q * dim;
    const size_t nk = (size_t)s->batch * kh * s->len_kv * dim;
    float *qd = malloc(nq * 4), *kd = malloc(nk * 4);
    sa_nvfp4 zq = {malloc(nq / 2), malloc(nq / 16), 0, 0};
    sa_nvfp4 zk = {malloc(nk / 2), malloc(nk / 16), 0, 0};
    ck_assert(qd && kd && zq.values && zq.scales && zk.values && zk.scales);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(qv, nq, &zq), SA_OK);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(kv, nk, &zk), SA_OK);
    ck_assert_int_eq(sa_nvfp4_dequantize(&zq, qd), SA_OK);
    ck_assert_int_eq(sa_nvfp4_dequantize(&zk, kd), SA_OK);
    for (size_t i = 0; i < rows * n; i++)
        S[i] = -INFINITY;
    /* One row (a tile, or a query) per iteration: the rows are independent, so the threads
     * share even a single (batch, KV head). */
    const size_t per_bh = per_query ? (size_t)s->len_q : (size_t)qt;
#pragma omp parallel for schedule(dynamic)
    for (size_t r = 0; r < rows; r++) {
        const size_t bhkv = r / per_bh, x = r % per_bh;
        const size_t b = bhkv / s->heads_kv, hkv = bhkv % s->heads_kv;
        const int i0 = per_query ? (int)x : (int)x * 128;
        const int i1 = per_query ? i0 + 1 : (i0 + 128 < s->len_q ? i0 + 128 : s->len_q);
        double *row = S + r * n;
        for (int j = 0; j < nheads; j++)
            for (int i = i0; i < i1; i++) {
                const size_t h = hkv * qh / s->heads_kv + j, hk = h * kh / qh;
                const float *xq = qd + (((b * qh + h) * s->len_q) + i) * dim;
                const long long lim = p->causal ? (long long)i + s->len_kv - s->len_q + 1
                                                : (long long)s->len_kv; /* keys [0, lim) */
                for (int key = 0; key < lim; key++) {
                    const float *y = kd + ((b * kh + hk) * s->len_kv + key) * dim;
                    double acc = 0;
                    for (int d = 0; d < dim; d++)
                        acc += (double)xq[d] * y[d];
                    if (acc > row[key / 128])
                        row[key / 128] = acc;
                }
            }
    }
    free(qd);
    free(kd);
    free(zq.values), free(zq.scales), free(zk.values), free(zk.scales);
    return S;
}

/* ------------------------------------------------------------------ list comparison */

/* 1 if gpu equals cpu, or differs only in blocks whose scores lie within tol of the CPU's
 * boundary (its lowest-scoring unforced choice). *swaps counts such blocks. */
static int row_agrees(const double *S, int n, int k, int diag, int sink, const int32_t *cpu,
                      const int32_t *gpu, double tol, int *swaps, char *why, size_t whylen)
{
    unsigned char *in = calloc(n > 0 ? n : 1, 1); /* bit 0: CPU, bit 1: GPU */
    ck_assert(in);
    int ok = 1;
    for (int j = 0; j < k && ok; j++) {
        if (gpu[j] < 0 || gpu[j] >= n || (j && gpu[j] <= gpu[j - 1])) {
            snprintf(why, whylen, "GPU slot %d holds %d: not sorted, distinct and in [0, %d)", j,
                     gpu[j], n);
            ok = 0;
        } else {
            in[gpu[j]] |= 2;
            in[cpu[j]] |= 1;
        }
    }
    double bound = INFINITY;
    for (int j = 0; j < k && ok; j++) {
        int x = cpu[j];
        if (x == diag || (sink && x == 0))
            continue;
        double v = isnan(S[x]) ? -INFINITY : S[x];
        bound = v < bound ? v : bound;
    }
    for (int x = 0; x < n && ok; x++) {
        if (in[x] == 0 || in[x] == 3)
            continue;
        double v = isnan(S[x]) ? -INFINITY : S[x];
        int forced = x == diag || (sink && x == 0);
        if (forced || !(v == bound || fabs(v - bound) <= tol)) {
            snprintf(why, whylen,
                     "block %d (score %.9g) chosen by %s only; CPU boundary score %.9g, tie band "
                     "%.3g%s",
                     x, S[x], in[x] == 1 ? "the CPU" : "the GPU", bound, tol,
                     forced ? ", and it is a forced block" : "");
            ok = 0;
        } else {
            (*swaps)++;
        }
    }
    free(in);
    return ok;
}

typedef struct sel_case {
    sa_shape s;
    int k, keep_diagonal, keep_sink, index_dim;
    int nan_block; /* >= 0: poison one key of this block with NaN (r1/r4 only) */
    int causal, keep_local;
    int index_heads; /* > 0: index vectors with this many heads (needs index_dim) */
} sel_case;

/* Blocks row x (a tile, or with per_query a query) competes for: all, or with causal the visible
 * prefix, from the public helpers (not the selectors' code). */
static int visible_blocks(const sa_shape *s, int per_query, int causal, int x)
{
    if (!causal)
        return sa_kv_blocks(s);
    return per_query ? sa_causal_query_blocks(s, x) : sa_causal_tile_blocks(s, x);
}

/* Runs CPU and GPU selector `name` on case c; checks format, counts and agreement. With
 * c->causal: every row's count is min(k, visible blocks) on both sides, the slots past it hold
 * -1 on the GPU (its lists were poisoned with another value), the GPU's lists pass the causal
 * validator (no future block, no empty row but those that see nothing), and the rows agree on
 * the row's visible prefix with its diagonal block forced. */
static void check_case(const char *name, const sel_case *c)
{
    const sa_selector *sel = sa_selector_by_name(name);
    ck_assert_msg(sel && sel->cuda, "selector %s has no GPU function", name);
    const sa_shape *s = &c->s;
    const uint64_t seed =
        sa_test_seed() ^ (uint64_t)(c->s.len_kv * 131 + c->k) ^ ((uint64_t)c->causal << 40);
    sa_rng rng;
    sa_rng_seed(&rng, seed);
    uint16_t *q = malloc(sa_q_elems(s) * 2), *k = malloc(sa_kv_elems(s) * 2);
    ck_assert(q && k);
    sa_rng_fill_bf16(&rng, q, sa_q_elems(s), 1.0f);
    sa_rng_fill_bf16(&rng, k, sa_kv_elems(s), 1.0f);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = c->k;
    p.keep_diagonal = c->keep_diagonal;
    p.keep_sink = c->keep_sink;
    p.causal = c->causal;
    p.keep_local = c->keep_local;
    uint16_t *qi = NULL, *ki = NULL;
    if (c->index_dim) {
        const int qh = c->index_heads ? c->index_heads : s->heads_q;
        const int kh = c->index_heads ? c->index_heads : s->heads_kv;
        size_t nq = (size_t)s->batch * qh * s->len_q * c->index_dim;
        size_t nk = (size_t)s->batch * kh * s->len_kv * c->index_dim;
        p.index_heads = c->index_heads;
        qi = malloc(nq * 2), ki = malloc(nk * 2);
        ck_assert(qi && ki);
        sa_rng_fill_bf16(&rng, qi, nq, 0.5f);
        sa_rng_fill_bf16(&rng, ki, nk, 2.0f);
        p.q_index = qi, p.k_index = ki, p.index_dim = c->index_dim;
    }
    if (c->nan_block >= 0) /* key 5 of that block, every (batch, KV head), dim 3 */
        for (int bh = 0; bh < s->batch * s->heads_kv; bh++) {
            uint16_t *kk = p.k_index ? ki : k;
            int dim = p.k_index ? c->index_dim : s->head_dim;
            kk[((size_t)bh * s->len_kv + c->nan_block * 128 + 5) * dim + 3] = 0x7fc0;
        }
    const size_t rows = sel_rows(sel, s), n = rows * c->k;
    const int per_bh = sel->per_query ? s->len_q : sa_q_tiles(s);
    int32_t *ic = malloc(n * 4), *cc = malloc(rows * 4);
    int32_t *ig = malloc(n * 4), *cg = malloc(rows * 4);
    ck_assert(ic && cc && ig && cg);
    ck_assert_int_eq(sel->cpu(s, q, k, &p, ic, cc), SA_OK);
    int rc = run_gpu_selector(sel, s, q, k, &p, ig, cg);
    if (c->index_heads && is_reps(name)) { /* CPU-only there (test_index_heads_reps) */
        ck_assert_int_eq(rc, SA_ERR_UNSUPPORTED);
        free(q), free(k), free(qi), free(ki), free(ic), free(cc), free(ig), free(cg);
        return;
    }
    ck_assert_msg(rc == SA_OK, "%s%s GPU: %s (seed %llu)", name, c->causal ? " causal" : "",
                  sa_strerror(rc), (unsigned long long)sa_test_seed());
    for (size_t r = 0; r < rows; r++) {
        const int vis = visible_blocks(s, sel->per_query, c->causal, (int)(r % per_bh));
        const int want = c->k < vis ? c->k : vis;
        ck_assert_msg(cg[r] == want && cc[r] == want,
                      "%s%s: counts[%zu] = %d (GPU), %d (CPU), expected %d (seed %llu)", name,
                      c->causal ? " causal" : "", r, cg[r], cc[r], want,
                      (unsigned long long)sa_test_seed());
        for (int j = want; j < c->k; j++)
            ck_assert_msg(ig[r * c->k + j] == -1 && ic[r * c->k + j] == -1,
                          "%s causal: row %zu slot %d past the count %d holds %d (GPU), %d "
                          "(CPU), expected -1 (seed %llu)",
                          name, r, j, want, ig[r * c->k + j], ic[r * c->k + j],
                          (unsigned long long)sa_test_seed());
    }
    /* The host validator on the GPU's lists (range, duplicates; causally no future block). */
    sa_attn_opts vo;
    sa_attn_opts_default(&vo);
    vo.allow_empty_rows = 0; /* a causal row that sees nothing may still be empty */
    vo.causal = c->causal;
    vo.allow_future_blocks = 0;
    if (sel->per_query) {
        sa_query_lists l = {ig, cg, c->k};
        ck_assert_int_eq(sa_query_lists_check_opts(s, &l, &vo), SA_OK);
    } else {
        sa_tile_lists l = {ig, cg, s->heads_kv, c->k};
        ck_assert_int_eq(sa_tile_lists_check_opts(s, &l, &vo), SA_OK);
    }
    if (memcmp(ic, ig, n * 4)) {
        double *S = ref_scores(name, s, q, k, &p);
        const int nb = sa_kv_blocks(s);
        int swaps = 0, rows_diff = 0;
        char why[256];
        for (size_t r = 0; r < rows; r++) {
            if (!memcmp(ic + r * c->k, ig + r * c->k, c->k * 4))
                continue;
            rows_diff++;
            const double *Sr = S + r * nb;
            const int x = (int)(r % per_bh);
            /* The blocks the row ranks, how many it keeps, its forced diagonal. */
            const int vis = visible_blocks(s, sel->per_query, c->causal, x);
            const int kr = c->k < vis ? c->k : vis;
            const int diag = c->causal          ? vis - 1
                             : c->keep_diagonal ? (sel->per_query ? x / 128 : x)
                                                : -1;
            double mx = 0;
            for (int b = 0; b < vis; b++)
                mx = isfinite(Sr[b]) && fabs(Sr[b]) > mx ? fabs(Sr[b]) : mx;
            double tol = mx * (is_reps(name) ? TIE_REL_REPS : TIE_REL_NVFP4);
            ck_assert_msg(row_agrees(Sr, vis, kr, diag, c->keep_sink, ic + r * c->k,
                                     ig + r * c->k, tol, &swaps, why, sizeof why),
                          "%s%s shape (%d,%d,%d,%d,%d,%d) k %d: row %zu differs: %s (seed %llu)",
                          name, c->causal ? " causal" : "", s->batch, s->heads_q, s->heads_kv,
                          s->len_q, s->len_kv, s->head_dim, c->k, r, why,
                          (unsigned long long)sa_test_seed());
        }
        printf("%s%s (%d,%d,%d,%d,%d,%d) k %d: %d of %zu rows differ from the CPU, %d blocks "
               "swapped inside the tie band: accepted\n",
               name, c->causal ? " causal" : "", s->batch, s->heads_q, s->heads_kv, s->len_q,
               s->len_kv, s->head_dim, c->k, rows_diff, rows, swaps);
        free(S);
    }
    free(q), free(k), free(qi), free(ki), free(ic), free(cc), free(ig), free(cg);
}

/* Shapes: the first is the smallest (SA_SMALL). */
static const sel_case cases[] = {
    /* GQA 4, partial final block (1000 = 7 * 128 + 104) and partial tile (200) */
    {{1, 4, 1, 200, 1000, 64}, 3, 0, 0, 0, -1, 0, 0, 0},
    /* GQA 1 */
    {{2, 2, 2, 256, 700, 128}, 3, 0, 0, 0, -1, 0, 0, 0},
    /* GQA 16, more blocks */
    {{1, 16, 1, 384, 2100, 128}, 8, 0, 0, 0, -1, 0, 0, 0},
    /* options: diagonal and sink (len_q == len_kv), GQA 2 */
    {{1, 4, 2, 640, 640, 64}, 3, 1, 1, 0, -1, 0, 0, 0},
    {{2, 4, 4, 300, 300, 64}, 2, 1, 0, 0, -1, 0, 0, 0},
    {{1, 8, 2, 256, 900, 64}, 4, 0, 1, 0, -1, 0, 0, 0},
    /* k == kv_blocks: every block */
    {{1, 4, 1, 128, 500, 64}, 4, 0, 0, 0, -1, 0, 0, 0},
    /* separate index vectors (index_dim 48) */
    {{1, 4, 2, 256, 1100, 64}, 5, 0, 0, 48, -1, 0, 0, 0},
    /* 196 blocks: the top-k's second row size (8 keys per lane) */
    {{1, 4, 1, 128, 25000, 64}, 16, 0, 0, 0, -1, 0, 0, 0},
    /* index_dim 256: two 128-dim slices per mean tile */
    {{1, 4, 2, 300, 1500, 64}, 4, 0, 1, 256, -1, 0, 0, 0},
    /* index_dim 192: three panels of the nvfp4 scorer */
    {{1, 4, 2, 300, 1000, 64}, 4, 0, 0, 192, -1, 0, 0, 0},
    /* index heads: one per KV group (MSA), fewer than the KV heads (shared lists), more */
    {{2, 8, 2, 300, 1000, 64}, 4, 0, 0, 64, -1, 0, 0, 2},
    {{1, 8, 4, 256, 900, 64}, 3, 0, 1, 128, -1, 0, 0, 2},
    {{1, 8, 2, 200, 700, 64}, 3, 0, 0, 48, -1, 0, 0, 4},
    /* 1025 blocks: past the warp-per-row top-k's reach (kSelWarpTopkMax), so the nvfp4 tile
     * lists take the top-k kernel with one CTA per row */
    {{1, 1, 1, 256, 131200, 64}, 20, 0, 0, 0, -1, 0, 0, 0},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

START_TEST(test_vs_cpu)
{
    for (int ci = 0; ci < (small() ? 1 : NCASES); ci++)
        for (int si = 0; gpu_selector(si); si++)
            check_case(gpu_selector(si)->name, &cases[ci]);
}
END_TEST

/* Causal lists (sa_select_params.causal = 1), every GPU selector of the registry against its CPU
 * function. The first two cases are small (SA_SMALL runs them only). */
#define NCAUSAL_SMALL 2
static const sel_case causal_cases[] = {
    /* a chunk after 200 cached keys (len_q < len_kv; 200 is not a multiple of 128), partial
     * final block (900 = 7 * 128 + 4) and tile (700 = 5 * 128 + 60): tile 0 and the first
     * queries see fewer than k blocks (counts below k, -1 after them), GQA 4 */
    {{1, 4, 1, 700, 900, 64}, 4, 0, 0, 0, -1, 1, 0, 0},
    /* len_q > len_kv: the first 400 queries see no key (count 0: tiles 0-2, and per query) */
    {{1, 4, 2, 700, 300, 64}, 2, 0, 0, 0, -1, 1, 0, 0},
    /* a chunk after 700 cached keys (len_q < len_kv; 700 is not a multiple of 128, so the block
     * before a tile's diagonal block is partly visible to its first queries), partial final
     * block (1000 = 7 * 128 + 104) and partial tile (300), GQA 4 */
    {{1, 4, 1, 300, 1000, 64}, 3, 0, 0, 0, -1, 1, 0, 0},
    /* prefill (len_q == len_kv) with a partial final block, GQA 1: the early tiles keep every
     * block they see */
    {{2, 2, 2, 500, 500, 128}, 3, 0, 0, 0, -1, 1, 0, 0},
    /* GQA 16, a chunk */
    {{1, 16, 1, 384, 2100, 128}, 8, 0, 0, 0, -1, 1, 0, 0},
    /* GQA 16, prefill, more tiles than k */
    {{1, 16, 1, 1000, 1000, 64}, 4, 0, 0, 0, -1, 1, 0, 0},
    /* sink and the diagonal forced, one block chosen, GQA 4 */
    {{1, 8, 2, 640, 1500, 64}, 3, 0, 1, 0, -1, 1, 0, 0},
    /* keep_diagonal and sink on a prefill (causal's diagonal is keep_diagonal's block) */
    {{1, 4, 2, 640, 640, 64}, 3, 1, 1, 0, -1, 1, 0, 0},
    /* keep_local off the diagonal: under causal it is the block causal keeps anyway */
    {{1, 4, 1, 256, 900, 64}, 3, 0, 0, 0, -1, 1, 1, 0},
    /* k == kv_blocks: every visible block */
    {{1, 4, 1, 256, 500, 64}, 4, 0, 0, 0, -1, 1, 0, 0},
    /* separate index vectors (index_dim 48) */
    {{1, 4, 2, 256, 1100, 64}, 5, 0, 0, 48, -1, 1, 0, 0},
    /* index heads shared by two KV heads, a chunk after 300 cached keys */
    {{1, 8, 4, 500, 800, 64}, 3, 0, 0, 64, -1, 1, 0, 2},
    /* 196 blocks: the warp top-k's 8 keys per lane; sink */
    {{1, 4, 1, 128, 25000, 64}, 16, 0, 1, 0, -1, 1, 0, 0},
    /* 133 blocks, 8 tiles that see 126 to 133 of them: the fused r1/r4 top-k over several
     * score chunks (r1: 128 blocks each, so the early tiles leave the second one unscored) */
    {{1, 1, 1, 1024, 17000, 64}, 16, 0, 0, 0, -1, 1, 0, 0},
    /* 1025 blocks: the top-k's one CTA per row; tile 0 sees 1024 of them, tile 1 all */
    {{1, 1, 1, 256, 131200, 64}, 20, 0, 1, 0, -1, 1, 0, 0},
};
#define NCAUSAL (int)(sizeof causal_cases / sizeof causal_cases[0])

START_TEST(test_causal_vs_cpu)
{
    for (int ci = 0; ci < (small() ? NCAUSAL_SMALL : NCAUSAL); ci++)
        for (int si = 0; gpu_selector(si); si++)
            check_case(gpu_selector(si)->name, &causal_cases[ci]);
}
END_TEST

/* The nvfp4 scorers' balanced split (sel_nvfp4_score.cu, choose_split), which the model takes
 * only where whole chunks would leave SMs idle, and none of the cases above is such a shape:
 * the first of a few shapes for which this device's SM count gives that split (on 132 SMs,
 * the first), both scorers against the CPU. A device whose SM count gives none of them says so
 * and checks nothing here. */
START_TEST(test_nvfp4_balanced)
{
    if (small())
        return;
    /* {batch, heads_q, heads_kv, len_q, len_kv, D}: 4 scored heads (query heads, no index
     * heads), rows of 17-25 tiles by 17-31 blocks */
    static const sa_shape shapes[] = {
        {1, 4, 1, 2176, 2944, 64}, {1, 4, 2, 3200, 2176, 64}, {1, 4, 1, 2176, 3712, 64}};
    int picked = -1;
    for (int i = 0; picked < 0 && i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        if (sel_nvfp4_balanced_split(shapes[i].batch, shapes[i].heads_q, shapes[i].len_q,
                                     shapes[i].len_kv))
            picked = i;
    if (picked < 0) {
        fprintf(stderr, "test_nvfp4_balanced: no shape takes the balanced split on this device's "
                        "SM count; not exercised\n");
        return;
    }
    const sel_case c = {shapes[picked], 4, 0, 0, 0, -1, 0, 0, 0};
    int ran = 0;
    for (int si = 0; gpu_selector(si); si++)
        if (!strcmp(gpu_selector(si)->name, "nvfp4") ||
            !strcmp(gpu_selector(si)->name, "nvfp4_query")) {
            check_case(gpu_selector(si)->name, &c);
            ran++;
        }
    ck_assert_int_eq(ran, 2);
}
END_TEST

/* r1 and r4 only (the CPU nvfp4 scorer would take minutes here): top-k over 1024 blocks
 * (131072 keys), a NaN block, and a large k. */
START_TEST(test_many_blocks)
{
    if (small())
        return;
    const sel_case big[] = {
        /* 1024 blocks: 32 keys per lane */
        {{1, 16, 1, 256, 131072, 64}, 16, 0, 0, 0, -1, 0, 0, 0},
        /* k close to kv_blocks */
        {{1, 4, 1, 256, 131000, 128}, 1000, 0, 1, 0, -1, 0, 0, 0},
        /* 469 blocks: 16 keys per lane */
        {{1, 4, 2, 128, 60000, 64}, 16, 0, 0, 0, -1, 0, 0, 0},
        /* 1094 blocks: one CTA per row */
        {{1, 4, 1, 128, 140000, 64}, 20, 0, 1, 0, -1, 0, 0, 0},
        /* a NaN block, never chosen */
        {{2, 4, 2, 512, 5000, 64}, 6, 0, 0, 0, 7, 0, 0, 0},
        /* the benchmark's shape */
        {{2, 16, 1, 4096, 8192, 128}, 16, 0, 1, 0, -1, 0, 0, 0},
        /* r4's wide score tile (> 1 wave) */
        {{2, 4, 1, 4096, 16384, 128}, 16, 0, 1, 0, -1, 0, 0, 0},
        /* group 20: r1's 16-deep tile, 2 passes */
        {{1, 20, 1, 256, 3000, 64}, 4, 0, 0, 0, -1, 0, 0, 0},
        /* index_dim 320: slices of 128, 128, 64 */
        {{1, 4, 1, 256, 3000, 64}, 4, 0, 1, 320, -1, 0, 0, 0},
    };
    /* Every registered GPU selector whose scores this test can recompute with the
     * representatives' reference (means(); the NVFP4 scorers have their own cases above). */
    for (int n = 0; gpu_selector(n); n++) {
        const char *name = gpu_selector(n)->name;
        if (!is_reps(name))
            continue;
        for (int ci = 0; ci < (int)(sizeof big / sizeof big[0]); ci++)
            check_case(name, &big[ci]);
    }
}
END_TEST

/* ------------------------------------------------------------------ NVFP4 quantizer */

/* Quantizes x (n BF16) on CPU and GPU; all bytes and the tensor scale must match. */
static void quant_same(const uint16_t *x, size_t n)
{
    sa_nvfp4 c = {malloc(n / 2), malloc(n / 16), 0, 0};
    uint8_t *gv = malloc(n / 2), *gs = malloc(n / 16);
    ck_assert(c.values && c.scales && gv && gs);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(x, n, &c), SA_OK);
    uint16_t *dx = dev_from_host(x, n * 2);
    sa_nvfp4 g = {0};
    CK_CUDA(cudaMalloc((void **)&g.values, n / 2));
    CK_CUDA(cudaMalloc((void **)&g.scales, n / 16));
    CK_CUDA(cudaMemset(g.values, 0xAB, n / 2));
    CK_CUDA(cudaMemset(g.scales, 0xAB, n / 16));
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, n, &g, NULL), SA_OK);
    CK_CUDA(cudaMemcpy(gv, g.values, n / 2, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(gs, g.scales, n / 16, cudaMemcpyDeviceToHost));
    ck_assert_uint_eq(g.n, n);
    uint32_t tc, tg;
    memcpy(&tc, &c.tensor_scale, 4);
    memcpy(&tg, &g.tensor_scale, 4);
    ck_assert_msg(tc == tg, "tensor scale %a (CPU) vs %a (GPU) (seed %llu)", c.tensor_scale,
                  g.tensor_scale, (unsigned long long)sa_test_seed());
    for (size_t i = 0; i < n / 16; i++)
        ck_assert_msg(c.scales[i] == gs[i], "scale %zu: CPU 0x%02x GPU 0x%02x (seed %llu)", i,
                      c.scales[i], gs[i], (unsigned long long)sa_test_seed());
    for (size_t i = 0; i < n / 2; i++)
        ck_assert_msg(c.values[i] == gv[i], "value byte %zu: CPU 0x%02x GPU 0x%02x (seed %llu)",
                      i, c.values[i], gv[i], (unsigned long long)sa_test_seed());
    /* The asynchronous form: the same bytes, the tensor scale and the flag in device memory. */
    float *dts;
    void *dwork;
    int *dbad, hbad = -1;
    float hts;
    CK_CUDA(cudaMalloc((void **)&dts, 4));
    CK_CUDA(cudaMalloc((void **)&dbad, 4));
    CK_CUDA(cudaMalloc(&dwork, SEL_NVFP4_QUANT_WORK_BYTES));
    CK_CUDA(cudaMemset(dwork, 0xAB, SEL_NVFP4_QUANT_WORK_BYTES)); /* needs no zeroing */
    CK_CUDA(cudaMemset(g.values, 0xAB, n / 2));
    CK_CUDA(cudaMemset(g.scales, 0xAB, n / 16));
    CK_CUDA(cudaMemset(dbad, 0xAB, 4));
    uint16_t *ddeq, *hdeq = malloc(n * 2);
    float *cdeq = malloc(n * 4);
    ck_assert(hdeq && cdeq);
    CK_CUDA(cudaMalloc((void **)&ddeq, n * 2));
    CK_CUDA(cudaMemset(ddeq, 0xFF, n * 2)); /* NaN */
    ck_assert_int_eq(sel_nvfp4_quantize_async(dx, n, g.values, g.scales, dts, dbad, dwork, ddeq,
                                              NULL),
                     SA_OK);
    CK_CUDA(cudaMemcpy(gv, g.values, n / 2, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(gs, g.scales, n / 16, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(&hts, dts, 4, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(&hbad, dbad, 4, cudaMemcpyDeviceToHost));
    memcpy(&tg, &hts, 4);
    ck_assert_msg(tc == tg && hbad == 0, "async: tensor scale %a vs %a, bad %d (seed %llu)",
                  c.tensor_scale, hts, hbad, (unsigned long long)sa_test_seed());
    ck_assert_msg(!memcmp(c.scales, gs, n / 16) && !memcmp(c.values, gv, n / 2),
                  "async: bytes differ from the CPU quantizer (seed %llu)",
                  (unsigned long long)sa_test_seed());
    /* The scorer's input: each BF16 value times the tensor scale is the CPU's dequantized value
     * bit for bit (both are an exact product rounded once by the tensor scale). */
    CK_CUDA(cudaMemcpy(hdeq, ddeq, n * 2, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(sa_nvfp4_dequantize(&c, cdeq), SA_OK);
    for (size_t i = 0; i < n; i++) {
        const float gpu = sa_bf16_to_f32(hdeq[i]) * c.tensor_scale;
        ck_assert_msg(!memcmp(&gpu, &cdeq[i], 4),
                      "deq %zu: GPU %a (BF16 0x%04x) x %a, CPU %a (seed %llu)", i,
                      sa_bf16_to_f32(hdeq[i]), hdeq[i], c.tensor_scale, cdeq[i],
                      (unsigned long long)sa_test_seed());
    }
    cudaFree(ddeq), free(hdeq), free(cdeq);
    cudaFree(dts), cudaFree(dbad), cudaFree(dwork);
    cudaFree(dx), cudaFree(g.values), cudaFree(g.scales);
    free(c.values), free(c.scales), free(gv), free(gs);
}

/* The quantizer takes its block scales' E4M3 codes and their values from the hardware
 * conversions (cvt with satfinite): they must be sa_e4m3_from_f32 / sa_e4m3_to_f32 on every
 * value the quantizer can pass (x >= 0, or +inf). Tested on each code's value, the midpoint to
 * the next code (a tie: the even code wins) and the floats beside both, the saturation and
 * subnormal edges, and random values log-uniform over 2^-14 .. 2^10. */
START_TEST(test_e4m3_hardware)
{
    const size_t n_rand = small() ? 1000 : 1000000, n_max = 127 * 6 + 16 + n_rand;
    float *x = malloc(n_max * 4), *dec = malloc(256 * 4);
    uint8_t *codes = malloc(n_max);
    ck_assert(x && dec && codes);
    size_t n = 0;
    for (int c = 0; c < 0x7F; c++) {
        const float v = sa_e4m3_to_f32((uint8_t)c);
        x[n++] = v;
        x[n++] = nextafterf(v, INFINITY);
        if (v > 0.0f)
            x[n++] = nextafterf(v, 0.0f);
        if (c < 0x7E) {
            const float mid = 0.5f * (v + sa_e4m3_to_f32((uint8_t)(c + 1))); /* exact */
            x[n++] = mid;
            x[n++] = nextafterf(mid, 0.0f);
            x[n++] = nextafterf(mid, INFINITY);
        }
    }
    const float edges[] = {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e30f, INFINITY, 0x1p-10f,
                           0x1.0p-11f, 0x1.8p-10f, 0x1p-126f, 0x1p-149f, 0.0f, 0x1.fp-7f,
                           0x1p-6f, 0x1.ep-7f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        x[n++] = edges[i];
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0xe4e3);
    for (size_t i = 0; i < n_rand; i++)
        x[n++] = ldexpf(1.0f + (float)sa_rng_uniform(&r), (int)sa_rng_below(&r, 25) - 14);
    float *dx, *ddec;
    uint8_t *dcodes;
    CK_CUDA(cudaMalloc((void **)&dx, n * 4));
    CK_CUDA(cudaMalloc((void **)&dcodes, n));
    CK_CUDA(cudaMalloc((void **)&ddec, 256 * 4));
    CK_CUDA(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemset(dcodes, 0xff, n));
    ck_assert_int_eq(sel_e4m3_cuda(dx, n, dcodes, ddec), SA_OK);
    CK_CUDA(cudaMemcpy(codes, dcodes, n, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(dec, ddec, 256 * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(codes[i] == sa_e4m3_from_f32(x[i]),
                      "E4M3 of %a: GPU 0x%02x, CPU 0x%02x (seed %llu)", x[i], codes[i],
                      sa_e4m3_from_f32(x[i]), (unsigned long long)sa_test_seed());
    for (int c = 0; c < 256; c++) {
        const float cpu = sa_e4m3_to_f32((uint8_t)c);
        ck_assert_msg(isnan(cpu) ? isnan(dec[c]) : !memcmp(&cpu, &dec[c], 4),
                      "E4M3 code 0x%02x: GPU %a, CPU %a", c, dec[c], cpu);
    }
    cudaFree(dx), cudaFree(dcodes), cudaFree(ddec);
    free(x), free(dec), free(codes);
}
END_TEST

START_TEST(test_quantizer_bits)
{
    const size_t n = small() ? 16 * 64 : 16 * 40000;
    uint16_t *x = malloc(n * 2);
    ck_assert(x);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x4e5646);
    /* Per block a scale drawn log-uniformly over 2^-30 .. 2^4 (E4M3 subnormal and saturated
     * scales, codes rounding to 0 and to 6), some all-zero blocks, some exact midpoints. */
    for (size_t b = 0; b < n / 16; b++) {
        double sc = ldexp(1.0, (int)sa_rng_below(&r, 35) - 30);
        int kind = (int)sa_rng_below(&r, 10);
        for (int i = 0; i < 16; i++) {
            float v = kind == 0 ? 0.0f
                    : kind == 1 ? (float)(sc * (0.25 * (int)sa_rng_below(&r, 25) - 3.0))
                                : (float)(sc * sa_rng_normal(&r));
            x[b * 16 + i] = sa_bf16_from_f32(v);
        }
    }
    quant_same(x, n);
    /* The same blocks scaled by 2^-96 and 2^+112 (exact in BF16 but for values pushed into its
     * subnormals): block denominators below and above the range of the kernel's reciprocal
     * division, so the exact division's branch runs on both sides of it. */
    uint16_t *y = malloc(n * 2);
    ck_assert(y);
    const int shifts[2] = {-96, 112};
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; i < n; i++)
            y[i] = sa_bf16_from_f32(ldexpf(sa_bf16_to_f32(x[i]), shifts[t]));
        quant_same(y, n);
    }
    free(y);
    /* One outlier: every other block's scale lands deep in E4M3's subnormals or at 0. */
    x[n / 2] = sa_bf16_from_f32(60000.0f);
    quant_same(x, n);
    for (size_t i = 0; i < n; i++) /* all zero: tensor scale 0, every byte 0 */
        x[i] = (i % 3) ? 0x0000 : 0x8000;
    quant_same(x, n);
    free(x);
}
END_TEST

START_TEST(test_quantizer_errors)
{
    uint16_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = sa_bf16_from_f32((float)i - 7.5f);
    uint16_t *dx = dev_from_host(h, sizeof h);
    sa_nvfp4 g = {0};
    CK_CUDA(cudaMalloc((void **)&g.values, 16));
    CK_CUDA(cudaMalloc((void **)&g.scales, 2));
    int *dw; /* async form's tensor scale, flag, then (from dw + 4) its work buffer */
    CK_CUDA(cudaMalloc((void **)&dw, 16 + SEL_NVFP4_QUANT_WORK_BYTES));
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(NULL, 32, &g, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, 32, NULL, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, 0, &g, NULL), SA_ERR_SHAPE);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, 24, &g, NULL), SA_ERR_SHAPE);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, 32, &g, NULL), SA_OK);
    const uint16_t bad[3] = {0x7fc0 /* NaN */, 0x7f80 /* +inf */, 0xff80 /* -inf */};
    for (int i = 0; i < 3; i++) {
        uint16_t hb[32];
        memcpy(hb, h, sizeof hb);
        hb[17] = bad[i];
        CK_CUDA(cudaMemcpy(dx, hb, sizeof hb, cudaMemcpyHostToDevice));
        sa_nvfp4 c = {malloc(16), malloc(2), 0, 0};
        ck_assert_int_eq(sa_nvfp4_quantize_bf16(hb, 32, &c), SA_ERR_ARG);
        ck_assert_int_eq(sa_nvfp4_quantize_bf16_cuda(dx, 32, &g, NULL), SA_ERR_ARG);
        ck_assert_int_eq(sel_nvfp4_quantize_async(dx, 32, g.values, g.scales, (float *)dw, dw + 1,
                                                  (dw + 4), NULL, NULL),
                         SA_OK);
        int hbad = 0;
        CK_CUDA(cudaMemcpy(&hbad, dw + 1, 4, cudaMemcpyDeviceToHost));
        ck_assert_int_eq(hbad, 1);
        free(c.values), free(c.scales);
    }
    ck_assert_int_eq(sel_nvfp4_quantize_async(dx, 24, g.values, g.scales, (float *)dw, dw + 1,
                                              (dw + 4), NULL, NULL),
                     SA_ERR_SHAPE);
    ck_assert_int_eq(sel_nvfp4_quantize_async(dx, 32, g.values, g.scales, NULL, dw + 1,
                                              (dw + 4), NULL, NULL),
                     SA_ERR_NULL);
    /* deq, when given, must be 16-byte aligned like x */
    ck_assert_int_eq(sel_nvfp4_quantize_async(dx, 32, g.values, g.scales, (float *)dw, dw + 1,
                                              (dw + 4), (uint16_t *)(dw + 3), NULL),
                     SA_ERR_UNSUPPORTED);
    cudaFree(dw);
    cudaFree(dx), cudaFree(g.values), cudaFree(g.scales);
}
END_TEST

/* ------------------------------------------------------------------ error codes */

/* Calls CPU and GPU with the same (possibly bad) arguments: both must return `expect`. */
static void same_error(const sa_selector *sel, const sa_shape *s, const uint16_t *hq,
                       const uint16_t *hk, const uint16_t *dq, const uint16_t *dk,
                       const sa_select_params *hp, const sa_select_params *dp, int32_t *hidx,
                       int32_t *didx, int expect, const char *what)
{
    int c = sel->cpu(s, hq, hk, hp, hidx, NULL);
    int g = sel->cuda(s, dq, dk, dp, didx, NULL);
    CK_CUDA(cudaDeviceSynchronize());
    ck_assert_msg(c == expect && g == expect, "%s, %s: expected %d, CPU %d, GPU %d", sel->name,
                  what, expect, c, g);
}

START_TEST(test_errors)
{
    const sa_shape s0 = {1, 4, 2, 256, 512, 64}; /* 4 blocks, 2 tiles */
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    uint16_t *hq = malloc(sa_q_elems(&s0) * 2), *hk = malloc(sa_kv_elems(&s0) * 2);
    const size_t ni = (size_t)4 * 4 * 256 * 64;
    uint16_t *hi = malloc(ni * 2);
    ck_assert(hq && hk && hi);
    sa_rng_fill_bf16(&r, hq, sa_q_elems(&s0), 1.0f);
    sa_rng_fill_bf16(&r, hk, sa_kv_elems(&s0), 1.0f);
    sa_rng_fill_bf16(&r, hi, ni, 1.0f);
    uint16_t *dq = dev_from_host(hq, sa_q_elems(&s0) * 2);
    uint16_t *dk = dev_from_host(hk, sa_kv_elems(&s0) * 2);
    uint16_t *di16 = dev_from_host(hi, ni * 2);
    int32_t *hidx = malloc(4 * 256 * 8), *didx;
    CK_CUDA(cudaMalloc((void **)&didx, 4 * 256 * 8));
    const sa_selector *sel;
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        sa_shape s = s0;
        sa_select_params hp, dp;
        sa_select_params_default(&hp);
        hp.k = 2;
        dp = hp;
#define SAME(expect, what) same_error(sel, &s, hq, hk, dq, dk, &hp, &dp, hidx, didx, expect, what)
        SAME(SA_OK, "valid arguments");
        same_error(sel, &s, NULL, hk, NULL, dk, &hp, &dp, hidx, didx, SA_ERR_NULL, "q NULL");
        same_error(sel, &s, hq, NULL, dq, NULL, &hp, &dp, hidx, didx, SA_ERR_NULL, "k NULL");
        same_error(sel, &s, hq, hk, dq, dk, &hp, &dp, NULL, NULL, SA_ERR_NULL, "indices NULL");
        same_error(sel, NULL, hq, hk, dq, dk, &hp, &dp, hidx, didx, SA_ERR_NULL, "shape NULL");
        hp.k = dp.k = 0;
        SAME(SA_ERR_ARG, "k 0");
        hp.k = dp.k = 5;
        SAME(SA_ERR_ARG, "k > kv_blocks");
        hp.k = dp.k = 4;
        SAME(SA_OK, "k == kv_blocks");
        hp.k = dp.k = 2;
        hp.keep_diagonal = dp.keep_diagonal = 1;
        SAME(SA_ERR_ARG, "keep_diagonal with len_q != len_kv");
        hp.keep_diagonal = dp.keep_diagonal = 0;
        hp.keep_sink = dp.keep_sink = 2;
        SAME(SA_ERR_ARG, "keep_sink 2");
        hp.keep_sink = dp.keep_sink = 0;
        s.len_kv = 256; /* square: diagonal and sink force 2 blocks in tile 1 */
        hp.keep_diagonal = dp.keep_diagonal = hp.keep_sink = dp.keep_sink = 1;
        hp.k = dp.k = 1;
        SAME(SA_ERR_ARG, "k 1 with diagonal and sink");
        hp.k = dp.k = 2;
        SAME(SA_OK, "k 2 with diagonal and sink");
        hp.keep_diagonal = dp.keep_diagonal = hp.keep_sink = dp.keep_sink = 0;
        s = s0;
        s.heads_kv = 3;
        SAME(SA_ERR_GQA, "heads_q % heads_kv");
        s = s0;
        s.head_dim = 96;
        SAME(SA_ERR_HEAD_DIM, "head_dim 96");
        s = s0;
        s.len_kv = 0;
        SAME(SA_ERR_SHAPE, "len_kv 0");
        s = s0;
        hp.q_index = hi, dp.q_index = di16;
        hp.index_dim = dp.index_dim = 32;
        SAME(SA_ERR_NULL, "q_index without k_index");
        hp.k_index = hi, dp.k_index = di16;
        SAME(SA_OK, "index vectors, index_dim 32");
        hp.index_dim = dp.index_dim = 24;
        SAME(SA_ERR_ARG, "index_dim 24");
        hp.index_dim = dp.index_dim = 0;
        SAME(SA_ERR_ARG, "index_dim 0 with index vectors");
        hp.q_index = hp.k_index = dp.q_index = dp.k_index = NULL;
        hp.index_dim = dp.index_dim = 16;
        SAME(SA_ERR_ARG, "index_dim without index vectors");
#undef SAME
    }
    /* Non-finite input: the GPU returns what the CPU does, which for the nvfp4 scorers is
     * SA_ERR_ARG (the others score it without complaint). */
    hk[77] = 0x7f80;
    CK_CUDA(cudaMemcpy(dk, hk, sa_kv_elems(&s0) * 2, cudaMemcpyHostToDevice));
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 2;
        const int expect = sel->cpu(&s0, hq, hk, &p, hidx, NULL);
        if (is_nvfp4(sel->name))
            ck_assert_int_eq(expect, SA_ERR_ARG);
        same_error(sel, &s0, hq, hk, dq, dk, &p, &p, hidx, didx, expect, "inf in K");
    }
    cudaFree(dq), cudaFree(dk), cudaFree(di16), cudaFree(didx);
    free(hq), free(hk), free(hi), free(hidx);
}
END_TEST

/* The causal argument rules, CPU and GPU alike: causal is a flag (SA_ERR_ARG), counts are
 * required (SA_ERR_NULL), the sink and the diagonal are two forced blocks (k 1 with the sink is
 * SA_ERR_ARG once there is more than one block); valid calls succeed, keep_local off the
 * diagonal included (under causal it names the diagonal block); index heads stay CPU-only
 * (SA_ERR_UNSUPPORTED after the checks). */
static void same_error_counts(const sa_selector *sel, const sa_shape *s, const uint16_t *hq,
                              const uint16_t *hk, const uint16_t *dq, const uint16_t *dk,
                              const sa_select_params *hp, const sa_select_params *dp,
                              int32_t *hidx, int32_t *didx, int32_t *hcnt, int32_t *dcnt,
                              int expect, const char *what)
{
    int c = sel->cpu(s, hq, hk, hp, hidx, hcnt);
    int g = sel->cuda(s, dq, dk, dp, didx, dcnt);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaGetLastError());
    ck_assert_msg(c == expect && g == expect, "%s, %s: expected %d, CPU %d, GPU %d (seed %llu)",
                  sel->name, what, expect, c, g, (unsigned long long)sa_test_seed());
}

START_TEST(test_causal_errors)
{
    /* 4 blocks; 1 block; 2 blocks with len_q > len_kv */
    const sa_shape s0 = {1, 4, 2, 256, 512, 64}, s1 = {1, 4, 2, 300, 100, 64},
                   s2 = {1, 4, 2, 300, 256, 64};
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0xca05a1);
    const size_t nq = sa_q_elems(&s1), nk = sa_kv_elems(&s0); /* the larger of each */
    const size_t ni = (size_t)2 * 512 * 64;                     /* index heads 2 */
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hi = malloc(ni * 2);
    ck_assert(hq && hk && hi);
    sa_rng_fill_bf16(&r, hq, nq, 1.0f);
    sa_rng_fill_bf16(&r, hk, nk, 1.0f);
    sa_rng_fill_bf16(&r, hi, ni, 1.0f);
    uint16_t *dq = dev_from_host(hq, nq * 2), *dk = dev_from_host(hk, nk * 2);
    uint16_t *di16 = dev_from_host(hi, ni * 2);
    const size_t max_rows = (size_t)2 * 300; /* per-query rows of s1 */
    int32_t *hidx = malloc(max_rows * 4 * 4), *hcnt = malloc(max_rows * 4), *didx, *dcnt;
    ck_assert(hidx && hcnt);
    CK_CUDA(cudaMalloc((void **)&didx, max_rows * 4 * 4));
    CK_CUDA(cudaMalloc((void **)&dcnt, max_rows * 4));
    const sa_selector *sel;
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 2;
        p.causal = 1;
#define SAMEC(sh, hc, dc, expect, what)                                                     \
    same_error_counts(sel, sh, hq, hk, dq, dk, &p, &p, hidx, didx, hc, dc, expect, what)
        SAMEC(&s0, hcnt, dcnt, SA_OK, "causal, valid arguments");
        SAMEC(&s0, NULL, NULL, SA_ERR_NULL, "causal without counts");
        p.causal = 2;
        SAMEC(&s0, hcnt, dcnt, SA_ERR_ARG, "causal 2");
        p.causal = 1;
        p.k = 0;
        SAMEC(&s0, hcnt, dcnt, SA_ERR_ARG, "causal, k 0 (before the counts)");
        SAMEC(&s0, NULL, NULL, SA_ERR_ARG, "causal, k 0 and no counts: k is checked first");
        p.k = 1;
        p.keep_sink = 1;
        SAMEC(&s0, hcnt, dcnt, SA_ERR_ARG, "causal, sink, k 1, 4 blocks");
        SAMEC(&s1, hcnt, dcnt, SA_OK, "causal, sink, k 1, 1 block");
        p.keep_sink = 0;
        p.k = 2;
        p.keep_local = 1;
        SAMEC(&s0, hcnt, dcnt, SA_OK, "causal, keep_local with len_q < len_kv");
        SAMEC(&s2, hcnt, dcnt, SA_ERR_ARG, "causal, keep_local with len_q > len_kv");
        p.keep_local = 0;
        p.keep_diagonal = 1;
        SAMEC(&s0, hcnt, dcnt, SA_ERR_ARG, "causal, keep_diagonal with len_q != len_kv");
        p.keep_diagonal = 0;
#undef SAMEC
        /* Index heads: CPU only for r1/r4, after the same checks; the nvfp4 scorers run them. */
        sa_select_params hp = p, dp = p;
        hp.q_index = hp.k_index = hi, hp.index_dim = 64, hp.index_heads = 2;
        dp.q_index = dp.k_index = di16, dp.index_dim = 64, dp.index_heads = 2;
        ck_assert_int_eq(sel->cpu(&s0, hq, hk, &hp, hidx, hcnt), SA_OK);
        ck_assert_int_eq(sel->cuda(&s0, dq, dk, &dp, didx, dcnt),
                         is_nvfp4(sel->name) ? SA_OK : SA_ERR_UNSUPPORTED);
        ck_assert_int_eq(sel->cuda(&s0, dq, dk, &dp, didx, NULL), SA_ERR_NULL);
        CK_CUDA(cudaDeviceSynchronize());
    }
    cudaFree(dq), cudaFree(dk), cudaFree(di16), cudaFree(didx), cudaFree(dcnt);
    free(hq), free(hk), free(hi), free(hidx), free(hcnt);
}
END_TEST

/* sel_cuda_run_host (what select-eval --device cuda uses) gives the same lists as a direct call
 * on device buffers (the kernels are deterministic) and passes the selector's errors through. */
START_TEST(test_host_wrapper)
{
    const sa_shape s = {1, 4, 2, 300, 1500, 64};
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 99);
    uint16_t *q = malloc(sa_q_elems(&s) * 2), *k = malloc(sa_kv_elems(&s) * 2);
    ck_assert(q && k);
    sa_rng_fill_bf16(&r, q, sa_q_elems(&s), 1.0f);
    sa_rng_fill_bf16(&r, k, sa_kv_elems(&s), 1.0f);
    const sa_selector *sel;
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 4;
        const size_t n = sa_selector_list_len(sel, &s, p.k), rows = n / p.k;
        int32_t *a = malloc(n * 4), *b = malloc(n * 4);
        int32_t *ca = malloc(rows * 4), *cb = malloc(rows * 4);
        ck_assert(a && b && ca && cb);
        double ms = -1;
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, q, k, &p, a, ca, &ms), SA_OK);
        ck_assert_int_eq(run_gpu_selector(sel, &s, q, k, &p, b, cb), SA_OK);
        ck_assert_msg(!memcmp(a, b, n * 4) && !memcmp(ca, cb, rows * 4),
                      "%s: host wrapper and direct call differ (seed %llu)", sel->name,
                      (unsigned long long)sa_test_seed());
        ck_assert(ms >= 0);
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, NULL, k, &p, a, NULL, NULL), SA_ERR_NULL);
        /* Causal: the same through the wrapper, which needs counts as the selector does. */
        p.causal = 1;
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, q, k, &p, a, ca, NULL), SA_OK);
        ck_assert_int_eq(run_gpu_selector(sel, &s, q, k, &p, b, cb), SA_OK);
        ck_assert_msg(!memcmp(a, b, n * 4) && !memcmp(ca, cb, rows * 4),
                      "%s causal: host wrapper and direct call differ (seed %llu)", sel->name,
                      (unsigned long long)sa_test_seed());
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, q, k, &p, a, NULL, NULL), SA_ERR_NULL);
        p.causal = 0;
        p.k = 0;
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, q, k, &p, a, NULL, NULL), SA_ERR_ARG);
        p.k = 1000;
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, q, k, &p, a, NULL, NULL), SA_ERR_ARG);
        free(a), free(b), free(ca), free(cb);
    }
    for (int i = 0; i < sa_selector_count(); i++) /* every selector without a GPU function */
        if (!sa_selector_at(i)->cuda)
            ck_assert_int_eq(sel_cuda_run_host(sa_selector_at(i), &s, q, k, NULL, (int32_t *)q,
                                               NULL, NULL),
                             SA_ERR_UNSUPPORTED);
    free(q), free(k);
}
END_TEST

/* Index heads (sa_select_params.index_heads > 0) are CPU-only for r1 and r4, keep_local off the
 * diagonal for every GPU selector, and head_lists modes outside .cuda_head_lists: the GPU
 * functions answer SA_ERR_UNSUPPORTED after the CPU's checks (bad values keep the CPU's code),
 * directly on device buffers of the index heads' layout and through sel_cuda_run_host (which
 * sizes its copies by that layout); the nvfp4 scorers run them (their lists are checked against
 * the CPU's in test_vs_cpu). keep_local with len_q == len_kv is keep_diagonal's block: the GPU
 * gives keep_diagonal's lists. */
START_TEST(test_index_heads_unsupported)
{
    const sa_shape s = {1, 8, 4, 256, 640, 64}, sq = {1, 8, 4, 384, 384, 64};
    const int hi = 2, dim = 32;
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x1d3e);
    const size_t nq = sa_q_elems(&sq), nk = sa_kv_elems(&s); /* the larger of the two shapes */
    const size_t nqi = (size_t)hi * 256 * dim, nki = (size_t)hi * 640 * dim;
    uint16_t *hq = malloc(nq * 2), *hk = malloc(nk * 2), *hqi = malloc(nqi * 2),
             *hki = malloc(nki * 2);
    ck_assert(hq && hk && hqi && hki);
    sa_rng_fill_bf16(&r, hq, nq, 1.0f);
    sa_rng_fill_bf16(&r, hk, nk, 1.0f);
    sa_rng_fill_bf16(&r, hqi, nqi, 1.0f);
    sa_rng_fill_bf16(&r, hki, nki, 1.0f);
    uint16_t *dq = dev_from_host(hq, nq * 2), *dk = dev_from_host(hk, nk * 2);
    uint16_t *dqi = dev_from_host(hqi, nqi * 2), *dki = dev_from_host(hki, nki * 2);
    const size_t max_rows = (size_t)4 * 384;
    int32_t *hidx = malloc(max_rows * 4 * 4), *hcnt = malloc(max_rows * 4), *didx;
    int32_t *a = malloc(max_rows * 4 * 4), *ca = malloc(max_rows * 4);
    ck_assert(hidx && hcnt && a && ca);
    CK_CUDA(cudaMalloc((void **)&didx, max_rows * 4 * 4));
    const sa_selector *sel;
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        sa_select_params hp, dp;
        sa_select_params_default(&hp);
        hp.k = 3;
        hp.q_index = hqi, hp.k_index = hki, hp.index_dim = dim, hp.index_heads = hi;
        dp = hp;
        dp.q_index = dqi, dp.k_index = dki;
        ck_assert_int_eq(sel->cpu(&s, hq, hk, &hp, hidx, NULL), SA_OK);
        const int want = is_nvfp4(sel->name) ? SA_OK : SA_ERR_UNSUPPORTED;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &dp, didx, NULL), want);
        CK_CUDA(cudaDeviceSynchronize());
        ck_assert_int_eq(sel_cuda_run_host(sel, &s, hq, hk, &hp, a, NULL, NULL), want);
        if (want == SA_OK) { /* the same lists by both paths */
            int32_t *g = malloc(sel_rows(sel, &s) * 3 * 4);
            ck_assert(g);
            CK_CUDA(cudaMemcpy(g, didx, sel_rows(sel, &s) * 3 * 4, cudaMemcpyDeviceToHost));
            ck_assert_msg(!memcmp(g, a, sel_rows(sel, &s) * 3 * 4),
                          "%s: index-head lists differ between device and host buffers (seed "
                          "%llu)", sel->name, (unsigned long long)sa_test_seed());
            free(g);
        }
        hp.index_heads = dp.index_heads = 3; /* not a layout of 8 / 4 heads */
        same_error(sel, &s, hq, hk, dq, dk, &hp, &dp, hidx, didx, SA_ERR_ARG, "index_heads 3");
        sa_select_params_default(&hp);
        hp.k = 3;
        hp.keep_local = 1;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &hp, didx, NULL), SA_ERR_UNSUPPORTED);
        CK_CUDA(cudaDeviceSynchronize());
        hp.keep_local = 2;
        same_error(sel, &s, hq, hk, dq, dk, &hp, &hp, hidx, didx, SA_ERR_ARG, "keep_local 2");
        /* head_lists: a mode outside .cuda_head_lists is SA_ERR_UNSUPPORTED (test_head_lists
         * runs the others); a value outside the modes is the CPU's SA_ERR_ARG. */
        hp.keep_local = 0;
        ck_assert(sel->cuda_head_lists & SA_HEAD_LISTS_BIT(SA_HEAD_LISTS_GROUP));
        ck_assert(!(sel->cuda_head_lists & ~sel->head_lists));
        for (int mode = SA_HEAD_LISTS_PER_HEAD; mode <= SA_HEAD_LISTS_POOLED; mode++) {
            hp.head_lists = mode;
            if (sel->cuda_head_lists & SA_HEAD_LISTS_BIT(mode))
                continue;
            ck_assert_int_eq(sel->cuda(&s, dq, dk, &hp, didx, NULL), SA_ERR_UNSUPPORTED);
            CK_CUDA(cudaDeviceSynchronize());
        }
        hp.head_lists = 3;
        same_error(sel, &s, hq, hk, dq, dk, &hp, &hp, hidx, didx, SA_ERR_ARG, "head_lists 3");
        hp.head_lists = SA_HEAD_LISTS_GROUP;
        /* Square: keep_local runs, and gives keep_diagonal's GPU lists. */
        hp.keep_local = 1;
        ck_assert_int_eq(run_gpu_selector(sel, &sq, hq, hk, &hp, hidx, hcnt), SA_OK);
        hp.keep_local = 0;
        hp.keep_diagonal = 1;
        ck_assert_int_eq(run_gpu_selector(sel, &sq, hq, hk, &hp, a, ca), SA_OK);
        const size_t n = sel_rows(sel, &sq) * hp.k;
        ck_assert_msg(!memcmp(hidx, a, n * 4), "%s: keep_local differs from keep_diagonal on "
                      "the GPU (seed %llu)", sel->name, (unsigned long long)sa_test_seed());
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dqi), cudaFree(dki), cudaFree(didx);
    free(hq), free(hk), free(hqi), free(hki), free(hidx), free(hcnt), free(a), free(ca);
}
END_TEST

/* Per-head and pooled lists on the GPU (the selectors whose .cuda_head_lists has them) against
 * their CPU function on the same input. Equal lists pass. Otherwise every per-head row that
 * differs must be a swap inside the tie band of brute-force per-head scores (a group of one),
 * and the GPU's pooled lists must pass bf_check_pooled on those scores (the budget, the caps,
 * the forced blocks and the exchange rule). The GPU lists are poisoned first and must pass the
 * causal validator. The first case is the small one (SA_SMALL). */
START_TEST(test_head_lists)
{
    static const sel_case hcases[] = {
        {{1, 4, 1, 700, 900, 64}, 4, 0, 0, 0, -1, 1, 0, 0},    /* causal chunk, partial tile */
        {{2, 4, 2, 640, 640, 128}, 3, 1, 1, 0, -1, 0, 0, 0},   /* keep_diagonal and the sink */
        {{1, 8, 2, 1000, 1000, 64}, 3, 0, 0, 0, -1, 1, 0, 0},  /* causal prefill, GQA 4 */
        {{1, 16, 1, 384, 2100, 128}, 8, 0, 0, 0, -1, 0, 0, 0}, /* GQA 16 */
    };
    const int ncases = small() ? 1 : (int)(sizeof hcases / sizeof hcases[0]);
    int ran = 0;
    for (int ci = 0; ci < ncases; ci++) {
        const sel_case *c = &hcases[ci];
        const sa_shape *s = &c->s;
        const sa_shape one = {s->batch, s->heads_q, s->heads_q, s->len_q, s->len_kv,
                              s->head_dim};
        sa_rng rng;
        sa_rng_seed(&rng, sa_test_seed() ^ (uint64_t)(ci * 7919));
        uint16_t *q = malloc(sa_q_elems(s) * 2), *k = malloc(sa_kv_elems(s) * 2);
        ck_assert(q && k);
        sa_rng_fill_bf16(&rng, q, sa_q_elems(s), 1.0f);
        sa_rng_fill_bf16(&rng, k, sa_kv_elems(s), 1.0f);
        /* Heads of unequal spread, so that pooling moves blocks between them. */
        for (size_t i = 0; i < sa_q_elems(s); i++) {
            const size_t h = i / ((size_t)s->len_q * s->head_dim) % s->heads_q;
            q[i] = sa_bf16_from_f32(sa_bf16_to_f32(q[i]) * (0.4f + 0.5f * (float)(h % 4)));
        }
        uint16_t *kk = bf_kv_per_head(s, k);
        uint16_t *dq = dev_from_host(q, sa_q_elems(s) * 2), *dk = dev_from_host(k, sa_kv_elems(s) * 2);
        const sa_selector *sel;
        for (int si = 0; (sel = gpu_selector(si)); si++)
            for (int mode = SA_HEAD_LISTS_PER_HEAD; mode <= SA_HEAD_LISTS_POOLED; mode++) {
                if (!(sel->cuda_head_lists & SA_HEAD_LISTS_BIT(mode)))
                    continue;
                sa_select_params p;
                sa_select_params_default(&p);
                p.k = c->k, p.keep_diagonal = c->keep_diagonal, p.keep_sink = c->keep_sink;
                p.causal = c->causal, p.head_lists = mode;
                int lh, rows, width;
                ck_assert_int_eq(sa_select_layout(sel, s, &p, &lh, &rows, &width), SA_OK);
                const size_t nr = (size_t)s->batch * lh * rows, n = nr * width;
                int32_t *ic = malloc(n * 4), *cc = malloc(nr * 4), *ig = malloc(n * 4),
                        *cg = malloc(nr * 4), *di, *dc;
                ck_assert(ic && cc && ig && cg);
                ck_assert_int_eq(sel->cpu(s, q, k, &p, ic, cc), SA_OK);
                CK_CUDA(cudaMalloc((void **)&di, n * 4 + 4));
                CK_CUDA(cudaMalloc((void **)&dc, nr * 4 + 4));
                CK_CUDA(cudaMemset(di, SEL_POISON_BYTE, n * 4 + 4));
                CK_CUDA(cudaMemset(dc, SEL_POISON_BYTE, nr * 4 + 4));
                const int rc = sel->cuda(s, dq, dk, &p, di, dc);
                CK_CUDA(cudaDeviceSynchronize());
                ck_assert_msg(rc == SA_OK, "%s mode %d GPU: %s (seed %llu)", sel->name, mode,
                              sa_strerror(rc), (unsigned long long)sa_test_seed());
                int32_t after[2];
                CK_CUDA(cudaMemcpy(ig, di, n * 4, cudaMemcpyDeviceToHost));
                CK_CUDA(cudaMemcpy(cg, dc, nr * 4, cudaMemcpyDeviceToHost));
                CK_CUDA(cudaMemcpy(&after[0], di + n, 4, cudaMemcpyDeviceToHost));
                CK_CUDA(cudaMemcpy(&after[1], dc + nr, 4, cudaMemcpyDeviceToHost));
                ck_assert_msg(after[0] == SEL_POISON_WORD && after[1] == SEL_POISON_WORD,
                              "%s mode %d wrote past its lists (seed %llu)", sel->name, mode,
                              (unsigned long long)sa_test_seed());
                sa_attn_opts vo;
                sa_attn_opts_default(&vo);
                vo.causal = c->causal;
                const sa_tile_lists l = {ig, cg, lh, width};
                ck_assert_int_eq(sa_tile_lists_check_opts(s, &l, &vo), SA_OK);
                if (memcmp(ic, ig, n * 4) || memcmp(cc, cg, nr * 4)) {
                    double *S = bf_scores_causal(sel->name, &one, q, kk, s->head_dim, c->causal);
                    const int nb = sa_kv_blocks(s);
                    int swaps = 0, rows_diff = 0, moved = 0;
                    char why[256];
                    if (mode == SA_HEAD_LISTS_POOLED) {
                        const char *w = bf_check_pooled(s, S, &p, ig, cg, width, &moved);
                        ck_assert_msg(!w, "%s pooled, case %d: GPU lists: %s (seed %llu)",
                                      sel->name, ci, w, (unsigned long long)sa_test_seed());
                        for (size_t r = 0; r < nr; r++)
                            rows_diff += cc[r] != cg[r] ||
                                         memcmp(ic + r * width, ig + r * width, width * 4);
                    } else {
                        for (size_t r = 0; r < nr; r++) {
                            if (!memcmp(ic + r * width, ig + r * width, width * 4))
                                continue;
                            rows_diff++;
                            const int x = (int)(r % rows);
                            const int vis = visible_blocks(s, 0, c->causal, x);
                            const int kr = c->k < vis ? c->k : vis;
                            const int diag = c->causal ? vis - 1 : c->keep_diagonal ? x : -1;
                            double mx = 0;
                            for (int b = 0; b < vis; b++)
                                mx = fabs(S[r * nb + b]) > mx ? fabs(S[r * nb + b]) : mx;
                            ck_assert_msg(cc[r] == cg[r] &&
                                              row_agrees(S + r * nb, vis, kr, diag, c->keep_sink,
                                                         ic + r * width, ig + r * width,
                                                         mx * TIE_REL_NVFP4, &swaps, why,
                                                         sizeof why),
                                          "%s per head, case %d: row %zu differs: %s (seed %llu)",
                                          sel->name, ci, r, why,
                                          (unsigned long long)sa_test_seed());
                        }
                    }
                    printf("%s %s case %d: %d of %zu rows differ from the CPU inside the tie "
                           "band: accepted\n", sel->name, mode == 1 ? "per head" : "pooled", ci,
                           rows_diff, nr);
                    free(S);
                }
                ran++;
                cudaFree(di), cudaFree(dc);
                free(ic), free(cc), free(ig), free(cg);
            }
        cudaFree(dq), cudaFree(dk);
        free(q), free(k), free(kk);
    }
    ck_assert_msg(ran > 0, "no GPU selector takes per-head or pooled lists");
}
END_TEST

/* sa_select_params.verdict: the nvfp4 scorers return without a host synchronization and record
 * a non-finite input there (SA_ERR_ARG) instead of returning it; valid inputs give the lists of
 * the synchronous call and leave the verdict at SA_OK, and lists from a NaN input stay
 * well-formed. The other GPU selectors ignore the field. */
START_TEST(test_nvfp4_verdict)
{
    const sa_shape s = {1, 4, 1, 256, 700, 64};
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x5e7d);
    uint16_t *hq = malloc(sa_q_elems(&s) * 2), *hk = malloc(sa_kv_elems(&s) * 2);
    ck_assert(hq && hk);
    sa_rng_fill_bf16(&r, hq, sa_q_elems(&s), 1.0f);
    sa_rng_fill_bf16(&r, hk, sa_kv_elems(&s), 1.0f);
    uint16_t *dq = dev_from_host(hq, sa_q_elems(&s) * 2);
    uint16_t *dk = dev_from_host(hk, sa_kv_elems(&s) * 2);
    sa_gpu_verdict *v = NULL;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    const size_t max_rows = (size_t)s.len_q, kk = 3;
    int32_t *d_sync, *d_async;
    CK_CUDA(cudaMalloc((void **)&d_sync, max_rows * kk * 4));
    CK_CUDA(cudaMalloc((void **)&d_async, max_rows * kk * 4));
    int32_t *a = malloc(max_rows * kk * 4), *b = malloc(max_rows * kk * 4);
    ck_assert(a && b);
    const sa_selector *sel;
    for (int si = 0; (sel = gpu_selector(si)); si++) {
        const size_t n = sel_rows(sel, &s) * kk;
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = (int)kk;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, d_sync, NULL), SA_OK);
        p.verdict = v;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, d_async, NULL), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_OK);
        CK_CUDA(cudaMemcpy(a, d_sync, n * 4, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(b, d_async, n * 4, cudaMemcpyDeviceToHost));
        ck_assert_msg(!memcmp(a, b, n * 4), "%s: lists with a verdict differ from those without "
                      "(seed %llu)", sel->name, (unsigned long long)sa_test_seed());
        if (!is_nvfp4(sel->name))
            continue;
        /* A NaN key: the synchronous call refuses it, the verdict records it. */
        const uint16_t nan = 0x7fc0;
        CK_CUDA(cudaMemcpy(dk + 5 * s.head_dim + 7, &nan, 2, cudaMemcpyHostToDevice));
        p.verdict = NULL;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, d_sync, NULL), SA_ERR_ARG);
        p.verdict = v;
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, d_async, NULL), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_ERR_ARG);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_OK); /* read resets it */
        CK_CUDA(cudaMemcpy(b, d_async, n * 4, cudaMemcpyDeviceToHost));
        for (size_t row = 0; row < n / kk; row++)
            for (size_t j = 0; j < kk; j++) {
                const int32_t x = b[row * kk + j];
                ck_assert_msg(x >= 0 && x < sa_kv_blocks(&s) && (j == 0 || x > b[row * kk + j - 1]),
                              "%s: row %zu slot %zu holds %d after a NaN input (seed %llu)",
                              sel->name, row, j, x, (unsigned long long)sa_test_seed());
            }
        CK_CUDA(cudaMemcpy(dk + 5 * s.head_dim + 7, hk + 5 * s.head_dim + 7, 2,
                           cudaMemcpyHostToDevice));
    }
    sa_gpu_verdict_destroy(v);
    cudaFree(dq), cudaFree(dk), cudaFree(d_sync), cudaFree(d_async);
    free(hq), free(hk), free(a), free(b);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    if (!gpu_selector(0)) {
        printf("no selector with a GPU function in the registry: nothing to test\n");
        return 77;
    }
    Suite *s = suite_create("gpu_selectors");
    TCase *tc = tcase_create("selectors");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_e4m3_hardware);
    tcase_add_test(tc, test_quantizer_bits);
    tcase_add_test(tc, test_quantizer_errors);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_vs_cpu);
    tcase_add_test(tc, test_causal_errors);
    tcase_add_test(tc, test_causal_vs_cpu);
    tcase_add_test(tc, test_many_blocks);
    tcase_add_test(tc, test_nvfp4_balanced);
    tcase_add_test(tc, test_host_wrapper);
    tcase_add_test(tc, test_index_heads_unsupported);
    tcase_add_test(tc, test_head_lists);
    tcase_add_test(tc, test_nvfp4_verdict);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
