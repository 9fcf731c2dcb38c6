// Lists from per-head block scores on the GPU (nvfp4_mass): the keys of group or per-head lists
// (mass_keys_kernel, then sel_cuda_topk), and pooled lists (pool_kernel), the rule of the CPU's
// sel_pool_end (sel_common.c, sa_selectors.h "head_lists modes").
//
// POOLED, one CTA per (batch, KV group, tile) and a warp per head, H heads of n competing blocks:
//   1. forced blocks per head (the row rule's diagonal, the sink), or where none is forced the
//      head's best block; f_j of them, and the group's rest R = H min(k, n) - sum f_j;
//   2. per head, the quota_j = min(cap, n) - f_j best unforced blocks are its candidates (a
//      head never holds more, so the greedy's skipping of full heads is this truncation);
//   3. the R best candidates over the group are taken.
// "Best" is by 64-bit composites (key << 32 | ~position) that are distinct and order as the CPU
// does (higher score first, then the lower head, then the lower block), so each "the q best" is
// one threshold found bit by bit from the top (the radix select of sel_topk.cu on 64 bits) and
// no tie needs a second pass. Each head's steps run in its warp; step 3 adds the warps' counts
// per bit. Rows are written in block order by a ballot scan.
#include "sel_cuda.cuh"

namespace {

constexpr size_t kPoolSmemMax = 96 * 1024; // the group's keys staged up to here

// One thread per (list row, block): the sum of its scored heads' masses in head order. Blocks
// past the row's competing prefix (causal) have no mass written and are never ranked: key 0.
__global__ void mass_keys_kernel(const float *__restrict__ mass, SelHeadsShape h, SelRowRule rule,
                                 uint32_t *__restrict__ keys)
{
    const size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t rows = (size_t)h.batch * h.list_heads * h.q_tiles;
    if (e >= rows * h.kv_blocks)
        return;
    const size_t r = e / h.kv_blocks;
    const int blk = (int)(e % h.kv_blocks), t = (int)(r % h.q_tiles);
    const int lh = (int)(r / h.q_tiles % h.list_heads), b = (int)(r / h.q_tiles / h.list_heads);
    if (blk >= sel_row_of(rule, t).n) {
        keys[e] = 0;
        return;
    }
    // sel_list_qheads: the list's scored heads
    const int first = (int)((long long)lh * h.qh / h.list_heads);
    const int nh = h.qh >= h.list_heads ? h.qh / h.list_heads : 1;
    float v = 0.0f;
    for (int j = 0; j < nh; j++)
        v += mass[(((size_t)b * h.qh + first + j) * h.q_tiles + t) * h.kv_blocks + blk];
    keys[e] = sel_score_key(v);
}

// One CTA of H warps per (batch, group, tile), warp j for head j. STAGED: the group's keys of
// the competing blocks are copied to shared memory once (H * kv_blocks words fit), else every
// pass reads the masses from global memory.
template <bool STAGED>
__global__ void __launch_bounds__(1024)
    pool_kernel(const float *__restrict__ mass, SelHeadsShape h, SelRowRule rule, int cap,
                int32_t *__restrict__ indices, int32_t *__restrict__ counts)
{
    extern __shared__ uint32_t staged[]; // STAGED: H rows of n keys
    __shared__ int s_cnt[32];
    const int lane = threadIdx.x % 32, j = threadIdx.x / 32, H = h.group;
    const int heads_kv = h.heads_q / H;
    const int t = (int)(blockIdx.x % h.q_tiles), bg = (int)(blockIdx.x / h.q_tiles);
    const int b = bg / heads_kv, g = bg % heads_kv, nb = h.kv_blocks;
    const SelRow rr = sel_row_of(rule, t);
    const int n = rr.n, kq = rr.k, hi = cap < n ? cap : n;
    auto row_of = [&](int head) { // head's masses
        const int sh = (int)((long long)(g * H + head) * h.qh / h.heads_q);
        return mass + (((size_t)b * h.qh + sh) * h.q_tiles + t) * nb;
    };
    if constexpr (STAGED) {
        for (int i = threadIdx.x; i < H * n; i += blockDim.x)
            staged[i] = sel_score_key(row_of(i / n)[i % n]);
        __syncthreads();
    }
    const float *my_row = row_of(j);
    auto key = [&](int blk) -> uint32_t {
        if constexpr (STAGED)
            return staged[j * n + blk];
        else
            return sel_score_key(my_row[blk]);
    };
    // Within a head: higher key first, then the lower block.
    auto comp = [&](int blk) {
        return (unsigned long long)key(blk) << 32 | (0xFFFFFFFFu - (unsigned)blk);
    };
    const bool any_fixed = (rr.diag >= 0 && rr.diag < n) || (rule.keep_sink && n > 0);
    // Step 1: the floor block of the head when nothing is forced (the lowest of the best).
    int fb = -1;
    if (!any_fixed && kq > 0) {
        unsigned long long best = 0;
        for (int blk = lane; blk < n; blk += 32)
            best = comp(blk) > best ? comp(blk) : best;
        for (int o = 16; o; o >>= 1) {
            const unsigned long long y = __shfl_xor_sync(0xffffffffu, best, o);
            best = y > best ? y : best;
        }
        fb = (int)(0xFFFFFFFFu - (unsigned)(best & 0xFFFFFFFFu));
    }
    auto forced = [&](int blk) {
        return blk == rr.diag || (rule.keep_sink && blk == 0) || blk == fb;
    };
    // Forced counts: the diagonal and the sink (one block when they coincide), or the floor.
    const int fixed = (rr.diag >= 0 && rr.diag < n) + (rule.keep_sink && n > 0 && rr.diag != 0);
    const int f = kq > 0 ? (any_fixed ? fixed : 1) : 0;
    const int left = kq > 0 ? H * (kq - f) : 0;
    const int quota = hi - f > 0 ? hi - f : 0;
    // Step 2: the threshold of the head's quota best unforced composites (0: all of them).
    unsigned long long tj = 0;
    if (left > 0) {
        int avail = 0;
        for (int blk = lane; blk < n; blk += 32)
            avail += !forced(blk);
        avail = (int)__reduce_add_sync(0xffffffffu, avail);
        if (quota == 0)
            tj = ~0ull; // no candidate: composites stay below it
        else if (quota < avail)
            for (int bit = 63; bit >= 0; bit--) {
                const unsigned long long cand = tj | 1ull << bit;
                int cnt = 0;
                for (int blk = lane; blk < n; blk += 32)
                    cnt += !forced(blk) && comp(blk) >= cand;
                if ((int)__reduce_add_sync(0xffffffffu, cnt) >= quota)
                    tj = cand;
            }
    }
    // Step 3: the group's threshold over the candidates, by composites with the head in them
    // (the lower head first among equal keys); each warp counts its head, the CTA adds.
    auto global_comp = [&](int blk) {
        return (unsigned long long)key(blk) << 32 | (0xFFFFFFFFu - (unsigned)(j * nb + blk));
    };
    auto candidate = [&](int blk) { return !forced(blk) && comp(blk) >= tj; };
    auto cta_count = [&](int mine) { // every thread gets the sum of the warps' counts
        mine = (int)__reduce_add_sync(0xffffffffu, mine);
        __syncthreads(); // s_cnt may still be read by the previous round
        if (lane == 0)
            s_cnt[j] = mine;
        __syncthreads();
        int total = 0;
        for (int w = 0; w < H; w++)
            total += s_cnt[w];
        return total;
    };
    unsigned long long tg = 0;
    if (left > 0) {
        int mine = 0;
        for (int blk = lane; blk < n; blk += 32)
            mine += candidate(blk);
        if (left < cta_count(mine))
            for (int bit = 63; bit >= 0; bit--) {
                const unsigned long long cand = tg | 1ull << bit;
                int cnt = 0;
                for (int blk = lane; blk < n; blk += 32)
                    cnt += candidate(blk) && global_comp(blk) >= cand;
                if (cta_count(cnt) >= left)
                    tg = cand;
            }
    }
    // The head's row in block order.
    const size_t r = ((size_t)b * h.heads_q + (size_t)g * H + j) * h.q_tiles + t;
    int32_t *out = indices + r * cap;
    int w = 0;
    for (int b0 = 0; b0 < n && kq > 0; b0 += 32) {
        const int blk = b0 + lane;
        const bool take =
            blk < n && (forced(blk) || (left > 0 && candidate(blk) && global_comp(blk) >= tg));
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

} // namespace

int sel_cuda_mass_keys(const float *mass, const SelHeadsShape &h, const SelRowRule &rule,
                       uint32_t *keys, cudaStream_t st)
{
    const size_t n = (size_t)h.batch * h.list_heads * h.q_tiles * h.kv_blocks;
    if (n == 0)
        return SA_OK;
    mass_keys_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(mass, h, rule, keys);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

int sel_cuda_pool(const float *mass, const SelHeadsShape &h, const SelRowRule &rule, int cap,
                  int32_t *indices, int32_t *counts, cudaStream_t st)
{
    if (h.group > 32)
        return SA_ERR_UNSUPPORTED; // one warp per head of the group, at most 1024 threads
    const long long ctas = (long long)h.batch * (h.heads_q / h.group) * h.q_tiles;
    if (ctas == 0)
        return SA_OK;
    if (ctas > 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    const size_t smem = (size_t)h.group * h.kv_blocks * sizeof(uint32_t);
    if (smem <= kPoolSmemMax) {
        int err = sel_smem_optin(reinterpret_cast<const void *>(pool_kernel<true>), smem);
        if (err)
            return err;
        pool_kernel<true><<<(unsigned)ctas, 32 * h.group, smem, st>>>(mass, h, rule, cap,
                                                                       indices, counts);
    } else {
        pool_kernel<false><<<(unsigned)ctas, 32 * h.group, 0, st>>>(mass, h, rule, cap, indices,
                                                                    counts);
    }
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}
