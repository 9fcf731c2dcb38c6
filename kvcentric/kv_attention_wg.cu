// KV-centric part 2 on the Hopper tensor core: one KV block against the gathered queries that
// chose it, with wgmma and warp specialization (sa_kv_params.attend = SA_KV_ATTEND_WGMMA).
//
// Focus: the same tasks and partials as kv_attention.cu (mma.sync, 8 warps), in the shape of
// the numbered stages: a producer warpgroup loads, two consumer warpgroups compute. A task's 128
// rows (query x head of the GQA group, row r = qi * group + g) are one Q tile; consumer
// warpgroup c owns rows 64c..64c+63, as stage 17 splits a Q tile. A task sees exactly one block,
// so there is no online softmax: each warpgroup takes S = Q K^T, its row max and sum, P V, and
// writes the normalized partial and its LSE.
// Assumptions: head_dim 128, KV blocks of 128 keys (the last may be partial: its padding
// columns are masked to -inf), BF16 inputs, the task list of part 1 (kv_index.cu). Causal
// (sa_kv_params.causal, bottom-right aligned as everywhere: query q sees key j when
// j <= q + len_kv - len_q) masks per row; the mma.sync kernel has no causal mask.
//
// SCHEDULE
//   Persistent: one CTA per SM. The task list (in window order, sa_kvcentric.h) is cut in runs of
//   RUN_TASKS consecutive tasks; CTA i takes runs i, i + grid, i + 2 grid, ... So all CTAs move
//   through the list together (the Q rows of the current window stay in L2), and inside a run
//   consecutive tasks mostly share a bucket, so K/V are loaded once per run, not once per task.
//
// ROLES (384 threads = 3 warpgroups)
//   WG0  producer, setmaxnreg.dec to PRODUCER_REGS. All 128 threads gather Q rows with cp.async
//        (16 lanes per 256-byte row, the 128B swizzle applied by hand, rows past the task's
//        count zero-filled); thread 0 also issues the K/V TMA loads when the bucket changes.
//   WG1  consumer of rows 0..63 (c = 0), setmaxnreg.inc to CONSUMER_REGS.
//   WG2  consumer of rows 64..127 (c = 1).
//
// DATAFLOW PER TASK (u-th task of the CTA, Q buffer b = u % 3)
//   producer:
//     1. wait q-free[b]. If the task's bucket differs from the last one: wait kv-free[s] of the
//        next K/V stage, TMA K and V of the block into it (kv-ready[s] counts the bytes).
//     2. each thread finds the source row of one Q row (the reverse index entry), writes it to
//        the buffer's row table; producer barrier; 16 cp.async per thread from the table.
//     3. thread 0 writes the task record (count, K/V stage and its use, valid keys, whether this
//        is the last task of the stage); every thread commits its copies as one group. They
//        land while the producer waits at the next task's step 1, where it waits for them
//        (cp.async.wait_group 0), runs fence.proxy.async (the copies are generic-proxy writes
//        that wgmma reads through the async proxy) and arrives on their q-ready, before any
//        K/V wait of the next task (see No deadlock).
//   consumer c, for task u (its S already computed and turned into P during task u - 1):
//     4. wait q-ready of task u + 1, read its record, load its rows' reverse index entries, wait
//        its kv-ready; turn: S' = Q_c K'^T for task u + 1 (8 wgmma, commit), then O = P V for
//        task u (8 wgmma, A = P from registers, commit); wait for S' only (wait_group 1);
//        arrive q-free of task u + 1.
//     5. for task u + 1, beside task u's PV: mask the padding columns of a partial block and,
//        causally, each row's keys after its query (per row: its query comes from the reverse
//        index entry); row max, P' = exp2(S' * scale log2e - max) in place in S's registers,
//        row sums. A row that sees no key of the block (an allowed future block) gets P' = 0,
//        O = 0 and LSE = -inf, which the combine weighs as nothing.
//     6. wait for the PV (wait_group 0); on the stage's last task arrive kv-free[s].
//     7. O / sum of task u to BF16 (or FP32) partial rows, 16-byte stores after a quad
//        transpose; LSE = (max + log2 sum) ln 2; then P' to BF16 A fragments.
//   The first task has a turn with S alone; the last a turn with its PV alone. So each
//   warpgroup's softmax overlaps its own PV (FlashAttention-3's intra-warpgroup overlap, across
//   tasks here since a task has one block) as well as the other warpgroup's wgmma.
//   The two consumers take turns (ping-pong, as stages 14-17): while one warpgroup runs its
//   softmax or epilogue, the other's wgmma run. A warpgroup whose rows are all past the task's
//   count still runs its wgmma on the zero-filled rows (a branch around wgmma makes ptxas
//   serialize every wgmma of the kernel) and skips only the stores.
//
// BARRIER PROTOCOL
//   | barrier     | kind      | direction             | arrivals             | meaning
//   | q-ready[b]  | mbarrier  | producer -> consumers | 128 producer threads | Q rows of buffer b landed (and fenced); record written
//   | q-free[b]   | mbarrier  | consumers -> producer | 8 (consumer warps)   | QK on buffer b done, record read
//   | kv-ready[s] | mbarrier  | producer -> consumers | 1 + 64 KB of TMA     | K and V of stage s landed
//   | kv-free[s]  | mbarrier  | consumers -> producer | 8                    | the last PV on stage s done
//   | row table   | named bar | producer threads      | 128                  | source rows of buffer b written
//   | turn[c]     | named bar | consumer 1-c -> c     | 256                  | c may issue its next wgmma
//   Parity: q-ready/q-free of buffer b on the CTA's u-th task: (u / 3) & 1; kv-ready/kv-free of
//   stage s on the stage's n-th load (the record carries n): (n / 2) & 1.
//   No deadlock: a consumer issues the QK of task u + 1 before it releases task u's K/V stage,
//   so the producer arrives on q-ready of task u + 1 before it waits for any stage (at the top
//   of iteration u + 2). It fills buffer b for task u + 3 only after both consumers did the QK
//   of task u, and it loads stage s anew (for task u) only after the last PV of the tasks of
//   the stage's previous load, which all come before task u - 1 (a stage's last task is known
//   because the producer reads one task ahead). So producer iteration u waits only on consumer
//   work of tasks up to u - 2, and consumer work on task u only on producer iterations up to
//   u + 1. (With the q-ready arrival after the K/V wait, the run deadlocked.)
//
// B200 -> HOPPER: the study's KV-centric CTA gathered Q rows for tcgen05 MMAs with Tensor Memory
// accumulators; here the accumulators are registers, 64 rows per warpgroup, and the gather is
// cp.async (TMA on Hopper has no row gather; a 3-D box per query would cover only groups that are
// multiples of 8 rows).
#include <cuda.h>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "kv_internal.h"
#include "sa_mbarrier.cuh"
#include "sa_stage14.cuh"
#include "sa_tma.cuh"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"

