// r1 and r4 on the GPU: the representative scoring of sel_reps.c in three launches.
//
// 1. group_means: the mean of every group of `span` tokens (128 for r1, 32 for r4), for Q and K
//    in one launch. A CTA copies 128 tokens x 128 dims into shared memory (cp.async, all in
//    flight at once), then a thread per dim adds each group's tokens in order and divides by the
//    group's valid token count: the same FP32 operations in the same order as the CPU, so the
//    means are bit-identical.
// 2. rep_scores: per (batch, KV head, Q tile) row and a chunk of KV blocks, the dot products of
//    the row's query means (P = 128/span per head, every head of the GQA group) with the chunk's
//    key means, as a small FP32 SGEMM through shared memory (4 x 4 outputs per thread); a block's
//    score is the max over its P key means and all query means, NaN kept as on the CPU. The FMA
//    order differs from the CPU's, so scores agree to rounding, not bit for bit.
// 3. sel_cuda_topk (sel_topk.cu).
// Launches 2 and 3 are programmatic dependent launches (sel_cuda.cuh): each may be scheduled
// while the one before it finishes, and waits (griddepcontrol.wait) before reading its output.
#include "sel_cuda.cuh"

namespace {

// A means CTA stages a tile of kMeanTok tokens x kMeanDims dims (32 KB of BF16) in shared
// memory with 16-byte cp.async copies, all in flight at once (no registers held), then thread d
// adds column d of each group in token order. The tile's tokens start at a multiple of 128, so
// groups (128 or 32 tokens) never straddle tiles.
constexpr int kMeanTok = 128, kMeanDims = 128, kMeanThreads = kMeanDims;

struct MeanArgs {
    const uint16_t *x[2]; // Q, K: (heads, len, dim)
    float *out[2];        // (heads, groups, dim)
    int len[2], groups[2], tiles[2]; // tiles: token tiles per head
    long long ctas0;      // CTAs covering Q
    int dim, slices;      // dim slices of kMeanDims
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int P> // groups per tile: 1 (r1, span 128) or 4 (r4, span 32)
__global__ void __launch_bounds__(kMeanThreads) group_means(MeanArgs a)
{
    constexpr int span = kMeanTok / P;
    __shared__ __align__(16) uint16_t tile[kMeanTok][kMeanDims];
    const long long c = blockIdx.x;
    const int side = c >= a.ctas0;
    const long long u = side ? c - a.ctas0 : c;
    // Ternaries, not a.x[side]: a runtime index into the parameter struct would copy it to
    // local memory.
    const int len = side ? a.len[1] : a.len[0], groups = side ? a.groups[1] : a.groups[0];
    const int tiles = side ? a.tiles[1] : a.tiles[0];
    const uint16_t *x = side ? a.x[1] : a.x[0];
    float *out = side ? a.out[1] : a.out[0];
    const int slice = (int)(u % a.slices);
    const long long rest = u / a.slices;
    const int tt = (int)(rest % tiles);
    const long long h = rest / tiles;
    const int t0 = tt * kMeanTok, nt = min(kMeanTok, len - t0);
    const int d0 = slice * kMeanDims, nd = min(kMeanDims, a.dim - d0); // a multiple of 16

    const int cpr = nd / 8; // 16-byte pieces per token row
    const uint16_t *src = x + ((size_t)h * len + t0) * a.dim + d0;
    for (int i = threadIdx.x; i < nt * cpr; i += kMeanThreads) {
        const int r = i / cpr, cc = i % cpr;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     ::"r"(smem_addr(&tile[r][cc * 8])), "l"(src + (size_t)r * a.dim + cc * 8));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    sa_pdl_trigger(); // every CTA has started: the scores kernel may be scheduled
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();

    const int d = threadIdx.x;
    if (d >= nd)
        return;
    // The P groups' sums are independent chains; each adds its tokens in order, as the CPU does.
    float acc[P];
#pragma unroll
    for (int g = 0; g < P; g++)
        acc[g] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < span; i++)
#pragma unroll
        for (int g = 0; g < P; g++)
            if (g * span + i < nt)
                acc[g] = __fadd_rn(acc[g], __uint_as_float((uint32_t)tile[g * span + i][d] << 16));
#pragma unroll
    for (int g = 0; g < P; g++) {
        const int n = min(span, nt - g * span);
        if (n > 0)
            out[((size_t)h * groups + tt * P + g) * a.dim + d0 + d] = __fdiv_rn(acc[g], (float)n);
    }
}

// Score tiling: 64 query means x 64 key means per pass, dims in chunks of 32, 16 x 16 threads
// each owning 4 x 4 dot products. Shared memory holds both operands transposed ([dim][vector],
// padded by 4 floats) so a thread reads its 4 vectors' values at one dim as one float4.
constexpr int kMQ = 64, kNK = 64, kDC = 32, kScoreThreads = 256, kPad = 4;

struct ScoreArgs {
    int heads_q, heads_kv, group, q_tiles, kv_blocks, dim;
    int qg, kg; // groups per (batch, head) on each side
};

template <int P> // representatives per tile / block: 1 (r1) or 4 (r4)
__global__ void __launch_bounds__(kScoreThreads, 2) // 3 per SM would spill
    rep_scores(const float *__restrict__ qr, const float *__restrict__ kr, ScoreArgs a,
               uint32_t *__restrict__ keys)
{
    constexpr int kNB = kNK / P; // blocks per chunk
    __shared__ __align__(16) float qs[kDC][kMQ + kPad];
    __shared__ __align__(16) float ks[kDC][kNK + kPad];
    __shared__ float red[kScoreThreads / 16][kNK];
    __shared__ float best[kNB];

    const int row = blockIdx.x; // (b * Hkv + hkv) * q_tiles + t
    const int t = row % a.q_tiles, bh = row / a.q_tiles;
    const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
    const int blk0 = blockIdx.y * kNB;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int mq_total = a.group * P;

    sa_pdl_trigger(); // the top-k's CTAs are small: let them wait resident
    if (tid < kNB)
        best[tid] = -INFINITY;
    sa_pdl_wait(); // the means come from the previous launch
    // The key means of this chunk: vector n is key group blk0 * P + n.
    const float *kbase = kr + (size_t)bh * a.kg * a.dim;

    for (int m0 = 0; m0 < mq_total; m0 += kMQ) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[i][j] = 0.0f;
        // 64 vectors x 32 dims per operand and chunk: thread -> (vector tid % 64, 8 dims at
        // (tid / 64) * 8), so a warp's transposed stores hit 32 consecutive floats (no bank
        // conflicts). dim is a multiple of 16, so a slice is wholly inside or wholly past it;
        // zeros past it add exact zeros. The next chunk's loads are issued into registers before
        // this chunk's FMAs, so their latency hides behind the arithmetic.
        const int v = tid % 64, dd = (tid / 64) * 8;
        const int m = m0 + v, e = blk0 * P + v;
        const float *qsrc = m < mq_total && t * P + m % P < a.qg
                                ? qr + (((size_t)b * a.heads_q + hkv * a.group + m / P) * a.qg +
                                        t * P + m % P) * a.dim + dd
                                : nullptr;
        const float *ksrc = e < a.kg ? kbase + (size_t)e * a.dim + dd : nullptr;
        float4 pq0, pq1, pk0, pk1;
        auto fetch = [&](int d0) {
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            const bool in = d0 + dd < a.dim;
            pq0 = qsrc && in ? __ldg(reinterpret_cast<const float4 *>(qsrc + d0)) : z;
            pq1 = qsrc && in ? __ldg(reinterpret_cast<const float4 *>(qsrc + d0) + 1) : z;
            pk0 = ksrc && in ? __ldg(reinterpret_cast<const float4 *>(ksrc + d0)) : z;
            pk1 = ksrc && in ? __ldg(reinterpret_cast<const float4 *>(ksrc + d0) + 1) : z;
        };
        fetch(0);
        for (int d0 = 0; d0 < a.dim; d0 += kDC) {
            qs[dd + 0][v] = pq0.x, qs[dd + 1][v] = pq0.y, qs[dd + 2][v] = pq0.z;
            qs[dd + 3][v] = pq0.w, qs[dd + 4][v] = pq1.x, qs[dd + 5][v] = pq1.y;
            qs[dd + 6][v] = pq1.z, qs[dd + 7][v] = pq1.w;
            ks[dd + 0][v] = pk0.x, ks[dd + 1][v] = pk0.y, ks[dd + 2][v] = pk0.z;
            ks[dd + 3][v] = pk0.w, ks[dd + 4][v] = pk1.x, ks[dd + 5][v] = pk1.y;
            ks[dd + 6][v] = pk1.z, ks[dd + 7][v] = pk1.w;
            __syncthreads();
            if (d0 + kDC < a.dim)
                fetch(d0 + kDC);
#pragma unroll 8
            for (int d = 0; d < kDC; d++) {
                const float4 qv = *reinterpret_cast<const float4 *>(&qs[d][ty * 4]);
                const float4 kv = *reinterpret_cast<const float4 *>(&ks[d][tx * 4]);
                const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, kb[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = fmaf(qa[i], kb[j], acc[i][j]);
            }
            __syncthreads();
        }
        // Max over this thread's valid query means, per key mean.
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int mi = m0 + ty * 4 + i;
                if (mi < mq_total && t * P + mi % P < a.qg)
                    mx = sel_nanmax(mx, acc[i][j]);
            }
            red[ty][tx * 4 + j] = mx;
        }
        __syncthreads();
        if (tid < kNB) {
            float mx = best[tid];
            for (int n = tid * P; n < tid * P + P; n++) {
                if ((blk0 * P + n) >= a.kg) // a partial final block has fewer key means
                    break;
                for (int y = 0; y < kScoreThreads / 16; y++)
                    mx = sel_nanmax(mx, red[y][n]);
            }
            best[tid] = mx;
        }
        __syncthreads();
    }
    if (tid < kNB && blk0 + tid < a.kv_blocks)
        keys[(size_t)row * a.kv_blocks + blk0 + tid] = sel_score_key(best[tid]);
}

