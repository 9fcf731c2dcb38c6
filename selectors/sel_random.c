/* random: k blocks drawn uniformly (after the forced ones) per (b, KV head, tile), from
 * params.seed. Each row has its own stream, so the lists do not depend on the thread count. A
 * lower bound for select-eval; q and k are not read and may be NULL. */
#include <stdlib.h>

#include "sel_internal.h"

#define ROW_STRIDE 0x9e3779b97f4a7c15ull /* golden-ratio step between row seeds */

static int random_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                      const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 0, 1, SEL_MODES_HEADS, &c);
    if (err)
        return err;
    const uint64_t seed = p ? p->seed : 0;
    const int n = c.kv_blocks;
    const int rows = s->batch * c.list_heads * c.q_tiles;
    int oom = 0;
#pragma omp parallel
    {
        /* A random score per block, picked like any other selector's scores: forced blocks and
         * the sorted output come from the shared top-k. */
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, 0);
        float *score = w.score;
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++) {
            if (failed)
                continue;
            sa_rng rng;
            sa_rng_seed(&rng, seed + (uint64_t)r * ROW_STRIDE);
            for (int blk = 0; blk < n; blk++)
                score[blk] = (float)sa_rng_uniform(&rng);
            sel_row_emit(&w, &c, 0, r % c.q_tiles, (size_t)r, indices, counts);
        }
        sel_row_free(&w);
    }
    return oom ? SA_ERR_NOMEM : SA_OK;
}

const sa_selector sa_selector_random = {
    .name = "random",
    .description = "uniformly random blocks from params.seed (a lower bound)",
    .per_query = 0,
    .cpu = random_cpu,
    .cuda = NULL,
    .head_lists = SEL_MODES_HEADS,
    .ignores_index = 1,
};
