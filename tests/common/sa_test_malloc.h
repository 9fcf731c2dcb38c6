/* Out-of-memory injection for one test program: include this in exactly one of its files. Its
 * malloc takes the C library's place for the whole process (the library's calls included);
 * while sa_fail_at > 0 it counts calls down and the sa_fail_at-th from now returns NULL. glibc
 * only, and not under ASan, which keeps malloc for itself: SA_TEST_MALLOC says whether it is
 * there, and tests that need it skip their body without it. */
#pragma once
#include <stddef.h>

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#define SA_TEST_MALLOC 1
extern void *__libc_malloc(size_t n);
static int sa_fail_at;
void *malloc(size_t n)
{
    if (sa_fail_at > 0 && --sa_fail_at == 0)
        return NULL;
    return __libc_malloc(n);
}
#endif