namespace {

constexpr int NTHREADS = 384;
// Three Q buffers: the copies of task u + 1 land while the consumers run task u - 1 and the
// producer waits for a free buffer; with two the producer had no room to run ahead.
constexpr int Q_BUFFERS = 3;
constexpr int KV_STAGES = 2;
// Tasks per run: a bucket has about window_queries * blocks per query / kv_blocks entries per
// window (64 at 64K keys, 16 blocks, GQA 16), i.e. several full tasks in a row; 8 keeps the CTAs
// within a few hundred tasks of each other.
constexpr int RUN_TASKS = 8;
// The producer needs more than stage 17's 24 registers (row tables, 64-bit addresses); the
// consumers keep O, S and P (160) with room: 128 * 40 + 256 * 232 = 64512 of the 65536.
constexpr int WG_PRODUCER_REGS = 40;
constexpr int WG_CONSUMER_REGS = 232;
constexpr int PRODUCER_BARRIER = 3; // named barrier of the producer warpgroup (turns use 1, 2)
constexpr int CONSUMER_WARPS = 8;

struct Record {
    int32_t count;    // queries of the task
    int32_t begin;    // its first entry
    int32_t bucket;
    int32_t kv_use;   // the stage's load number n: stage n % 2, parity (n / 2) & 1
    int32_t valid;    // valid keys of the block
    int32_t release;  // 1: the last task of this CTA on this K/V stage
    int32_t pad[2];
};

struct alignas(1024) Smem {
    uint8_t q[Q_BUFFERS][TILE_BYTES];
    uint8_t k[KV_STAGES][TILE_BYTES];
    uint8_t v[KV_STAGES][TILE_BYTES];
    uint64_t q_ready[Q_BUFFERS], q_free[Q_BUFFERS];
    uint64_t kv_ready[KV_STAGES], kv_free[KV_STAGES];
    int32_t src[Q_BUFFERS][TILE]; // Q row of each tile row (-1: past the count)
    Record rec[Q_BUFFERS];
};
constexpr size_t SMEM_BYTES = sizeof(Smem) + 1024;
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 per-block limit");

struct Args {
    const uint16_t *q;
    const int32_t *entries;
    const sa_kv_task *tasks;
    const int32_t *info; // [1]: tasks used
    float *part_lse;
    void *part_o;
    int heads_q, heads_kv, group, len_q, len_kv, blocks, m;
    int causal, q_off; // query q sees key j when j <= q + q_off (q_off = len_kv - len_q)
};

// The schedule: the task after t for CTA `cta` of `grid` (runs of RUN_TASKS).
__device__ __forceinline__ int next_task(int t)
{
    return (t + 1) % RUN_TASKS ? t + 1 : t + 1 + (int)(gridDim.x - 1) * RUN_TASKS;
}

__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ int read_lane0(const int32_t *word, int lane)
{
    int v = 0;
    if (lane == 0)
        v = *reinterpret_cast<const volatile int32_t *>(word);
    return __shfl_sync(0xffffffffu, v, 0);
}

// What a consumer keeps of a task between its QK and its epilogue.
struct Cur {
    int count, begin, bucket, stage, valid, release;
    bool live;                     // this warpgroup has a row of the task
    int ent[2];                    // reverse index entries of the thread's two rows (-1: none)
    int lim[2];                    // their last visible column of the block (-1: none)
    float row_max[2], row_sum[2];  // log2-domain max, per-thread partial sums
};

// Step 4's waits: q-ready of the u-th task, its record, its K/V stage. The reverse index entries
// of the thread's two rows are loaded here, so their latency hides under the wgmma.
template <bool CAUSAL, typename S>
__device__ __forceinline__ void take_task(S &sm, const Args &a, int c, int warp, int lane,
                                          uint32_t u, Cur &d)
{
    const int qb = u % Q_BUFFERS;
    sa_mbar_wait(&sm.q_ready[qb], (u / Q_BUFFERS) & 1);
    const Record *rc = &sm.rec[qb];
    d.count = read_lane0(&rc->count, lane);
    d.begin = read_lane0(&rc->begin, lane);
    d.bucket = read_lane0(&rc->bucket, lane);
    const int n = read_lane0(&rc->kv_use, lane);
    const int valid = read_lane0(&rc->valid, lane);
    d.valid = valid;
    d.release = read_lane0(&rc->release, lane);
    d.stage = n % KV_STAGES;
    d.live = 64 * c < d.count * a.group;
    const int blk = d.bucket % a.blocks;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int qi = (64 * c + warp * 16 + lane / 4 + 8 * i) / a.group;
        d.ent[i] = qi < d.count ? a.entries[d.begin + qi] : -1;
        d.lim[i] = valid - 1;
        if (CAUSAL && d.ent[i] >= 0) {
            // Keys past the query's last visible one leave the softmax (a future block: all).
            const int q = (d.ent[i] / a.m) % a.len_q;
            d.lim[i] = max(-1, min(d.lim[i], q + a.q_off - blk * TILE));
        }
    }
    sa_mbar_wait(&sm.kv_ready[d.stage], (n / KV_STAGES) & 1);
}

