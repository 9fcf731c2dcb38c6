// Stage 17: block-sparse attention forward for Hopper (sm_90a), in the Hopper-native shape: one
// Q tile per CTA split over two consumer warpgroups, softmax overlapped with the tensor core
// inside each warpgroup, and list validation inside the kernel. Diff it against stage 15.
//
// FOCUS
//   Stages 14-16 keep the B200 work unit: each consumer warpgroup owns a whole 128-row Q tile,
//   so with independent lists each warpgroup has its own K/V stream (stage 15's ring ownership)
//   and O alone takes 128 of its 240 registers. That leaves no room for a second score tile in
//   flight, so a warpgroup's softmax can only hide behind the OTHER warpgroup's tensor work
//   (ping-pong turns), and the two streams cost list walking, owner bookkeeping and padding
//   turns on every block (docs/stage15.md: tensor pipe 64% busy against 73% for stage 14, 13%
//   more instructions per block).
//   Here a work item is ONE 128-row Q tile of one head. Consumer warpgroup c takes its rows
//   64c..64c+63: both walk the same list, read the same K/V stage, and one load serves both (the
//   dense case of stage 14's ring, for every list). O of 64 rows is 64 registers, S 64, P 32:
//   room for the score tile of block j to be computed while the PV of block j-1 runs, so each
//   warpgroup's softmax overlaps its own tensor work (FlashAttention-3's intra-warpgroup
//   overlap) as well as the other warpgroup's (the ping-pong turns, kept).
//   Version 4 keeps each warpgroup's 64 Q rows in registers (32 more, 240 still suffice): S =
//   Q K^T reads only K from shared memory, the Q buffer is free as soon as an item starts, so one
//   Q buffer is enough, and its 32 KB pay for a third K/V stage, which hides the latency of the
//   scattered block loads (+5-7% on the study's lists, docs/log/stage17-history.md). Calls with
//   no causal mask and no partial final block run a build of the kernel without step 4's mask
//   test.
//   Version 5 gives the other calls that loop too: the producer issues the blocks of a row that
//   need a mask (a causal diagonal block, the partial final block: one or two per tile) after
//   all the others, and the consumers run the others through the loop without the test and only
//   the last ones through the loop with it (MASK LAST below). Version 6 carries each block's
//   K/V stage and phase to the next block instead of dividing its sequence number by
//   KV_STAGES ahead of the first wait (+1-2%, docs/log/stage17-history.md).
//   Version 7 takes row masks (sa_gpu_attn.row_masks): 128 bits per list entry saying which rows
//   of the tile see the block, so tile lists carry per-query lists exactly (a tile's union, each
//   block masked to the queries that chose it: the KV-centric hybrid's Q-centric pass). Calls
//   with row masks run a third build of the kernel (ROWS) in which every block takes step 4's
//   mask; the other two builds keep their instructions (only shared-memory offsets moved).
//   Version 8 applies the row mask in the softmax instead: a row left out of a block keeps its
//   max and gets -inf for it, so all its P are 0 (4 selects per thread where version 7 wrote -inf
//   into 64 scores), and a ROWS block needs step 4 only when a non-ROWS call would (causal
//   diagonal, partial final block): the others run in the loop without the mask test. The
//   producer copies a block's mask beside its K stage with cp.async, which the stage's k-ready
//   barrier waits for (version 7's producer waited for the load itself), and row-mask calls that
//   need no step-4 mask at all get a fourth build, without the producer's MASK LAST passes.
//   Version 9 is a programmatic dependent launch (sa_pdl.cuh): its CTAs may become resident while
//   the kernel ahead on the stream (a GPU selector's top-k, which lets them in at its start)
//   finishes, and every thread waits for that kernel (sa_pdl_wait) before any global access, so
//   the launch's latency and the prologue hide behind the selector. Version 10 copies a block's
//   row mask with the bulk copy engine on the k-ready barrier's transaction bytes (version 8's
//   cp.async arrival on that barrier was synccheck's "Missing wait"). Version 11 decides step
//   5's rescale per warpgroup (a vote on a named barrier) instead of per warp, so that every warp
//   of the warpgroup reaches the same wgmma.wait_group, as its .aligned form requires (version
//   2's arms broke that rule whenever the warps disagreed). With both, synccheck is clean on
//   every build; the vote costs 0.4-3.4% (docs/stage17.md). Version 12 takes a gate for the
//   KV-centric hybrid (sa_stage17_launch_gated): a device word the kernel reads after its
//   dependent-launch wait, returning at once unless (word != 0) is what the launch wants, so
//   the hybrid queues the build without row masks and the one with them and the GPU runs the
//   one its plan asks for (the first when every planned block serves every row of its tile).
//   Only the builds without step 4's mask take a gate (calls without causal masks and with
//   whole blocks, SA_ERR_UNSUPPORTED otherwise), so the causal builds keep their code.
//
// WHY THE B200 UNIT DOES NOT FIT HOPPER LISTS
//   On the B200 one thread issues every MMA into Tensor Memory; a CTA holding two Q tiles is two
//   independent MMA streams with no register cost. On Hopper a warpgroup issues its own wgmma
//   and holds the accumulators: two tiles per CTA means two streams that each need a full 128-row
//   O in registers, and independent lists make them two K/V streams through one ring. Splitting
//   one tile over the two warpgroups turns every list, independent or not, into one stream, and
//   buys the registers for in-warpgroup overlap. The price: a 128-row tile per CTA instead of
//   two, so K/V is read once per tile rather than once per tile pair (more L2 traffic, not more
//   HBM traffic: the heads of a GQA group run on neighbouring CTAs at the same time).
//
// ASSUMPTIONS (the check refuses anything else before a launch: SA_ERR_UNSUPPORTED, SA_ERR_ARG
//   for a flag not 0 or 1, sa_shape_check's codes for a bad shape)
//   As stage 15: BF16 Q/K/V/O in BHSD layout, head_dim 128, any len_q and len_kv (a partial last
//   Q tile stores only its rows; the partial final KV block's padding columns are masked to
//   -inf), GQA by index, per-head or group-shared lists, counts NULL = max_blocks.
//   Causal (a->causal, docs/api.md): query i sees key j when j <= i + (len_kv - len_q). A block
//   wholly visible to the tile costs nothing; a diagonal block (and the partial final block) is
//   masked per element in step 4 (mask_block); a row that sees no key gives O = 0, LSE = -inf.
//   A listed block wholly after the tile's last visible key is a bad list (SA_ERR_FUTURE_BLOCK)
//   unless a->allow_future_blocks, which loads it and masks it out.
//   Row masks (version 7): row r of the tile sees entry j's block only when bit r of the entry's
//   mask is set (on top of the causal and padding masks); a row that sees no key gives O = 0,
//   LSE = -inf. The masks are not validated: any bits are a valid mask.
//
// VALIDATION INSIDE THE KERNEL (p.check = 1)
//   The producer warp checks each list row before it issues the row's first load: count in
//   [0, max_blocks] (and not 0 unless empty rows are allowed), every index in [0, kv_blocks), no
//   index twice (__match_any_sync within a 32-entry chunk, 32 broadcasts per pair of chunks), and
//   causally no block past the tile's last visible key (unless allowed).
//   A bad row loads nothing: its rows of O and LSE are written as NaN, the code goes to the
//   verdict word with atomicMin (the most negative code wins, as in the separate check kernel),
//   and every other row is computed as usual. So no host synchronization is needed and the call
//   can be captured in a CUDA graph (sa_gpu_verdict in sparseattn.h). Every list row is walked
//   by at least one item (each row serves the heads of its list head), so every row is checked.
//   With p.check = 0 counts are clamped to [0, max_blocks] (no read past a row) and an index out
//   of range makes TMA read other rows of K/V or zero-fill: wrong numbers, never a bad access.
//
// WORK
//   item = ((b * Hkv + g) * q_tiles + t) * group + h: Q tile t (causal: q_tiles - 1 - t, the
//   longest items first) of head g * group + h. The head index is innermost, so the heads of a
//   GQA group run on neighbouring CTAs at the same time and read the same blocks of the same KV
//   head from L2 when their lists are shared. CTA b takes items b, b + grid, ... (grid = #SMs,
//   or the items if fewer); its loads continue from one item into the next.
//   Causal calls (version 3) are scheduled dynamically instead: the producer fetches each next
//   item from a work counter (atomicAdd; the launch's last fetch, number items + grid - 1,
//   resets it to 0 for the next launch on the stream), in chunks of CHUNK_HEADS heads (whole
//   GQA groups), tile-major inside a chunk with the longest tiles first, so a CTA that drew short
//   items takes more and the triangle's tail is short items on every SM. The static order gave
//   89% / 93% / 95% balance on the causal dense shapes (4K / 8K / 16K, a simulation of the item
//   lengths); the dynamic order measured 8-10% faster there. Without a counter (a stream being
//   captured into a graph, more than 8 streams in one thread, or no device memory for it:
//   sa_sched_counter) causal calls take the static order.
//
// ITEM START (consumer c): wait q-ready; read the record; load rows 64c..64c+63 of Q into the
//   A fragments of the 8 QK k-steps (ldmatrix from the swizzled tile); arrive q-free.
//
// MASK LAST (version 5, the kernel built with MASKS)
//   The producer counts the row's blocks that step 4 must mask (needs_mask: the partial final
//   block, or a block that some row of the tile sees only in part) and writes the number of the
//   others into the record (unmasked). It then walks the row twice: pass 0 issues the blocks
//   without a mask in list order, pass 1 the masked ones. The
//   producer never reads the row masks to sort the blocks: a version 7 draft that did (a block
//   whose mask has every row went first, unmasked) hung at scale with 16-entry rows, for a cause
//   not found (docs/log/stage17-history.md, version 7). The consumers run blocks
//   1..unmasked-1 through a copy of the loop without the mask test (the loop of the kernel
//   without MASKS), then the rest through the copy with it; block 0 is masked when unmasked is 0.
//   Since version 8 row masks do not enter this: both loops apply them (step 4), so the producer
//   sorts a ROWS row exactly as it sorts a row without masks, without reading the masks.
//   The order of a row's blocks does not change the result beyond rounding, and it is the same
//   in every call, so repeated calls still agree bit for bit.
//
// ROLES (384 threads = 3 warpgroups)
//   WG0  producer. setmaxnreg.dec to 24. Warp 0 walks (and checks) the lists, lane 0 issues the
//        Q and K/V copies; warps 1-3 leave.
//   WG1  consumer of rows 0..63 of the item's tile (c = 0). setmaxnreg.inc to 240.
//   WG2  consumer of rows 64..127 (c = 1).
//
// DATAFLOW PER KV BLOCK j >= 1 (consumer c; stage s = n % KV_STAGES for the CTA's n-th block)
//   1. wait k-ready[s] (ROWS: read the warp's word of the block's row mask, beside the stage);
//      wait v-ready of block j-1's stage; wait turn[c].
//   2. S = Q_c K_j^T (8 wgmma, A = Q from registers, commit); O += P_{j-1} V_{j-1} (8 wgmma,
//      A = P from registers, commit). pass turn.
//   3. wait for S only (wgmma.wait_group 1).
//   4. in the loop of the masked blocks (MASK LAST), read the block's valid keys and index that
//      the producer left beside stage s, and mask the padding columns if it is the partial
//      final block, the columns past each row's last visible key if it is a causal diagonal
//      block; arrive k-free[s]; row max (ROWS, both loops: a row the word of step 1 leaves out
//      keeps its max); lazy rescaling as stage 14 (a new max is adopted only when it exceeds
//      the running one by more than RESCALE_THRESHOLD);
//      P = exp2(S * scale * log2e - max) computed in place in S's registers (-inf in place of
//      the max of a left-out row: P = 0), row sums updated. All of it while step 2's PV runs.
//   5. wait for the PV (wait_group 0, one copy in each arm of the rescale branch: pv_wait);
//      rescale O if a row of this warp adopted a new max; pack P to BF16 (the A operand of the
//      next PV); arrive v-free of block j-1's stage.
//   Block 0 has a turn with S alone and its softmax; the item ends with a turn holding only the
//   last PV. Epilogue as stage 14 for 64 rows: reduce the row sums over the quad, O /= sum, 16-byte
//   stores after a quad transpose, LSE = (max + log2(sum)) ln 2.
//
// BARRIER PROTOCOL
//   | barrier        | kind      | direction               | arrivals              | meaning
//   | q-ready[b]     | mbarrier  | producer -> consumers   | 1 (+ 32 KB TMA bytes) | Q landed in buffer b; its item record (item, count, code, unmasked) is written
//   | q-free[b]      | mbarrier  | consumers -> producer   | 8 (4 warps x 2 WGs)   | Q of buffer b in registers, record read
//   | k-ready[s]     | mbarrier  | producer -> consumers   | 1 + 32 KB TMA bytes   | K in stage s landed; its valid-key count, block and row mask written
//   |                |           |                         | (+16 B, ROWS)         | (ROWS: the mask's bulk copy counts towards the same bytes)
//   | v-ready[s]     | mbarrier  | producer -> consumers   | 1 + 32 KB TMA bytes   | V in stage s landed
//   | k-free[s]      | mbarrier  | consumers -> producer   | 8                     | both halves' QK on K[s] done, its valid-key count, block and row mask read
//   | v-free[s]      | mbarrier  | consumers -> producer   | 8                     | both halves' PV on V[s] done
//   | turn[c]        | named bar | consumer 1-c -> c       | 256 (arrive + sync)   | c may issue its next batch
//   | vote[c]        | named bar | within consumer c       | 128 (bar.red.or)      | version 11: any row of warpgroup c moved (step 5 rescales)
//   The CTA's u-th item uses Q buffer b = u % Q_BUFFERS. With Q in registers (version 4) one
//   buffer suffices: it is free once an item has started, so the producer loads the next item's
//   Q and writes its record while this item runs. (With Q read from shared memory, versions 1-3
//   took two buffers; one would make every item wait for a Q load issued after the previous
//   item's last QK.)
//   The consumers learn each item from its record; a record with item NO_ITEM ends the CTA (the
//   producer writes it after its last item and leaves; nobody releases it).
//   Every wait sleeps until its phase completes (sa_mbar_wait_sleep, version 3): with a bare
//   try_wait the producer spun about 100 times per block on its free slots (ncu).
//   Phase parity = use count & 1. An empty (or invalid) row gets a q-ready arrival without a copy
//   and no K/V loads; both consumers walk the same row, so they take the same turns (none for an
//   empty row) and the strict alternation of stage 14 holds with no padding turns.
//   No deadlock: the producer issues K_0, V_0, K_1, V_1, ...; a consumer needs K_j then V_{j-1}
//   and releases K_j after step 3 and V_{j-1} after step 5 of the same block, so the loads KV_STAGES
//   blocks back are released before any turn that waits for a later load (KV_STAGES >= 2).
//
// SHARED MEMORY: Q 1 x 32 KB, K and V KV_STAGES x 32 KB each (3 stages: 224 KB in all, the
//   most that fits below the 227 KB limit), barriers, an item record per Q buffer and one
//   valid-key count, block index and row mask per K stage.
//
// B200 -> HOPPER MAPPING
//   | B200 (original)                         | Hopper (this file)
//   | two Q tiles per CTA, one per MMA stream | one Q tile per CTA, 64 rows per consumer warpgroup
//   | independent lists: two K/V streams      | one stream for every list
//   | S in TMEM, softmax beside the MMA       | S of block j in flight while PV of j-1 runs, in registers
//   | a separate check kernel before the call | the check inside the producer warp, verdict in device memory
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh"
#include "sa_mma_sync.cuh"
#include "sa_pdl.cuh"
#include "sa_timeline.cuh"
#include "sa_stage14.cuh"
#include "sa_stage15.cuh"
#include "sa_stage_entries.h"
#include "sa_tma.cuh"
#include "sa_verdict.h"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"
#include "sparseattn.h"

