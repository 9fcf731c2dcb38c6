/* The GPU backward (sa_gpu_tile_sparse_backward, issue #20) against the CPU reference
 * sa_ref_tile_sparse_backward on the same inputs: Q, K, V, dO and lists drawn fresh each run (the
 * seed is printed on failure, SA_SEED replays it), the forward's O and LSE from the CPU reference
 * (O rounded to BF16, as a GPU forward gives it). dQ, dK and dV are poisoned with NaN before each
 * call; each must pass the project's tolerance (rel L2 <= 1e-2, max error <= 3e-2 of the largest
 * reference value), an element the reference leaves at exactly 0 (a key no query chose, a query
 * with no key) must be exactly 0, and a second call (with a caller's workspace) must give the
 * same bits. Every case runs both dQ passes (dS^T stored by the dK/dV kernel, and recomputed);
 * the workspace of AUTO is that of STORED at these sizes, and RECOMPUTE's is smaller. Cases:
 * GQA 1/2/4/16, per-head and group-shared lists, variable counts with empty rows, partial last
 * Q tile and partial final block, every block (dense), causal with len_q = len_kv and len_q <
 * len_kv, future blocks allowed, more dK/dV CTAs than SMs (their launch order longest walk
 * first); the workspace AUTO picks (STORED's below 2 GiB of dS^T, RECOMPUTE's above, no kernel
 * run); then bad lists (each code), a short workspace and unchecked bad lists (no fault, finite
 * outputs). SA_SMALL=1: first case and the error cases. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/naive.h"
#include "bwd_fake_args.h"
#include "sa_test_gpu.h"

#define SEED (unsigned long long)sa_test_seed()
#define OK_EMPTY 1 /* a bad_lists row that is no error */

typedef struct bwd_case {
    int batch, hq, hkv, len_q, len_kv;
    int per_head; /* 1: list_heads = hq */
    int k;        /* max_blocks; 0: every block (causal: every visible one) */
    int causal, future;
    float q_scale;
} bwd_case;

typedef struct bwd_bufs {
    uint16_t *q, *k, *v, *o, *d_o;
    float *lse, *dq, *dk, *dv;
    int32_t *idx, *cnt;
} bwd_bufs;

static void dev_alloc(bwd_bufs *d, const sa_shape *s, size_t list_len, size_t rows)
{
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), nl = sa_lse_elems(s);
    CK_CUDA(cudaMalloc((void **)&d->q, nq * 2));
    CK_CUDA(cudaMalloc((void **)&d->o, nq * 2));
    CK_CUDA(cudaMalloc((void **)&d->d_o, nq * 2));
    CK_CUDA(cudaMalloc((void **)&d->k, nkv * 2));
    CK_CUDA(cudaMalloc((void **)&d->v, nkv * 2));
    CK_CUDA(cudaMalloc((void **)&d->lse, nl * 4));
    CK_CUDA(cudaMalloc((void **)&d->dq, nq * 4));
    CK_CUDA(cudaMalloc((void **)&d->dk, nkv * 4));
    CK_CUDA(cudaMalloc((void **)&d->dv, nkv * 4));
    CK_CUDA(cudaMalloc((void **)&d->idx, list_len * 4));
    CK_CUDA(cudaMalloc((void **)&d->cnt, rows * 4));
}

static void dev_free(bwd_bufs *d)
{
    void *p[] = {d->q, d->o, d->d_o, d->k, d->v, d->lse, d->dq, d->dk, d->dv, d->idx, d->cnt};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        CK_CUDA(cudaFree(p[i]));
}

static sa_gpu_attn_bwd bwd_args(const sa_shape *s, const bwd_bufs *d, int list_heads, int k)
{
    sa_gpu_attn_bwd a;
    sa_gpu_attn_bwd_default(&a);
    a.shape = *s;
    a.q = d->q, a.k = d->k, a.v = d->v, a.o = d->o, a.lse = d->lse, a.d_o = d->d_o;
    a.lists = (sa_tile_lists){d->idx, d->cnt, list_heads, k};
    a.dq = d->dq, a.dk = d->dk, a.dv = d->dv;
    return a;
}

