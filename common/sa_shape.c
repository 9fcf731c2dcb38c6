#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sparseattn.h"

/* Largest element count we accept: indexing stays in size_t and int64 everywhere. */
#define SA_MAX_ELEMS ((uint64_t)1 << 40)

int sa_shape_check(const sa_shape *s)
{
    if (!s)
        return SA_ERR_NULL;
    if (s->batch <= 0 || s->heads_q <= 0 || s->heads_kv <= 0 || s->len_q <= 0 || s->len_kv <= 0 ||
        s->head_dim <= 0)
        return SA_ERR_SHAPE;
    if (s->heads_q % s->heads_kv)
        return SA_ERR_GQA;
    if (s->head_dim != 64 && s->head_dim != 128)
        return SA_ERR_HEAD_DIM;
    uint64_t q = (uint64_t)s->batch * s->heads_q * s->len_q * s->head_dim;
    uint64_t kv = (uint64_t)s->batch * s->heads_kv * s->len_kv * s->head_dim;
    if (q > SA_MAX_ELEMS || kv > SA_MAX_ELEMS)
        return SA_ERR_SHAPE;
    return SA_OK;
}

int sa_q_tiles(const sa_shape *s) { return (s->len_q + SA_TILE - 1) / SA_TILE; }
int sa_kv_blocks(const sa_shape *s) { return (s->len_kv + SA_TILE - 1) / SA_TILE; }

int sa_block_len(const sa_shape *s, int blk)
{
    int rest = s->len_kv - blk * SA_TILE;
    return rest < SA_TILE ? rest : SA_TILE;
}

size_t sa_q_elems(const sa_shape *s)
{
    return (size_t)s->batch * s->heads_q * s->len_q * s->head_dim;
}
size_t sa_kv_elems(const sa_shape *s)
{
    return (size_t)s->batch * s->heads_kv * s->len_kv * s->head_dim;
}
size_t sa_lse_elems(const sa_shape *s) { return (size_t)s->batch * s->heads_q * s->len_q; }

/* ---- BF16: the top 16 bits of an IEEE float, rounded to nearest even. */
uint16_t sa_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, keep the sign */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float sa_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void sa_bf16_from_f32_array(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sa_bf16_from_f32(src[i]);
}

void sa_bf16_to_f32_array(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sa_bf16_to_f32(src[i]);
}

void sa_attn_opts_default(sa_attn_opts *o)
{
    if (!o)
        return;
    o->allow_empty_rows = 1;
    o->validate = 1;
}

void sa_gpu_attn_default(sa_gpu_attn *a)
{
    if (!a)
        return;
    memset(a, 0, sizeof *a);
    a->validate = 1;
    a->allow_empty_rows = 1;
}
