// The GPU backward of tile-list attention (sa_gpu_tile_sparse_backward, docs/backward.md): the
// entry point, its workspace, D and the splits' sum. The two GEMM kernels are in bwd_wgmma.cu.
//
// FOCUS
//   Exact gradients of masked-softmax attention over 128-token tile lists, for head_dim 128, BF16
//   inputs and FP32 gradients, deterministic: no atomics anywhere, every sum taken in a fixed
//   order. The forward's LSE is reused, so P is recomputed without a max or a sum:
//     P = exp(scale Q K^T - LSE),  dV = P^T dO,  dP = dO V^T,  dS = P (dP - D),
//     dQ = scale dS K,  dK = scale dS^T Q,  D_i = rowsum(dO_i O_i).
//   Kernels on the caller's stream:
//     1. bwd_dsum: D per query row (one warp a row).
//     2. bwd_dkdv_wgmma: one CTA per (batch, KV head, KV block, split) owns that block's dK and
//        dV in registers and walks the Q tiles that listed the block, for its heads of the GQA
//        group: the reverse of the lists, built by the KV-centric reverse index
//        (sa_kv_build_index on a shape whose "queries" are the list rows, kvcentric/), so the
//        sums over the heads and the tiles stay on chip.
//     2b. bwd_reduce (splits > 1): dK, dV = the splits' partial sums, added in split order.
//     3. dQ: one CTA per (batch, query head, Q tile) walks the tile's own list in list order and
//        owns dQ of its 128 rows, by one of two passes (sa_gpu_attn_bwd.dq_pass):
//        bwd_dq_stored reads the dS^T that kernel 2 stored in the workspace (one GEMM per block,
//        5 in all); bwd_dq_wgmma recomputes S and dP (2 of its 3 GEMMs, 7 in all) in a small
//        workspace. Both deterministic; fused atomics were measured no faster (docs/backward.md).
//
// ASSUMPTIONS
//   head_dim 128; any len_q and len_kv (rows past len_q and keys past len_kv are zero-filled on
//   load and masked); GQA by index; per-head or group-shared lists (list head of query head h is
//   h / (heads_q / list_heads)); counts NULL = max_blocks. Lists checked on the GPU before the
//   kernels (validate = 1) or unchecked: then a count outside [0, max_blocks] is an empty row and
//   an index outside [0, kv_blocks) is skipped, in both kernels alike (the reverse index drops
//   them too).
//   Causal: query i sees key j when j <= i + (len_kv - len_q); a listed block wholly in a tile's
//   future contributes nothing.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>

#include "bwd_common.cuh"
#include "bwd_internal.h"
#include "sa_checked.h"
#include "sa_cuda_internal.h"
#include "sa_validate.h"
#include "sa_verdict.h"
#include "sparseattn.h"

namespace {

constexpr int THREADS = 256; // 8 warps (D and the splits' sum)
constexpr size_t ALIGN = 256; // workspace arrays start on 256-byte boundaries

// ------------------------------------------------------------------ kernel 1: D = rowsum(dO O)
__global__ void __launch_bounds__(THREADS) bwd_dsum(const uint16_t *__restrict__ o,
                                                     const uint16_t *__restrict__ d_o,
                                                     float *__restrict__ dsum, int rows)
{
    const int lane = threadIdx.x % 32;
    for (int row = (blockIdx.x * THREADS + threadIdx.x) / 32; row < rows;
         row += gridDim.x * (THREADS / 32)) {
        const uint2 x = *reinterpret_cast<const uint2 *>(o + (size_t)row * D + lane * 4);
        const uint2 y = *reinterpret_cast<const uint2 *>(d_o + (size_t)row * D + lane * 4);
        const float2 x0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x.x));
        const float2 x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x.y));
        const float2 y0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&y.x));
        const float2 y1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&y.y));
        float s = x0.x * y0.x + x0.y * y0.y + x1.x * y1.x + x1.y * y1.y;
#pragma unroll
        for (int m = 16; m > 0; m /= 2)
            s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0)
            dsum[row] = s;
    }
}

// ------------------------------------------------------------------ kernel 2b: the splits' sum
// Kernel 2b (splits > 1 only): dK, dV = the sum of the splits' partial sums, in split order.
// part is (B * Hkv, splits, len_kv, D), out (B * Hkv, len_kv, D).
__global__ void __launch_bounds__(THREADS) bwd_reduce(const float4 *__restrict__ dk_part,
                                                       const float4 *__restrict__ dv_part,
                                                       float4 *__restrict__ dk,
                                                       float4 *__restrict__ dv, long long n,
                                                       int splits, long long per_split)
{
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        const long long bg = i / per_split, r = i - bg * per_split;
        const long long base = bg * splits * per_split + r;
        float4 x = dk_part[base], y = dv_part[base];
        for (int s = 1; s < splits; s++) {
            const float4 a = dk_part[base + s * per_split], b = dv_part[base + s * per_split];
            x.x += a.x, x.y += a.y, x.z += a.z, x.w += a.w;
            y.x += b.x, y.y += b.y, y.z += b.z, y.w += b.w;
        }
        dk[i] = x;
        dv[i] = y;
    }
}