#ifndef SA_STAGE17_KV_STAGES
#define SA_STAGE17_KV_STAGES 3 // a compile-time variant for A/B runs (scripts/device-ab.sh)
#endif
// Q buffers: with Q in registers (version 4) 1 is enough, the buffer is free once an item has
// started. With Q read from shared memory 2 let the producer load the next item's Q while this
// item runs, and 1 waits for the item's last QK. A/B variant.
#ifndef SA_STAGE17_Q_BUFFERS
#define SA_STAGE17_Q_BUFFERS 1
#endif
// 1: step 5's PV wait stands in each arm of the rescale branch (pv_wait); 0: one wait after the
// softmax, which ptxas hoists above it (the first version of this stage); 2: in each arm of a
// branch on a value every thread holds and ptxas cannot see. A/B variant. Version 2's arms (1)
// break wgmma.wait_group's .aligned rule whenever the warps of a warpgroup disagree on the
// rescale (its condition is only warp-uniform): compute-sanitizer's synccheck reports
// "Mismatching warpgroup instruction pc between warps" and stops the kernel. 2 keeps every
// warp at one wait (synccheck clean) but measured 3-4% slower (docs/stage17.md, "Synccheck").
// 3 (version 11, the default): version 2's two arms on a warpgroup-wide vote of the rescale
// (warp_group_any: one bar.red per block), so every warp of the warpgroup takes the same arm; a
// warp whose rows did not move rescales by factor 1, which is exact. Synccheck clean, 0.4-3.4%
// slower than 1 on the study's lists (session 23).
#ifndef SA_STAGE17_ARM_WAIT
#define SA_STAGE17_ARM_WAIT 3
#endif
// Which launches take the dynamic schedule (WORK, version 3): 0 none, 1 causal ones, 2 all.
// A/B variant.
#ifndef SA_STAGE17_DYNAMIC
#define SA_STAGE17_DYNAMIC 1
#endif
// 1: every wait of this stage sleeps until its phase completes (sa_mbar_wait_sleep); 0: the
// bare try_wait loop of stages 14-16. A/B variant.
#ifndef SA_STAGE17_SLEEP_WAIT
#define SA_STAGE17_SLEEP_WAIT 1
#endif
// 1: each consumer warpgroup loads its 64 Q rows into registers (ldmatrix) when an item starts
// and releases the Q buffer at once; S = Q K^T then reads only K from shared memory (version 4).
// 0: Q is read from shared memory by every QK wgmma (versions 1-3; build it with Q_BUFFERS 2
// and KV_STAGES 2, as it was). A/B variant.
#ifndef SA_STAGE17_Q_IN_REGS
#define SA_STAGE17_Q_IN_REGS 1
#endif
// 1: a kernel built without the step-4 mask for calls that never need one (non-causal, len_kv a
// multiple of 128); 0: one kernel that tests every block (versions 1-4). A/B variant.
#ifndef SA_STAGE17_MASK_SPECIALIZE
#define SA_STAGE17_MASK_SPECIALIZE 1
#endif
// 1: in the kernel with masks, the producer issues a row's blocks that step 4 must mask (the
// causal diagonal, the partial final block) after all the others, and the consumers run those
// others through the loop without the mask test (version 5); 0: every block in list order
// through the loop with the test (version 4). A/B variant.
#ifndef SA_STAGE17_MASK_LAST
#define SA_STAGE17_MASK_LAST 1
#endif
#ifndef SA_STAGE17_PINGPONG
#define SA_STAGE17_PINGPONG 1
#endif
// 1: the loop carries the K/V stage and phase of its block from one block to the next (version
// 6); 0: it derives them as n % KV_STAGES and n / KV_STAGES, a multiply-high chain ahead of
// every wait (versions 1-5). A/B variant.
#ifndef SA_STAGE17_STAGE_CARRY
#define SA_STAGE17_STAGE_CARRY 1
#endif
// SA_STAGE17_CEILING=1 builds a timing variant, not attention: the softmax is replaced by a plain
// scaling of S (no max, no exp), so the run shows what the schedule, the tensor core and the
// loads allow without the softmax's work (docs/stage17.md). Its output is wrong by design.
#ifndef SA_STAGE17_CEILING
#define SA_STAGE17_CEILING 0
#endif

