/* The reverse index's limits, in C so that the GPU backward's argument check (backward/,
 * which builds the KV-centric index on a stand-in shape) holds the same ones as the index's
 * own check (kv_index.cu, kv_check_args). Not public. */
#ifndef SA_KV_LIMITS_H
#define SA_KV_LIMITS_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
#define KV_D 128 /* the kernels are written for head_dim 128 */
/* SA_ERR_UNSUPPORTED unless the index and the kernels can take shape s and lists l: head_dim
 * KV_D, a GQA group of at most 128 heads, entries, tasks and buckets in int32 (with their sum,
 * which one scan takes), an int per (bucket, Q tile), max_blocks below SA_KV_MAX_BLOCKS.
 * s must pass sa_shape_check and l sa_query_lists_check_args. */
int kv_index_limits(const sa_shape *s, const sa_query_lists *l);
#ifdef __cplusplus
}
#endif
#endif
