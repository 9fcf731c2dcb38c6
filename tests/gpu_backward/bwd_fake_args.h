/* GPU backward arguments whose tensors are fake, aligned addresses that nothing may read: for
 * what runs before any kernel (the argument checks, the workspace size). */
#ifndef BWD_FAKE_ARGS_H
#define BWD_FAKE_ARGS_H
#include <stdint.h>

#include "sparseattn.h"

/* Aligned addresses that are never dereferenced. */
#define FAKE(n) ((void *)(uintptr_t)(0x100000u * (n)))

static inline sa_gpu_attn_bwd bwd_fake_args(sa_shape s, int list_heads, int max_blocks)
{
    sa_gpu_attn_bwd a;
    sa_gpu_attn_bwd_default(&a);
    a.shape = s;
    a.q = FAKE(1), a.k = FAKE(2), a.v = FAKE(3), a.o = FAKE(4), a.lse = FAKE(5);
    a.d_o = FAKE(6), a.dq = FAKE(7), a.dk = FAKE(8), a.dv = FAKE(9);
    a.lists = (sa_tile_lists){FAKE(10), FAKE(11), list_heads, max_blocks};
    return a;
}
#endif