// Step 5 in place: one block, so the max is final and nothing is rescaled. Columns past each
// row's lim (a partial block's padding; causally, keys after the row's query) go to -inf; S
// becomes P = exp2(S * scale log2e - max) (FP32, still in sc); row sums per thread. A row that
// sees no key of the block (a future block the lists were allowed to name) gets P = 0.
// Without CAUSAL every row sees a valid key and only the partial block is masked: the code of
// the non-causal kernel stays free of the per-row limits and guards (measured 7% slower with
// them, 2026-12-01).
template <bool CAUSAL>
__device__ __forceinline__ void block_softmax(float (&sc)[64], int valid, const int (&lim)[2],
                                              int lane, float (&row_max)[2], float (&row_sum)[2])
{
    if (!CAUSAL && valid < TILE)
        mask_tail(sc, valid, lane);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (CAUSAL && lim[i] < TILE - 1) {
#pragma unroll
            for (int jj = 0; jj < 16; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (8 * jj + 2 * (lane % 4) + e > lim[i])
                        sc[4 * jj + 2 * i + e] = -CUDART_INF_F;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int jj = 0; jj < 16; jj++)
            mx = fmaxf(mx, fmaxf(sc[4 * jj + 2 * i], sc[4 * jj + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        row_max[i] = mx * SCORE_TO_LOG2; // -inf only for a row that sees no key here
        row_sum[i] = 0.f;
    }
    float neg_max[2] = {-row_max[0], -row_max[1]};
    if (CAUSAL) {
        neg_max[0] = row_max[0] == -CUDART_INF_F ? 0.f : neg_max[0];
        neg_max[1] = row_max[1] == -CUDART_INF_F ? 0.f : neg_max[1];
    }
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float p0 = fast_exp2(fmaf(sc[4 * jj + 2 * i], SCORE_TO_LOG2, neg_max[i]));
            const float p1 = fast_exp2(fmaf(sc[4 * jj + 2 * i + 1], SCORE_TO_LOG2, neg_max[i]));
            row_sum[i] += p0 + p1;
            sc[4 * jj + 2 * i] = p0;
            sc[4 * jj + 2 * i + 1] = p1;
        }
    }
}

// P to the BF16 A fragments of the PV (only once the previous PV has read pa).
__device__ __forceinline__ void pack_p(const float (&sc)[64], uint32_t (&pa)[32])
{
#pragma unroll
    for (int jj = 0; jj < 16; jj++)
#pragma unroll
        for (int i = 0; i < 2; i++)
            pa[(jj / 2) * 4 + (jj % 2) * 2 + i] = pack_bf16(sc[4 * jj + 2 * i], sc[4 * jj + 2 * i + 1]);
}

// O = P V, the first k-step overwriting O (a task sees one block: nothing to accumulate onto).
__device__ __forceinline__ void issue_pv_first(float (&o)[64], const uint32_t (&pa)[32],
                                               uint32_t v_lo)
{
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
        sa_wgmma_m64n128k16_rs(o, a, sa_desc_join(v_lo + ((kk * 2 * ATOM_BYTES) >> 4), DESC_HI),
                               kk > 0);
    }
}

