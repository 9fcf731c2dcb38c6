/* The stage registry: the only list of GPU stages. Tests, the CLI, the benchmarks and the docs
 * read it. Built without CUDA it is empty and sa_gpu_available() says 0. */
#include <string.h>

#include "sparseattn.h"

static const sa_stage *const registry[] = {
    NULL, /* placeholder until the first stage lands */
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

#ifndef SA_HAVE_CUDA
int sa_gpu_available(void) { return 0; }
#endif
