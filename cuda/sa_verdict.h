/* The device side of sa_gpu_verdict (cuda/sa_verdict.cu), for the stages. It is part of the
 * public API's plumbing, not of any stage's schedule: it came with stage 17, and stages 15 and 16
 * record their synchronous verdict through it too, so that every validating stage takes a
 * caller's verdict alike (the exception to "earlier stages never use later helpers"). A verdict
 * is one int of device memory holding the most negative code recorded since its last read;
 * kernels record with atomicMin, so every bad row of every call lands and the result does not
 * depend on the order in which CTAs find them. */
#ifndef SA_VERDICT_H
#define SA_VERDICT_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
/* The device word of a verdict (NULL for NULL). */
int *sa_verdict_word(sa_gpu_verdict *v);
/* A verdict of this host thread's own, made on first use, for validated calls without one: the
 * call records into it, then reads it (which synchronizes the stream). */
int sa_verdict_for_this_thread(sa_gpu_verdict **out);
/* Records `code` (a negative sa_status; SA_OK records nothing) into v from the stream, for
 * stages that learn the verdict on the host. */
int sa_verdict_record(sa_gpu_verdict *v, int code, void *stream);
#ifdef __cplusplus
}
#endif
#endif