// ------------------------------------------------------------------ kernel 2's launch order
// Kernel 2's CTAs walk lists of different lengths (a block listed by few tiles or many, and with
// random lists the spread is wide), and the GPU hands CTAs to SMs about in launch order: long
// walks that start in the last wave set the kernel's end. This kernel orders the CTAs longest
// walk first (an LPT schedule), counted in list entries and binned (lengths from LPT_BINS - 1 up
// share the top bin), within each segment of kv_blocks x splits CTAs (one batch and KV head; a
// block's splits are neighbours in the default launch order, and with group lists their walks
// have one length, so they mostly stay close). CTAs that run together then still read one
// group's Q and dO, which stay in L2 (ordering all CTAs at once made MHA at 16K keys 12%
// slower). Within a bin the order comes from atomics: it decides only when a CTA starts, never
// what it computes, so the gradients keep their bits. One CTA per segment.
constexpr int LPT_BINS = 1024, LPT_THREADS = 1024;
#ifndef SA_BWD_LPT
#define SA_BWD_LPT 1 // 0: launch order (an A/B)
#endif
constexpr bool LPT = SA_BWD_LPT != 0;
static_assert(LPT_THREADS == LPT_BINS, "one bin per thread in the prefix sum");

__device__ int walk_length(const Args &a, int cta)
{
    const KvCta c = kv_cta(a, cta);
    int n = 0;
    for (int h = c.sp * a.group / a.splits; h < (c.sp + 1) * a.group / a.splits; h++) {
        const int bucket = bucket_of(a, c.b, c.g, h, c.blk);
        n += a.offsets[bucket + 1] - a.offsets[bucket];
    }
    return n;
}

__global__ void __launch_bounds__(LPT_THREADS) bwd_lpt_order(const Args a, int32_t *order)
{
    __shared__ int bin_start[LPT_BINS];
    const int tid = threadIdx.x, seg = a.kv_blocks * a.splits, first = blockIdx.x * seg;
    bin_start[tid] = 0; // LPT_THREADS == LPT_BINS
    __syncthreads();
    auto bin_of = [&](int cta) { return LPT_BINS - 1 - min(walk_length(a, cta), LPT_BINS - 1); };
    for (int c = first + tid; c < first + seg; c += LPT_THREADS)
        atomicAdd(&bin_start[bin_of(c)], 1);
    __syncthreads();
    // Exclusive prefix sum over the bins (Hillis-Steele on the inclusive sums, then shifted).
    for (int d = 1; d < LPT_BINS; d *= 2) {
        const int x = tid >= d ? bin_start[tid - d] : 0;
        __syncthreads();
        bin_start[tid] += x;
        __syncthreads();
    }
    const int excl = tid ? bin_start[tid - 1] : 0;
    __syncthreads();
    bin_start[tid] = first + excl;
    __syncthreads();
    for (int c = first + tid; c < first + seg; c += LPT_THREADS)
        order[atomicAdd(&bin_start[bin_of(c)], 1)] = c;
}

// ------------------------------------------------------------------ host
// The reverse index is the KV-centric one over a shape whose queries are the list rows: batch B,
// heads_q = heads_kv = list_heads, len_q = q_tiles, the lists as per-query lists. Unvalidated
// (the caller's lists were checked on the host, or not at all) and causal off (causal is the
// kernels' business: a tile's visibility is not a query's).
sa_kv_params index_params(const sa_gpu_attn_bwd *a, void *ws)
{
    sa_kv_params p;
    sa_kv_params_default(&p);
    p.shape = bwd_index_shape(a);
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = const_cast<uint16_t *>(a->o); // required by the argument check; the index never writes it
    p.lists = (sa_query_lists){a->lists.indices, a->lists.counts, a->lists.max_blocks};
    p.partial_format = SA_KV_PARTIAL_BF16; // the smallest workspace: no partial is written
    p.validate = 0;
    p.workspace = ws;
    p.workspace_bytes = ws ? SIZE_MAX : 0;
    p.stream = a->stream;
    return p;
}

struct Layout {
    int splits;
    int stored; // 1: the dQ pass reads dS^T stored by the dK/dV kernel (SA_BWD_DQ_STORED)
    int kv_ctas;
    size_t dsum_bytes, part_off, part_bytes, index_off, index_bytes, order_off, ds_off, total;
};

