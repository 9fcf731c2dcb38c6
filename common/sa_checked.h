/* Checked size arithmetic and the option rule, shared by every entry point (C and the host code
 * of the CUDA files). Library-internal, not installed.
 *
 * A size is an int64_t >= 0. SA_SIZE_BAD (-1) marks a result that overflowed int64 or had a
 * negative operand, and every operation on SA_SIZE_BAD gives SA_SIZE_BAD, so a chain such as
 * sa_sz_mul4(b, h, s, d) is tested once, at its end (sa_sz_within). The limits these sizes are
 * held to are stated in sparseattn.h (SA_MAX_ROWS, SA_MAX_ELEMS). */
#ifndef SA_CHECKED_H
#define SA_CHECKED_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "sparseattn.h"

#define SA_SIZE_BAD ((int64_t)-1)

/* a * b, or SA_SIZE_BAD. */
static inline int64_t sa_sz_mul(int64_t a, int64_t b)
{
    if (a < 0 || b < 0 || (a != 0 && b > INT64_MAX / a))
        return SA_SIZE_BAD;
    return a * b;
}

/* a + b, or SA_SIZE_BAD. */
static inline int64_t sa_sz_add(int64_t a, int64_t b)
{
    if (a < 0 || b < 0 || b > INT64_MAX - a)
        return SA_SIZE_BAD;
    return a + b;
}

static inline int64_t sa_sz_mul3(int64_t a, int64_t b, int64_t c)
{
    return sa_sz_mul(sa_sz_mul(a, b), c);
}

static inline int64_t sa_sz_mul4(int64_t a, int64_t b, int64_t c, int64_t d)
{
    return sa_sz_mul(sa_sz_mul3(a, b, c), d);
}

/* ceil(a / b) for b > 0, without forming a + b - 1 (which wraps near the type's maximum). */
static inline int64_t sa_sz_ceil_div(int64_t a, int64_t b)
{
    if (a < 0 || b <= 0)
        return SA_SIZE_BAD;
    return a / b + (a % b != 0);
}

/* a rounded up to a multiple of b (b > 0), or SA_SIZE_BAD. */
static inline int64_t sa_sz_round_up(int64_t a, int64_t b)
{
    return sa_sz_mul(sa_sz_ceil_div(a, b), b);
}

/* 1 when n is a size in [0, limit]; SA_SIZE_BAD never is. */
static inline int sa_sz_within(int64_t n, int64_t limit) { return n >= 0 && n <= limit; }

/* 1 when n is a size that size_t holds (always, on a 64-bit host, for n >= 0). */
static inline int sa_sz_fits_size_t(int64_t n)
{
    return n >= 0 && (uint64_t)n <= (uint64_t)SIZE_MAX;
}

/* malloc of n elements of elem bytes each, sized through the checks above: NULL when the byte
 * count overflows (or n, elem < 0) as well as when the allocation fails. n == 0 allocates one
 * byte, so NULL always means failure. */
static inline void *sa_sz_malloc(int64_t n, int64_t elem)
{
    int64_t bytes = sa_sz_mul(n, elem);
    if (!sa_sz_fits_size_t(bytes))
        return NULL;
    return malloc(bytes ? (size_t)bytes : 1);
}

/* ---------------------------------------------------------------- derived counts of a shape
 * Each is SA_SIZE_BAD unless every field it reads is positive; none of them can overflow for a
 * shape that passes sa_shape_check, and none of them wraps for one that does not. */
static inline int64_t sa_sz_q_tiles(const sa_shape *s)
{
    return s->len_q > 0 ? sa_sz_ceil_div(s->len_q, SA_TILE) : SA_SIZE_BAD;
}
static inline int64_t sa_sz_kv_blocks(const sa_shape *s)
{
    return s->len_kv > 0 ? sa_sz_ceil_div(s->len_kv, SA_TILE) : SA_SIZE_BAD;
}
/* Rows of all heads, each sequence rounded up to whole tiles (what SA_MAX_ROWS bounds). */
static inline int64_t sa_sz_q_rows_padded(const sa_shape *s)
{
    return sa_sz_mul4(s->batch, s->heads_q, sa_sz_q_tiles(s), SA_TILE);
}
static inline int64_t sa_sz_kv_rows_padded(const sa_shape *s)
{
    return sa_sz_mul4(s->batch, s->heads_kv, sa_sz_kv_blocks(s), SA_TILE);
}
static inline int64_t sa_sz_q_elems(const sa_shape *s)
{
    return sa_sz_mul4(s->batch, s->heads_q, s->len_q, s->head_dim);
}
static inline int64_t sa_sz_kv_elems(const sa_shape *s)
{
    return sa_sz_mul4(s->batch, s->heads_kv, s->len_kv, s->head_dim);
}
static inline int64_t sa_sz_lse_elems(const sa_shape *s)
{
    return sa_sz_mul3(s->batch, s->heads_q, s->len_q);
}

/* ---------------------------------------------------------------- the option rule
 * Every option field of every entry point, CPU and GPU: a flag is 0 or 1, an enum value lies in
 * [0, count). Anything else is SA_ERR_ARG (never "nonzero means on"). */
static inline int sa_flag_ok(int v) { return v == 0 || v == 1; }
static inline int sa_enum_ok(int v, int count) { return v >= 0 && v < count; }

/* sa_gpu_attn_check_common, the GPU stages' shared argument check, is declared in sparseattn.h
 * (the stage files include nothing else of ours for it) and defined in common/sa_gpu_check.c. */

#endif