namespace {

constexpr int KV_STAGES = SA_STAGE17_KV_STAGES;
constexpr bool Q_IN_REGS = SA_STAGE17_Q_IN_REGS != 0;
constexpr bool MASK_LAST = SA_STAGE17_MASK_LAST != 0;
constexpr int Q_BUFFERS = SA_STAGE17_Q_BUFFERS;
constexpr bool PINGPONG = SA_STAGE17_PINGPONG != 0; // turns between the consumer warpgroups
constexpr int HALVES = 2;                           // consumer warpgroups = 64-row halves of a tile
constexpr int NTHREADS = 128 * (1 + HALVES);
constexpr int FREE_ARRIVALS = 4 * HALVES; // one per consumer warp
// Dynamic order: heads per chunk (rounded up to whole GQA groups). Within a chunk the tiles go
// longest first; a chunk's K/V (a few MB) stays in L2 while its tiles run.
constexpr int CHUNK_HEADS = 8;
// The item record's value that tells the consumers the CTA has no more items.
constexpr int NO_ITEM = -1;
// A row whose list fails the check gets NaN (BF16 0x7FC0, FP32 quiet NaN) in O and LSE.
constexpr uint32_t BF16X2_NAN = 0x7FC07FC0u;

struct alignas(1024) Smem {
    uint8_t q[Q_BUFFERS][TILE_BYTES];
    uint8_t k[KV_STAGES][TILE_BYTES];
    uint8_t v[KV_STAGES][TILE_BYTES];
    uint64_t q_ready[Q_BUFFERS], q_free[Q_BUFFERS];
    uint64_t k_ready[KV_STAGES], v_ready[KV_STAGES], k_free[KV_STAGES], v_free[KV_STAGES];
    int32_t k_valid[KV_STAGES]; // valid keys of the block in K stage s (128 unless partial)
    int32_t k_blk[KV_STAGES];   // the block in K stage s (causal_diag needs it)
    alignas(16) int32_t k_rows[KV_STAGES][4]; // the rows of the tile that see it (row masks)
    // The item record, beside its Q buffer: the item, its count, its check's code, and how many
    // of its blocks come first that need no mask (MASK_LAST; 0 otherwise).
    int32_t item[Q_BUFFERS], count[Q_BUFFERS], error[Q_BUFFERS], unmasked[Q_BUFFERS];
};
constexpr size_t SMEM_BYTES = sizeof(Smem) + 1024; // + room to align the dynamic base
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 per-block limit");

struct Params {
    uint16_t *o;
    float *lse;
    const int32_t *indices, *counts; // device lists; counts may be NULL (max_blocks per row)
    int group;                       // heads_q / heads_kv
    int list_div;                    // heads_q / list_heads
    int max_blocks;
    int len_q, len_kv;
    int q_tiles, kv_blocks;
    int tail;  // valid keys of the last KV block, 1..128
    int items; // B * Hq * q_tiles
    int check; // 1: check each row in the kernel (VALIDATION INSIDE THE KERNEL)
    int causal, allow_future;
    int q_off; // len_kv - len_q: query i sees key j when j <= i + q_off (causal)
    int allow_empty;
    int *verdict; // where a bad row's code goes (atomicMin); non-NULL when check = 1
    int *sched;   // the work counter (dynamic schedule), NULL: static (WORK)
    int chunk;    // heads per chunk of the dynamic order, a multiple of group
    int chunk_items, heads; // chunk * q_tiles; B * Hq
    const uint4 *row_masks;  // version 7: one 128-bit row mask per list entry, NULL: every row
};

// Every mbarrier wait of this stage (SA_STAGE17_SLEEP_WAIT).
__device__ __forceinline__ void wait_phase(uint64_t *bar, uint32_t parity)
{
    if (SA_STAGE17_SLEEP_WAIT)
        sa_mbar_wait_sleep(bar, parity);
    else
        sa_mbar_wait(bar, parity);
}

// Where an item lives: the flattened (batch, head_q) index and the Q tile.
struct Item {
    int bh, tile;
};
__device__ __forceinline__ Item item_at(const Params &p, int item)
{
    const unsigned it = item, group = p.group, q_tiles = p.q_tiles; // all >= 0
    if (p.sched) {
        // Dynamic order: chunks of p.chunk heads (the last one may be smaller); inside a chunk
        // tile-major with the head innermost, the tiles longest first when causal.
        const unsigned k = it / (unsigned)p.chunk_items, h0 = k * p.chunk;
        const unsigned width = min((unsigned)p.chunk, p.heads - h0);
        const unsigned r = it - k * p.chunk_items;
        const int t = (int)(r / width);
        return {(int)(h0 + r % width), p.causal ? p.q_tiles - 1 - t : t};
    }
    const unsigned rest = it / group;
    // (b * Hkv + g) * group + h = b * Hq + g * group + h. Causally the last tiles see the most
    // blocks: they go first, so the short items fill the end of the persistent schedule.
    const int t = (int)(rest % q_tiles);
    return {(int)((rest / q_tiles) * group + it % group), p.causal ? p.q_tiles - 1 - t : t};
}

// The list row of an item and its raw count (unchecked).
__device__ __forceinline__ const int32_t *row_of(const Params &p, Item it, int *raw_count)
{
    const int row = (int)((unsigned)it.bh / (unsigned)p.list_div) * p.q_tiles + it.tile;
    *raw_count = p.counts ? p.counts[row] : p.max_blocks;
    return p.indices + (size_t)row * p.max_blocks;
}

// Causal masking: DIAG_ALL, diag_of and mask_block (sa_stage15.cuh) for this stage's Params.
__device__ __forceinline__ int causal_diag(const Params &p, int tile, int blk)
{
    return diag_of(p.causal, p.q_off, tile, blk);
}

// The last block a tile can see (causal): its last valid row's last visible key, -1 when that row
// sees none. Blocks past it are "future" blocks.
// In 32 bits: the last row is below len_q and the key in [-len_q, len_kv - 1].
__device__ __forceinline__ int last_visible_block(const Params &p, int tile)
{
    const int key = min(tile * TILE + TILE - 1, p.len_q - 1) + p.q_off;
    return key < 0 ? -1 : key / TILE;
}

// Whether step 4 must mask block blk for some row of the tile: the partial final block, or a
// block that some row sees only in part (causal). Row masks (ROWS) need no step-4 mask: the
// softmax leaves the rows out (version 8), in both loops. Any int is safe here (unchecked lists).
__device__ __forceinline__ bool needs_mask(const Params &p, int tile, int blk)
{
    return (blk == p.kv_blocks - 1 && p.tail < TILE) || causal_diag(p, tile, blk) < DIAG_ALL;
}


// The key by which duplicates are found: the block index when it is in range, else a negative
// value unique to the slot (out-of-range entries are reported as SA_ERR_INDEX, never as twins).
__device__ __forceinline__ int dup_key(const int32_t *row, int j, int count, int kv_blocks,
                                       bool *bad_index)
{
    if (j >= count)
        return -1 - j;
    const int b = row[j];
    if (b < 0 || b >= kv_blocks) {
        *bad_index = true;
        return -1 - j;
    }
    return b;
}

// The check of one row by the producer warp (every lane returns the row's code): the codes and
// their precedence of the separate check kernel (sa_validate.cu): a bad count hides the entries;
// a duplicate outranks an index out of range (the most negative code of the row wins).
// Causally, a block in range but past the last block the tile can see is SA_ERR_FUTURE_BLOCK
// (unless allowed), which as the most negative code of the entries outranks a duplicate and an
// index out of range; its pass over the row is separate, so the duplicate pass keeps within the
// producer's 24 registers. A causal row that sees no key may be empty even when empty rows are
// not allowed (it has nothing to list), as in the host validator.
__device__ __forceinline__ int check_row(const Params &p, const int32_t *row, int raw, int lane,
                                         int tile)
{
    const int last_blk = p.causal ? last_visible_block(p, tile) : INT32_MAX;
    if (raw < 0 || raw > p.max_blocks)
        return SA_ERR_COUNT;
    if (raw == 0)
        return p.allow_empty || last_blk < 0 ? SA_OK : SA_ERR_EMPTY_ROW;
    if (!p.allow_future && last_blk < p.kv_blocks - 1) {
        bool future = false;
#pragma unroll 1
        for (int j = lane; j < raw; j += 32)
            future |= row[j] > last_blk && row[j] < p.kv_blocks;
        if (__any_sync(0xffffffffu, future))
            return SA_ERR_FUTURE_BLOCK;
    }
    bool bad_index = false, dup = false;
#pragma unroll 1
    for (int j0 = 0; j0 < raw; j0 += 32) {
        const int a = dup_key(row, j0 + lane, raw, p.kv_blocks, &bad_index);
        dup |= __popc(__match_any_sync(0xffffffffu, a)) > 1;
#pragma unroll 1
        for (int j1 = j0 + 32; j1 < raw; j1 += 32) {
            bool ignored = false; // chunk j1's range errors are counted in its own pass
            const int b = dup_key(row, j1 + lane, raw, p.kv_blocks, &ignored);
#pragma unroll 1
            for (int l = 0; l < 32; l++)
                dup |= b == __shfl_sync(0xffffffffu, a, l);
        }
    }
    if (__any_sync(0xffffffffu, dup))
        return SA_ERR_DUPLICATE;
    return __any_sync(0xffffffffu, bad_index) ? SA_ERR_INDEX : SA_OK;
}

// Step 4 of the dataflow: row max and the lazy rescaling decision (softmax_row_max), then
// P = exp2(S * scale * log2e - max) in place of S, with O's rescale deferred: O is still being
// accumulated by the PV in flight. Returns whether any row of this warp adopted a new max (a
// warp-uniform answer, so the rescale is skipped by the whole warp together).
// ROWS (version 8, row masks): bit i of `rows` clear means this thread's row i does not see the
// block: its max stays, and -inf in place of its max makes every P of the row 0 (2 selects per
// row where version 7 wrote -inf into all 32 of the row's scores). That -inf is hidden from the
// compiler: knowing it, ptxas branched around each pair of exponentials (32 divergent branches
// per block, the ROWS build 25-45% slower on the H200).
template <bool ROWS>
__device__ __forceinline__ bool softmax_in_place(float (&sc)[64], float (&row_max)[2],
                                                 float (&row_sum)[2], float (&factor)[2],
                                                 uint32_t rows)
{
    if (SA_STAGE17_CEILING) {
#pragma unroll
        for (int r = 0; r < 64; r++)
            sc[r] *= 1.f / 64;
        row_max[0] = row_max[1] = 0.f;
        row_sum[0] = row_sum[1] = 1.f;
        factor[0] = factor[1] = 1.f;
        return false;
    }
    const bool need_any = softmax_row_max(sc, row_max, row_sum, factor, ROWS ? rows : 3u);
    // A row that has seen no key yet (causal) keeps max -inf: its P must be 0, not NaN.
    // ROWS: a row left out of the block gets -inf: exp2(-inf) = 0 for every score.
    float row_neg[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (ROWS) {
            row_neg[i] = !((rows >> i) & 1u)           ? -CUDART_INF_F
                         : row_max[i] == -CUDART_INF_F ? 0.f
                                                       : -row_max[i];
            asm volatile("" : "+f"(row_neg[i]));
        }
    }
    float part[2] = {0.f, 0.f}; // this block's row sums, added to the (rescaled) running ones
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float neg_max =
                ROWS ? row_neg[i] : row_max[i] == -CUDART_INF_F ? 0.f : -row_max[i];
            const float p0 = fast_exp2(fmaf(sc[4 * jj + 2 * i], SCORE_TO_LOG2, neg_max));
            const float p1 = fast_exp2(fmaf(sc[4 * jj + 2 * i + 1], SCORE_TO_LOG2, neg_max));
            part[i] += p0 + p1;
            sc[4 * jj + 2 * i] = p0;
            sc[4 * jj + 2 * i + 1] = p1;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
        row_sum[i] += part[i];
    return __any_sync(0xffffffffu, need_any);
}

// Step 5: O *= factor per row (only when a row of the warp moved), P to BF16 A fragments.
__device__ __forceinline__ void rescale_and_pack(bool rescale, const float (&factor)[2],
                                                 float (&o)[64], const float (&sc)[64],
                                                 uint32_t (&pa)[32])
{
    if (rescale) {
#pragma unroll
        for (int jj = 0; jj < 16; jj++) {
            o[4 * jj + 0] *= factor[0];
            o[4 * jj + 1] *= factor[0];
            o[4 * jj + 2] *= factor[1];
            o[4 * jj + 3] *= factor[1];
        }
    }
#pragma unroll
    for (int jj = 0; jj < 16; jj++)
#pragma unroll
        for (int i = 0; i < 2; i++)
            pa[(jj / 2) * 4 + (jj % 2) * 2 + i] = pack_bf16(sc[4 * jj + 2 * i], sc[4 * jj + 2 * i + 1]);
}

// Step 5's wait for the PV in flight (wgmma.wait_group 0), one copy per arm of the rescale branch.
// A single wait after step 4 is scheduled by ptxas at the top of step 4's basic block, as it
// would schedule a load (the SASS shows WARPGROUP.DEPBAR before the first MUFU.EX2): the softmax
// then waits for this warpgroup's PV and the overlap of step 4 is lost. In the arms of a branch
// that follows the softmax the wait cannot move above it. The arms' asm strings differ so that
// the compiler does not merge the two copies back into one before the branch.
template <int ARM> __device__ __forceinline__ void pv_wait()
{
    if (ARM == 1)
        asm volatile("wgmma.wait_group.sync.aligned 0; // rescale arm" ::: "memory");
    else
        asm volatile("wgmma.wait_group.sync.aligned 0; // no-rescale arm" ::: "memory");
}

// Version 11: whether any thread of consumer warpgroup c holds `pred`, in every thread of it: a
// reduction on named barrier VOTE_BARRIER0 + c over the warpgroup's 128 threads (barriers 1 and 2
// are the ping-pong turns). The id is a template argument (sa_warpgroup.cuh says why).
constexpr int VOTE_BARRIER0 = TURN_BARRIER0 + 2;
template <int ID> __device__ __forceinline__ bool bar_red_or(bool pred)
{
    uint32_t r;
    asm volatile("{\n\t.reg .pred p, q;\n\t"
                 "setp.ne.u32 p, %1, 0;\n\t"
                 "bar.red.or.pred q, %2, 128, p;\n\t"
                 "selp.u32 %0, 1, 0, q;\n\t}"
                 : "=r"(r)
                 : "r"((uint32_t)pred), "n"(ID)
                 : "memory");
    return r != 0;
}
__device__ __forceinline__ bool warp_group_any(int c, bool pred)
{
    return c == 0 ? bar_red_or<VOTE_BARRIER0>(pred) : bar_red_or<VOTE_BARRIER0 + 1>(pred);
}

// A word the producer left in shared memory, read by lane 0 alone and broadcast: the lane that
// later releases the word (warp_arrive) is then the one that read it, so the release orders the
// read for compute-sanitizer's racecheck as well as for the hardware.
__device__ __forceinline__ int read_lane0(const int32_t *word, int lane)
{
    int v = 0;
    if (lane == 0)
        v = *reinterpret_cast<const volatile int32_t *>(word);
    return __shfl_sync(0xffffffffu, v, 0);
}

// Version 10: the row mask of the list entry at `entry` (16 bytes) into K stage s's record by the
// bulk copy engine, on the stage's k-ready barrier beside K's tensor copies: the caller's
// expect_tx counts its bytes (ROW_MASK_BYTES). Version 8 used cp.async with
// cp.async.mbarrier.arrive (one more pending arrival on that barrier), which synccheck reported
// as "Missing wait" at the producer's arrival. Lane 0 of the producer, after its expect_tx.
constexpr uint32_t ROW_MASK_BYTES = 16;
__device__ __forceinline__ void load_rows_async(Smem &sm, int s, const Params &p,
                                                const int32_t *entry)
{
    sa_bulk_load(sm.k_rows[s], p.row_masks + (entry - p.indices), ROW_MASK_BYTES, &sm.k_ready[s]);
}
// This warp's word of the row mask in K stage s's record (its 16 rows are bits 16 (warp % 2) ..
// +15 of word 2c + warp / 2), read once the stage is ready.
__device__ __forceinline__ uint32_t stage_row_word(const Smem &sm, int s, int c, int warp, int lane)
{
    return (uint32_t)read_lane0(&sm.k_rows[s][2 * c + warp / 2], lane);
}
// This thread's two rows (lane / 4 and lane / 4 + 8 of its warp's 16) in that word: bit i set when
// row i sees the block (softmax_in_place).
__device__ __forceinline__ uint32_t rows_in_word(uint32_t w, int warp, int lane)
{
    w >>= 16 * (warp % 2) + lane / 4;
    return (w & 1u) | ((w >> 7) & 2u);
}

// Version 4: S = Q K^T with Q from registers; the k-steps of K as in issue_qk.
__device__ __forceinline__ void issue_qk_rs(float (&sc)[64], const uint32_t (&qa)[32], uint32_t k_lo)
{
    {
        const uint32_t a[4] = {qa[0], qa[1], qa[2], qa[3]};
        sa_wgmma_m64n128k16_rs_zero(sc, a, sa_desc_join(k_lo, DESC_HI));
    }
#pragma unroll
    for (int kk = 1; kk < 8; kk++) {
        const uint32_t off = ((kk / 4) * HALF_BYTES + (kk % 4) * 32) >> 4;
        const uint32_t a[4] = {qa[4 * kk], qa[4 * kk + 1], qa[4 * kk + 2], qa[4 * kk + 3]};
        sa_wgmma_m64n128k16_rs<0>(sc, a, sa_desc_join(k_lo + off, DESC_HI), 1);
    }
}

// S of the next block: Q from registers (version 4) or from shared memory.
__device__ __forceinline__ void issue_s(float (&sc)[64], const uint32_t (&qa)[32], uint32_t q_lo,
                                        uint32_t k_lo)
{
    if (Q_IN_REGS)
        issue_qk_rs(sc, qa, k_lo);
    else
        issue_qk(sc, q_lo, k_lo);
}

__device__ __forceinline__ void turn_begin(int c)
{
    if (PINGPONG)
        turn_wait(c);
}
__device__ __forceinline__ void turn_end(int c)
{
    if (PINGPONG)
        turn_pass(c);
}

// One block's K and V into stage kv_n % KV_STAGES (lane 0 of the producer warp): wait until both
// halves have released the stage, leave the block's valid keys, index and row mask (of the list
// entry at `entry`) beside it for step 4's mask (only the kernel with masks reads them), issue
// the copies.
template <bool MASKS, bool ROWS>
__device__ __forceinline__ void load_block(Smem &sm, const CUtensorMap *map_k,
                                           const CUtensorMap *map_v, const Params &p,
                                           uint32_t kv_n, int kv_row0, int blk,
                                           const int32_t *entry)
{
    const int s = kv_n % KV_STAGES;
    const uint32_t par = ((kv_n / KV_STAGES) & 1) ^ 1;
    const int krow = kv_row0 + blk * TILE;
    wait_phase(&sm.k_free[s], par);
    if (MASKS) {
        sm.k_valid[s] = blk == p.kv_blocks - 1 ? p.tail : TILE;
        sm.k_blk[s] = blk;
    }
    sa_mbar_arrive_expect_tx(&sm.k_ready[s], TILE_BYTES + (ROWS ? ROW_MASK_BYTES : 0u));
    if (ROWS)
        load_rows_async(sm, s, p, entry);
    sa_tma_load_2d(sm.k[s], map_k, &sm.k_ready[s], 0, krow);
    sa_tma_load_2d(sm.k[s] + HALF_BYTES, map_k, &sm.k_ready[s], HALF_COLS, krow);
    wait_phase(&sm.v_free[s], par);
    sa_mbar_arrive_expect_tx(&sm.v_ready[s], TILE_BYTES);
    sa_tma_load_2d(sm.v[s], map_v, &sm.v_ready[s], 0, krow);
    sa_tma_load_2d(sm.v[s] + HALF_BYTES, map_v, &sm.v_ready[s], HALF_COLS, krow);
}

// Which loop of the consumer a block runs in: with step 4's mask test (true) or without (false).
template <bool M> struct MaskTag {
    static constexpr bool value = M;
};

// MASKS = false: the call has no causal mask and no partial final block, so no block needs step
// 4's mask: the test, the reads of the stage's valid-key count and block and the branch around
// the mask leave the loop. ROWS (version 7): the call has row masks; kernels of their own, so
// that the others keep their code (the producer's registers are short, and the consumers of the
// others read no row mask). Version 7 had only <true, true>; version 8 adds <false, true>, which
// spares whole-block calls without causal masks (the hybrid's) the producer's MASK LAST passes.
template <bool MASKS, bool ROWS>
__global__ void __launch_bounds__(NTHREADS, 1)
    split_tile_kernel(const __grid_constant__ CUtensorMap map_q,
                      const __grid_constant__ CUtensorMap map_k,
                      const __grid_constant__ CUtensorMap map_v, const Params p,
                      const int *gate, int gate_want)
{
    extern __shared__ uint8_t smem_raw[];
    // The dynamic base is only 16-byte aligned; the swizzle atoms need 1024.
    const uint32_t pad = (1024 - (sa_smem_addr(smem_raw) & 1023)) & 1023;
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw + pad);

    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        SA_TL_START(0);
        for (int b = 0; b < Q_BUFFERS; b++) {
            sa_mbar_init(&sm.q_ready[b], 1);
            sa_mbar_init(&sm.q_free[b], FREE_ARRIVALS);
        }
        for (int s = 0; s < KV_STAGES; s++) {
            sa_mbar_init(&sm.k_ready[s], 1);
            sa_mbar_init(&sm.v_ready[s], 1);
            sa_mbar_init(&sm.k_free[s], FREE_ARRIVALS);
            sa_mbar_init(&sm.v_free[s], FREE_ARRIVALS);
        }
        sa_mbar_fence_init();
    }
    // Version 9: the kernel ahead (it may have written the lists, Q, K or V, or still read O) has
    // finished and its writes are visible. Every thread waits, the consumers too (they write O
    // and read row masks), so no access depends on the ordering through the producer.
    sa_pdl_wait();
    if (threadIdx.x == 0)
        SA_TL_WAITED(0);
    // Version 12: a gated launch the plan does not want ends here, every thread alike, having
    // touched nothing (O, LSE and the work counter are the other launch's). The gate is a
    // kernel argument of its own, not a field of Params, and only the builds without step 4's
    // mask test it (the hybrid's whole-block calls): both ways the causal builds' code stays as
    // it was (a larger Params moved ptxas's spills of the causal build from 28 to 44 bytes).
    if constexpr (!MASKS)
        if (gate && (*gate != 0) != (gate_want != 0))
            return;
    __syncthreads(); // the last CTA-wide barrier: after this the roles never meet again

    if (wg == 0) {
        // ------------------------------------------------------------ producer
        sa_setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x >= 32)
            return;
        const int lane = threadIdx.x;
        if (lane == 0) {
            sa_tma_prefetch_map(&map_q);
            sa_tma_prefetch_map(&map_k);
            sa_tma_prefetch_map(&map_v);
        }
        uint32_t q_uses = 0, kv_n = 0;
        for (int next = blockIdx.x;; next += grid_size()) {
            int item = next;
            if (p.sched) {
                // One fetch per item and one that fails per CTA: items + grid fetches in all.
                // The last of them is the launch's last use of the counter: it resets it.
                if (lane == 0) {
                    item = atomicAdd(p.sched, 1);
                    if (item == p.items + (int)gridDim.x - 1)
                        atomicExch(p.sched, 0);
                }
                item = __shfl_sync(0xffffffffu, item, 0);
            }
            if (item >= p.items) {
                // The end record: consumers leave when they read it.
                const int qb = q_uses % Q_BUFFERS;
                wait_phase(&sm.q_free[qb], ((q_uses / Q_BUFFERS) & 1) ^ 1);
                if (lane == 0) {
                    sm.item[qb] = NO_ITEM;
                    sa_mbar_arrive(&sm.q_ready[qb]);
                }
                break;
            }
            const Item it = item_at(p, item);
            int raw;
            const int32_t *row = row_of(p, it, &raw);
            const int err = p.check ? check_row(p, row, raw, lane, it.tile) : SA_OK;
            const int count = err ? 0 : min(max(raw, 0), p.max_blocks);
            if (err && lane == 0)
                atomicMin(p.verdict, err);
            // MASK_LAST: the blocks step 4 must mask are issued after the others (two passes over
            // the row below), so the consumers learn here how many come first without a mask.
            int masked = 0;
            if (MASKS && MASK_LAST) {
#pragma unroll 1
                for (int j0 = 0; j0 < count; j0 += 32)
                    masked += __popc(__ballot_sync(
                        0xffffffffu, j0 + lane < count &&
                                         needs_mask(p, it.tile, row[j0 + lane])));
            }
            // The item's Q buffer and record are free again (its previous user's last QK is done).
            const int qb = q_uses % Q_BUFFERS;
            wait_phase(&sm.q_free[qb], ((q_uses / Q_BUFFERS) & 1) ^ 1);
            if (lane == 0) {
                sm.item[qb] = item;
                sm.count[qb] = count;
                sm.error[qb] = err;
                sm.unmasked[qb] = MASKS && MASK_LAST ? count - masked : 0;
                if (count > 0) {
                    // Q rows are numbered over the flattened (batch, head, seq) matrix.
                    const int qrow = it.bh * p.len_q + it.tile * TILE;
                    sa_mbar_arrive_expect_tx(&sm.q_ready[qb], TILE_BYTES);
                    sa_tma_load_2d(sm.q[qb], &map_q, &sm.q_ready[qb], 0, qrow);
                    sa_tma_load_2d(sm.q[qb] + HALF_BYTES, &map_q, &sm.q_ready[qb], HALF_COLS,
                                   qrow);
                } else {
                    sa_mbar_arrive(&sm.q_ready[qb]); // the record alone: nothing to load
                }
            }
            q_uses++;
            const int kv_row0 = (int)((unsigned)it.bh / (unsigned)p.group) * p.len_kv;
            if (!(MASKS && MASK_LAST)) {
                // One pass in list order. The two-pass walk below would do here too (one pass,
                // every entry taken), but its extra state makes the producer of the kernel
                // without masks spill (16 bytes per item, checked with -Xptxas -v): kept apart.
                int idx = 0;
#pragma unroll 1
                for (int j = 0; j < count; j++, kv_n++) {
                    if ((j & 31) == 0) // the next 32 entries, one per lane
                        idx = j + lane < count ? row[j + lane] : 0;
                    const int blk = __shfl_sync(0xffffffffu, idx, j & 31);
                    if (lane == 0)
                        load_block<MASKS, ROWS>(sm, &map_k, &map_v, p, kv_n, kv_row0, blk, row + j);
                }
            } else {
                // MASK_LAST: pass 0 issues the blocks that need no mask, pass 1 the others; each
                // pass walks the row 32 entries at a time, one per lane, and issues the taken
                // ones in list order.
#pragma unroll 1
                for (int pass = 0; pass < 2; pass++) {
#pragma unroll 1
                    for (int j0 = 0; j0 < count; j0 += 32) {
                        const int idx = j0 + lane < count ? row[j0 + lane] : 0;
                        const bool take =
                            j0 + lane < count &&
                            needs_mask(p, it.tile, idx) == (pass == 1);
#pragma unroll 1
                        for (uint32_t todo = __ballot_sync(0xffffffffu, take); todo;
                             todo &= todo - 1, kv_n++) {
                            const int l = __ffs(todo) - 1;
                            const int blk = __shfl_sync(0xffffffffu, idx, l);
                            if (lane == 0)
                                load_block<MASKS, ROWS>(sm, &map_k, &map_v, p, kv_n, kv_row0, blk,
                                                  row + j0 + l);
                        }
                    }
                }
            }
        }
        return;
    }

    // ---------------------------------------------------------------- consumers
    sa_setmaxnreg_inc<CONSUMER_REGS>();
    const int c = wg - 1; // which 64-row half of the tile this warpgroup owns
    const int t = threadIdx.x % 128;
    const int warp = t / 32, lane = t % 32;
    // Descriptors of this warpgroup's Q rows and of stage 0's K and V; a k-step or another
    // stage only adds (byte offset >> 4) to the address field, which never carries (< 256 KB).
    // K-major operands (Q, K): lbo unused; V (MN-major): lbo = step between 64-column halves.
    constexpr uint32_t Q_HALF = (64 * ROW_BYTES) >> 4; // rows 64..127 of the Q tile
    constexpr uint32_t STAGE_STEP = TILE_BYTES >> 4;
    const uint32_t q_desc0 = sa_desc_lo(sa_smem_addr(sm.q[0]), 16) + c * Q_HALF;
    const uint32_t k_desc0 = sa_desc_lo(sa_smem_addr(sm.k[0]), 16);
    const uint32_t v_desc0 = sa_desc_lo(sa_smem_addr(sm.v[0]), HALF_BYTES);

    if (PINGPONG && c == 1)
        turn_pass(c); // warpgroup 0 takes the first turn

    uint32_t q_uses = 0, kv_n = 0;
    for (;;) {
        const int qb = q_uses % Q_BUFFERS;
        wait_phase(&sm.q_ready[qb], (q_uses / Q_BUFFERS) & 1);
        q_uses++;
        const int item = read_lane0(&sm.item[qb], lane);
        if (item == NO_ITEM)
            break; // the producer has left: nothing waits for a release of this record
        const int count = read_lane0(&sm.count[qb], lane);
        if (count == 0) {
            const int err = read_lane0(&sm.error[qb], lane);
            warp_arrive(&sm.q_free[qb], lane); // the record is read
            // An empty row selects no key: O = 0, LSE = -inf; a row that failed the check: NaN.
            const Item it = item_at(p, item);
            const size_t row0 = (size_t)it.bh * p.len_q + (size_t)it.tile * TILE + 64 * c;
            const int rows = min(64, p.len_q - it.tile * TILE - 64 * c);
            const uint32_t fill = err ? BF16X2_NAN : 0u;
            uint4 *dst = reinterpret_cast<uint4 *>(p.o + row0 * HEAD_DIM);
            for (int e = t; e < rows * (HEAD_DIM / 8); e += 128)
                dst[e] = make_uint4(fill, fill, fill, fill);
            if (p.lse)
                for (int r = t; r < rows; r += 128)
                    p.lse[row0 + r] = err ? CUDART_NAN_F : -CUDART_INF_F;
            continue;
        }

        const int tile = item_at(p, item).tile; // for the causal diagonal
        // Blocks 0..unmasked-1 need no mask (MASK_LAST: the producer issued the others last).
        const int unmasked = MASKS ? read_lane0(&sm.unmasked[qb], lane) : count;
        uint32_t qa[32]; // version 4: this warpgroup's Q rows, loaded once per item
        if (Q_IN_REGS) {
            sa_wgmma_load_a_sw128<8, HALF_BYTES>(qa, sa_smem_addr(sm.q[qb]), c, warp, lane);
            warp_arrive(&sm.q_free[qb], lane); // Q and the record are read
        }
        float o[64], sc[64];
        float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F}, row_sum[2] = {0.f, 0.f};
        float factor[2];
        uint32_t pa[32];
