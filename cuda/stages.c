/* The stage registry: the only list of GPU stages. Tests, the CLI, the benchmarks and the docs
 * read it. Built without CUDA it is empty and sa_gpu_available() says 0. */
#include <string.h>

#include "sparseattn.h"

#ifdef SA_HAVE_CUDA
#include "sa_stage_entries.h"

static const sa_stage stage14 = {
    .id = 14,
    .name = "dense_persistent",
    .summary = "dense BF16 forward, d=128: TMA + wgmma, 1 producer warp + 2 consumer warpgroups, "
               "persistent",
    .roles = SA_ROLE_DEFAULT_DENSE,
    .check = sa_stage14_check,
    .launch = sa_stage14_launch};
static const sa_stage stage15 = {
    .id = 15,
    .name = "block_sparse",
    .summary =
        "tile-list sparse forward, d=128: stage 14 with one K/V stream per Q tile through the ring",
    .roles = SA_ROLE_SPARSE,
    .check = sa_stage15_check,
    .launch = sa_stage15_launch};
static const sa_stage stage16 = {
    .id = 16,
    .name = "gqa_pairs",
    .summary =
        "tile-list sparse forward, d=128: a CTA takes one Q tile of two heads of a GQA group",
    .roles = SA_ROLE_SPARSE,
    .check = sa_stage16_check,
    .launch = sa_stage16_launch};
static const sa_stage stage17 = {
    .id = 17,
    .name = "split_tile",
    .summary = "tile-list sparse forward, d=128: one Q tile per CTA split over two warpgroups, "
               "softmax overlapped with the next block's QK, lists checked inside the kernel",
    .roles = SA_ROLE_SPARSE | SA_ROLE_DEFAULT_TILE | SA_ROLE_GPU_VERDICT | SA_ROLE_ROW_MASKS,
    .check = sa_stage17_check,
    .launch = sa_stage17_launch};
#endif

static const sa_stage *const registry[] = {
#ifdef SA_HAVE_CUDA
    &stage14,
    &stage15,
    &stage16,
    &stage17,
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
int sa_gpu_thread_release(void) { return SA_OK; } /* nothing is ever kept */
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