static void poison(const sa_shape *s, const bwd_bufs *d)
{
    CK_CUDA(cudaMemset(d->dq, SA_POISON_BYTE, sa_q_elems(s) * 4));
    CK_CUDA(cudaMemset(d->dk, SA_POISON_BYTE, sa_kv_elems(s) * 4));
    CK_CUDA(cudaMemset(d->dv, SA_POISON_BYTE, sa_kv_elems(s) * 4));
}

static void fetch(float *dst, const float *src, size_t n)
{
    CK_CUDA(cudaMemcpy(dst, src, n * 4, cudaMemcpyDeviceToHost));
}

/* x against ref; rows (of D elements) with untouched[row] set have no term at all (a query with
 * no key, a key no query sees) and must be exactly 0. A row with terms may still sum to 0 by
 * cancellation (a query that sees one key: dS = P (dP - D) = 0), so only the structure decides. */
static void expect_close(const char *name, const char *what, const float *x, const float *ref,
                         size_t n, const unsigned char *untouched)
{
    sa_cmp c = sa_compare(x, ref, n);
    ck_assert_msg(sa_cmp_ok(&c),
                  "%s %s: rel_l2 %.3g max_abs %.3g (ref max %.3g, %zu non-finite, first bad %zu)"
                  " (seed %llu)",
                  name, what, c.rel_l2, c.max_abs, c.ref_max, c.nonfinite, c.first_bad, SEED);
    for (size_t e = 0; e < n; e++)
        if (untouched[e / 128])
            ck_assert_msg(x[e] == 0.f, "%s %s: [%zu] = %g in a row with no term (seed %llu)",
                          name, what, e, x[e], SEED);
}

/* The key rows (B, Hkv, Skv) that no query sees through its tile's list: the tile lists the
 * key's block and, causally, the tile's last valid row sees the key. */
static unsigned char *untouched_keys(const sa_shape *s, const sa_tile_lists *l, int causal)
{
    const int tiles = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    const int per = s->heads_q / l->list_heads; /* query heads per list head */
    const size_t n = (size_t)s->batch * s->heads_kv * s->len_kv;
    unsigned char *u = nv_malloc(n);
    memset(u, 1, n);
    for (int b = 0; b < s->batch; b++)
        for (int lh = 0; lh < l->list_heads; lh++)
            for (int t = 0; t < tiles; t++) {
                const size_t row = ((size_t)b * l->list_heads + lh) * tiles + t;
                const int cnt = l->counts ? l->counts[row] : l->max_blocks;
                const int last_row = t * 128 + 127 < s->len_q ? t * 128 + 127 : s->len_q - 1;
                const long long last_key = (long long)last_row + s->len_kv - s->len_q;
                const int hkv = lh * per / group;
                for (int j = 0; j < cnt; j++) {
                    const int blk = l->indices[row * l->max_blocks + j];
                    for (int key = blk * 128; key < blk * 128 + 128 && key < s->len_kv; key++)
                        if (!causal || key <= last_key)
                            u[((size_t)b * s->heads_kv + hkv) * s->len_kv + key] = 0;
                }
            }
    return u;
}

