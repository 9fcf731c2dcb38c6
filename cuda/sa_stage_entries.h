/* Entry points of the GPU stages, for the registry in stages.c (internal, not installed).
 * Each stage file defines its check and launch functions with C linkage. */
#ifndef SA_STAGE_ENTRIES_H
#define SA_STAGE_ENTRIES_H

#include "sa_internal_api.h" /* SA_INTERNAL_API; includes sparseattn.h */

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
/* Stage 17 (version 12) for the KV-centric hybrid: the launch of sa_stage17_launch whose kernel
 * does nothing unless (*gate != 0) == (want != 0), gate being device memory written by work
 * queued before it (the hybrid's plan). With a gate, SA_ERR_UNSUPPORTED for calls that need
 * step 4's mask (causal, or len_kv not a multiple of 128): only the other builds test it.
 * Exported for its test (tests/gpu_sparse/test_gpu_row_masks.c). */
SA_INTERNAL_API int sa_stage17_launch_gated(const sa_gpu_attn *a, const int *gate, int want);
/* 1 where this library has the builds without step 4's mask, so that whole-block calls take a
 * gate; 0 in a library compiled with -DSA_STAGE17_MASK_SPECIALIZE=0, where every gated launch
 * is SA_ERR_UNSUPPORTED (and the hybrid launches ungated). For the gate's test. */
SA_INTERNAL_API int sa_stage17_gate_builds(void);

#ifdef __cplusplus
}
#endif
#endif