#pragma unroll
        for (int r = 0; r < 64; r++)
            o[r] = 0.f;

        // Step 4's mask of the block in K stage s, in the loop that may need one (M): a partial
        // block or a causal diagonal one; any other block pays its reads and compares.
        const auto mask_stage = [&](int s, auto m) {
            if (!decltype(m)::value)
                return;
            const int valid = read_lane0(&sm.k_valid[s], lane);
            const int d = causal_diag(p, tile, read_lane0(&sm.k_blk[s], lane)) + 64 * c;
            if (valid < TILE || d < DIAG_ALL)
                mask_block(sc, valid, d, warp, lane);
        };

        // Block 0: a turn with S alone, then its softmax (no PV in flight: rescale at once).
        {
            const int s = kv_n % KV_STAGES;
            uint32_t q_desc = Q_IN_REGS ? 0u : q_desc0 + qb * STAGE_STEP;
            uint32_t k_desc = k_desc0 + s * STAGE_STEP;
            asm volatile("" : "+r"(q_desc), "+r"(k_desc));
            wait_phase(&sm.k_ready[s], (kv_n / KV_STAGES) & 1);
            const uint32_t row_word = ROWS ? stage_row_word(sm, s, c, warp, lane) : 0u;
            turn_begin(c);
            sa_wgmma_fence();
            issue_s(sc, qa, q_desc, k_desc);
            sa_wgmma_commit();
            turn_end(c);
            sa_wgmma_wait<0>();
            if (MASKS && unmasked == 0)
                mask_stage(s, MaskTag<true>{}); // before k-free: the producer rewrites the record
            const uint32_t rows = ROWS ? rows_in_word(row_word, warp, lane) : 3u; // version 8
            warp_arrive(&sm.k_free[s], lane);
            if (!Q_IN_REGS && count == 1)
                warp_arrive(&sm.q_free[qb], lane);
            const bool moved = softmax_in_place<ROWS>(sc, row_max, row_sum, factor, rows);
            rescale_and_pack(moved, factor, o, sc, pa);
        }
        // Blocks 1..count-1, steps 1-5; M: the loop of the blocks that may need step 4's mask.
        // The stage and phase of the block in hand (STAGE_CARRY); the block before it is one
        // stage back.
        int st_cur = (kv_n + 1) % KV_STAGES;
        uint32_t ph_cur = ((kv_n + 1) / KV_STAGES) & 1;
        const auto kv_block = [&](int j, auto m) {
            const uint32_t n = kv_n + j;
            const int s = SA_STAGE17_STAGE_CARRY ? st_cur : n % KV_STAGES;
            const uint32_t ph = SA_STAGE17_STAGE_CARRY ? ph_cur : (n / KV_STAGES) & 1;
            const int s_prev = SA_STAGE17_STAGE_CARRY ? (s == 0 ? KV_STAGES - 1 : s - 1)
                                                      : (n - 1) % KV_STAGES;
            const uint32_t ph_p = SA_STAGE17_STAGE_CARRY ? (s == 0 ? ph ^ 1 : ph)
                                                         : ((n - 1) / KV_STAGES) & 1;
            // Opaque copies: without them the compiler hoists every per-k-step descriptor out of
            // the loop and keeps them in registers that the accumulators need.
            uint32_t k_desc = k_desc0 + s * STAGE_STEP;
            uint32_t v_desc = v_desc0 + s_prev * STAGE_STEP;
            uint32_t q_desc = 0;
            if (Q_IN_REGS) {
                asm volatile("" : "+r"(k_desc), "+r"(v_desc));
            } else {
                q_desc = q_desc0 + qb * STAGE_STEP;
                asm volatile("" : "+r"(q_desc), "+r"(k_desc), "+r"(v_desc));
            }

            // ---- steps 1-2: S of block j and PV of block j-1 in one turn
            wait_phase(&sm.k_ready[s], ph);
            const uint32_t row_word = ROWS ? stage_row_word(sm, s, c, warp, lane) : 0u;
            wait_phase(&sm.v_ready[s_prev], ph_p);
            turn_begin(c);
            sa_wgmma_fence();
            issue_s(sc, qa, q_desc, k_desc);
            sa_wgmma_commit();
            issue_pv(o, pa, v_desc);
            sa_wgmma_commit();
            turn_end(c);
            // ---- step 3: S is done (the PV may still run)
            sa_wgmma_wait<1>();
            // ---- step 4: softmax of block j beside the PV of block j-1
            mask_stage(s, m); // before k-free: the producer rewrites the stage's record
            const uint32_t rows = ROWS ? rows_in_word(row_word, warp, lane) : 3u; // version 8
            warp_arrive(&sm.k_free[s], lane);
            if (!Q_IN_REGS && j == count - 1)
                warp_arrive(&sm.q_free[qb], lane);
            const bool moved = softmax_in_place<ROWS>(sc, row_max, row_sum, factor, rows);
            // ---- step 5: the wait for the PV stands in each arm of the branch (pv_wait)
            if (SA_STAGE17_ARM_WAIT == 3) {
                if (warp_group_any(c, moved)) { // the same arm in every warp of the warpgroup
                    pv_wait<1>();
                    rescale_and_pack(true, factor, o, sc, pa);
                } else {
                    pv_wait<2>();
                    rescale_and_pack(false, factor, o, sc, pa);
                }
            } else if (SA_STAGE17_ARM_WAIT == 2) {
                int arm = 1; // 1 in every thread; opaque, so both arms stay
                asm volatile("" : "+r"(arm));
                if (arm)
                    pv_wait<1>();
                else
                    pv_wait<2>();
                rescale_and_pack(moved, factor, o, sc, pa);
            } else if (!SA_STAGE17_ARM_WAIT) {
                sa_wgmma_wait<0>();
                rescale_and_pack(moved, factor, o, sc, pa);
            } else if (moved) {
                pv_wait<1>();
                rescale_and_pack(true, factor, o, sc, pa);
            } else {
                pv_wait<2>();
                rescale_and_pack(false, factor, o, sc, pa);
            }
            warp_arrive(&sm.v_free[s_prev], lane);
            if (++st_cur == KV_STAGES) {
                st_cur = 0;
                ph_cur ^= 1;
            }
        };
