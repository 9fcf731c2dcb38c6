/*
 * Selector (indexer) plug-in interface: a selector scores KV blocks and writes block lists; it
 * never computes attention output. Included by sparseattn.h.
 */
#ifndef SA_SELECTORS_H
#define SA_SELECTORS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sa_shape;

typedef struct sa_select_params {
    int k;             /* blocks chosen per row (default 16); k > kv_blocks is SA_ERR_ARG */
    int keep_diagonal; /* always keep the block holding the tile's own positions (len_q == len_kv) */
    int keep_sink;     /* always keep block 0 (attention sink) */
    /* Optional separate index vectors (as MSA's index heads); NULL means the attention's Q and K.
     * q_index is (B, Hq, Sq, index_dim), k_index (B, Hkv, Skv, index_dim), BF16. */
    const uint16_t *q_index;
    const uint16_t *k_index;
    int index_dim;
    void *stream; /* cudaStream_t for the CUDA function; NULL = default stream */
} sa_select_params;
void sa_select_params_default(sa_select_params *p);

/* Output format of a selector:
 *   per_query == 0: tile lists, indices (B, Hkv, q_tiles, k), the GQA group shares a list;
 *   per_query == 1: per-query lists, indices (B, Hkv, Sq, k).
 * counts (same leading shape) may be NULL. Rows are sorted by block index. */
typedef int (*sa_select_fn)(const struct sa_shape *s, const uint16_t *q, const uint16_t *k,
                            const sa_select_params *p, int32_t *indices, int32_t *counts);

typedef struct sa_selector {
    const char *name;        /* "r1", "r4", "nvfp4", ... */
    const char *description; /* one line */
    int per_query;
    sa_select_fn cpu;  /* host pointers */
    sa_select_fn cuda; /* device pointers, or NULL where no GPU kernel exists */
} sa_selector;

int sa_selector_count(void);
const sa_selector *sa_selector_at(int i);
const sa_selector *sa_selector_by_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
