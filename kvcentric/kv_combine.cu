// KV-centric part 3: merge each (query, head)'s partials by their LSE weights.
//
//   lse = m + ln(sum_j exp(lse_j - m)),  o = sum_j exp(lse_j - lse) * o_j,  over slots j < count.
//
// Memory-bound: a half-warp owns one output row; each lane owns 8 of the 128 dims, so one slot
// of a BF16 partial is one 16-byte load per lane (two for FP32), coalesced across the row. Slots
// at or past the row's count were never written and are never read. Loads are streaming
// (.cs): partials are read once. With the hybrid schedule the Q-centric pass's output (already
// in o) is one more partial, weighed by its LSE; a row it covered whole is left as it is, and
// without o_f32 the combine walks only the plan's list of rows with entries left (the grid fills
// the GPU once either way: a pass over every row cost 76-113 us at 64K when none was left).
#include <cuda_bf16.h>

#include "kv_internal.h"

namespace {

constexpr int kThreads = 256;
constexpr int kLanes = 16; // lanes per output row

struct combine_args {
    const void *part_o;
    const float *part_lse;
    const int32_t *counts;
    uint16_t *o;
    float *o_f32, *lse;
    int heads_q, group, len_q, m;
    long long rows; // B * Hq * Sq
    // The hybrid schedule (kv_plan.cu): tile_cnt NULL without it. A row's tile ran tile_cnt
    // blocks Q-centric into o (BF16) and shared_lse: one more partial of this row, whole when
    // row_left (entries of the list row left to the KV-centric part) is 0.
    const int32_t *tile_cnt, *row_left;
    const float *shared_lse;
    int q_tiles;
    // Without o_f32 the hybrid's combine walks only the list rows with entries left (merge_n of
    // them in merge_rows, kv_plan.cu), each for every head of its group; NULL: every row.
    const int32_t *merge_rows, *merge_n;
};

__device__ __forceinline__ void load8(const float *p, float (&v)[8])
{
    float4 a = __ldcs((const float4 *)p), b = __ldcs((const float4 *)p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float (&v)[8])
{
    uint4 u = __ldcs((const uint4 *)p);
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}

// Idx: the integer type of the row arithmetic, 32 bits whenever the rows fit (64-bit divisions
// cost the hybrid's combine 113 us at 64K on rows it then skipped, H200, ncu).
template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreads) kv_combine(const combine_args a)
{
    const int sub = threadIdx.x % kLanes;
    // Shuffle within this half-warp only: the other half may own no row on the last pass.
    const unsigned half = 0xffffu << (threadIdx.x & 16);
    const T *part = (const T *)a.part_o;
    const Idx rows = (Idx)a.rows, len_q = (Idx)a.len_q, heads_q = (Idx)a.heads_q;
    const Idx group = (Idx)a.group, heads_kv = heads_q / group;
    const bool listed = a.merge_rows != nullptr;
    // Work item i: output row i, or head i % group of listed row i / group (at most the rows).
    const Idx items = listed ? (Idx)*a.merge_n * group : rows;
    for (Idx i = (Idx)((blockIdx.x * (long long)kThreads + threadIdx.x) / kLanes); i < items;
         i += (Idx)((long long)gridDim.x * kThreads / kLanes)) {
        // row = (b * Hq + hq) * Sq + q; its list row is (b * Hkv + hq / group) * Sq + q.
        Idx row, lbh; // the output row; the list row's (batch, kv head)
        int q;
        if (listed) {
            const Idx lr = a.merge_rows[i / group], g = i % group;
            lbh = lr / len_q;
            q = (int)(lr - lbh * len_q);
            const Idx b = lbh / heads_kv, hkv = lbh - b * heads_kv;
            row = (b * heads_q + hkv * group + g) * len_q + q;
        } else {
            row = i;
            const Idx bh = row / len_q;
            q = (int)(row - bh * len_q);
            const Idx b = bh / heads_q, hq = bh - b * heads_q;
            lbh = b * heads_kv + hq / group;
        }
        const long long lrow = (long long)(lbh * len_q + q);
        const long long r = row; // addresses in 64 bits: rows x slots x D exceeds 2^31
        // The hybrid's Q-centric partial (each planned block masked to the queries that list it).
        float lse_s = -INFINITY;
        if (a.tile_cnt) {
            if (!listed && a.row_left[lrow] == 0 && !a.o_f32)
                continue; // the Q-centric pass wrote this row's O and LSE whole
            if (a.tile_cnt[(long long)lbh * a.q_tiles + q / SA_TILE] > 0)
                lse_s = a.shared_lse[r];
        }
        int c = a.counts ? a.counts[lrow] : a.m;
        c = c < 0 ? 0 : (c > a.m ? a.m : c); // lists were validated; this keeps reads in bounds
        const float *pl = a.part_lse + r * a.m;

        float mx = lse_s;
        for (int j = sub; j < c; j += kLanes)
            mx = fmaxf(mx, pl[j]);
#pragma unroll
        for (int off = kLanes / 2; off; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(half, mx, off));
        float sum = 0.f;
        for (int j = sub; j < c; j += kLanes)
            sum += __expf(pl[j] - mx);
        if (sub == 0 && lse_s > -INFINITY)
            sum += __expf(lse_s - mx);
#pragma unroll
        for (int off = kLanes / 2; off; off >>= 1)
            sum += __shfl_xor_sync(half, sum, off);
        // A row whose every slot saw no key (causal: only future keys, or none) has max -inf:
        // O = 0 and LSE = -inf, like an empty row; its slots' O (zeros) are not read.
        if (mx == -INFINITY)
            c = 0;
        const float lse = c ? mx + __logf(sum) : -INFINITY;

        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (c && lse_s > -INFINITY) {
            float v[8];
            load8(reinterpret_cast<const __nv_bfloat16 *>(a.o) + r * KV_D + sub * 8, v);
            const float w = __expf(lse_s - lse);
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = w * v[i];
        }
        const T *src = part + r * a.m * KV_D + sub * 8;
#pragma unroll 4
        for (int j = 0; j < c; j++) {
            // A slot of LSE -inf adds nothing and may never have been written (the hybrid's
            // planned slots): its O is not read.
            if (pl[j] == -INFINITY)
                continue;
            float v[8];
            load8(src + (size_t)j * KV_D, v);
            float w = __expf(pl[j] - lse);
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = fmaf(w, v[i], acc[i]);
        }

        uint4 ob;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&ob;
#pragma unroll
        for (int i = 0; i < 4; i++)
            h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        *(uint4 *)(a.o + r * KV_D + sub * 8) = ob;
        if (a.o_f32) {
            float4 *of = (float4 *)(a.o_f32 + r * KV_D + sub * 8);
            of[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            of[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
        if (a.lse && sub == 0)
            a.lse[r] = lse;
    }
}

} // namespace

extern "C" int sa_kv_combine(const sa_kv_params *p)
{
    if (!p || !p->workspace)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, p->workspace, &w);
    if (err)
        return err;
    const sa_shape *s = &p->shape;
    combine_args a;
    a.part_o = w.part_o;
    a.part_lse = w.part_lse;
    a.counts = p->lists.counts;
    a.o = p->o;
    a.o_f32 = p->o_f32;
    a.lse = p->lse;
    a.heads_q = s->heads_q;
    a.group = s->heads_q / s->heads_kv;
    a.len_q = s->len_q;
    a.m = p->lists.max_blocks;
    a.rows = (long long)s->batch * s->heads_q * s->len_q;
    const bool hybrid = p->schedule == SA_KV_SCHEDULE_HYBRID;
    a.tile_cnt = hybrid ? w.tile_cnt : nullptr;
    a.row_left = w.row_left;
    a.shared_lse = hybrid ? kv_shared_lse(p, &w) : nullptr;
    // The plan's list of rows to merge (without o_f32, which the combine writes for every row;
    // not when the plan was skipped for too many blocks, kv_plan).
    const bool listed = hybrid && !p->o_f32 && kv_plan_fits(s);
    a.merge_rows = listed ? w.merge_rows : nullptr;
    a.merge_n = w.merge_n;
    a.q_tiles = sa_q_tiles(s);
    // A grid that fills the GPU once, each half-warp striding over rows: one CTA per 16 rows
    // cost 33 us at 16K (16384 CTAs) when the hybrid had left no row to merge (H200, ncu).
    const bool f32 = p->partial_format == SA_KV_PARTIAL_F32;
    // The list rows B * Hkv * Sq are at most the output rows; the half that int32 leaves above
    // the rows keeps the grid-stride step from overflowing.
    const bool narrow = a.rows <= INT32_MAX / 2;
    void (*const kernel)(combine_args) =
        f32 ? (narrow ? kv_combine<float, int> : kv_combine<float, long long>)
            : (narrow ? kv_combine<__nv_bfloat16, int> : kv_combine<__nv_bfloat16, long long>);
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    static int per_sm_of[2][2]; // per format and width, asked once (the same on every sm_90)
    int &per_sm = per_sm_of[f32][narrow];
    if (!per_sm)
        SA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    const long long blocks = (a.rows * kLanes + kThreads - 1) / kThreads;
    const long long fill = (long long)sms * (per_sm > 0 ? per_sm : 1);
    const unsigned grid = (unsigned)(blocks < fill ? blocks : fill);
    kernel<<<grid, kThreads, 0, kv_stream(p)>>>(a);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}