static void run_case(const bwd_case *c, uint64_t salt)
{
    char what[160];
    snprintf(what, sizeof what, "B%d Hq%d Hkv%d Sq%d Skv%d %s k=%d%s%s", c->batch, c->hq, c->hkv,
             c->len_q, c->len_kv, c->per_head ? "per-head" : "group", c->k,
             c->causal ? " causal" : "", c->future ? " future" : "");
    sa_shape s = {c->batch, c->hq, c->hkv, c->len_q, c->len_kv, 128};
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    const int list_heads = c->per_head ? c->hq : c->hkv, tiles = sa_q_tiles(&s);
    const int kk = c->k ? c->k : sa_kv_blocks(&s);
    const size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    const size_t rows = nv_tile_rows(&s, list_heads);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ (salt * 0x9e3779b97f4a7c15ull));
    uint16_t *q = nv_malloc(nq * 2), *k = nv_malloc(nkv * 2), *v = nv_malloc(nkv * 2);
    uint16_t *o = nv_malloc(nq * 2), *d_o = nv_malloc(nq * 2);
    float *of = nv_malloc(nq * 4), *lse = nv_malloc(nl * 4);
    float *dq_ref = nv_malloc(nq * 4), *dk_ref = nv_malloc(nkv * 4), *dv_ref = nv_malloc(nkv * 4);
    float *dq = nv_malloc(nq * 4), *dk = nv_malloc(nkv * 4), *dv = nv_malloc(nkv * 4);
    float *dq2 = nv_malloc(nq * 4), *dk2 = nv_malloc(nkv * 4), *dv2 = nv_malloc(nkv * 4);
    int32_t *idx = nv_malloc(rows * kk * 4), *cnt = nv_malloc(rows * 4);
    sa_rng_fill_bf16(&r, q, nq, c->q_scale);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    sa_rng_fill_bf16(&r, d_o, nq, 1.0f);
    if (c->k) {
        nv_fill_rows(&r, &s, idx, cnt, rows, tiles, 1, kk, c->causal, c->future, 0);
    } else { /* every block (or, causally, every visible one) */
        for (size_t row = 0; row < rows; row++) {
            const int n = c->causal ? nv_tile_visible(&s, (int)(row % tiles)) : kk;
            for (int j = 0; j < kk; j++)
                idx[row * kk + j] = j < n ? j : -1;
            cnt[row] = n;
        }
    }

    sa_tile_lists l = {idx, cnt, list_heads, kk};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    opts.causal = c->causal;
    opts.allow_future_blocks = c->future;
    sa_outputs out = {o, of, lse};
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, k, v, &l, &opts, &out), SA_OK);
    ck_assert_int_eq(sa_ref_tile_sparse_backward(&s, q, k, v, &l, &opts, of, lse, d_o, dq_ref,
                                                 dk_ref, dv_ref),
                     SA_OK);

    bwd_bufs d;
    dev_alloc(&d, &s, rows * kk, rows);
    CK_CUDA(cudaMemcpy(d.q, q, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.k, k, nkv * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.v, v, nkv * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.o, o, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.d_o, d_o, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.lse, lse, nl * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.idx, idx, rows * kk * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.cnt, cnt, rows * 4, cudaMemcpyHostToDevice));

    sa_gpu_attn_bwd a = bwd_args(&s, &d, list_heads, kk);
    a.causal = c->causal;
    a.allow_future_blocks = c->future;
    size_t ws_auto = 0, ws_stored = 0, ws_recompute = 0;
    ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, &ws_auto), SA_OK);
    a.dq_pass = SA_BWD_DQ_STORED;
    ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, &ws_stored), SA_OK);
    a.dq_pass = SA_BWD_DQ_RECOMPUTE;
    ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, &ws_recompute), SA_OK);
    ck_assert_msg(ws_auto == ws_stored && ws_recompute < ws_stored,
                  "%s: workspace auto %zu stored %zu recompute %zu", what, ws_auto, ws_stored,
                  ws_recompute);
    static const int passes[] = {SA_BWD_DQ_STORED, SA_BWD_DQ_RECOMPUTE};
    for (int pi = 0; pi < 2; pi++) {
        a.dq_pass = passes[pi];
        snprintf(what, sizeof what, "B%d Hq%d Hkv%d Sq%d Skv%d %s k=%d%s%s %s", c->batch, c->hq,
                 c->hkv, c->len_q, c->len_kv, c->per_head ? "per-head" : "group", c->k,
                 c->causal ? " causal" : "", c->future ? " future" : "",
                 pi == 0 ? "stored" : "recompute");
        a.workspace = NULL;
        a.workspace_bytes = 0;
        poison(&s, &d);
        int rc = sa_gpu_tile_sparse_backward(&a);
        ck_assert_msg(rc == SA_OK, "%s: %s (seed %llu)", what, sa_strerror(rc), SEED);
        CK_CUDA(cudaDeviceSynchronize());
        fetch(dq, d.dq, nq), fetch(dk, d.dk, nkv), fetch(dv, d.dv, nkv);
        unsigned char *no_q = nv_malloc(nl), *no_k = untouched_keys(&s, &l, c->causal);
        for (size_t i = 0; i < nl; i++)
            no_q[i] = lse[i] == -INFINITY; /* the query sees no selected key */
        expect_close("dQ", what, dq, dq_ref, nq, no_q);
        expect_close("dK", what, dk, dk_ref, nkv, no_k);
        expect_close("dV", what, dv, dv_ref, nkv, no_k);
        free(no_q);
        free(no_k);

        /* Again, through a workspace of the caller: the same bits. */
        size_t bytes = 0;
        ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, &bytes), SA_OK);
        ck_assert(bytes > 0);
        CK_CUDA(cudaMalloc(&a.workspace, bytes));
        a.workspace_bytes = bytes;
        /* A workspace of NaNs (0xffff is a BF16 NaN): a stored dS^T the dQ pass read but the
         * dK/dV kernel never wrote would turn its dQ rows to NaN. */
        CK_CUDA(cudaMemset(a.workspace, 0xff, bytes));
        poison(&s, &d);
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        fetch(dq2, d.dq, nq), fetch(dk2, d.dk, nkv), fetch(dv2, d.dv, nkv);
        ck_assert_msg(!memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nkv * 4) &&
                          !memcmp(dv, dv2, nkv * 4),
                      "%s: a second call differs (not deterministic) (seed %llu)", what, SEED);
        CK_CUDA(cudaFree(a.workspace));
    }

    dev_free(&d);
    void *h[] = {q, k, v, o, d_o, of, lse, dq_ref, dk_ref, dv_ref, dq, dk, dv, dq2, dk2, dv2, idx, cnt};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        free(h[i]);
}

