// r1 and r4 on the GPU: the representative scoring of sel_reps.c in three launches.
//
// 1. group_means on the keys: the mean of every group of `span` tokens (128 for r1, 32 for r4).
//    A CTA copies 128 tokens x 128 dims into shared memory (cp.async, all in flight at once),
//    then a thread per dim adds each group's tokens in order and divides by the group's valid
//    token count: the same FP32 operations in the same order as the CPU, so the means are
//    bit-identical. This launch also zeroes the scores kernel's row counters.
// 2. group_means on the queries, a programmatic dependent launch: its CTAs start while the key
//    launch runs (the keys are a fifth of the bytes at the study's shape, so the two share the
//    memory system instead of queueing), and each waits for the key launch before it exits, so
//    that the next launch may rely on both.
// 3. rep_scores, dependent on 2: per (batch, KV head, Q tile) row and a chunk of KV blocks, the
//    dot products of the row's query means (P = 128/span per head, every head of the GQA group)
//    with the chunk's key means, as a small FP32 SGEMM through shared memory on a tile sized to
//    each selector and length (ScoreTile: 16 x 32/64/128 for r1, 64 x 64 or 64 x 128 for r4;
//    r4's 16x more dot products run on tensor cores as 3xTF32, about FP32's precision); a
//    block's score is the max over its P key means and all query means, NaN kept as on the CPU.
//    The summation order differs from the CPU's, so scores agree to rounding, not bit for bit.
//    Rows of up to 1024 blocks are ranked in the same launch by the warp top-k (sel_warp_topk):
//    from shared memory when one CTA scores the whole row, else by the CTA that scores the
//    row's last chunk (a per-row counter). Longer rows take the separate top-k launch
//    (sel_topk.cu).
// Causal (sa_select_params.causal): the scores stay those of whole blocks, as on the CPU
// (sel_reps.c, docs/selectors.md "Causal lists"); only the ranking changes. A tile's competing
// blocks are the prefix it can see, the last of them forced (sel_row_of), min(k, visible) are
// kept and the slots past them hold -1; a chunk of blocks wholly after the tile's last visible
// key is not scored.
// Fewer, overlapped launches matter here: at the study's shape the whole selector is tens of
// microseconds, and each launch boundary costs a few (docs/selectors.md has the measurements).
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
    int side;             // which of them this launch covers: 0 Q, 1 K
    int dim, slices;      // dim slices of kMeanDims
    uint32_t *zero;       // words to zero for the scores launch (nullptr: none)
    long long zero_words;
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
    const long long u = blockIdx.x;
    const int side = a.side;
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
    sa_pdl_trigger(); // every CTA has started: the next launch may be scheduled
    for (long long i = u * kMeanThreads + threadIdx.x; i < a.zero_words;
         i += (long long)gridDim.x * kMeanThreads)
        a.zero[i] = 0u;
    asm volatile("cp.async.wait_all;\n" ::);
    // The query launch depends on the key launch only so that its completion implies the keys'
    // (the scores launch waits on the query launch alone); without a predecessor this returns.
    sa_pdl_wait();
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

// Score tiling. A pass covers MQ query means x NK key means (NK / P blocks) over a slice of up
// to kDS dims. Both operands are copied whole into shared memory with cp.async, all in flight at
// once (one L2 round trip per pass instead of one per 32-dim chunk), as rows of kDS + 4 floats:
// the padding shifts each row by 4 banks, so 8 lanes reading 16 bytes of 8 consecutive rows hit
// 32 distinct banks. The 256 threads form a TX x TY grid, warps of 8 TX x 4 TY; thread (tx, ty)
// owns query means ty + i * TY (i < TM) and key means tx + j * TX (j < TN), and per 4 dims reads
// TM + TN float4s for 4 * TM * TN FMAs. r1 has only `group` query means per row (16 on the
// study's shape), so its tile is 16 deep where r4's is 64. A wider tile (NK 128) makes half as
// many CTAs: r4 takes it only when the narrow one would fill more than one wave (long sequences).
constexpr int kDS = 128, kScoreThreads = 256, kRow = kDS + 4;
template <int P, int NK> struct ScoreTile {
    static constexpr int MQ = P == 1 ? 16 : 64, TN = P == 1 ? NK / 32 : NK / 16, TX = NK / TN,
                         TY = kScoreThreads / TX, TM = MQ / TY;
    static constexpr size_t smem = (size_t)(MQ + NK) * kRow * sizeof(float);
};

