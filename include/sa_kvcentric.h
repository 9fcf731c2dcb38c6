/* KV-centric attention for per-query block lists. Included by sparseattn.h.
 *
 * When every query keeps its own list (sa_query_lists), a Q tile would have to visit the union
 * of its queries' blocks, which for independent lists is almost every block. The KV-centric
 * path turns the work around: a task is one KV block and up to task_queries of the queries that
 * chose it. Three parts, each callable alone (the benchmark times them apart):
 *   1. reverse index: for each bucket (batch, kv head, kv block) the entries that chose it, in
 *      ascending query order; buckets split into tasks of at most task_queries queries, the
 *      largest tasks first;
 *   2. attention: per task, one pass over one KV block for all heads of the GQA group of the
 *      task's queries; writes a partial O and LSE per (query, head, slot);
 *   3. combine: per (query, head) the partials of its slots, weighted by their LSE.
 * docs/kvcentric.md describes the dataflow and where the time goes.
 */
#ifndef SA_KVCENTRIC_H
#define SA_KVCENTRIC_H
#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h" /* SA_API, sa_shape, sa_query_lists; it includes this header at its end */
#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ reverse index format
 * A bucket is one (batch, kv head, kv block): bucket = (b * heads_kv + hkv) * kv_blocks + blk.
 * An entry is a position in the list array, entry = ((b * heads_kv + hkv) * len_q + q) *
 * max_blocks + slot: query q chose block indices[entry] in its slot `slot`, and its partial for
 * that block goes to slot `slot`. Entries of bucket k are entries[offsets[k] .. offsets[k+1]),
 * in ascending entry order (so ascending query: a valid row names a block at most once). */
/* The largest max_blocks the GPU index takes is SA_KV_MAX_BLOCKS - 1 (SA_ERR_UNSUPPORTED past
 * it): a list position must fit the 24 bits the index's error word keeps for it, and this
 * limit leaves one of them spare. The GPU backward, which builds this index, holds it too. */
#define SA_KV_MAX_BLOCKS (1 << 23)
typedef struct sa_kv_task {
    int32_t bucket; /* which (batch, kv head, kv block) */
    int32_t begin;  /* first entry: offsets[bucket] + chunk * task_queries */
    int32_t count;  /* queries in this task, 1 .. task_queries */
    int32_t chunk;  /* which piece of its bucket, from 0 */
} sa_kv_task;
/* Task order: by the query window of the task's first entry, then by bucket, then by chunk
 * (deterministic). A window is (batch, kv head, query / sa_kv_window_queries): the tasks of one
 * window touch only that window's Q rows, and the attention kernel walks the list in order with
 * all its CTAs at once, so the Q rows it gathers (each query once per selected block) stay in L2. */
#define SA_KV_WINDOW_ROWS 32768 /* Q rows (query x head of the group) per window: 8 MB of BF16 at D 128 */

SA_API size_t sa_kv_buckets(const struct sa_shape *s); /* B*Hkv*kv_blocks */
SA_API size_t sa_kv_max_entries(const struct sa_shape *s,
                                const struct sa_query_lists *l); /* rows*max */
/* An upper bound of the task count: max_entries / task_queries + buckets. */
SA_API size_t sa_kv_max_tasks(const struct sa_shape *s, const struct sa_query_lists *l,
                              int task_queries);
/* Queries per task of the GPU kernel: 128 / (heads_q / heads_kv), so a task gathers at most 128
 * rows (queries x heads of the group), one MMA tile. 0 when the group has more than 128 heads. */
SA_API int sa_kv_task_queries(const struct sa_shape *s);
/* Queries per window of the task order: SA_KV_WINDOW_ROWS / (heads_q / heads_kv), rounded down
 * to whole Q tiles (SA_TILE), at least one tile; 0 for a shape that fails sa_shape_check. */
SA_API int sa_kv_window_queries(const struct sa_shape *s);

/* CPU reference of part 1 (host memory). Validates the lists (sa_query_lists_check, empty rows
 * allowed), then writes offsets (buckets + 1), entries (max_entries capacity) and tasks
 * (sa_kv_max_tasks capacity); *n_entries and *n_tasks get the counts used. */
SA_API int sa_kv_index_ref(const struct sa_shape *s, const struct sa_query_lists *l,
                           int task_queries, int32_t *offsets, int32_t *entries,
                           sa_kv_task *tasks, int *n_entries, int *n_tasks);