START_TEST(shapes)
{
    /* GQA 2, group lists, partial last tile and partial final block. */
    bwd_case c = {1, 2, 1, 300, 700, 0, 3, 0, 0, 2.0f};
    run_case(&c, 1);
    if (sa_test_small())
        return;
    static const bwd_case more[] = {
        {1, 2, 2, 512, 512, 1, 4, 0, 0, 2.0f},     /* GQA 1, per-head lists */
        {2, 8, 2, 256, 1000, 0, 5, 0, 0, 2.0f},    /* GQA 4, batch 2 */
        {1, 16, 1, 512, 2048, 0, 6, 0, 0, 2.0f},   /* GQA 16 (the study's ratio) */
        {1, 16, 1, 384, 1024, 1, 3, 0, 0, 2.0f},   /* GQA 16, per-head lists */
        {1, 4, 1, 384, 384, 0, 0, 0, 0, 4.0f},     /* every block: dense */
        {1, 4, 1, 640, 640, 0, 4, 1, 0, 3.0f},     /* causal, len_q = len_kv */
        {2, 4, 2, 300, 1000, 1, 4, 1, 1, 3.0f},    /* causal, chunked prefill, future blocks */
        {1, 4, 4, 600, 256, 0, 2, 1, 0, 3.0f},     /* causal, the first queries see nothing */
        {1, 8, 2, 768, 768, 0, 0, 1, 0, 4.0f},     /* causal, every visible block */
        /* More dK/dV CTAs than an H200 has SMs, so their launch order is the LPT one: */
        {1, 2, 2, 384, 17920, 1, 5, 0, 0, 2.0f},   /* 280 CTAs, per-head lists */
        {1, 8, 1, 256, 16384, 0, 6, 0, 0, 2.0f},   /* 128 blocks x 2 splits of the group */
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        run_case(&more[i], 10 + i);
}
END_TEST

/* Bad lists with validation on: each code of the host validator, nothing launched. With a
 * verdict the call returns SA_OK at once and the verdict holds the same code; on good lists its
 * gradients are the synchronous call's, bit for bit. Unchecked bad lists (validate = 0): no
 * fault (compute-sanitizer checks the accesses), finite outputs. A workspace too small:
 * SA_ERR_ARG. */
START_TEST(bad_lists)
{
    sa_shape s = {1, 4, 2, 256, 384, 128};
    const int k = 2, list_heads = 2;
    const size_t rows = nv_tile_rows(&s, list_heads), nq = sa_q_elems(&s), nkv = sa_kv_elems(&s);
    int32_t idx[8] = {0, 1, 2, 0, 1, 2, 0, 2}, cnt[4] = {2, 2, 2, 2};
    ck_assert_uint_eq(rows, 4);
    bwd_bufs d;
    dev_alloc(&d, &s, rows * k, rows);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    uint16_t *h = nv_malloc(nq * 2);
    sa_rng_fill_bf16(&r, h, nq, 1.0f);
    CK_CUDA(cudaMemcpy(d.q, h, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.o, h, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.d_o, h, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.k, h, nkv * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.v, h, nkv * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemset(d.lse, 0, sa_lse_elems(&s) * 4));
    free(h);
    struct {
        int slot, value, cnt_row, cnt_value, causal, code;
    } bad[] = {
        {1, 3, -1, 0, 0, SA_ERR_INDEX},        /* block 3 of 3 */
        {1, -1, -1, 0, 0, SA_ERR_INDEX},
        {1, 0, -1, 0, 0, SA_ERR_DUPLICATE},    /* row 0: {0, 0} */
        {-1, 0, 2, 3, 0, SA_ERR_COUNT},        /* count 3 > max_blocks */
        {-1, 0, 1, -1, 0, SA_ERR_COUNT},
        {-1, 0, 0, 0, 0, OK_EMPTY},           /* an empty row: allowed by default */
        {1, 2, -1, 0, 1, SA_ERR_FUTURE_BLOCK}, /* causal: tile 0 sees blocks 0..1 of 3 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t bi[8], bc[4];
        memcpy(bi, idx, sizeof bi);
        memcpy(bc, cnt, sizeof bc);
        if (bad[i].slot >= 0)
            bi[bad[i].slot] = bad[i].value;
        if (bad[i].cnt_row >= 0)
            bc[bad[i].cnt_row] = bad[i].cnt_value;
        if (bad[i].causal) /* the other rows: visible blocks only */
            bi[0] = 0, bi[2] = 0, bi[3] = 1, bi[4] = 0, bi[5] = 1, bi[6] = 0, bi[7] = 1;
        CK_CUDA(cudaMemcpy(d.idx, bi, sizeof bi, cudaMemcpyHostToDevice));
        CK_CUDA(cudaMemcpy(d.cnt, bc, sizeof bc, cudaMemcpyHostToDevice));
        sa_gpu_attn_bwd a = bwd_args(&s, &d, list_heads, k);
        a.causal = bad[i].causal;
        const int want = bad[i].code == OK_EMPTY ? SA_OK : bad[i].code;
        ck_assert_msg(sa_gpu_tile_sparse_backward(&a) == want, "bad list %zu: want %s", i,
                      sa_strerror(want));
        float *sync_dq = nv_malloc(nq * 4), *rec_dq = nv_malloc(nq * 4);
        if (want == SA_OK)
            fetch(sync_dq, d.dq, nq);
        sa_gpu_verdict *v = NULL;
        ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
        a.verdict = v;
        poison(&s, &d);
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_OK);
        ck_assert_msg(sa_gpu_verdict_read(v, NULL) == want, "bad list %zu with a verdict: want %s",
                      i, sa_strerror(want));
        a.verdict = NULL;
        sa_gpu_verdict_destroy(v);
        if (want == SA_OK) {
            fetch(rec_dq, d.dq, nq);
            ck_assert_msg(!memcmp(sync_dq, rec_dq, nq * 4), "bad list %zu: dQ with a verdict "
                          "differs from the synchronous call's", i);
        }
        free(sync_dq);
        free(rec_dq);
        if (want == SA_OK)
            continue;
        a.allow_empty_rows = 0;
        a.validate = 0; /* unchecked: defined outputs, no bad access */
        poison(&s, &d);
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        float *dq = nv_malloc(nq * 4);
        fetch(dq, d.dq, nq);
        for (size_t e = 0; e < nq; e++)
            ck_assert_msg(dq[e] == dq[e], "bad list %zu unchecked: dQ[%zu] not written", i, e);
        free(dq);
    }
    /* An empty row with empty rows refused. */
    int32_t bc[4] = {2, 0, 2, 2};
    CK_CUDA(cudaMemcpy(d.idx, idx, sizeof idx, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.cnt, bc, sizeof bc, cudaMemcpyHostToDevice));
    sa_gpu_attn_bwd a = bwd_args(&s, &d, list_heads, k);
    a.allow_empty_rows = 0;
    ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_ERR_EMPTY_ROW);
    /* A workspace one byte short. */
    a.allow_empty_rows = 1;
    size_t bytes = 0;
    ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, &bytes), SA_OK);
    CK_CUDA(cudaMalloc(&a.workspace, bytes));
    a.workspace_bytes = bytes - 1;
    ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_ERR_ARG);
    CK_CUDA(cudaFree(a.workspace));
    dev_free(&d);
}
END_TEST