// Step 7: rows lane/4 (i = 0) and lane/4 + 8 (i = 1) of the warp's 16: O / sum as BF16 (16-byte
// stores after a quad transpose) or FP32 (8-byte stores), and the LSE.
template <bool F32, bool CAUSAL>
__device__ __forceinline__ void store_partials(const Args &a, const Cur &d, const float (&o)[64],
                                               int c, int warp, int lane)
{
    const int bh = d.bucket / a.blocks;
    const int b = bh / a.heads_kv, hkv = bh - b * a.heads_kv;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float sum = d.row_sum[i];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        // Causally a row may see no key of the block: O = 0, LSE = -inf.
        const float inv = !CAUSAL || sum > 0.f ? 1.f / sum : 0.f;
        const int r = 64 * c + warp * 16 + lane / 4 + 8 * i;
        const int g = r % a.group;
        const bool ok = d.ent[i] >= 0;
        // e = (bh * len_q + q) * m + slot; the partial row is (head * len_q + q) * m + slot.
        const int head = b * a.heads_q + hkv * a.group + g;
        const long long pr = ok ? (long long)(head - bh) * a.len_q * a.m + d.ent[i] : 0;
        if (F32) {
            float2 *dst =
                reinterpret_cast<float2 *>(static_cast<float *>(a.part_o) + pr * HEAD_DIM) + (lane % 4);
#pragma unroll
            for (int jj = 0; jj < 16; jj++)
                if (ok)
                    dst[4 * jj] = make_float2(o[4 * jj + 2 * i] * inv, o[4 * jj + 2 * i + 1] * inv);
        } else {
            uint4 *dst =
                reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.part_o) + pr * HEAD_DIM) + (lane % 4);
