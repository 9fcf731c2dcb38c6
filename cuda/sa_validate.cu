// Block-list validation on the GPU, so that bad metadata never reaches an attention kernel
// unchecked while the lists stay in device memory. Introduced with stage 15, which queues the
// check right before its own kernel (sa_validate.h); sa_gpu_*_lists_check are the standalone
// public forms, for tile and per-query lists.
//
// One warp checks one row: count in [0, max_blocks] (and not 0 unless empty rows are allowed),
// every index in [0, kv_blocks), no index twice; with causal (tile rows) no block after the
// tile's last visible key unless allowed (SA_ERR_FUTURE_BLOCK), and a row that sees no key may be
// empty, as the host validator (sa_list_rows_check). Duplicates are found with a per-warp bitmap of
// kv_blocks bits in shared memory: each lane sets its entries' bits with atomicOr, and a bit
// that was already set is a duplicate. The error of the whole launch is the minimum of the codes
// found (atomicMin), so a list with one fault reports the same code as the host validator.
//
// The verdict leaves the GPU without extra stream operations: the last CTA to finish (a done
// counter) publishes the minimum to the device verdict word that the dependent kernel reads and
// to a mapped host word that sa_validate_finish reads after its one synchronization, then
// zeroes the error word and the counter for the next check. (A memset before and a copy back
// after cost a stream operation each on every validated call.)
#include <cuda_runtime.h>
#include <new>

#include "sa_checked.h"
#include "sa_cuda_internal.h"
#include "sa_internal.h"
#include "sa_pdl.cuh"
#include "sa_validate.h"

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kWarp = 32;

// Causal rules of tile rows (rows of q_tiles tiles of shape s): the blocks [0, visible) a tile
// sees, by the host validators' own geometry (sa_geo_*, sa_internal.h).
struct CausalRule {
    int causal, allow_future, q_tiles;
    sa_shape s;
};

__device__ __forceinline__ int visible_blocks(const CausalRule &cr, long long row, int kv_blocks)
{
    if (!cr.causal)
        return kv_blocks;
    const int t = (int)(row % cr.q_tiles);
    return sa_geo_blocks(sa_geo_last_key(&cr.s, sa_geo_tile_last_row(&cr.s, t)));
}

__global__ void validate_rows_kernel(const int32_t *__restrict__ indices,
                                     const int32_t *__restrict__ counts, long long rows,
                                     int max_blocks, int kv_blocks, int allow_empty,
                                     CausalRule cr, int *error, unsigned int *done, int *verdict,
                                     volatile int *host_verdict)
{
    // The dependent kernel only waits for our completion before it reads the verdict, so it may
    // be scheduled as soon as every CTA of ours is running.
    sa_pdl_trigger();
    extern __shared__ unsigned int bitmaps[];
    const int words = (kv_blocks + 31) / 32;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    unsigned int *bits = bitmaps + (size_t)warp * words;
    for (int w = lane; w < words; w += kWarp)
        bits[w] = 0u;
    __syncwarp();

    const long long warps_total = (long long)gridDim.x * kWarpsPerBlock;
    for (long long row = (long long)blockIdx.x * kWarpsPerBlock + warp; row < rows;
         row += warps_total) {
        const int c = counts ? counts[row] : max_blocks;
        const int visible = visible_blocks(cr, row, kv_blocks);
        int err = 0;
        if (c < 0 || c > max_blocks)
            err = SA_ERR_COUNT;
        else if (c == 0 && !allow_empty && visible > 0)
            err = SA_ERR_EMPTY_ROW;
        const int n = err ? 0 : c;
        const int32_t *r = indices + row * (long long)max_blocks;
        for (int j = lane; j < n; j += kWarp) {
            const int b = r[j];
            if (b < 0 || b >= kv_blocks) {
                err = min(err, (int)SA_ERR_INDEX);
                continue;
            }
            const unsigned int bit = 1u << (b & 31);
            if (atomicOr(&bits[b >> 5], bit) & bit)
                err = min(err, (int)SA_ERR_DUPLICATE);
            if (b >= visible && !cr.allow_future)
                err = min(err, (int)SA_ERR_FUTURE_BLOCK);
        }
        __syncwarp();
        // Clear only the words this row touched: rows are short, bitmaps may be long.
        for (int j = lane; j < n; j += kWarp) {
            const int b = r[j];
            if (b >= 0 && b < kv_blocks)
                bits[b >> 5] = 0u;
        }
        __syncwarp();
        if (err)
            atomicMin(error, err);
    }
    if (!done)
        return; // recording into a verdict's word (sa_validate_tile_lists_record): done already
    __threadfence(); // our atomicMin is visible before our CTA counts as done
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(done, 1u) == gridDim.x - 1) {
        __threadfence(); // every other CTA's atomicMin is visible to the last one
        const int v = atomicExch(error, 0);
        *done = 0u;
        *verdict = v;
        *host_verdict = v;
        __threadfence_system();
    }
}