int rep_select_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                    const sa_select_params *p, int span, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin(s, q, k, p, indices, 1, 1, &c);
    if (err)
        return err;
    if (c.kv_blocks > SEL_CUDA_MAX_BLOCKS || !sel_aligned16(c.q) ||
        !sel_aligned16(c.k))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    const int P = SA_TILE / span;
    const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
    const size_t nq = (size_t)s->batch * s->heads_q * qg, nk = (size_t)s->batch * s->heads_kv * kg;
    const int rows = s->batch * s->heads_kv * c.q_tiles;

    SelScratch scr(st);
    const size_t o_qr = scr.add(nq * c.dim * sizeof(float));
    const size_t o_kr = scr.add(nk * c.dim * sizeof(float));
    const size_t o_keys = scr.add((size_t)rows * c.kv_blocks * sizeof(uint32_t));
    if ((err = scr.commit()))
        return err;
    float *qr = scr.at<float>(o_qr), *kr = scr.at<float>(o_kr);
    uint32_t *keys = scr.at<uint32_t>(o_keys);

    MeanArgs ma;
    ma.x[0] = c.q, ma.x[1] = c.k;
    ma.out[0] = qr, ma.out[1] = kr;
    ma.len[0] = s->len_q, ma.len[1] = s->len_kv;
    ma.groups[0] = qg, ma.groups[1] = kg;
    ma.tiles[0] = c.q_tiles, ma.tiles[1] = c.kv_blocks;
    ma.dim = c.dim;
    ma.slices = (c.dim + kMeanDims - 1) / kMeanDims;
    ma.ctas0 = (long long)s->batch * s->heads_q * c.q_tiles * ma.slices;
    const long long mean_ctas =
        ma.ctas0 + (long long)s->batch * s->heads_kv * c.kv_blocks * ma.slices;
    if (mean_ctas > 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    if (span == SA_TILE)
        group_means<1><<<(unsigned)mean_ctas, kMeanThreads, 0, st>>>(ma);
    else
        group_means<4><<<(unsigned)mean_ctas, kMeanThreads, 0, st>>>(ma);
    SA_CUDA_TRY(cudaGetLastError());

    ScoreArgs sa = {s->heads_q, s->heads_kv, c.group, c.q_tiles, c.kv_blocks, c.dim, qg, kg};
    dim3 grid(rows, (c.kv_blocks + kNK / P - 1) / (kNK / P));
    if ((err = sel_launch_pdl(P == 1 ? rep_scores<1> : rep_scores<4>, grid, dim3(kScoreThreads),
                              0, st, qr, kr, sa, keys)))
        return err;
    return sel_cuda_topk(keys, rows, c.kv_blocks, c.q_tiles, 0, c.k_sel, c.keep_diagonal,
                         c.keep_sink, indices, counts, st);
}

} // namespace

extern "C" int sel_r1_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return rep_select_cuda(s, q, k, p, SA_TILE, indices, counts);
}

extern "C" int sel_r4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return rep_select_cuda(s, q, k, p, SA_TILE / 4, indices, counts);
}
