/* KV-centric attention for per-query block lists. Included by sparseattn.h. */
#ifndef SA_KVCENTRIC_H
#define SA_KVCENTRIC_H
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
