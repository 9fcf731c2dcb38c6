/* The GPU list check in two halves (cuda/sa_validate.cu, introduced with stage 15), so a stage
 * can queue the check and its own kernel back to back and synchronize once:
 *   1. sa_validate_tile_lists_enqueue: argument errors now; else queues the check on `stream`.
 *      Its last CTA writes the verdict (0 or a negative sa_status) to the device word *verdict
 *      and to a mapped host word, and leaves its own counters at zero for the next check: no
 *      memset before and no copy after.
 *   2. the stage launches its kernel right behind it as a programmatic dependent launch
 *      (sa_pdl.cuh): the kernel may be scheduled while the check finishes, calls sa_pdl_wait()
 *      and then reads *verdict, and exits, writing nothing, if it is not 0;
 *   3. sa_validate_finish(verdict, stream): synchronizes the stream and returns the verdict.
 * The verdict is per host thread: finish it before the next enqueue on the same thread.
 * The _opts form also takes the causal rules (docs/api.md, "Causal attention"): a block after its
 * tile's last visible key is SA_ERR_FUTURE_BLOCK unless allow_future, and a row that sees no key
 * may be empty even without allow_empty, as sa_tile_lists_check_opts has them. */
#ifndef SA_VALIDATE_H
#define SA_VALIDATE_H
#include "sparseattn.h"
#ifdef __cplusplus
extern "C" {
#endif
int sa_validate_tile_lists_enqueue(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                                   void *stream, const int **verdict);
int sa_validate_tile_lists_enqueue_opts(const sa_shape *s, const sa_tile_lists *l,
                                        int allow_empty, int causal, int allow_future,
                                        void *stream, const int **verdict);
int sa_validate_finish(const int *verdict, void *stream);
/* The _opts check recorded into a verdict's device word instead (sa_verdict_word): every code
 * found goes there by atomicMin, as a verdict holds codes; queued on `stream`, no
 * synchronization and no per-thread state. Argument errors (those of sa_tile_lists_check_args,
 * SA_ERR_NULL for no word) are returned at once. */
int sa_validate_tile_lists_record(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                                  int causal, int allow_future, int *word, void *stream);
#ifdef __cplusplus
}
#endif
#endif