#pragma unroll 1
        for (int j = 1; j < unmasked; j++)
            kv_block(j, MaskTag<false>{});
        if (MASKS) {
#pragma unroll 1
            for (int j = max(unmasked, 1); j < count; j++)
                kv_block(j, MaskTag<true>{});
        }
        // The item's last turn: PV of its last block.
        {
            const uint32_t n = kv_n + count - 1;
            const int s = n % KV_STAGES;
            uint32_t v_desc = v_desc0 + s * STAGE_STEP;
            asm volatile("" : "+r"(v_desc));
            wait_phase(&sm.v_ready[s], (n / KV_STAGES) & 1);
            turn_begin(c);
            sa_wgmma_fence();
            issue_pv(o, pa, v_desc);
            sa_wgmma_commit();
            turn_end(c);
            sa_wgmma_wait<0>();
            warp_arrive(&sm.v_free[s], lane);
        }
        kv_n += count;

        // Epilogue: normalise and store this warpgroup's 64 rows. The row is recomputed from the
        // item index rather than kept live through the KV loop, where registers are short.
        int item_now = item;
        asm volatile("" : "+r"(item_now));
        const Item it = item_at(p, item_now);
        const size_t row0 = (size_t)it.bh * p.len_q + (size_t)it.tile * TILE;
        const int rows = min(TILE, p.len_q - it.tile * TILE); // a partial last Q tile
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float sum = row_sum[i];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            // A row that sees no key at all (causal, len_q > len_kv): O = 0, LSE = -inf.
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            const int r = 64 * c + warp * 16 + lane / 4 + 8 * i;
            const size_t row = row0 + r;
            uint4 *dst = reinterpret_cast<uint4 *>(p.o + row * HEAD_DIM) + (lane % 4);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                // Columns 32g..32g+31 of the row, 8 per lane after the transpose: one 16-byte
                // store per lane, 64 contiguous bytes per quad.
                uint32_t a[4];