/* ------------------------------------------------------------ GPU entry point
 * Every GPU entry point below (sa_kvcentric_attention, sa_kv_workspace_size, sa_kv_build_index,
 * sa_kv_attend, sa_kv_combine, sa_kv_index_get) answers in this order. Steps 1-3 make no CUDA
 * call and read no tensor, so they answer alike on any machine, with or without a GPU:
 *   1. SA_ERR_NULL for the call's own pointers (p, bytes, v; the workspace of the three parts
 *      and of sa_kv_index_get), then the shape (sa_shape_check's codes), the required
 *      pointers (SA_ERR_NULL) and the lists' sizes (SA_ERR_MAX_BLOCKS);
 *   2. SA_ERR_ARG: a flag not 0 or 1, an enum out of range, hybrid_share outside 1..128 with
 *      SA_KV_SCHEDULE_HYBRID (whatever else the call asks for);
 *   3. SA_ERR_UNSUPPORTED: what the kernels cannot run (HYBRID or causal on the mma.sync kernel,
 *      head_dim other than 128, a GQA group over 128 heads, the index's int32 limits), then
 *      pointer alignment: q, k, v, o, o_f32 and workspace at multiples of 16 bytes (rows are
 *      copied and stored 16 bytes at a time, K/V loaded by TMA), lse, lists.indices and
 *      lists.counts of 4 (optional pointers may be NULL);
 *   4. SA_ERR_NO_DEVICE without an sm_90 GPU (every entry point, sa_kv_workspace_size too: the
 *      workspace holds CUB's scratch, whose size CUB asks the device for);
 *   5. the workspace: SA_ERR_ARG when workspace_bytes is below sa_kv_workspace_size's answer,
 *      SA_ERR_NOMEM when sa_kvcentric_attention cannot allocate one; then, as the work runs,
 *      the lists' errors (with validate), SA_ERR_CUDA, and for the hybrid whatever the tile
 *      stage of its Q-centric pass answers.
 * Built without CUDA each of them returns SA_ERR_NOT_BUILT without checking. */
enum { SA_KV_PARTIAL_F32 = 0, SA_KV_PARTIAL_BF16 = 1 };
/* Which kernel runs part 2 (sa_kv_params.attend). WGMMA, the default: a producer warpgroup gathers
 * each task's Q rows and streams K/V with TMA, two consumer warpgroups split the task's 128 rows
 * and run wgmma with ping-pong turns. MMA_SYNC: the earlier kernel (8 warps of mma.sync), kept for
 * comparison. Both write the same partials. */
enum { SA_KV_ATTEND_WGMMA = 0, SA_KV_ATTEND_MMA_SYNC = 1 };
/* How the work is split between schedules (sa_kv_params.schedule).
 * KV: every (query, block) pair runs KV-centric (parts 1-3 below).
 * HYBRID: planned on the GPU, with no host synchronization: per 128-query tile, the blocks that
 *   at least hybrid_share / 128 of the tile's queries list run Q-centric, once for the whole
 *   tile, each masked to the rows of the queries that chose it (the registry's default tile-list
 *   stage with row masks, sa_gpu_attn.row_masks, whose output is one more partial per query),
 *   and only the rest of each query's list runs KV-centric; the combine merges both by their
 *   LSE. Exact in every case: a tile whose queries agree is all Q-centric, one whose queries
 *   share nothing all KV-centric. Needs attend = SA_KV_ATTEND_WGMMA and a default tile stage
 *   that takes the shape (and row masks, when hybrid_share < 128); tiles over more than
 *   SA_KV_PLAN_MAX_BLOCKS KV blocks are planned all KV-centric. The reverse index then leaves
 *   the Q-centric entries out (sa_kv_index_get shows what the KV-centric part runs).
 *   With hybrid_share < 128 a tile also runs its WHOLE union Q-centric when the blocks below the
 *   share are few for what they hold: (blocks below the share) x SA_KV_PLAN_BLOCK_COST <=
 *   (their entries) + (queries holding one) x SA_KV_PLAN_ROW_COST (the planner's cost count in
 *   KV-centric entries; docs/kvcentric.md has the measurements behind it). */
enum { SA_KV_SCHEDULE_KV = 0, SA_KV_SCHEDULE_HYBRID = 1 };
/* The planner's cost count, from H200 rates at 64K (docs/kvcentric.md, session 11): a block run
 * Q-centric for a whole tile (0.21 us for 16 heads) costs what 44 KV-centric entries cost (4.7 ns
 * each, combine included); a row merged by the combine, about one entry. */
