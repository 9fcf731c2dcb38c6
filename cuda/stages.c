/* The stage registry: the only list of GPU stages. Tests, the CLI, the benchmarks and the docs
 * read it. Built without CUDA it is empty and sa_gpu_available() says 0. */
#include <string.h>

#include "sparseattn.h"

#ifdef SA_HAVE_CUDA
#include "sa_stage_entries.h"

static const sa_stage stage14 = {
    14, "dense_persistent",
    "dense BF16 forward, d=128: TMA + wgmma, 1 producer warp + 2 consumer warpgroups, persistent",
    0, SA_ROLE_DEFAULT_DENSE, sa_stage14_check, sa_stage14_launch};
static const sa_stage stage15 = {
    15, "block_sparse",
    "tile-list sparse forward, d=128: stage 14 with one K/V stream per Q tile through the ring",
    1, SA_ROLE_SPARSE, sa_stage15_check, sa_stage15_launch};
static const sa_stage stage16 = {
    16, "gqa_pairs",
    "tile-list sparse forward, d=128: a CTA takes one Q tile of two heads of a GQA group",
    1, SA_ROLE_SPARSE | SA_ROLE_DEFAULT_TILE, sa_stage16_check, sa_stage16_launch};
#endif

static const sa_stage *const registry[] = {
#ifdef SA_HAVE_CUDA
    &stage14,
    &stage15,
    &stage16,
#endif
    NULL, /* end marker */
};

int sa_stage_count(void) { return (int)(sizeof registry / sizeof registry[0]) - 1; }

const sa_stage *sa_stage_at(int i) { return i >= 0 && i < sa_stage_count() ? registry[i] : NULL; }

const sa_stage *sa_stage_by_id(int id)
{
    for (int i = 0; i < sa_stage_count(); i++)
        if (registry[i]->id == id)
            return registry[i];
    return NULL;
}

const sa_stage *sa_stage_by_name(const char *name)
{
    for (int i = 0; name && i < sa_stage_count(); i++)
        if (!strcmp(registry[i]->name, name))
            return registry[i];
    return NULL;
}

const sa_stage *sa_stage_with(unsigned roles)
{
    for (int i = 0; i < sa_stage_count(); i++)
        if ((registry[i]->roles & roles) == roles)
            return registry[i];
    return NULL;
}

#ifndef SA_HAVE_CUDA
int sa_gpu_available(void) { return 0; }
int sa_gpu_verdict_create(sa_gpu_verdict **out)
{
    if (out)
        *out = NULL;
    return out ? SA_ERR_NOT_BUILT : SA_ERR_NULL;
}
int sa_gpu_verdict_read(sa_gpu_verdict *v, void *stream)
{
    (void)stream;
    return v ? SA_ERR_NOT_BUILT : SA_ERR_NULL;
}
void sa_gpu_verdict_destroy(sa_gpu_verdict *v) { (void)v; }
#endif

#ifndef SA_HAVE_CUDA
int sa_gpu_tile_lists_check(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                            void *stream)
{
    (void)s, (void)l, (void)allow_empty, (void)stream;
    return SA_ERR_NOT_BUILT;
}
int sa_gpu_query_lists_check(const sa_shape *s, const sa_query_lists *l, int allow_empty,
                             void *stream)
{
    (void)s, (void)l, (void)allow_empty, (void)stream;
    return SA_ERR_NOT_BUILT;
}
#endif
