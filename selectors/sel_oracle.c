/* oracle: the blocks holding the most exact attention mass. A tile's score for a block is the sum,
 * over the tile's valid queries and the list's heads (the GQA group's; one head with per-head and
 * pooled lists), of the dense softmax probability that falls in the block (sa_block_mass). It
 * needs the full dense QK^T, so it is an upper bound for select-eval, not a practical selector.
 * It always scores the attention's Q and K; index vectors in the params are validated and
 * ignored. */
#include <stdlib.h>

#include "sa_checked.h"
#include "sel_internal.h"

static int oracle_cpu(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                      const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 0, SEL_MODES_MASS, &c);
    if (err)
        return err;
    const int n = c.kv_blocks;
    float *mass = sa_sz_malloc(sa_sz_mul((int64_t)sa_lse_elems(s), n), sizeof *mass);
    if (!mass)
        return SA_ERR_NOMEM;
    /* Under causal the mass of causal attention: a block's score is what the tile's queries
     * would give it, their invisible keys counting nothing. */
    sa_attn_opts mo;
    sa_attn_opts_default(&mo);
    mo.causal = c.causal;
    err = sa_block_mass_opts(s, q, k, &mo, mass);
    if (!err)
        err = sel_pool_begin(&c);
    const int rows = s->batch * c.list_heads * c.q_tiles;
    int oom = 0;
#pragma omp parallel if (!err)
    {
        double *acc = malloc((size_t)n * sizeof *acc);
        sel_row w;
        const int failed = sel_row_start(&w, &c, &oom, !acc);
        float *score = w.score;
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < rows; r++) {
            if (failed || err)
                continue;
            int t = r % c.q_tiles, bh = r / c.q_tiles;
            int b = bh / c.list_heads, lh = bh % c.list_heads;
            int i0 = t * SA_TILE, i1 = i0 + SA_TILE < s->len_q ? i0 + SA_TILE : s->len_q;
            for (int blk = 0; blk < n; blk++)
                acc[blk] = 0.0;
            int h0;
            const int nh = sel_list_qheads(&c, lh, &h0); /* the group's heads, or the one */
            for (int j = 0; j < nh; j++) {
                size_t hq = (size_t)b * s->heads_q + (size_t)h0 + j;
                for (int i = i0; i < i1; i++)
                    for (int blk = 0; blk < n; blk++)
                        acc[blk] += mass[(hq * s->len_q + i) * n + blk];
            }
            for (int blk = 0; blk < n; blk++)
                score[blk] = (float)acc[blk];
            sel_row_emit(&w, &c, 0, t, (size_t)r, indices, counts);
        }
        free(acc);
        sel_row_free(&w);
    }
    free(mass);
    return sel_pool_end(&c, err ? err : oom ? SA_ERR_NOMEM : SA_OK, indices, counts);
}

const sa_selector sa_selector_oracle = {
    .name = "oracle",
    .description = "blocks of largest exact softmax mass (needs dense QK^T: an upper bound)",
    .per_query = 0,
    .cpu = oracle_cpu,
    .cuda = NULL,
    .head_lists = SEL_MODES_MASS,
    .ignores_index = 1,
};