struct ScoreArgs {
    int heads_q, heads_kv, group, q_tiles, kv_blocks, dim;
    int qg, kg; // groups per (batch, head) on each side
    // The fused top-k (ITEMS > 0): chunk CTAs done per row (zeroed by the key launch), and
    // the lists.
    unsigned *row_done;
    int32_t *indices, *counts;
    SelRowRule rule; // which blocks of a row compete (causal: a prefix) and how many it keeps
};

// 16 bytes from src to shared dst, or zeros when !in (cp.async with a source size of 0).
__device__ __forceinline__ void copy16_or_zero(float *dst, const float *src, bool in)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(in ? src : nullptr), "r"(in ? 16 : 0));
}

#ifndef SEL_R4_TF32
#define SEL_R4_TF32 1 // 0: r4's scores on FP32 FMAs, as r1's (for A/B runs)
#endif

// x = hi + lo + (|x| * 2^-21 or less), hi and lo TF32 (low 13 bits zero, cut): "3xTF32", after
// CUTLASS's fast-accurate FP32 GEMM. hi * hi + hi * lo + lo * hi on tensor cores then carries
// nearly FP32's precision; lo * lo (2^-20 relative at most) is dropped. Three integer/FP32 ops a
// value: the splits, redone per fragment, are most of the kernel's instructions. An infinite x
// gives lo = NaN, so a block whose score involves an infinite mean scores NaN (ranked last),
// where the CPU's FP32 sum may give +-inf or NaN.
__device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo)
{
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}

