#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sa_checked.h"

int sa_shape_check(const sa_shape *s)
{
    if (!s)
        return SA_ERR_NULL;
    if (s->batch <= 0 || s->heads_q <= 0 || s->heads_kv <= 0 || s->len_q <= 0 || s->len_kv <= 0 ||
        s->head_dim <= 0)
        return SA_ERR_SHAPE;
    if (s->heads_q % s->heads_kv)
        return SA_ERR_GQA;
    if (s->head_dim != 64 && s->head_dim != 128 && s->head_dim != 256) /* GPU: stages check */
        return SA_ERR_HEAD_DIM;
    /* The limits of sparseattn.h, every product checked (no product of four ints wraps here). */
    if (!sa_sz_within(sa_sz_q_rows_padded(s), SA_MAX_ROWS) ||
        !sa_sz_within(sa_sz_kv_rows_padded(s), SA_MAX_ROWS) ||
        !sa_sz_within(sa_sz_q_elems(s), SA_MAX_ELEMS) ||
        !sa_sz_within(sa_sz_kv_elems(s), SA_MAX_ELEMS))
        return SA_ERR_SHAPE;
    return SA_OK;
}

int sa_q_tiles(const sa_shape *s)
{
    return s && s->len_q > 0 ? (int)sa_sz_q_tiles(s) : 0;
}
int sa_kv_blocks(const sa_shape *s)
{
    return s && s->len_kv > 0 ? (int)sa_sz_kv_blocks(s) : 0;
}

int sa_block_len(const sa_shape *s, int blk)
{
    if (!s || blk < 0 || blk >= sa_kv_blocks(s))
        return 0;
    int64_t rest = (int64_t)s->len_kv - (int64_t)blk * SA_TILE;
    return rest < SA_TILE ? (int)rest : SA_TILE;
}

size_t sa_q_elems(const sa_shape *s)
{
    return sa_shape_check(s) ? 0 : (size_t)sa_sz_q_elems(s);
}
size_t sa_kv_elems(const sa_shape *s)
{
    return sa_shape_check(s) ? 0 : (size_t)sa_sz_kv_elems(s);
}
size_t sa_lse_elems(const sa_shape *s)
{
    return sa_shape_check(s) ? 0 : (size_t)sa_sz_lse_elems(s);
}

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
    o->causal = 0;
    o->allow_future_blocks = 0;
}

int sa_attn_opts_check(const sa_attn_opts *o)
{
    if (!o)
        return SA_ERR_NULL;
    return sa_flag_ok(o->allow_empty_rows) && sa_flag_ok(o->validate) && sa_flag_ok(o->causal) &&
                   sa_flag_ok(o->allow_future_blocks)
               ? SA_OK
               : SA_ERR_ARG;
}

void sa_gpu_attn_default(sa_gpu_attn *a)
{
    if (!a)
        return;
    memset(a, 0, sizeof *a);
    a->validate = 1;
    a->allow_empty_rows = 1;
}