// The verdict's home, one set per host thread and context (sa_thread_cached), made on first use
// and kept: the error word and done counter rest at zero between checks (the last CTA resets
// them), `dev` is what the dependent kernel reads, `host` a mapped pinned word the kernel writes
// directly.
constexpr int kPending = 1; // not an sa_status: the check has not published yet
struct Verdict {
    int *error = nullptr; // [0] error word, [1] done counter, [2] verdict
    int *dev = nullptr;
    volatile int *host = nullptr;
    int *host_dev = nullptr; // the device's address of *host
};

void *verdict_make()
{
    int *words = nullptr, *h = nullptr, *hd = nullptr;
    if (cudaMalloc(&words, 3 * sizeof(int)) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    Verdict *v = nullptr;
    if (cudaMemset(words, 0, 3 * sizeof(int)) != cudaSuccess ||
        cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&hd, h, 0) != cudaSuccess ||
        !(v = new (std::nothrow) Verdict)) {
        (void)cudaGetLastError();
        if (h)
            cudaFreeHost(h);
        cudaFree(words);
        return nullptr;
    }
    v->error = words;
    v->dev = words + 2;
    v->host = h;
    v->host_dev = hd;
    return v;
}

void verdict_destroy(void *p)
{
    Verdict *v = static_cast<Verdict *>(p);
    cudaFree(v->error);
    cudaFreeHost((void *)v->host);
    delete v;
}

int verdict_for_this_thread(Verdict **out)
{
    *out = static_cast<Verdict *>(
        sa_thread_cached(SA_CACHED_CHECK_VERDICT, verdict_make, verdict_destroy));
    return *out ? SA_OK : SA_ERR_NOMEM;
}

// The kernel's shared memory for rows of kv_blocks blocks, or 0 past the 48 KB default
// (SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS, which the stages' check() also holds).
static_assert((size_t)kWarpsPerBlock * (SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS / 32) * sizeof(unsigned) ==
                  48 * 1024,
              "the public limit is the bitmaps' 48 KB");
size_t bitmap_smem(int kv_blocks)
{
    if (kv_blocks > SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS)
        return 0;
    return (size_t)kWarpsPerBlock * ((kv_blocks + 31) / 32) * sizeof(unsigned int);
}

int grid_of(long long rows)
{
    const long long blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    return (int)(blocks < 4096 ? blocks : 4096);
}

// Enqueues the check of `rows` rows on `stream`; the verdict lands in *flag (0 = valid).
int enqueue_rows(const int32_t *indices, const int32_t *counts, long long rows, int max_blocks,
                 int kv_blocks, int allow_empty, const CausalRule &cr, cudaStream_t stream,
                 const int **flag)
{
    const size_t smem = bitmap_smem(kv_blocks);
    if (!smem)
        return SA_ERR_UNSUPPORTED; // more than SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS blocks per row
    Verdict *v;
    int rc = verdict_for_this_thread(&v);
    if (rc)
        return rc;
    const int grid = grid_of(rows);
    *v->host = kPending; // the previous check on this thread has been finished (synchronized)
    validate_rows_kernel<<<grid, kWarpsPerBlock * kWarp, smem, stream>>>(
        indices, counts, rows, max_blocks, kv_blocks, allow_empty, cr, v->error,
        reinterpret_cast<unsigned int *>(v->error + 1), v->dev, v->host_dev);
    if (cudaGetLastError() != cudaSuccess)
        return SA_ERR_CUDA;
    *flag = v->dev;
    return SA_OK;
}


} // namespace

