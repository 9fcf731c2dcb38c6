/* r4: four representatives per side, each the mean of 32 consecutive tokens; a block's score is
 * the largest of the 4 x 4 dot products, max over the GQA group's heads; top-k. A partial tile or
 * block uses only its 32-token groups that hold at least one valid token, each averaged over its
 * valid tokens. */
#include "sel_cuda.h"
#include "sel_internal.h"

#define R4_SPAN 32

static int r4_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return sel_rep_select(s, q, k, p, R4_SPAN, 0, indices, counts);
}

const sa_selector sa_selector_r4 = {
    .name = "r4",
    .description = "4 means of 32 tokens per side, max of the 16 dot products and over heads",
    .per_query = 0,
    .cpu = r4_cpu,
    .cuda = SEL_CUDA(sel_r4_cuda),
    .head_lists = SEL_MODES_HEADS,
    .cuda_head_lists = SEL_CUDA_MODES(SEL_MODES_GROUP),
};
