// r1 and r4 on the GPU: the representative scoring of sel_reps.c in three launches.
//
// 1. group_means: the mean of every group of `span` tokens (128 for r1, 32 for r4), for Q and K
//    in one launch. A CTA copies 128 tokens x 128 dims into shared memory (cp.async, all in
//    flight at once), then a thread per dim adds each group's tokens in order and divides by the
//    group's valid token count: the same FP32 operations in the same order as the CPU, so the
//    means are bit-identical.
// 2. rep_scores: per (batch, KV head, Q tile) row and a chunk of KV blocks, the dot products of
//    the row's query means (P = 128/span per head, every head of the GQA group) with the chunk's
//    key means, as a small FP32 SGEMM through shared memory on a tile sized to each selector
//    and length (ScoreTile: 16 x 128 for r1, 64 x 64 or 64 x 128 for r4); a block's score is the
//    max over its P key means and all query means, NaN kept as on the CPU. The FMA order differs
//    from the CPU's, so scores agree to rounding, not bit for bit.
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

// Score tiling. A pass covers MQ query means x NK key means (NK / P blocks), dims in chunks of
// kDC; the 256 threads form a TX x TY grid (TX = NK / 4), each owning TM x 4 dot products. r1
// has only `group` query means per row (16 on the study's shape), so its tile is 16 deep where
// r4's is 64: a 64-deep r1 tile computed three dummy rows for every real one. A wider tile (NK
// 128) reads fewer shared-memory bytes per FMA but makes half as many CTAs: r4 takes it only
// when the narrow tile would fill more than one wave of the GPU (long sequences). Shared memory
// holds both operands transposed ([dim][vector], padded by 4 floats), so a thread reads its
// vectors' values at one dim as float2s / float4s. A warp is 8 TX x 4 TY threads: per dim it
// reads 8 distinct key float4s and 4 distinct query pieces, one wavefront each.
constexpr int kDC = 32, kScoreThreads = 256, kPad = 4;
template <int P, int NK> struct ScoreTile {
    static constexpr int MQ = P == 1 ? 16 : 64, TN = 4, TX = NK / TN, TY = kScoreThreads / TX,
                         TM = MQ / TY;
};

struct ScoreArgs {
    int heads_q, heads_kv, group, q_tiles, kv_blocks, dim;
    int qg, kg; // groups per (batch, head) on each side
};

// P: representatives per tile / block, 1 (r1) or 4 (r4); NK: key means per CTA (ScoreTile).
template <int P, int NK>
__global__ void __launch_bounds__(kScoreThreads, 2)
    rep_scores(const float *__restrict__ qr, const float *__restrict__ kr, ScoreArgs a,
               uint32_t *__restrict__ keys)
{
    using T = ScoreTile<P, NK>;
    constexpr int MQ = T::MQ, TM = T::TM, TN = T::TN, TX = T::TX, TY = T::TY;
    static_assert(TX * TY == kScoreThreads && TM * TY == MQ && TX % 8 == 0 && TY % 4 == 0,
                  "a 256-thread grid of 8 x 4 warps covering the tile");
    static_assert(TN == 4 && TM % 2 == 0, "float4 key reads, float2 or float4 query reads");
    constexpr int kNB = NK / P;             // blocks per chunk
    constexpr int V = MQ + NK;              // vectors staged per dim chunk
    constexpr int SLOTS = V * (kDC / 8);    // (vector, 8 dims) pieces per dim chunk
    constexpr int PER = (SLOTS + kScoreThreads - 1) / kScoreThreads;
    __shared__ __align__(16) float qs[kDC][MQ + kPad];
    __shared__ __align__(16) float ks[kDC][NK + kPad];
    __shared__ float red[TY][NK];
    __shared__ float best[kNB];

    const int row = blockIdx.x; // (b * Hkv + hkv) * q_tiles + t
    const int t = row % a.q_tiles, bh = row / a.q_tiles;
    const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
    const int blk0 = blockIdx.y * kNB;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int tx = (warp % (TX / 8)) * 8 + lane % 8, ty = (warp / (TX / 8)) * 4 + lane / 8;
    const int mq_total = a.group * P;

    sa_pdl_trigger(); // the top-k's CTAs are small: let them wait resident
    if (tid < kNB)
        best[tid] = -INFINITY;
    sa_pdl_wait(); // the means come from the previous launch
    // The key means of this chunk: vector n is key group blk0 * P + n.
    const float *kbase = kr + (size_t)bh * a.kg * a.dim;

    for (int m0 = 0; m0 < mq_total; m0 += MQ) {
        float acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
                acc[i][j] = 0.0f;
        // Staging: slot s is 8 dims (group s / V) of vector s % V (query means first, then key
        // means), so consecutive lanes store consecutive floats of one transposed row (no bank
        // conflicts). dim is a multiple of 16, so an 8-dim piece is wholly inside or wholly past
        // it; zeros past it add exact zeros. The next chunk's loads are issued into registers
        // before this chunk's FMAs, so their latency hides behind the arithmetic.
        const float *src[PER];
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int sl = tid + i * kScoreThreads, v = sl % V, g8 = (sl / V) * 8;
            src[i] = nullptr;
            if (sl < SLOTS && v < MQ) {
                const int m = m0 + v;
                if (m < mq_total && t * P + m % P < a.qg)
                    src[i] = qr + (((size_t)b * a.heads_q + hkv * a.group + m / P) * a.qg +
                                   t * P + m % P) * a.dim + g8;
            } else if (sl < SLOTS) {
                const int e = blk0 * P + v - MQ;
                if (e < a.kg)
                    src[i] = kbase + (size_t)e * a.dim + g8;
            }
        }
        float4 pre[PER][2];
        auto fetch = [&](int d0) {
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const int g8 = ((tid + i * kScoreThreads) / V) * 8;
                const bool in = src[i] && d0 + g8 < a.dim;
                const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
                pre[i][0] = in ? __ldg(reinterpret_cast<const float4 *>(src[i] + d0)) : z;
                pre[i][1] = in ? __ldg(reinterpret_cast<const float4 *>(src[i] + d0) + 1) : z;
            }
        };
        fetch(0);
        for (int d0 = 0; d0 < a.dim; d0 += kDC) {
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const int sl = tid + i * kScoreThreads, v = sl % V, g8 = (sl / V) * 8;
                if (sl >= SLOTS)
                    continue;
                const float f[8] = {pre[i][0].x, pre[i][0].y, pre[i][0].z, pre[i][0].w,
                                    pre[i][1].x, pre[i][1].y, pre[i][1].z, pre[i][1].w};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (v < MQ)
                        qs[g8 + e][v] = f[e];
                    else
                        ks[g8 + e][v - MQ] = f[e];
                }
            }
            __syncthreads();
            if (d0 + kDC < a.dim)
                fetch(d0 + kDC);