/* The dQ pass AUTO takes, seen through the workspace size (no kernel runs; the pointers are
 * fake and never read): STORED while
 * its dS^T (32 KiB per query head, tile and list slot) fits in SA_BWD_STORED_DS_AUTO_MAX,
 * RECOMPUTE past it, and the stored workspace holds all of dS^T. */
START_TEST(auto_dq_pass)
{
    static const struct {
        int heads_q, len_q, max_blocks, stored;
    } cases[] = {
        {4, 256, 3, 1},       /* 24 blocks of dS^T: 768 KiB */
        {16, 4096, 16, 1},    /* the study's shape at batch 1: 256 MiB */
        {32, 65536, 64, 0},   /* 32 x 512 x 64 blocks: 32 GiB */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sa_gpu_attn_bwd a = bwd_fake_args(
            (sa_shape){1, cases[i].heads_q, 1, cases[i].len_q, cases[i].len_q, 128}, 1,
            cases[i].max_blocks);
        size_t sizes[3] = {0, 0, 0};
        const int passes[3] = {SA_BWD_DQ_AUTO, SA_BWD_DQ_STORED, SA_BWD_DQ_RECOMPUTE};
        for (int p = 0; p < 3; p++) {
            a.dq_pass = passes[p];
            const int rc = sa_gpu_backward_workspace_size(&a, &sizes[p]);
            ck_assert_msg(rc == SA_OK, "case %zu pass %d: %s", i, passes[p], sa_strerror(rc));
        }
        const uint64_t ds = (uint64_t)cases[i].heads_q * (cases[i].len_q / 128) *
                            cases[i].max_blocks * 32768u;
        ck_assert_msg(sizes[1] >= sizes[2] + ds, "case %zu: stored %zu, recompute %zu, dS %llu", i,
                      sizes[1], sizes[2], (unsigned long long)ds);
        ck_assert_msg(sizes[0] == sizes[cases[i].stored ? 1 : 2],
                      "case %zu: AUTO's workspace %zu is not %s's", i, sizes[0],
                      cases[i].stored ? "STORED" : "RECOMPUTE");
    }
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    Suite *s = suite_create("gpu_backward");
    TCase *tc = tcase_create("backward");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, shapes);
    tcase_add_test(tc, bad_lists);
    tcase_add_test(tc, auto_dq_pass);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
