/* Placeholder: the exact CPU reference lands with the foundation work. */
#include "sparseattn.h"
int sa_ref_dense(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                 const sa_outputs *out)
{ (void)s; (void)q; (void)k; (void)v; (void)out; return SA_ERR_UNSUPPORTED; }