#pragma unroll 4
            for (int d = 0; d < kDC; d++) {
                float qa[TM];
                if constexpr (TM % 4 == 0) {
#pragma unroll
                    for (int i = 0; i < TM; i += 4) {
                        const float4 q4 = *reinterpret_cast<const float4 *>(&qs[d][ty * TM + i]);
                        qa[i] = q4.x, qa[i + 1] = q4.y, qa[i + 2] = q4.z, qa[i + 3] = q4.w;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < TM; i += 2) {
                        const float2 q2 = *reinterpret_cast<const float2 *>(&qs[d][ty * TM + i]);
                        qa[i] = q2.x, qa[i + 1] = q2.y;
                    }
                }
                const float4 kv = *reinterpret_cast<const float4 *>(&ks[d][tx * TN]);
                const float kb[TN] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                    for (int j = 0; j < TN; j++)
                        acc[i][j] = fmaf(qa[i], kb[j], acc[i][j]);
            }
            __syncthreads();
        }
        // Max over this thread's valid query means, per key mean.
#pragma unroll
        for (int j = 0; j < TN; j++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < TM; i++) {
                const int mi = m0 + ty * TM + i;
                if (mi < mq_total && t * P + mi % P < a.qg)
                    mx = sel_nanmax(mx, acc[i][j]);
            }
            red[ty][tx * TN + j] = mx;
        }
        __syncthreads();
        if (tid < kNB) {
            float mx = best[tid];
            for (int n = tid * P; n < tid * P + P; n++) {
                if ((blk0 * P + n) >= a.kg) // a partial final block has fewer key means
                    break;
                for (int y = 0; y < TY; y++)
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
    int sms = 0, major = 0; // the score kernel's tile depends on how many CTAs fill the GPU
    if (sa_cuda_device_info(&sms, &major) != SA_OK)
        return SA_ERR_NO_DEVICE;
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
    // r4's wide tile only where the narrow one would make more than a wave of CTAs (2 per SM).
    const long long narrow_ctas = (long long)rows * ((c.kv_blocks + 15) / 16);
    const bool wide = P == 1 || narrow_ctas > 2LL * sms;
    const int nb = (wide ? 128 : 64) / P; // blocks per CTA
    dim3 grid(rows, (c.kv_blocks + nb - 1) / nb);
    void (*kern)(const float *, const float *, ScoreArgs, uint32_t *) =
        P == 1 ? rep_scores<1, 128> : wide ? rep_scores<4, 128> : rep_scores<4, 64>;
    if ((err = sel_launch_pdl(kern, grid, dim3(kScoreThreads), 0, st, qr, kr, sa, keys)))
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