// c += a (16 x 8, row) * b (8 x 8, col), TF32 in, FP32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// P: representatives per tile / block, 1 (r1) or 4 (r4); NK: key means per CTA (ScoreTile);
// ITEMS: keys per lane of the fused top-k (kv_blocks <= 32 * ITEMS), 0 for none.
template <int P, int NK, int ITEMS>
__global__ void __launch_bounds__(kScoreThreads, 2)
    rep_scores(const float *__restrict__ qr, const float *__restrict__ kr, ScoreArgs a,
               uint32_t *__restrict__ keys)
{
    using T = ScoreTile<P, NK>;
    constexpr int MQ = T::MQ, TM = T::TM, TN = T::TN, TX = T::TX, TY = T::TY;
    static_assert(TX * TY == kScoreThreads && TM * TY == MQ && TN * TX == NK && TX % 8 == 0 &&
                      TY % 4 == 0,
                  "a 256-thread grid of 8 x 4 warps covering the tile");
    constexpr int kNB = NK / P; // blocks per chunk
    // r4 on tensor cores (3xTF32, below): warp w owns query means [32 (w % 2), + 32) (two
    // m-tiles of 16) and key means [NK / 4 * (w / 2), + NK / 4) (NT n-tiles of 8): 32 x 32 on
    // the wide tile, so each split value feeds 4 (a) or 2 (b) MMAs.
    constexpr bool kTC = SEL_R4_TF32 && P == 4;
    constexpr int NT = NK / 32, RY = kTC ? 2 : TY;
    static_assert(!kTC || (MQ == 64 && kScoreThreads == 256), "2 m-halves x 4 n-quarters");
    extern __shared__ __align__(16) float smem[];
    float(*qs)[kRow] = reinterpret_cast<float(*)[kRow]>(smem);
    float(*ks)[kRow] = reinterpret_cast<float(*)[kRow]>(smem + MQ * kRow);
    float(*red)[NK] = reinterpret_cast<float(*)[NK]>(smem); // after the last pass
    __shared__ float best[kNB];
    __shared__ int last;

    const int row = blockIdx.x; // (b * Hkv + hkv) * q_tiles + t
    const int t = row % a.q_tiles, bh = row / a.q_tiles;
    const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
    const int blk0 = blockIdx.y * kNB;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int tx = (warp % (TX / 8)) * 8 + lane % 8, ty = (warp / (TX / 8)) * 4 + lane / 8;
    const int g = lane / 4, tg = lane % 4, mh = warp % 2, nq = warp / 2; // tensor path
    const int mq_total = a.group * P;
    // The row's competing blocks [0, n_row): all, or with causal those the tile can see. The
    // scores are those of whole blocks either way (sel_reps.c); a chunk wholly past n_row is
    // never ranked, so it skips the scoring (n_row is uniform over the CTA).
    const SelRow rr = sel_row_of(a.rule, t);

    sa_pdl_trigger(); // the next launch's CTAs are small: let them wait resident
    if (tid < kNB)
        best[tid] = -INFINITY;
    sa_pdl_wait(); // the means come from the previous launch
    // The key means of this chunk: vector n is key group blk0 * P + n.
    const float *kbase = kr + (size_t)bh * a.kg * a.dim;
    constexpr int kPieces = kDS / 4; // 16-byte pieces per row

    for (int m0 = 0; m0 < mq_total && blk0 < rr.n; m0 += MQ) {
        float acc[kTC ? 1 : TM][kTC ? 1 : TN];
        float cacc[kTC ? 2 : 1][kTC ? NT : 1][4];
#pragma unroll
        for (int i = 0; i < (kTC ? 1 : TM); i++)
#pragma unroll
            for (int j = 0; j < (kTC ? 1 : TN); j++)
                acc[i][j] = 0.0f;
#pragma unroll
        for (int h = 0; h < (kTC ? 2 : 1); h++)
#pragma unroll
            for (int i = 0; i < (kTC ? NT : 1); i++)
                cacc[h][i][0] = cacc[h][i][1] = cacc[h][i][2] = cacc[h][i][3] = 0.0f;
        for (int d0 = 0; d0 < a.dim; d0 += kDS) {
            for (int i = tid; i < (MQ + NK) * kPieces; i += kScoreThreads) {
                const int v = i / kPieces, d = d0 + (i % kPieces) * 4;
                if (v < MQ) {
                    const int m = m0 + v;
                    const bool in = m < mq_total && t * P + m % P < a.qg && d < a.dim;
                    copy16_or_zero(&qs[v][d - d0],
                                   qr + (((size_t)b * a.heads_q + hkv * a.group + m / P) * a.qg +
                                         t * P + m % P) * a.dim + d,
                                   in);
                } else {
                    const int e = blk0 * P + v - MQ;
                    copy16_or_zero(&ks[v - MQ][d - d0], kbase + (size_t)e * a.dim + d,
                                   e < a.kg && d < a.dim);
                }
            }
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_all;\n" ::);
            __syncthreads();
            const int dn = min(kDS, a.dim - d0);
            if constexpr (kTC) {
                // Per 8 dims: each m-tile's a fragment (rows g, g + 8; dims tg, tg + 4) and each
                // n-tile's b fragment (key mean g; dims tg, tg + 4), split into tf32 halves.
                for (int d = 0; d < dn; d += 8) {
                    uint32_t ah[2][4], al[2][4];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float *q0 = &qs[mh * 32 + h * 16 + g][d + tg];
                        const float *q8 = q0 + 8 * kRow;
                        tf32_split(q0[0], ah[h][0], al[h][0]);
                        tf32_split(q8[0], ah[h][1], al[h][1]);
                        tf32_split(q0[4], ah[h][2], al[h][2]);
                        tf32_split(q8[4], ah[h][3], al[h][3]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const float *k0 = &ks[nq * (NK / 4) + nt * 8 + g][d + tg];
                        uint32_t bh[2], bl[2];
                        tf32_split(k0[0], bh[0], bl[0]);
                        tf32_split(k0[4], bh[1], bl[1]);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            mma_tf32(cacc[h][nt], ah[h], bl); // small terms first
                            mma_tf32(cacc[h][nt], al[h], bh);
                            mma_tf32(cacc[h][nt], ah[h], bh);
                        }
                    }
                }
            } else {
#pragma unroll 2
                for (int d = 0; d < dn; d += 4) {
                    float4 qa[TM], kb[TN];
#pragma unroll
                    for (int i = 0; i < TM; i++)
                        qa[i] = *reinterpret_cast<const float4 *>(&qs[ty + i * TY][d]);
#pragma unroll
                    for (int j = 0; j < TN; j++)
                        kb[j] = *reinterpret_cast<const float4 *>(&ks[tx + j * TX][d]);
#pragma unroll
                    for (int i = 0; i < TM; i++)
#pragma unroll
                        for (int j = 0; j < TN; j++) {
                            float s = acc[i][j];
                            s = fmaf(qa[i].x, kb[j].x, s);
                            s = fmaf(qa[i].y, kb[j].y, s);
                            s = fmaf(qa[i].z, kb[j].z, s);
                            acc[i][j] = fmaf(qa[i].w, kb[j].w, s);
                        }
                }
            }
            __syncthreads(); // the next slice (or red) overwrites the operands
        }
        // Max over the valid query means, per key mean: red[y][n] holds it over the query
        // means of thread row y (FMA path) or of m-half y (tensor path).
        auto valid_m = [&](int mi) { return mi < mq_total && t * P + mi % P < a.qg; };
        if constexpr (kTC) {
            bool v[2][2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                v[h][0] = valid_m(m0 + mh * 32 + h * 16 + g);
                v[h][1] = valid_m(m0 + mh * 32 + h * 16 + g + 8);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float c0 = -INFINITY, c1 = -INFINITY;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    c0 = sel_nanmax(c0, sel_nanmax(v[h][0] ? cacc[h][nt][0] : -INFINITY,
                                                   v[h][1] ? cacc[h][nt][2] : -INFINITY));
                    c1 = sel_nanmax(c1, sel_nanmax(v[h][0] ? cacc[h][nt][1] : -INFINITY,
                                                   v[h][1] ? cacc[h][nt][3] : -INFINITY));
                }
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) { // over g: lanes tg, tg + 4, ...
                    c0 = sel_nanmax(c0, __shfl_xor_sync(0xffffffffu, c0, o));
                    c1 = sel_nanmax(c1, __shfl_xor_sync(0xffffffffu, c1, o));
                }
                if (g == 0) {
                    red[mh][nq * (NK / 4) + nt * 8 + 2 * tg] = c0;
                    red[mh][nq * (NK / 4) + nt * 8 + 2 * tg + 1] = c1;
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < TN; j++) {
                float mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < TM; i++)
                    if (valid_m(m0 + ty + i * TY))
                        mx = sel_nanmax(mx, acc[i][j]);
                red[ty][tx + j * TX] = mx;
            }
        }
        __syncthreads();
        if (tid < kNB) {
            float mx = best[tid];
            for (int n = tid * P; n < tid * P + P; n++) {
                if ((blk0 * P + n) >= a.kg) // a partial final block has fewer key means
                    break;
                for (int y = 0; y < RY; y++)
                    mx = sel_nanmax(mx, red[y][n]);
            }
            best[tid] = mx;
        }
        __syncthreads();
    }
    if constexpr (ITEMS > 0) {
        if (gridDim.y == 1) {
            // The whole row is ours: rank it from shared memory (rr.n <= kv_blocks <= kNB).
            if (warp == 0)
                sel_warp_rank<ITEMS>([&](int i) { return sel_score_key(best[i]); }, a.rule, row,
                                     a.indices, a.counts);
            return;
        }
        // The CTA that scores the row's last chunk ranks the row.
        if (tid < kNB && blk0 + tid < a.kv_blocks) {
            keys[(size_t)row * a.kv_blocks + blk0 + tid] = sel_score_key(best[tid]);
            __threadfence(); // published before this chunk counts as done
        }
        __syncthreads();
        if (tid == 0)
            last = atomicAdd(&a.row_done[row], 1u) == gridDim.y - 1;
        __syncthreads();
        if (!last || warp != 0)
            return;
        __threadfence(); // the other chunks' keys, published before their count
        const uint32_t *src = keys + (size_t)row * a.kv_blocks;
        sel_warp_rank<ITEMS>([&](int i) { return __ldcg(&src[i]); }, a.rule, row, a.indices,
                             a.counts);
    } else if (tid < kNB && blk0 + tid < a.kv_blocks) {
        keys[(size_t)row * a.kv_blocks + blk0 + tid] = sel_score_key(best[tid]);
    }
}

