/* Shared by the fuzz targets: reading fields from the input, and a check that aborts (so
 * libFuzzer records the input) with a message naming the broken rule. */
#ifndef SA_FUZZ_UTIL_H
#define SA_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparseattn.h"

#define FUZZ_REQUIRE(cond, ...)                                                                   \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz rule broken at %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

/* Consumes the input front to back; past its end every field reads as 0. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n;
} fuzz_in;

static inline int32_t fuzz_i32(fuzz_in *in)
{
    uint8_t b[4] = {0, 0, 0, 0};
    size_t k = in->n < 4 ? in->n : 4;
    memcpy(b, in->p, k);
    in->p += k;
    in->n -= k;
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

static inline uint8_t fuzz_u8(fuzz_in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static inline sa_shape fuzz_shape(fuzz_in *in)
{
    sa_shape s;
    s.batch = fuzz_i32(in);
    s.heads_q = fuzz_i32(in);
    s.heads_kv = fuzz_i32(in);
    s.len_q = fuzz_i32(in);
    s.len_kv = fuzz_i32(in);
    s.head_dim = fuzz_i32(in);
    return s;
}

/* The limits of sparseattn.h, recomputed in 128-bit arithmetic that cannot overflow: the code
 * sa_shape_check must return. */
typedef __int128 i128;
static inline i128 fuzz_ceil128(i128 a) { return (a + SA_TILE - 1) / SA_TILE; }
static inline int fuzz_expected_shape_code(const sa_shape *s)
{
    if (s->batch <= 0 || s->heads_q <= 0 || s->heads_kv <= 0 || s->len_q <= 0 || s->len_kv <= 0 ||
        s->head_dim <= 0)
        return SA_ERR_SHAPE;
    if (s->heads_q % s->heads_kv)
        return SA_ERR_GQA;
    if (s->head_dim != 64 && s->head_dim != 128 && s->head_dim != 256)
        return SA_ERR_HEAD_DIM;
    i128 qr = (i128)s->batch * s->heads_q * fuzz_ceil128(s->len_q) * SA_TILE;
    i128 kr = (i128)s->batch * s->heads_kv * fuzz_ceil128(s->len_kv) * SA_TILE;
    i128 qe = (i128)s->batch * s->heads_q * s->len_q * s->head_dim;
    i128 ke = (i128)s->batch * s->heads_kv * s->len_kv * s->head_dim;
    if (qr > SA_MAX_ROWS || kr > SA_MAX_ROWS || qe > SA_MAX_ELEMS || ke > SA_MAX_ELEMS)
        return SA_ERR_SHAPE;
    return SA_OK;
}

#endif
