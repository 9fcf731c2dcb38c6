/* The selector registry: the only list of selectors. Adding a selector is one line here. */
#include <string.h>

#include "sparseattn.h"

void sa_select_params_default(sa_select_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->k = 16;
}

static const sa_selector *const registry[] = {
    NULL, /* placeholder until the first selector lands */
};

int sa_selector_count(void) { return (int)(sizeof registry / sizeof registry[0]) - 1; }

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
