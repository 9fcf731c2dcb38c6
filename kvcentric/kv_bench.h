/* KV-centric timing for `sparseattn bench kvcentric` (internal, not part of the public API): the
 * CLI is C without the CUDA headers, so the events live in the library. */
#ifndef SA_KV_BENCH_H
#define SA_KV_BENCH_H

#include "sa_internal_api.h" /* SA_INTERNAL_API; includes sparseattn.h */

#ifdef __cplusplus
extern "C" {
#endif

/* Medians over reps, in ms, on p->stream, after `warmup` untimed whole runs. index / attend /
 * combine / total: the three parts with validation off, each between its own events (total from
 * the first to the last). validated: the whole entry point with validation on, which synchronises
 * once inside (included). p->validate is restored. */
typedef struct sa_kv_times {
    double index, attend, combine, total, validated;
} sa_kv_times;
SA_INTERNAL_API int sa_kv_time_parts(sa_kv_params *p, int warmup, int reps, sa_kv_times *t);

#ifdef __cplusplus
}
#endif
#endif