// Kernel-2 CTAs a (batch, KV head, block) is split into: enough to give about SPLIT_TARGET CTAs
// in all (two per SM of an H200), at most one per head of the group. A function of the shape
// alone, so the sums (and their bits) are the same on every device.
constexpr int SPLIT_TARGET = 256;
int splits_for(const sa_shape *s)
{
    const long long ctas = (long long)s->batch * s->heads_kv * sa_kv_blocks(s);
    const int group = s->heads_q / s->heads_kv;
    long long want = (SPLIT_TARGET + ctas - 1) / ctas;
    return (int)(want < 1 ? 1 : want > group ? group : want);
}

int layout(const sa_gpu_attn_bwd *a, Layout *l)
{
    const sa_kv_params p = index_params(a, nullptr);
    int err = sa_kv_workspace_size(&p, &l->index_bytes);
    if (err)
        return err;
    l->splits = splits_for(&a->shape);
    const int64_t dsum = sa_sz_round_up(sa_sz_mul((int64_t)sa_lse_elems(&a->shape), 4), ALIGN);
    // dK and dV partial sums: splits x the size of dK, each (none without splits).
    const int64_t part = l->splits == 1 ? 0
                                        : sa_sz_round_up(sa_sz_mul3((int64_t)sa_kv_elems(&a->shape),
                                                                    l->splits, 4),
                                                         ALIGN);
    // dS^T on the stored path: one TILE x TILE BF16 block per (batch, query head, tile, slot).
    const int64_t ds = sa_sz_mul(sa_sz_mul3(sa_sz_mul(a->shape.batch, a->shape.heads_q),
                                            sa_q_tiles(&a->shape), a->lists.max_blocks),
                                 (int64_t)SA_TILE * SA_TILE * 2);
    l->stored = a->dq_pass == SA_BWD_DQ_STORED ||
                (a->dq_pass == SA_BWD_DQ_AUTO &&
                 sa_sz_within(ds, (int64_t)SA_BWD_STORED_DS_AUTO_MAX));
    const int64_t index_end = sa_sz_round_up(sa_sz_add(sa_sz_add(dsum, sa_sz_mul(part, 2)),
                                                       (int64_t)l->index_bytes),
                                             ALIGN);
    // Kernel 2's launch order (bwd_lpt_order): one int per CTA.
    const int64_t kv_ctas = sa_sz_mul(sa_sz_mul3(a->shape.batch, a->shape.heads_kv,
                                                 sa_kv_blocks(&a->shape)),
                                      l->splits);
    if (!sa_sz_within(kv_ctas, INT32_MAX))
        return SA_ERR_UNSUPPORTED;
    l->kv_ctas = (int)kv_ctas;
    const int64_t order_end = sa_sz_add(index_end, sa_sz_round_up(sa_sz_mul(kv_ctas, 4), ALIGN));
    const int64_t total = l->stored ? sa_sz_add(order_end, ds) : order_end;
    if (!sa_sz_fits_size_t(total))
        return SA_ERR_UNSUPPORTED;
    l->dsum_bytes = (size_t)dsum;
    l->part_off = (size_t)dsum;
    l->part_bytes = (size_t)part;
    l->index_off = (size_t)(dsum + 2 * part);
    l->order_off = (size_t)index_end;
    l->ds_off = (size_t)order_end;
    l->total = (size_t)total;
    return SA_OK;
}

// The lists checked on the GPU with the forward's rules and codes (cuda/sa_validate.cu, the check
// stages 15 and 16 queue): one small kernel, then one synchronization for its verdict; the lists
// never leave the device.
int validate_on_gpu(const sa_gpu_attn_bwd *a, cudaStream_t st)
{
    const int *verdict = nullptr;
    const int err = sa_validate_tile_lists_enqueue_opts(&a->shape, &a->lists, a->allow_empty_rows,
                                                        a->causal, a->allow_future_blocks, st,
                                                        &verdict);
    return err ? err : sa_validate_finish(verdict, st);
}

