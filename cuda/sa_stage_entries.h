/* Entry points of the GPU stages, for the registry in stages.c (internal, not installed).
 * Each stage file defines its check and launch functions with C linkage. */
#ifndef SA_STAGE_ENTRIES_H
#define SA_STAGE_ENTRIES_H

#include "sparseattn.h"

#ifdef __cplusplus
extern "C" {
#endif

int sa_stage14_check(const sa_gpu_attn *a);
int sa_stage14_launch(const sa_gpu_attn *a);
int sa_stage15_check(const sa_gpu_attn *a);
int sa_stage15_launch(const sa_gpu_attn *a);
int sa_stage16_check(const sa_gpu_attn *a);
int sa_stage16_launch(const sa_gpu_attn *a);
int sa_stage17_check(const sa_gpu_attn *a);
int sa_stage17_launch(const sa_gpu_attn *a);

#ifdef __cplusplus
}
#endif
#endif
