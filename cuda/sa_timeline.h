/* The host side of cuda/sa_timeline.cuh (a build configured with -Dtimeline=true only): each
 * function copies its translation unit's stamps to out (3 per slot: first start, first past the
 * dependent-launch wait, last end, in ns of the GPU's global timer; ~0 and 0 where nothing ran)
 * and with reset clears them. `sparseattn bench selectors --timeline N` reads them. */
#ifndef SA_TIMELINE_H
#define SA_TIMELINE_H
#include "sa_internal_api.h"

#define SA_TIMELINE_SLOTS 2 /* slots of three stamps per translation unit */
#define SA_TIMELINE_STAMPS (3 * SA_TIMELINE_SLOTS)
#ifdef SA_TIMELINE
#ifdef __cplusplus
extern "C" {
#endif
SA_INTERNAL_API int sa_timeline_nvfp4(unsigned long long *out, int reset); /* amax, quantize */
SA_INTERNAL_API int sa_timeline_score(unsigned long long *out, int reset); /* score_wgmma */
SA_INTERNAL_API int sa_timeline_topk(unsigned long long *out, int reset);  /* the top-k */
SA_INTERNAL_API int sa_timeline_s17(unsigned long long *out, int reset);   /* stage 17 */
#ifdef __cplusplus
}
#endif
#endif
#endif