// The scores kernel for P, NK, with the top-k fused where the row fits a warp.
template <int P, int NK> static void (*score_kernel(int n))(const float *, const float *,
                                                             ScoreArgs, uint32_t *)
{
    return n <= 128               ? rep_scores<P, NK, 4>
           : n <= 256             ? rep_scores<P, NK, 8>
           : n <= 512             ? rep_scores<P, NK, 16>
           : n <= kSelWarpTopkMax ? rep_scores<P, NK, 32>
                                  : rep_scores<P, NK, 0>;
}

int rep_select_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                    const sa_select_params *p, int span, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    // The CPU's checks, counts required with causal included (SA_ERR_NULL, as on the CPU).
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, SEL_MODES_GROUP, &c);
    if (err)
        return err;
    // Index heads, and a local block off the diagonal without causal: CPU only for now
    // (sa_selectors.h). Under causal the local block is the diagonal block causal keeps anyway
    // (sel_row_choose), so keep_local changes nothing there.
    if (c.index_heads || (c.keep_local && !c.causal))
        return SA_ERR_UNSUPPORTED;
    if (c.kv_blocks > SEL_CUDA_MAX_BLOCKS || !sel_aligned16(c.q) ||
        !sel_aligned16(c.k))
        return SA_ERR_UNSUPPORTED;
    int sms = 0; // the score kernel's tile depends on how many CTAs fill the GPU
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    const int P = SA_TILE / span;
    const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
    const size_t nq = (size_t)s->batch * s->heads_q * qg, nk = (size_t)s->batch * s->heads_kv * kg;
    const int rows = s->batch * s->heads_kv * c.q_tiles;

    const bool fused_topk = c.kv_blocks <= kSelWarpTopkMax; // one warp ranks a row
    // The scores launch's tile. r1: as wide as the row up to 128 key means (no dummy columns on
    // short rows). r4: the wide tile only where the narrow one would make more than a wave of
    // CTAs (2 per SM).
    const long long narrow_ctas = (long long)rows * ((c.kv_blocks + 15) / 16);
    const int nkc = P == 1 ? (c.kv_blocks <= 32 ? 32 : c.kv_blocks <= 64 ? 64 : 128)
                          : (narrow_ctas > 2LL * sms ? 128 : 64);
    const int nb = nkc / P; // blocks per CTA
    const dim3 grid(rows, (c.kv_blocks + nb - 1) / nb);
    // Scores pass through global memory only when a row is not ranked in shared memory.
    const bool need_keys = !fused_topk || grid.y > 1;
    SelScratch scr(st);
    const size_t o_qr = scr.add(nq * c.dim * sizeof(float));
    const size_t o_kr = scr.add(nk * c.dim * sizeof(float));
    const size_t o_keys = need_keys ? scr.add((size_t)rows * c.kv_blocks * sizeof(uint32_t)) : 0;
    const size_t o_done = scr.add((size_t)rows * sizeof(unsigned));
    if ((err = scr.commit()))
        return err;
    float *qr = scr.at<float>(o_qr), *kr = scr.at<float>(o_kr);
    uint32_t *keys = need_keys ? scr.at<uint32_t>(o_keys) : nullptr;
    unsigned *row_done = scr.at<unsigned>(o_done);

    // 1. Key means, and the row counters zeroed; 2. query means, overlapping it.
    MeanArgs ma = {};
    ma.x[0] = c.q, ma.x[1] = c.k;
    ma.out[0] = qr, ma.out[1] = kr;
    ma.len[0] = s->len_q, ma.len[1] = s->len_kv;
    ma.groups[0] = qg, ma.groups[1] = kg;
    ma.tiles[0] = c.q_tiles, ma.tiles[1] = c.kv_blocks;
    ma.dim = c.dim;
    ma.slices = (c.dim + kMeanDims - 1) / kMeanDims;
    const long long q_ctas = (long long)s->batch * s->heads_q * c.q_tiles * ma.slices;
    const long long k_ctas = (long long)s->batch * s->heads_kv * c.kv_blocks * ma.slices;
    if (q_ctas > 0x7fffffffLL || k_ctas > 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    void (*means)(MeanArgs) = P == 1 ? group_means<1> : group_means<4>;
    MeanArgs mk = ma;
    mk.side = 1;
    mk.zero = row_done;
    mk.zero_words = fused_topk ? rows : 0;
    means<<<(unsigned)k_ctas, kMeanThreads, 0, st>>>(mk);
    SA_CUDA_TRY(cudaGetLastError());
    MeanArgs mq = ma;
    mq.side = 0;
    if ((err = sel_launch_pdl(means, dim3((unsigned)q_ctas), dim3(kMeanThreads), 0, st, mq)))
        return err;

    // 3. Scores, and the top-k where a row fits a warp.
    const SelRowRule rule = {c.kv_blocks, c.q_tiles, 0, c.k_sel, c.keep_diagonal, c.keep_sink,
                             c.causal, s->len_q, s->len_kv};
    ScoreArgs sa = {s->heads_q, s->heads_kv, c.group, c.q_tiles, c.kv_blocks, c.dim, qg, kg,
                    row_done, indices, counts, rule};
    void (*kern)(const float *, const float *, ScoreArgs, uint32_t *);
    size_t smem;
    if (P == 1 && nkc == 32)
        kern = score_kernel<1, 32>(c.kv_blocks), smem = ScoreTile<1, 32>::smem;
    else if (P == 1 && nkc == 64)
        kern = score_kernel<1, 64>(c.kv_blocks), smem = ScoreTile<1, 64>::smem;
    else if (P == 1)
        kern = score_kernel<1, 128>(c.kv_blocks), smem = ScoreTile<1, 128>::smem;
    else if (nkc == 128)
        kern = score_kernel<4, 128>(c.kv_blocks), smem = ScoreTile<4, 128>::smem;
    else
        kern = score_kernel<4, 64>(c.kv_blocks), smem = ScoreTile<4, 64>::smem;
    // Over the 48 KB default, so the kernel must be allowed it (once per kernel and device).
    if ((err = sel_smem_optin(reinterpret_cast<const void *>(kern), smem)))
        return err;
    if ((err = sel_launch_pdl(kern, grid, dim3(kScoreThreads), smem, st, qr, kr, sa, keys)))
        return err;
    if (fused_topk)
        return SA_OK;
    return sel_cuda_topk(keys, rows, rule, indices, counts, st);
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
