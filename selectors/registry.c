/* The selector registry: the only list of selectors. Adding a selector is one new file defining a
 * `const sa_selector` plus its line in the registry (and its name in the extern declaration). */
#include <string.h>

#include "sparseattn.h"

void sa_select_params_default(sa_select_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->k = 16;
}

extern const sa_selector sa_selector_r1, sa_selector_r4, sa_selector_nvfp4,
    sa_selector_nvfp4_query, sa_selector_oracle, sa_selector_random;

static const sa_selector *const registry[] = {
    &sa_selector_r1,
    &sa_selector_r4,
    &sa_selector_nvfp4,
    &sa_selector_nvfp4_query,
    &sa_selector_oracle,
    &sa_selector_random,
};

int sa_selector_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const sa_selector *sa_selector_at(int i)
{
    return i >= 0 && i < sa_selector_count() ? registry[i] : NULL;
}

const sa_selector *sa_selector_by_name(const char *name)
{
    for (int i = 0; name && i < sa_selector_count(); i++)
        if (!strcmp(registry[i]->name, name))
            return registry[i];
    return NULL;
}

size_t sa_selector_list_len(const sa_selector *sel, const sa_shape *s, int k)
{
    if (!sel || !s || k <= 0 || sa_shape_check(s))
        return 0;
    size_t per = sel->per_query ? (size_t)s->len_q : (size_t)sa_q_tiles(s);
    return (size_t)s->batch * s->heads_kv * per * k;
}

int sa_select_cpu(const char *name, const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    if (!name)
        return SA_ERR_NULL;
    const sa_selector *sel = sa_selector_by_name(name);
    if (!sel)
        return SA_ERR_UNKNOWN;
    return sel->cpu(s, q, k, p, indices, counts);
}
