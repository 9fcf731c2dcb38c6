/* OpenMP helpers shared by the reference and the CPU selectors (C only). */
#ifndef SA_OMP_H
#define SA_OMP_H

/* Called by every thread of a parallel region once it has tried its scratch allocations
 * (failed_here: this thread's failed): 1 in every thread if any thread's failed, after a barrier.
 * A thread may write output only when it returns 0, so a call out of memory writes nothing;
 * *flag starts at 0, shared by the region. */
static inline int sa_omp_any_failed(int *flag, int failed_here)
{
    if (failed_here) {
#pragma omp atomic write
        *flag = 1;
    }
#pragma omp barrier
    int any;
#pragma omp atomic read
    any = *flag;
    return any;
}

#endif