int run(const sa_gpu_attn_bwd *a, uint8_t *ws, const Layout &l, int sms)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    const sa_shape *s = &a->shape;
    const sa_kv_params ip = index_params(a, ws + l.index_off);
    int err = sa_kv_build_index(&ip);
    if (err)
        return err;
    sa_kv_index_view view;
    if ((err = sa_kv_index_get(&ip, &view)))
        return err;

    Args g;
    g.q = a->q;
    g.k = a->k;
    g.v = a->v;
    g.d_o = a->d_o;
    g.lse = a->lse;
    g.dsum = reinterpret_cast<float *>(ws);
    g.indices = a->lists.indices;
    g.counts = a->lists.counts;
    g.offsets = view.offsets;
    g.entries = view.entries;
    g.dq = a->dq;
    g.dk = a->dk;
    g.dv = a->dv;
    g.splits = l.splits;
    g.dk_part = l.splits == 1 ? nullptr : reinterpret_cast<float *>(ws + l.part_off);
    g.dv_part = l.splits == 1 ? nullptr
                              : reinterpret_cast<float *>(ws + l.part_off + l.part_bytes);
    g.ds = l.stored ? reinterpret_cast<uint16_t *>(ws + l.ds_off) : nullptr;
    g.heads_q = s->heads_q;
    g.heads_kv = s->heads_kv;
    g.group = s->heads_q / s->heads_kv;
    g.list_heads = a->lists.list_heads;
    g.list_div = s->heads_q / a->lists.list_heads;
    g.len_q = s->len_q;
    g.len_kv = s->len_kv;
    g.q_tiles = sa_q_tiles(s);
    g.kv_blocks = sa_kv_blocks(s);
    g.max_blocks = a->lists.max_blocks;
    g.causal = a->causal;
    g.q_off = s->len_kv - s->len_q;
    g.scale = 1.0f / sqrtf((float)D);
    g.scale_log2 = g.scale * LOG2E;

    const int rows = (int)sa_lse_elems(s); // bwd_check_args: fits int32
    bwd_dsum<<<min((rows + 7) / 8, sms * 16), THREADS, 0, st>>>(a->o, a->d_o,
                                                                  reinterpret_cast<float *>(ws), rows);
    SA_CUDA_TRY(cudaGetLastError());

    const int kv_ctas = l.kv_ctas;
    const int q_ctas = s->batch * s->heads_q * g.q_tiles;
    g.order = nullptr;
    if (LPT && kv_ctas > sms) { // one wave needs no order
        int32_t *order = reinterpret_cast<int32_t *>(ws + l.order_off);
        bwd_lpt_order<<<kv_ctas / (g.kv_blocks * g.splits), LPT_THREADS, 0, st>>>(g, order);
        SA_CUDA_TRY(cudaGetLastError());
        g.order = order;
    }
    if ((err = sa_bwd::launch_dkdv_wgmma(g, kv_ctas, st)))
        return err;
    if (l.splits > 1) {
        const long long per_split = (long long)s->len_kv * D / 4, n = s->batch * s->heads_kv * per_split;
        bwd_reduce<<<(int)min((n + THREADS - 1) / THREADS, (long long)sms * 8), THREADS, 0, st>>>(
            reinterpret_cast<const float4 *>(g.dk_part), reinterpret_cast<const float4 *>(g.dv_part),
            reinterpret_cast<float4 *>(a->dk), reinterpret_cast<float4 *>(a->dv), n, l.splits,
            per_split);
        SA_CUDA_TRY(cudaGetLastError());
    }
    err = l.stored ? sa_bwd::launch_dq_stored(g, q_ctas, st)
                   : sa_bwd::launch_dq_wgmma(g, q_ctas, st);
    if (err)
        return err;
    return SA_OK;
}

} // namespace

extern "C" int sa_gpu_backward_workspace_size(const sa_gpu_attn_bwd *a, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int err = bwd_check_args(a);
    if (err)
        return err;
    if (!bytes)
        return SA_ERR_NULL;
    Layout l;
    if ((err = layout(a, &l)))
        return err;
    *bytes = l.total;
    return SA_OK;
}

extern "C" int sa_gpu_tile_sparse_backward(const sa_gpu_attn_bwd *a)
{
    int err = bwd_check_args(a);
    if (err)
        return err;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    Layout l;
    if ((err = layout(a, &l)))
        return err;
    if (a->workspace && a->workspace_bytes < l.total)
        return SA_ERR_ARG;
    cudaStream_t st = (cudaStream_t)a->stream;
    // With a verdict the check is recorded there, no synchronization: the kernels are safe on
    // bad lists.
    if (a->validate && a->verdict)
        err = sa_validate_tile_lists_record(&a->shape, &a->lists, a->allow_empty_rows, a->causal,
                                            a->allow_future_blocks, sa_verdict_word(a->verdict),
                                            st);
    else if (a->validate)
        err = validate_on_gpu(a, st);
    if (err)
        return err;
    uint8_t *ws = (uint8_t *)a->workspace;
    if (!ws && cudaMallocAsync((void **)&ws, l.total, st) != cudaSuccess)
        return SA_ERR_NOMEM;
    err = run(a, ws, l, sms);
    if (!a->workspace && cudaFreeAsync(ws, st) != cudaSuccess && !err)
        err = SA_ERR_CUDA;
    return err;
}