extern "C" int sa_validate_tile_lists_enqueue_opts(const sa_shape *s, const sa_tile_lists *l,
                                                   int allow_empty, int causal, int allow_future,
                                                   void *stream, const int **flag)
{
    int err = sa_tile_lists_check_args(s, l);
    if (err)
        return err;
    const CausalRule cr = {causal, allow_future, sa_q_tiles(s), *s};
    return enqueue_rows(l->indices, l->counts, (long long)sa_tile_rows(s, l), l->max_blocks,
                        sa_kv_blocks(s), allow_empty, cr, (cudaStream_t)stream, flag);
}

extern "C" int sa_validate_tile_lists_record(const sa_shape *s, const sa_tile_lists *l,
                                             int allow_empty, int causal, int allow_future,
                                             int *word, void *stream)
{
    int err = sa_tile_lists_check_args(s, l);
    if (err)
        return err;
    if (!word)
        return SA_ERR_NULL;
    const size_t smem = bitmap_smem(sa_kv_blocks(s));
    if (!smem)
        return SA_ERR_UNSUPPORTED;
    const long long rows = (long long)sa_tile_rows(s, l);
    const CausalRule cr = {causal, allow_future, sa_q_tiles(s), *s};
    // Every code found goes to the word by atomicMin: no counter, no publish, no per-thread state.
    validate_rows_kernel<<<grid_of(rows), kWarpsPerBlock * kWarp, smem, (cudaStream_t)stream>>>(
        l->indices, l->counts, rows, l->max_blocks, sa_kv_blocks(s), allow_empty, cr, word,
        nullptr, nullptr, nullptr);
    return cudaGetLastError() == cudaSuccess ? SA_OK : SA_ERR_CUDA;
}

extern "C" int sa_validate_tile_lists_enqueue(const sa_shape *s, const sa_tile_lists *l,
                                              int allow_empty, void *stream, const int **flag)
{
    return sa_validate_tile_lists_enqueue_opts(s, l, allow_empty, 0, 0, stream, flag);
}

extern "C" int sa_validate_finish(const int *flag, void *stream)
{
    Verdict *v;
    int rc = verdict_for_this_thread(&v);
    if (rc)
        return rc;
    if (flag != v->dev)
        return SA_ERR_ARG;
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_CUDA;
    }
    const int verdict = *v->host;
    return verdict == kPending ? SA_ERR_CUDA : verdict;
}

extern "C" int sa_gpu_tile_lists_check(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                                       void *stream)
{
    const int *flag;
    int err = sa_tile_lists_check_args(s, l);
    if (err)
        return err;
    if (!sa_flag_ok(allow_empty)) // the option rule, as on the host validators
        return SA_ERR_ARG;
    err = sa_validate_tile_lists_enqueue(s, l, allow_empty, stream, &flag);
    return err ? err : sa_validate_finish(flag, stream);
}

extern "C" int sa_gpu_query_lists_check(const sa_shape *s, const sa_query_lists *l,
                                        int allow_empty, void *stream)
{
    int err = sa_query_lists_check_args(s, l);
    if (err)
        return err;
    if (!sa_flag_ok(allow_empty)) // the option rule, as on the host validators
        return SA_ERR_ARG;
    const int *flag;
    err = enqueue_rows(l->indices, l->counts, (long long)sa_query_rows(s), l->max_blocks,
                       sa_kv_blocks(s), allow_empty, CausalRule{0, 0, 1, *s},
                       (cudaStream_t)stream, &flag);
    return err ? err : sa_validate_finish(flag, (cudaStream_t)stream);
}
