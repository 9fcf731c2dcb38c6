// Lists from per-head block scores on the GPU (nvfp4_mass): the keys of group or per-head lists
// (mass_keys_kernel, then sel_cuda_topk), and pooled lists (pool_kernel), the rule of the CPU's
// sel_pool_end (sel_common.c, sa_selectors.h "head_lists modes").
//
// POOLED, one warp per (batch, KV group, tile), H heads of n competing blocks:
//   1. forced blocks per head (the row rule's diagonal, the sink), or where none is forced the
//      head's best block; f_j of them, and the group's rest R = H min(k, n) - sum f_j;
//   2. per head, the quota_j = min(cap, n) - f_j best unforced blocks are its candidates (a
//      head never holds more, so the greedy's skipping of full heads is this truncation);
//   3. the R best candidates over the group are taken.
// "Best" is by 64-bit composites (key << 32 | ~position) that are distinct and order as the CPU
// does (higher score first, then the lower head, then the lower block), so each "the q best" is
// one threshold found bit by bit from the top (the radix select of sel_topk.cu on 64 bits) and
// no tie needs a second pass. Rows are written in block order by a ballot scan.
#include "sel_cuda.cuh"

namespace {

constexpr int kPoolThreads = 128; // 4 warps, one (batch, group, tile) each

__device__ __forceinline__ uint32_t mass_key(const float *row, int blk)
{
    return sel_score_key(row[blk]);
}

// One thread per (list row, block): the sum of its scored heads' masses in head order.
__global__ void mass_keys_kernel(const float *__restrict__ mass, SelHeadsShape h,
                                 uint32_t *__restrict__ keys)
{
    const size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t rows = (size_t)h.batch * h.list_heads * h.q_tiles;
    if (e >= rows * h.kv_blocks)
        return;
    const size_t r = e / h.kv_blocks;
    const int blk = (int)(e % h.kv_blocks), t = (int)(r % h.q_tiles);
    const int lh = (int)(r / h.q_tiles % h.list_heads), b = (int)(r / h.q_tiles / h.list_heads);
    // sel_list_qheads: the list's scored heads
    const int first = (int)((long long)lh * h.qh / h.list_heads);
    const int nh = h.qh >= h.list_heads ? h.qh / h.list_heads : 1;
    float v = 0.0f;
    for (int j = 0; j < nh; j++)
        v += mass[(((size_t)b * h.qh + first + j) * h.q_tiles + t) * h.kv_blocks + blk];
    keys[e] = sel_score_key(v);
}

__global__ void __launch_bounds__(kPoolThreads)
    pool_kernel(const float *__restrict__ mass, SelHeadsShape h, SelRowRule rule, int cap,
                int32_t *__restrict__ indices, int32_t *__restrict__ counts)
{
    const int lane = threadIdx.x % 32;
    const long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    const int heads_kv = h.heads_q / h.group;
    if (gw >= (long long)h.batch * heads_kv * h.q_tiles)
        return;
    const int t = (int)(gw % h.q_tiles), bg = (int)(gw / h.q_tiles);
    const int b = bg / heads_kv, g = bg % heads_kv, H = h.group, nb = h.kv_blocks;
    const SelRow rr = sel_row_of(rule, t);
    const int n = rr.n, kq = rr.k, hi = cap < n ? cap : n;
    auto row_of = [&](int j) { // head j's scores
        const int sh = (int)((long long)(g * H + j) * h.qh / h.heads_q);
        return mass + (((size_t)b * h.qh + sh) * h.q_tiles + t) * nb;
    };
    auto forced_fixed = [&](int blk) { return blk == rr.diag || (rule.keep_sink && blk == 0); };
    const bool any_fixed = (rr.diag >= 0 && rr.diag < n) || (rule.keep_sink && n > 0);
    // Step 1: the floor block of each head when nothing is forced (the lowest of the best).
    // H <= 32 heads per group here (sel_cuda_pool checks), one per lane's register.
    int floor_blk = -1;
    if (!any_fixed && kq > 0)
        for (int j = 0; j < H; j++) {
            const float *row = row_of(j);
            unsigned long long best = 0;
            for (int blk = lane; blk < n; blk += 32) {
                const unsigned long long c =
                    (unsigned long long)mass_key(row, blk) << 32 | (0xFFFFFFFFu - (unsigned)blk);
                best = c > best ? c : best;
            }
            for (int o = 16; o; o >>= 1) {
                const unsigned long long y = __shfl_xor_sync(0xffffffffu, best, o);
                best = y > best ? y : best;
            }
            if (lane == j)
                floor_blk = (int)(0xFFFFFFFFu - (unsigned)(best & 0xFFFFFFFFu));
        }
    auto floor_of = [&](int j) { return __shfl_sync(0xffffffffu, floor_blk, j); };
    auto is_forced = [&](int j, int fb, int blk) { return forced_fixed(blk) || blk == fb; };
    // Forced counts: the diagonal and the sink (one block when they coincide), or the floor.
    const int fixed = (rr.diag >= 0 && rr.diag < n) + (rule.keep_sink && n > 0 && rr.diag != 0);
    const int f = kq > 0 ? (any_fixed ? fixed : 1) : 0;
    const int left = kq > 0 ? H * kq - H * f : 0;
    const int quota = hi - f > 0 ? hi - f : 0;
    // Step 2: per head, the threshold of its quota best unforced composites (lane j keeps head
    // j's); 0 takes every one.
    unsigned long long tj = 0;
    for (int j = 0; j < H && left > 0; j++) {
        const float *row = row_of(j);
        const int fb = floor_of(j);
        int avail = 0;
        for (int blk = lane; blk < n; blk += 32)
            avail += !is_forced(j, fb, blk);
        avail = (int)__reduce_add_sync(0xffffffffu, avail);
        unsigned long long T = 0;
        if (quota == 0) {
            T = ~0ull; // no candidate: composites stay below it
        } else if (quota < avail) {
            for (int bit = 63; bit >= 0; bit--) {
                const unsigned long long cand = T | 1ull << bit;
                int cnt = 0;
                for (int blk = lane; blk < n; blk += 32) {
                    const unsigned long long c = (unsigned long long)mass_key(row, blk) << 32 |
                                                 (0xFFFFFFFFu - (unsigned)blk);
                    cnt += !is_forced(j, fb, blk) && c >= cand;
                }
                if ((int)__reduce_add_sync(0xffffffffu, cnt) >= quota)
                    T = cand;
            }
        }
        if (lane == j)
            tj = T;
    }
    // Step 3: the group's threshold over the candidates, by composites with the head in them.
    auto candidate = [&](int j, int fb, unsigned long long T_j, const float *row, int blk,
                         unsigned long long &C) {
        const unsigned key = mass_key(row, blk);
        const unsigned long long c = (unsigned long long)key << 32 | (0xFFFFFFFFu - (unsigned)blk);
        C = (unsigned long long)key << 32 | (0xFFFFFFFFu - (unsigned)(j * nb + blk));
        return !is_forced(j, fb, blk) && c >= T_j;
    };
    int ncand = 0;
    for (int j = 0; j < H && left > 0; j++) {
        const float *row = row_of(j);
        const int fb = floor_of(j);
        const unsigned long long T_j = __shfl_sync(0xffffffffu, tj, j);
        for (int blk = lane; blk < n; blk += 32) {
            unsigned long long C;
            ncand += candidate(j, fb, T_j, row, blk, C);
        }
    }
    ncand = (int)__reduce_add_sync(0xffffffffu, ncand);
    unsigned long long TG = 0;
    if (left > 0 && left < ncand)
        for (int bit = 63; bit >= 0; bit--) {
            const unsigned long long cand = TG | 1ull << bit;
            int cnt = 0;
            for (int j = 0; j < H; j++) {
                const float *row = row_of(j);
                const int fb = floor_of(j);
                const unsigned long long T_j = __shfl_sync(0xffffffffu, tj, j);
                for (int blk = lane; blk < n; blk += 32) {
                    unsigned long long C;
                    cnt += candidate(j, fb, T_j, row, blk, C) && C >= cand;
                }
            }
            if ((int)__reduce_add_sync(0xffffffffu, cnt) >= left)
                TG = cand;
        }
    // Write each head's row in block order.
    for (int j = 0; j < H; j++) {
        const float *row = row_of(j);
        const int fb = floor_of(j);
        const unsigned long long T_j = __shfl_sync(0xffffffffu, tj, j);
        const size_t r = ((size_t)b * h.heads_q + (size_t)g * H + j) * h.q_tiles + t;
        int32_t *out = indices + r * cap;
        int w = 0;
        for (int b0 = 0; b0 < n && kq > 0; b0 += 32) {
            const int blk = b0 + lane;
            bool take = false;
            if (blk < n) {
                unsigned long long C;
                take = is_forced(j, fb, blk) ||
                       (left > 0 && candidate(j, fb, T_j, row, blk, C) && C >= TG);
            }
            const unsigned m = __ballot_sync(0xffffffffu, take);
            if (take)
                out[w + __popc(m & ((1u << lane) - 1))] = blk;
            w += __popc(m);
        }
        for (int e = w + lane; e < cap; e += 32)
            out[e] = -1;
        if (lane == 0)
            counts[r] = w;
    }
}

} // namespace

int sel_cuda_mass_keys(const float *mass, const SelHeadsShape &h, uint32_t *keys, cudaStream_t st)
{
    const size_t n = (size_t)h.batch * h.list_heads * h.q_tiles * h.kv_blocks;
    if (n == 0)
        return SA_OK;
    mass_keys_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(mass, h, keys);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

int sel_cuda_pool(const float *mass, const SelHeadsShape &h, const SelRowRule &rule, int cap,
                  int32_t *indices, int32_t *counts, cudaStream_t st)
{
    if (h.group > 32)
        return SA_ERR_UNSUPPORTED; // one head per lane in the warp's registers
    const long long warps = (long long)h.batch * (h.heads_q / h.group) * h.q_tiles;
    const long long ctas = (warps * 32 + kPoolThreads - 1) / kPoolThreads;
    if (ctas > 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    pool_kernel<<<(unsigned)ctas, kPoolThreads, 0, st>>>(mass, h, rule, cap, indices, counts);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}
