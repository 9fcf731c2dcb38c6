/* gauss: r1's means plus each block's per-channel key variance. A block's score estimates the
 * log of its softmax mass for the tile's mean query q, as if its keys were Gaussian with mean m
 * and diagonal variance v: q.m + (scale / 2) sum_d q_d^2 v_d + log(n) / scale (n: the block's
 * keys, scale: 1 / sqrt(dim)); max over the group's heads; top-k. A block whose keys spread along
 * the query's large channels can hold a strong key that its mean hides: r1 misses it, gauss
 * ranks it up, at twice r1's scoring work and no more memory traffic (both read K once). */
#include "sel_internal.h"

static int gauss_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                     const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return sel_rep_select(s, q, k, p, SA_TILE, 1, indices, counts);
}

const sa_selector sa_selector_gauss = {
    .name = "gauss",
    .description = "r1 plus the block's per-channel key variance: a Gaussian estimate of its "
                   "log softmax mass, max over the group's heads (CPU only)",
    .per_query = 0,
    .cpu = gauss_cpu,
    .cuda = NULL,
};
