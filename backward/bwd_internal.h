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
#ifdef __cplusplus
}
#endif
#endif