#pragma unroll
            for (int gq = 0; gq < 4; gq++) {
                uint32_t w[4];
#pragma unroll
                for (int k = 0; k < 4; k++)
                    w[k] = pack_bf16(o[4 * (4 * gq + k) + 2 * i] * inv,
                                     o[4 * (4 * gq + k) + 2 * i + 1] * inv);
                quad_transpose(w, lane);
                if (ok)
                    dst[4 * gq] = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        if (ok && lane % 4 == 0)
            a.part_lse[pr] =
                !CAUSAL || sum > 0.f ? (d.row_max[i] + __log2f(sum)) * LN2 : -CUDART_INF_F;
    }
}

template <bool F32, bool CAUSAL>
__global__ void __launch_bounds__(NTHREADS, 1)
    kv_attention_wg(const __grid_constant__ CUtensorMap map_k,
                    const __grid_constant__ CUtensorMap map_v, const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    const uint32_t pad = (1024 - (sa_smem_addr(smem_raw) & 1023)) & 1023;
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw + pad);
    const int ntasks = a.info[1];
    const int first = (int)blockIdx.x * RUN_TASKS;
    if (first >= ntasks)
        return; // the whole CTA, before any barrier

    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int b = 0; b < Q_BUFFERS; b++) {
            sa_mbar_init(&sm.q_ready[b], 128);
            sa_mbar_init(&sm.q_free[b], CONSUMER_WARPS);
        }
        for (int s = 0; s < KV_STAGES; s++) {
            sa_mbar_init(&sm.kv_ready[s], 1);
            sa_mbar_init(&sm.kv_free[s], CONSUMER_WARPS);
        }
        sa_mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        // ------------------------------------------------------------ producer
        sa_setmaxnreg_dec<WG_PRODUCER_REGS>();
        const int t = threadIdx.x;
        if (t == 0) {
            sa_tma_prefetch_map(&map_k);
            sa_tma_prefetch_map(&map_v);
        }
        uint32_t u = 0;
        int kv_n = -1, cur_bucket = -1;
        sa_kv_task d = a.tasks[first];
        for (int task = first; task < ntasks; u++) {
            const int nxt = next_task(task);
            const sa_kv_task dn = nxt < ntasks ? a.tasks[nxt] : sa_kv_task{-1, 0, 0, 0};
            const int qb = u % Q_BUFFERS;
            const int bh = d.bucket / a.blocks, blk = d.bucket - bh * a.blocks;
            // Step 1.
            sa_mbar_wait(&sm.q_free[qb], ((u / Q_BUFFERS) & 1) ^ 1);
            // The previous task's copies (one commit group per task) landed while we waited:
            // fenced, ready. This comes before the K/V wait below: a consumer releases a K/V
            // stage only after issuing the next task's QK, so q-ready of task u - 1 must never
            // wait for a stage that task u - 2 still holds.
            if (u > 0) {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
                fence_proxy_async();
                sa_mbar_arrive(&sm.q_ready[(u - 1) % Q_BUFFERS]);
            }
            if (d.bucket != cur_bucket) {
                kv_n++;
                cur_bucket = d.bucket;
                if (t == 0) {
                    const int s = kv_n % KV_STAGES;
                    sa_mbar_wait(&sm.kv_free[s], ((kv_n / KV_STAGES) & 1) ^ 1);
                    const int krow = bh * a.len_kv + blk * TILE;
                    sa_mbar_arrive_expect_tx(&sm.kv_ready[s], 2 * TILE_BYTES);
                    sa_tma_load_2d(sm.k[s], &map_k, &sm.kv_ready[s], 0, krow);
                    sa_tma_load_2d(sm.k[s] + HALF_BYTES, &map_k, &sm.kv_ready[s], HALF_COLS, krow);
                    sa_tma_load_2d(sm.v[s], &map_v, &sm.kv_ready[s], 0, krow);
                    sa_tma_load_2d(sm.v[s] + HALF_BYTES, &map_v, &sm.kv_ready[s], HALF_COLS, krow);
                }
            }
            // Step 2: row t of the tile is query qi = t / group, head g of the group.
            {
                const int qi = t / a.group, g = t - qi * a.group;
                int src = -1;
                if (qi < d.count) {
                    const int e = a.entries[d.begin + qi];
                    const int b = bh / a.heads_kv, hkv = bh - b * a.heads_kv;
                    const int head = b * a.heads_q + hkv * a.group + g;
                    src = head * a.len_q + (e / a.m - bh * a.len_q); // below 2^31 (launch check)
                }
                sm.src[qb][t] = src;
            }
            sa_named_barrier_sync<PRODUCER_BARRIER>(128);
            const uint32_t qbase = sa_smem_addr(sm.q[qb]);
            const int chunk = t % 16; // 16-byte chunk of the 256-byte row
            const uint32_t col = (chunk / 8) * HALF_BYTES, c8 = chunk % 8;
#pragma unroll 4
            for (int i = 0; i < 16; i++) {
                const int r = t / 16 + 8 * i;
                const int src = sm.src[qb][r];
                const uint32_t dst = qbase + col + r * ROW_BYTES + ((c8 ^ (r & 7)) << 4);
                cp_async16_zfill(dst, a.q + (size_t)(src >= 0 ? src : 0) * HEAD_DIM + chunk * 8,
                                 src >= 0);
            }
            // Step 3.
            if (t == 0) {
                Record &rc = sm.rec[qb];
                rc.count = d.count;
                rc.begin = d.begin;
                rc.bucket = d.bucket;
                rc.kv_use = kv_n;
                rc.valid = min(TILE, a.len_kv - blk * TILE);
                rc.release = dn.bucket != d.bucket;
            }
            // This task's copies stay in flight until the next iteration's step 1.
            asm volatile("cp.async.commit_group;" ::: "memory");
            d = dn;
            task = nxt;
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        fence_proxy_async();
        sa_mbar_arrive(&sm.q_ready[(u - 1) % Q_BUFFERS]); // u >= 1: the CTA had a task
        return;
    }

    // ---------------------------------------------------------------- consumers
    sa_setmaxnreg_inc<WG_CONSUMER_REGS>();
    const int c = wg - 1;
    const int t = threadIdx.x % 128;
    const int warp = t / 32, lane = t % 32;
    constexpr uint32_t Q_HALF = (64 * ROW_BYTES) >> 4;
    constexpr uint32_t STAGE_STEP = TILE_BYTES >> 4;
    const uint32_t q_desc0 = sa_desc_lo(sa_smem_addr(sm.q[0]), 16) + c * Q_HALF;
    const uint32_t k_desc0 = sa_desc_lo(sa_smem_addr(sm.k[0]), 16);
    const uint32_t v_desc0 = sa_desc_lo(sa_smem_addr(sm.v[0]), HALF_BYTES);

    if (c == 1)
        turn_pass(c); // warpgroup 0 takes the first turn

    float sc[64], o[64];
    uint32_t pa[32];
