/* The GPU list check in two halves (cuda/sa_validate.cu, introduced with stage 15), so a stage
 * can queue the check and its own kernel back to back and synchronize once:
 *   1. sa_validate_tile_lists_enqueue: argument errors now; else queues the check on `stream`,
 *      whose verdict (0 or a negative sa_status) lands in the device word *flag.
 *   2. the stage's kernel reads *flag first and exits, writing nothing, if it is not 0;
 *   3. sa_validate_finish(flag, stream): synchronizes the stream and returns the verdict.
 * The flag is per host thread: finish it before the next enqueue on the same thread. */
#ifndef SA_VALIDATE_H
#define SA_VALIDATE_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
int sa_validate_tile_lists_enqueue(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                                   void *stream, int **flag);
int sa_validate_finish(const int *flag, void *stream);
#ifdef __cplusplus
}
#endif
#endif
