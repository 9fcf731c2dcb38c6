/* Out-of-memory injection for one test program: include this in exactly one of its files. Its
 * malloc takes the C library's place for the whole process (the library's calls included):
 *   - while sa_fail_at > 0 it counts calls down, and the sa_fail_at-th from now returns NULL;
 *   - while sa_fail_thread1 > 0, every block of at least sa_fail_thread1 bytes that OpenMP
 *     thread 1 asks for returns NULL, after a short wait (as a failing system call may take):
 *     the other threads then reach their rows first, the case a call must not write in.
 * glibc only, and not under ASan, which keeps malloc for itself: SA_TEST_MALLOC says whether it
 * is there, and tests that need it skip their body without it. */
#pragma once
#include <stddef.h>

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#define SA_TEST_MALLOC 1
#include <omp.h>
#include <unistd.h>
extern void *__libc_malloc(size_t n);
static int sa_fail_at;
static volatile size_t sa_fail_thread1;
void *malloc(size_t n)
{
    if (sa_fail_at > 0 && --sa_fail_at == 0)
        return NULL;
    if (sa_fail_thread1 && n >= sa_fail_thread1 && omp_get_thread_num() == 1) {
        usleep(20000);
        return NULL;
    }
    return __libc_malloc(n);
}
#else
#include <stdio.h>
/* A test that needs the injection says, where it is missing, that it did not run. */
#define SA_TEST_MALLOC_SKIP()                                                                     \
    fprintf(stderr, "%s: skipped: no malloc injection in this build (ASan, or not glibc)\n",    \
            __func__)
#endif