#pragma unroll
    for (int r = 0; r < 64; r++)
        o[r] = 0.f;
    Cur cur; // the task whose PV and epilogue are pending
    uint32_t u = 0;
    int task = first;
    // Prologue: the first task's S and softmax alone (steps 4-5).
    {
        take_task<CAUSAL>(sm, a, c, warp, lane, u, cur);
        uint32_t q_desc = q_desc0 + (u % Q_BUFFERS) * STAGE_STEP;
        uint32_t k_desc = k_desc0 + cur.stage * STAGE_STEP;
        asm volatile("" : "+r"(q_desc), "+r"(k_desc));
        turn_wait(c);
        sa_wgmma_fence();
        issue_qk(sc, q_desc, k_desc);
        sa_wgmma_commit();
        turn_pass(c);
        sa_wgmma_wait<0>();
        warp_arrive(&sm.q_free[u % Q_BUFFERS], lane);
        block_softmax<CAUSAL>(sc, cur.valid, cur.lim, lane, cur.row_max, cur.row_sum);
        pack_p(sc, pa);
    }
#pragma unroll 1
    for (;;) {
        task = next_task(task);
        u++;
        const bool more = task < ntasks;
        Cur nxt;
        if (more) {
            // Steps 4 and 6 in one turn: S of the next task, then the PV of this one.
            take_task<CAUSAL>(sm, a, c, warp, lane, u, nxt);
            uint32_t q_desc = q_desc0 + (u % Q_BUFFERS) * STAGE_STEP;
            uint32_t k_desc = k_desc0 + nxt.stage * STAGE_STEP;
            uint32_t v_desc = v_desc0 + cur.stage * STAGE_STEP;
            asm volatile("" : "+r"(q_desc), "+r"(k_desc), "+r"(v_desc));
            turn_wait(c);
            sa_wgmma_fence();
            issue_qk(sc, q_desc, k_desc);
            sa_wgmma_commit();
            issue_pv_first(o, pa, v_desc);
            sa_wgmma_commit();
            turn_pass(c);
            sa_wgmma_wait<1>(); // S of the next task; its PV partner may still run
            warp_arrive(&sm.q_free[u % Q_BUFFERS], lane);
            // Step 5 of the next task beside step 6 of this one (P stays in pa until the PV ends).
            block_softmax<CAUSAL>(sc, nxt.valid, nxt.lim, lane, nxt.row_max, nxt.row_sum);
        } else {
            uint32_t v_desc = v_desc0 + cur.stage * STAGE_STEP;
            asm volatile("" : "+r"(v_desc));
            turn_wait(c);
            sa_wgmma_fence();
            issue_pv_first(o, pa, v_desc);
            sa_wgmma_commit();
            turn_pass(c);
        }
        sa_wgmma_wait<0>();
        if (cur.release)
            warp_arrive(&sm.kv_free[cur.stage], lane);
        // Step 7 for this task.
        if (cur.live)
            store_partials<F32, CAUSAL>(a, cur, o, c, warp, lane);
        if (!more)
            break;
        pack_p(sc, pa);
        cur = nxt;
    }
    if (c == 0)
        turn_wait(c); // the opening pass of warpgroup 1
}