#pragma unroll
                for (int k = 0; k < 4; k++)
                    a[k] = pack_bf16(o[4 * (4 * g + k) + 2 * i] * inv,
                                     o[4 * (4 * g + k) + 2 * i + 1] * inv);
                quad_transpose(a, lane);
                if (r < rows) // a partial last Q tile stores only its rows
                    dst[4 * g] = make_uint4(a[0], a[1], a[2], a[3]);
            }
            if (p.lse && lane % 4 == 0 && r < rows)
                p.lse[row] = sum > 0.f ? (row_max[i] + __log2f(sum)) * LN2 : -CUDART_INF_F;
        }
    }
    // Every turn_pass found its turn_wait except the opening one of warpgroup 1: take it, so no
    // named barrier is left half-arrived when the CTA exits.
    if (PINGPONG && c == 0)
        turn_wait(c);
    if (threadIdx.x % 128 == 0) // the consumer warpgroups' first threads
        SA_TL_END(0);
}

} // namespace

extern "C" int sa_stage17_check(const sa_gpu_attn *a)
{
    // Shape, pointers, options, list arguments, 32-bit TMA rows (a partial tile reaches up to
    // 127 rows past the end) and alignment: the checks every stage shares (common/sa_gpu_check.c).
    return sa_gpu_attn_check_common(a, SA_CHECK_SPARSE | SA_CHECK_CAUSAL | SA_CHECK_ROW_MASKS,
                                    HEAD_DIM, TILE);
}

