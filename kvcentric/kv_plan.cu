// The hybrid schedule (SA_KV_SCHEDULE_HYBRID, sa_kvcentric.h): plan on the GPU, then a Q-centric
// pass over what the queries of each tile share.
//
// Why: a Q-centric stage costs the per-tile UNION of its queries' lists and runs at the dense
// rate; the KV-centric path costs each query's own list at about a third of that rate (gathered
// Q, partials written and read back). A block that every query of a tile lists is in the union
// at no extra cost: it is cheaper Q-centric. So each tile's intersection runs Q-centric (exact:
// every query of the tile really selected it) and only the rest KV-centric; the combine merges
// the Q-centric output as one more partial. Tiles whose queries agree become all Q-centric,
// tiles whose queries share nothing all KV-centric, with no host round trip: the plan is device
// memory that the index, the tile stage and the combine read.
//
// Plan, one CTA per tile (b, hkv, t), numbered steps:
//   1. zero a histogram of kv_blocks counters in shared memory;
//   2. every (query, slot) of the tile's rows adds one to its block (indices out of range and
//      slots past a row's count are skipped, so a bad list never becomes an address);
//   3. warp 0 compacts the blocks whose count equals the tile's number of queries, in
//      ascending order, with a ballot per 32 blocks; at most max_blocks are kept.
// With validation on, duplicates are still caught: the index keeps the planned entries in
// their own key range (kv_index.cu), next to each other in the sort.
#include "kv_internal.h"
#include "sa_internal.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    kv_plan_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ counts, int m,
                   int len_q, int q_tiles, int blocks, long long tiles, int32_t *tile_idx,
                   int32_t *tile_cnt)
{
    extern __shared__ int hist[];
    const int lane = threadIdx.x % 32;
    for (long long tr = blockIdx.x; tr < tiles; tr += gridDim.x) {
        // Step 1.
        for (int i = threadIdx.x; i < blocks; i += kThreads)
            hist[i] = 0;
        __syncthreads();
        // Step 2: rows (bh * len_q + q) for the tile's queries q.
        const long long bh = tr / q_tiles;
        const int q0 = (int)(tr - bh * q_tiles) * SA_TILE;
        const int nq = min(SA_TILE, len_q - q0);
        for (int e = threadIdx.x; e < nq * m; e += kThreads) {
            const int qi = e / m, j = e - qi * m;
            const long long row = bh * len_q + q0 + qi;
            int c = counts ? counts[row] : m;
            c = c < 0 ? 0 : (c > m ? m : c);
            if (j < c) {
                const int b = idx[row * m + j];
                if (b >= 0 && b < blocks)
                    atomicAdd(&hist[b], 1);
            }
        }
        __syncthreads();
        // Step 3.
        if (threadIdx.x < 32) {
            int n = 0;
            for (int base = 0; base < blocks; base += 32) {
                const int b = base + lane;
                const bool shared = b < blocks && hist[b] == nq;
                const unsigned bal = __ballot_sync(0xffffffffu, shared);
                const int pos = n + __popc(bal & ((1u << lane) - 1));
                if (shared && pos < m)
                    tile_idx[tr * m + pos] = b;
                n += __popc(bal);
            }
            if (lane == 0)
                tile_cnt[tr] = n < m ? n : m;
        }
        __syncthreads(); // the histogram is reused by the next tile
    }
}

} // namespace

int kv_plan(const sa_kv_params *p, const kv_ws *w)
{
    const sa_shape *s = &p->shape;
    const int blocks = sa_kv_blocks(s), q_tiles = sa_q_tiles(s), m = p->lists.max_blocks;
    const long long tiles = (long long)s->batch * s->heads_kv * q_tiles;
    cudaStream_t st = kv_stream(p);
    if (blocks > SA_KV_PLAN_MAX_BLOCKS) { // too many blocks for the histogram: all KV-centric
        SA_CUDA_TRY(cudaMemsetAsync(w->tile_cnt, 0, (size_t)tiles * sizeof(int32_t), st));
        return SA_OK;
    }
    const size_t smem = (size_t)blocks * sizeof(int);
    static int smem_set;
    if (!smem_set) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kv_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         SA_KV_PLAN_MAX_BLOCKS * (int)sizeof(int)));
        smem_set = 1;
    }
    const unsigned grid = (unsigned)(tiles < 65535 ? tiles : 65535);
    kv_plan_kernel<<<grid, kThreads, smem, st>>>(p->lists.indices, p->lists.counts, m, s->len_q,
                                                q_tiles, blocks, tiles, w->tile_idx, w->tile_cnt);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

int kv_shared_pass(const sa_kv_params *p, const kv_ws *w)
{
    const sa_stage *st = sa_stage_with(SA_ROLE_DEFAULT_TILE);
    if (!st)
        return SA_ERR_UNSUPPORTED;
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = p->shape;
    a.q = p->q;
    a.k = p->k;
    a.v = p->v;
    a.lists = (sa_tile_lists){w->tile_idx, w->tile_cnt, p->shape.heads_kv, p->lists.max_blocks};
    a.o = p->o;
    a.lse = kv_shared_lse(p, w);
    a.validate = 0; // the plan is well formed by construction: ascending, distinct, in range
    a.allow_empty_rows = 1;
    a.stream = p->stream;
    a.causal = p->causal;
    // A block every query of a causal tile lists may still lie after some of its queries'
    // last keys (when the lists were allowed future blocks): the stage masks it per row.
    a.allow_future_blocks = 1;
    return st->launch(&a);
}
