/* Fuzz target: a host list validator, sa_tile_lists_check (built as fuzz_tile_lists) or, with
 * FUZZ_QUERY, sa_query_lists_check (fuzz_query_lists), against a plain re-implementation of the
 * rules of sparseattn.h. The lists the validator reads are exactly as large as the shape says
 * (so ASan sees any read past them), filled from the input.
 * Input: six int32 shape fields, list_heads (tile lists only), max_blocks and allow_empty
 * (int32), one byte of flags (bit 0: counts given), then int32 values that fill the counts and
 * then the indices, repeated from the start when they run out (all 0 when there are none). */
#include "fuzz_util.h"
#include "sa_internal.h"

/* Lists larger than this are checked for their arguments only (the rows are not built). */
#define MAX_ENTRIES (1 << 18)

static int32_t pick(const int32_t *v, size_t n, size_t i) { return n ? v[i % n] : 0; }

/* The rules, written out: first bad row wins, within a row the first bad entry. */
static int expect_rows(const int32_t *idx, const int32_t *cnt, size_t rows, int m, int nb,
                       int allow_empty)
{
    for (size_t r = 0; r < rows; r++) {
        int c = cnt ? cnt[r] : m;
        if (c < 0 || c > m)
            return SA_ERR_COUNT;
        if (c == 0 && !allow_empty)
            return SA_ERR_EMPTY_ROW;
        const int32_t *row = idx + r * (size_t)m;
        for (int j = 0; j < c; j++) {
            if (row[j] < 0 || row[j] >= nb)
                return SA_ERR_INDEX;
            for (int k = 0; k < j; k++)
                if (row[k] == row[j])
                    return SA_ERR_DUPLICATE;
        }
    }
    return SA_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    sa_shape s = fuzz_shape(&in);
#ifdef FUZZ_QUERY
    const int list_heads = s.heads_kv;
#else
    const int list_heads = fuzz_i32(&in);
#endif
    const int m = fuzz_i32(&in), allow_empty = fuzz_i32(&in);
    const int with_counts = fuzz_u8(&in) & 1;
    const size_t nv = in.n / 4;
    int32_t *vals = malloc((nv ? nv : 1) * sizeof *vals);
    for (size_t i = 0; i < nv; i++)
        vals[i] = fuzz_i32(&in);

    /* What the validator must answer before it reads a row. */
    const int shape_code = fuzz_expected_shape_code(&s);
    i128 rows = 0;
    int want = shape_code;
    if (want == SA_OK) {
#ifdef FUZZ_QUERY
        rows = (i128)s.batch * s.heads_kv * s.len_q;
#else
        rows = (i128)s.batch * list_heads * fuzz_ceil128(s.len_q);
        if (list_heads != s.heads_kv && list_heads != s.heads_q)
            want = SA_ERR_LIST_HEADS;
#endif
    }
    if (want == SA_OK && (m <= 0 || rows * m > SA_MAX_ELEMS))
        want = SA_ERR_MAX_BLOCKS;
    if (want == SA_OK && allow_empty != 0 && allow_empty != 1)
        want = SA_ERR_ARG;
    const i128 entries = rows * (m > 0 ? m : 0);

    int32_t dummy = 0;
    int32_t *idx = &dummy, *cnt = NULL;
    const int build = want == SA_OK && entries + rows <= MAX_ENTRIES;
    if (build) {
        /* Exactly the sizes the shape implies: ASan catches any read past them. */
        cnt = with_counts ? malloc((size_t)rows * sizeof *cnt) : NULL;
        idx = malloc((size_t)(entries ? entries : 1) * sizeof *idx);
        size_t at = 0;
        for (size_t r = 0; cnt && r < (size_t)rows; r++)
            cnt[r] = pick(vals, nv, at++);
        for (size_t e = 0; e < (size_t)entries; e++)
            idx[e] = pick(vals, nv, at++);
        want = expect_rows(idx, cnt, (size_t)rows, m, sa_kv_blocks(&s), allow_empty);
    }

#ifdef FUZZ_QUERY
    sa_query_lists ql = {idx, cnt, m};
    const int args = sa_query_lists_check_args(&s, &ql);
    const int got = build || want != SA_OK ? sa_query_lists_check(&s, &ql, allow_empty) : want;
#else
    sa_tile_lists tl = {idx, cnt, list_heads, m};
    const int args = sa_tile_lists_check_args(&s, &tl);
    const int got = build || want != SA_OK ? sa_tile_lists_check(&s, &tl, allow_empty) : want;
#endif
    /* Past MAX_ENTRIES only the arguments are judged: they must pass. */
    FUZZ_REQUIRE(build || want != SA_OK || args == SA_OK, "args %d on a valid large list", args);
    FUZZ_REQUIRE(got == want, "shape (%d,%d,%d,%d,%d,%d) list_heads %d max_blocks %d "
                 "allow_empty %d counts %d: got %d, want %d", s.batch, s.heads_q, s.heads_kv,
                 s.len_q, s.len_kv, s.head_dim, list_heads, m, allow_empty, with_counts, got, want);
    if (cnt)
        free(cnt);
    if (idx != &dummy)
        free(idx);
    free(vals);
    return 0;
}