extern "C" int sa_stage17_gate_builds(void)
{
    return SA_STAGE17_MASK_SPECIALIZE != 0;
}

extern "C" int sa_stage17_launch(const sa_gpu_attn *a)
{
    return sa_stage17_launch_gated(a, nullptr, 0);
}

extern "C" int sa_stage17_launch_gated(const sa_gpu_attn *a, const int *gate, int want)
{
    int rc = sa_stage17_check(a);
    if (rc != SA_OK)
        return rc;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    const sa_shape *s = &a->shape;
    // The verdict: the caller's (asynchronous), or this thread's own, read before we return.
    sa_gpu_verdict *verdict = a->verdict;
    if (a->validate && !verdict && (rc = sa_verdict_for_this_thread(&verdict)) != SA_OK)
        return rc;

    sa_qkv_maps maps; // the check made head_dim HEAD_DIM
    if ((rc = sa_tensor_maps_qkv(a, TILE, HALF_COLS, &maps)) != SA_OK)
        return rc;

    Params p;
    p.o = a->o;
    p.lse = a->lse;
    p.indices = a->lists.indices;
    p.counts = a->lists.counts;
    p.group = s->heads_q / s->heads_kv;
    p.list_div = s->heads_q / a->lists.list_heads;
    p.max_blocks = a->lists.max_blocks;
    p.len_q = s->len_q;
    p.len_kv = s->len_kv;
    p.q_tiles = sa_q_tiles(s);
    p.kv_blocks = sa_kv_blocks(s);
    p.tail = s->len_kv - (p.kv_blocks - 1) * TILE;
    const long long items = (long long)s->batch * s->heads_q * p.q_tiles;
    if (items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.items = (int)items;
    p.check = a->validate;
    p.allow_empty = a->allow_empty_rows;
    p.causal = a->causal;
    p.allow_future = a->allow_future_blocks;
    p.q_off = s->len_kv - s->len_q; // both positive ints: the difference fits
    p.verdict = sa_verdict_word(verdict);
    p.chunk = (CHUNK_HEADS + p.group - 1) / p.group * p.group;
    p.heads = s->batch * s->heads_q; // items / q_tiles, below 2^31
    const long long chunk_items = (long long)p.chunk * p.q_tiles; // at most 8 x items
    if (chunk_items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.chunk_items = (int)chunk_items;
    p.row_masks = reinterpret_cast<const uint4 *>(a->row_masks); // 16-byte aligned (the check)
    p.sched = nullptr;
    if (SA_STAGE17_DYNAMIC == 2 || (SA_STAGE17_DYNAMIC == 1 && a->causal))
        if ((rc = sa_sched_counter(a->stream, &p.sched)) != SA_OK)
            return rc;

    // No block of the call needs the step-4 mask: a kernel without it; row masks: a kernel that
    // reads them (version 7; version 8 has both with and without step 4's mask).
    const bool masks = !SA_STAGE17_MASK_SPECIALIZE || p.causal || p.tail != TILE;
    if (gate && masks)
        return SA_ERR_UNSUPPORTED; // only the builds without step 4's mask test a gate
    const int variant = (p.row_masks ? 2 : 0) + masks;
    void (*const kernels[4])(CUtensorMap, CUtensorMap, CUtensorMap, Params, const int *, int) = {
        split_tile_kernel<false, false>, split_tile_kernel<true, false>,
        split_tile_kernel<false, true>, split_tile_kernel<true, true>};
    void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, Params, const int *, int) =
        kernels[variant];
    // The shared-memory opt-in, once per process and kernel (every device of this build is sm_90
    // with the same limit; a failed attempt is retried on the next call).
    static int smem_set[4];
    if (!smem_set[variant]) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)SMEM_BYTES));
        smem_set[variant] = 1;
    }
    const int grid = p.items < sms ? p.items : sms;
    SA_CUDA_TRY(sa_launch_pdl(kernel, 1, dim3(grid), dim3(NTHREADS), SMEM_BYTES,
                              (cudaStream_t)a->stream, maps.q, maps.k, maps.v, p, gate, want));
    // Synchronous convenience: no verdict given, so wait for ours and return its code.
    if (a->validate && !a->verdict)
        return sa_gpu_verdict_read(verdict, a->stream);
    return SA_OK;
}

SA_TL_HOST(s17) // sa_timeline_s17: slot 0 split_tile_kernel (every build)