template <bool F32, bool CAUSAL> int launch_wg(const Args &a, const sa_kv_params *p, int sms, size_t max_tasks)
{
    const sa_shape *s = &p->shape;
    CUtensorMap mk, mv;
    const uint64_t kv_rows = (uint64_t)s->batch * s->heads_kv * s->len_kv;
    int rc;
    if ((rc = sa_tensor_map_bf16_2d(&mk, p->k, kv_rows, HEAD_DIM, TILE, HALF_COLS)) != SA_OK ||
        (rc = sa_tensor_map_bf16_2d(&mv, p->v, kv_rows, HEAD_DIM, TILE, HALF_COLS)) != SA_OK)
        return rc;
    static int smem_set;
    if (!smem_set) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kv_attention_wg<F32, CAUSAL>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)SMEM_BYTES));
        smem_set = 1;
    }
    size_t runs = (max_tasks + RUN_TASKS - 1) / RUN_TASKS;
    const unsigned grid = (unsigned)(runs < (size_t)sms ? (runs ? runs : 1) : (size_t)sms);
    kv_attention_wg<F32, CAUSAL><<<grid, NTHREADS, SMEM_BYTES, kv_stream(p)>>>(mk, mv, a);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

} // namespace

int kv_attend_wgmma(const sa_kv_params *p, const kv_ws *w, int sms)
{
    const sa_shape *s = &p->shape;
    // Q rows are int32 in the row table; K/V rows must fit the tensor map.
    if ((long long)s->batch * s->heads_q * s->len_q >= INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    Args a;
    a.q = p->q;
    a.entries = w->entries;
    a.tasks = w->tasks;
    a.info = w->info;
    a.part_lse = w->part_lse;
    a.part_o = w->part_o;
    a.heads_q = s->heads_q;
    a.heads_kv = s->heads_kv;
    a.group = s->heads_q / s->heads_kv;
    a.len_q = s->len_q;
    a.len_kv = s->len_kv;
    a.blocks = sa_kv_blocks(s);
    a.m = p->lists.max_blocks;
    a.causal = p->causal;
    a.q_off = s->len_kv - s->len_q; // both positive ints: the difference fits
    const bool f32 = p->partial_format == SA_KV_PARTIAL_F32;
    if (p->causal)
        return f32 ? launch_wg<true, true>(a, p, sms, w->max_tasks)
                   : launch_wg<false, true>(a, p, sms, w->max_tasks);
    return f32 ? launch_wg<true, false>(a, p, sms, w->max_tasks)
               : launch_wg<false, false>(a, p, sms, w->max_tasks);
}
