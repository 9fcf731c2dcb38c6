/* gauss: r1's means plus each block's per-channel key spread. A block's score estimates the
 * log of its softmax mass for the tile's mean query q, as if each channel of its keys spread
 * around the mean m as a split normal, its upper semivariance above m and its lower one below
 * (doubled: both equal the variance for a symmetric spread): q.m + (scale / 2) sum_d q_d^2 v_d
 * + log(n) / scale, v_d the half on q_d's side (n: the block's keys, scale: 1 / sqrt(dim)); max
 * over the group's heads; top-k. A block whose keys reach out toward the query's large channels
 * can hold a strong key that its mean hides: r1 misses it, gauss ranks it up; keys far out on
 * the other side do not count (the first, symmetric, version counted them and lost loss:
 * docs/quality.md). Twice r1's scoring work, no more memory traffic (both read K once). */
#include "sel_internal.h"

static int gauss_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                     const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return sel_rep_select(s, q, k, p, SA_TILE, 1, indices, counts);
}

const sa_selector sa_selector_gauss = {
    .name = "gauss",
    .description = "r1 plus the block's per-channel key semivariances: a split-normal estimate "
                   "of its log softmax mass, max over the group's heads (CPU only)",
    .per_query = 0,
    .cpu = gauss_cpu,
    .cuda = NULL,
    .head_lists = SEL_MODES_HEADS,
};
