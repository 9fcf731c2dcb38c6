// Block-list validation on the GPU, so that bad metadata never reaches an attention kernel
// unchecked while the lists stay in device memory. Introduced with stage 15; the KV-centric
// entry uses it for per-query lists.
//
// One warp checks one row: count in [0, max_blocks] (and not 0 unless empty rows are allowed),
// every index in [0, kv_blocks), no index twice. Duplicates are found with a per-warp bitmap of
// kv_blocks bits in shared memory: each lane sets its entries' bits with atomicOr, and a bit
// that was already set is a duplicate. The error of the whole launch is the minimum of the codes
// found (atomicMin), so a list with one fault reports the same code as the host validator.
#include <cuda_runtime.h>

#include "sparseattn.h"

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kWarp = 32;

__global__ void validate_rows_kernel(const int32_t *__restrict__ indices,
                                     const int32_t *__restrict__ counts, long long rows,
                                     int max_blocks, int kv_blocks, int allow_empty,
                                     int *__restrict__ error)
{
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
        int err = 0;
        if (c < 0 || c > max_blocks)
            err = SA_ERR_COUNT;
        else if (c == 0 && !allow_empty)
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
}

int validate_rows(const int32_t *indices, const int32_t *counts, long long rows, int max_blocks,
                  int kv_blocks, int allow_empty, cudaStream_t stream)
{
    const size_t smem = (size_t)kWarpsPerBlock * ((kv_blocks + 31) / 32) * sizeof(unsigned int);
    if (smem > 48 * 1024)
        return SA_ERR_UNSUPPORTED; // more than 98304 blocks (12.5M keys) per row
    int *d_err = nullptr;
    if (cudaMallocAsync(&d_err, sizeof(int), stream) != cudaSuccess)
        return SA_ERR_NOMEM;
    int status = SA_OK, h_err = 0;
    long long blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const int grid = (int)(blocks < 4096 ? blocks : 4096);
    if (cudaMemsetAsync(d_err, 0, sizeof(int), stream) != cudaSuccess)
        status = SA_ERR_CUDA;
    if (!status) {
        validate_rows_kernel<<<grid, kWarpsPerBlock * kWarp, smem, stream>>>(
            indices, counts, rows, max_blocks, kv_blocks, allow_empty, d_err);
        if (cudaGetLastError() != cudaSuccess ||
            cudaMemcpyAsync(&h_err, d_err, sizeof(int), cudaMemcpyDeviceToHost, stream) !=
                cudaSuccess)
            status = SA_ERR_CUDA;
    }
    cudaFreeAsync(d_err, stream);
    if (cudaStreamSynchronize(stream) != cudaSuccess)
        return SA_ERR_CUDA;
    return status ? status : h_err;
}

} // namespace

extern "C" int sa_gpu_tile_lists_check(const sa_shape *s, const sa_tile_lists *l, int allow_empty,
                                       void *stream)
{
    if (!s || !l)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!l->indices)
        return SA_ERR_NULL;
    if (l->list_heads != s->heads_kv && l->list_heads != s->heads_q)
        return SA_ERR_LIST_HEADS;
    if (l->max_blocks <= 0)
        return SA_ERR_MAX_BLOCKS;
    return validate_rows(l->indices, l->counts, (long long)sa_tile_rows(s, l), l->max_blocks,
                         sa_kv_blocks(s), allow_empty, (cudaStream_t)stream);
}

extern "C" int sa_gpu_query_lists_check(const sa_shape *s, const sa_query_lists *l,
                                        int allow_empty, void *stream)
{
    if (!s || !l)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!l->indices)
        return SA_ERR_NULL;
    if (l->max_blocks <= 0)
        return SA_ERR_MAX_BLOCKS;
    return validate_rows(l->indices, l->counts, (long long)sa_query_rows(s), l->max_blocks,
                         sa_kv_blocks(s), allow_empty, (cudaStream_t)stream);
}