#define SA_KV_PLAN_BLOCK_COST 44
#define SA_KV_PLAN_ROW_COST 1
#define SA_KV_PLAN_MAX_BLOCKS 12288 /* the planner's per-tile histogram: 48 KB of shared memory */
/* sa_kv_params.hybrid_share, in 128ths of a tile's queries: 128 plans only the blocks every
 * query lists, 1 the tile's whole union (Q-centric with row masks). The default, 80 (62.5%),
 * lies between the shares measured to lose and to win on the H200 (docs/kvcentric.md: blocks
 * listed by about 53% of a tile's queries ran no faster Q-centric, by about 87% 1.4x faster). */
#define SA_KV_HYBRID_SHARE_DEFAULT 80

typedef struct sa_kv_params {
    struct sa_shape shape;      /* head_dim 128; heads_q / heads_kv <= 128 */
    const uint16_t *q, *k, *v;  /* device, BF16 BHSD */
    struct sa_query_lists lists; /* device pointers */
    uint16_t *o;                /* device BF16 (B, Hq, Sq, D), required */
    float *o_f32;               /* device FP32 (B, Hq, Sq, D), optional */
    float *lse;                 /* device FP32 (B, Hq, Sq), optional; -inf for an empty row */
    int partial_format;         /* SA_KV_PARTIAL_F32 (default) or SA_KV_PARTIAL_BF16 */
    int validate;               /* 1 (default): check the lists on the GPU; costs one sync */
    int allow_empty_rows;       /* 1 (default) */
    void *workspace;            /* device, sa_kv_workspace_size bytes; NULL: allocated per call */
    size_t workspace_bytes;
    void *stream;               /* cudaStream_t; NULL is the default stream */
    /* As sa_attn_opts.causal and .allow_future_blocks (flags, default 0): bottom-right aligned
     * causal attention, each query masked per key by the wgmma kernel (a block wholly in a
     * query's future gives it a partial of LSE -inf, which the combine ignores). With validate,
     * future blocks are SA_ERR_FUTURE_BLOCK unless allowed, and a row that sees no key may be
     * empty even with allow_empty_rows = 0 (the host validator's rules). The mma.sync kernel has
     * no causal mask: causal = 1 with attend = SA_KV_ATTEND_MMA_SYNC is SA_ERR_UNSUPPORTED. */
    int causal;
    int allow_future_blocks;
    int attend;                 /* SA_KV_ATTEND_WGMMA (default) or SA_KV_ATTEND_MMA_SYNC */
    int schedule;               /* SA_KV_SCHEDULE_KV (default) or SA_KV_SCHEDULE_HYBRID */
    int hybrid_share;           /* 1..128, SA_KV_HYBRID_SHARE_DEFAULT (see above); HYBRID only:
                                   with SA_KV_SCHEDULE_KV it is neither read nor checked */
} sa_kv_params;
SA_API void sa_kv_params_default(sa_kv_params *p);

/* Bytes of device workspace for this shape, list size and partial format: the reverse index,
 * the tasks, CUB's scan scratch, and the partials (B*Hq*Sq*max_blocks rows of D values plus an
 * LSE).
 * Needs the device (SA_ERR_NO_DEVICE without one); *bytes is 0 after any error. */
SA_API int sa_kv_workspace_size(const sa_kv_params *p, size_t *bytes);

/* The whole operation: checks the arguments, builds the index (validating the lists when
 * p->validate), runs the attention and the combine on p->stream. Returns when the work is
 * queued (or done, if it had to validate or allocate). With SA_KV_SCHEDULE_HYBRID and
 * validate = 0, outside graph capture, the Q-centric pass runs on a second stream of the
 * library's (one per thread and CUDA context, made on first use and kept until
 * sa_gpu_thread_release), forked from p->stream and joined back into it before the combine:
 * work queued on p->stream after the call still waits for all of it. */
SA_API int sa_kvcentric_attention(const sa_kv_params *p);

/* The three parts alone, for tests and benchmarks; each needs p->workspace. */
SA_API int sa_kv_build_index(const sa_kv_params *p);
SA_API int sa_kv_attend(const sa_kv_params *p);
SA_API int sa_kv_combine(const sa_kv_params *p);

/* Device pointers into p->workspace where part 1 leaves its results: offsets (buckets + 1),
 * entries (max_entries), tasks (max_tasks, task_queries = sa_kv_task_queries), and info[0] =
 * entries used, info[1] = tasks used. */
typedef struct sa_kv_index_view {
    const int32_t *offsets;
    const int32_t *entries;
    const sa_kv_task *tasks;
    const int32_t *info;
} sa_kv_index_view;
SA_API int sa_kv_index_get(const sa_kv_params *p, sa_kv_index_view *v);

#ifdef __cplusplus
}
#endif
#endif
