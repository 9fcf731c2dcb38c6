/* r1: one representative per side. A tile's query mean (per head) dotted with a block's key mean;
 * the max over the GQA group's heads; top-k. Cheap, but a mean can hide a single strong key. */
#include "sel_cuda.h"
#include "sel_internal.h"

static int r1_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return sel_rep_select(s, q, k, p, SA_TILE, 0, indices, counts);
}

const sa_selector sa_selector_r1 = {
    .name = "r1",
    .description = "mean query of the tile . mean key of the block, max over the group's heads",
    .per_query = 0,
    .cpu = r1_cpu,
    .cuda = SEL_CUDA(sel_r1_cuda),
    .head_lists = SEL_MODES_HEADS,
    .cuda_head_lists = SEL_CUDA_MODES(SEL_MODES_GROUP),
};
