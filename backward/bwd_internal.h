/* The GPU backward (backward/): what its C and CUDA files share. Not public. */
#ifndef SA_BWD_INTERNAL_H
#define SA_BWD_INTERNAL_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
#define BWD_HEAD_DIM 128 /* the kernels are written for head_dim 128 */
/* Pointers, shape, list arguments, option flags and the int32 limits of the kernels; no CUDA
 * call and no look at the lists. */
int bwd_check_args(const sa_gpu_attn_bwd *a);
/* The shape the reverse index is built on (the KV-centric index, its "queries" the list rows):
 * batch B, heads_q = heads_kv = list_heads, len_q = q_tiles, len_kv and head_dim as a's. */
sa_shape bwd_index_shape(const sa_gpu_attn_bwd *a);
#ifdef __cplusplus
}
#endif
#endif
