/* The selector registry: the only list of selectors. Adding a selector is one new file defining
 * `const sa_selector sa_selector_NAME` plus its line X(NAME) in SA_SELECTOR_LIST below (and the
 * file in selectors/meson.build); tools and tests find it here, its GPU function through .cuda. */
#include <string.h>

#include "sel_internal.h"

void sa_select_params_default(sa_select_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->k = 16;
}

/* One line per selector, in the order the tools list them: X(NAME) names the struct
 * sa_selector_NAME, which declares it and enters it in the registry. */
#define SA_SELECTOR_LIST(X) \
    X(r1)                   \
    X(r4)                   \
    X(r4_mass)              \
    X(gauss)                \
    X(nvfp4)                \
    X(nvfp4_query)          \
    X(nvfp4_mass)           \
    X(nvfp4_mass_q8)        \
    X(oracle)               \
    X(random)

#define SA_SELECTOR_DECLARE(n) extern const sa_selector sa_selector_##n;
#define SA_SELECTOR_ENTRY(n) &sa_selector_##n,
SA_SELECTOR_LIST(SA_SELECTOR_DECLARE)

static const sa_selector *const registry[] = {SA_SELECTOR_LIST(SA_SELECTOR_ENTRY)};

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

int sa_select_layout(const sa_selector *sel, const sa_shape *s, const sa_select_params *p,
                     int *list_heads, int *rows, int *row_width)
{
    if (!sel || !s || !list_heads || !rows || !row_width)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    sa_select_params def;
    if (!p) {
        sa_select_params_default(&def);
        p = &def;
    }
    if (p->k <= 0 || p->k > sa_kv_blocks(s))
        return SA_ERR_ARG;
    if ((err = sel_head_layout(s, p, sel->head_lists, list_heads, row_width)))
        return err;
    *rows = sel->per_query ? s->len_q : sa_q_tiles(s);
    return SA_OK;
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
