// KV-centric path: what the CUDA files share (workspace layout, error checks). Not public.
#ifndef SA_KV_INTERNAL_H
#define SA_KV_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "kv_limits.h"        // KV_D, kv_index_limits
#include "sa_cuda_internal.h" // SA_CUDA_TRY: return SA_ERR_CUDA when a CUDA call fails
#include "sparseattn.h"

#define KV_ALIGN 256      // every workspace array starts on a 256-byte boundary
// Alignment the kernels need of the caller's pointers (kv_check_args, SA_ERR_UNSUPPORTED):
// Q rows are gathered and K/V rows copied 16 bytes at a time (cp.async; the wgmma kernel loads
// K/V with TMA, whose base must be 16-byte aligned), the combine writes O and O_f32 16 bytes a
// lane, and the workspace holds 16-byte tasks and partials read and written 16 bytes at a time
// (its arrays start at multiples of KV_ALIGN from it); LSE is floats, the lists int32.
#define KV_VEC_ALIGN 16
#define KV_WORD_ALIGN 4
// The reverse index's per-tile pass keeps four ints per KV block in shared memory (64 KB for
// 4096 blocks); shapes with more blocks take them in slices of this many (each slice reads the
// tile's lists again).
#define SA_KV_INDEX_SLICE 4096

// The first list error found on the GPU is kept as the minimum of (row << 32 | pos << 8 | -code),
// pos = 0 for the row's count, slot + 1 for an entry: the same error the host validator reports
// (it stops at the first bad row, and within it at the first bad slot).
#define KV_NO_ERROR 0xffffffffffffffffull

typedef struct kv_ws {
    // sizes
    size_t buckets, max_entries, max_tasks, partial_rows;
    size_t tiles;          // B * Hkv * q_tiles
    size_t window_buckets; // B * Hkv * windows * kv_blocks: the task list's (window, bucket) cells
    int task_queries;
    int window_queries, windows; // the task order's query windows (sa_kv_window_queries)
    size_t scan_items; // buckets + 1 + window_buckets + 1: step 3's one exclusive sum
    size_t tmp_bytes, total;
    // arrays (NULL when only the size was asked)
    unsigned long long *err;
    int32_t *info;        // [0] entries used, [1] tasks used
    int32_t *bucket_n;    // (buckets + 1) entries per bucket, last 0; wtasks follows it
    int32_t *offsets;     // (buckets + 1); task_off follows it
    int32_t *tcount;      // (buckets, q_tiles): a tile's entries in the bucket, then their start
    int32_t *tile_left;   // (tiles): entries each tile leaves to the KV-centric part
    int32_t *first_chunk; // (B * Hkv, windows + 1, kv_blocks): first chunk whose first entry is
                          // in the window (windows: the bucket's chunk count)
    int32_t *wtasks;      // (window_buckets + 1): tasks per (bh, window, block), last 0
    int32_t *task_off;    // (window_buckets + 1): entries' total + where they start in the list
    int32_t *entries;
    sa_kv_task *tasks;
    void *tmp;
    // SA_KV_SCHEDULE_HYBRID only: the plan (per tile the blocks that hybrid_share / 128 of its
    // queries list, as tile lists with list_heads = Hkv, each with the row mask of the queries
    // that list it), how many entries of each list row are left to the KV-centric part, and the
    // Q-centric pass's LSE when the caller gave none.
    int plan_cap;                 // entries per plan row: min(kv blocks, 128 * max_blocks)
    int32_t *tile_idx, *tile_cnt; // (B, Hkv, q_tiles, plan_cap), (B, Hkv, q_tiles)
    uint32_t *row_masks;          // (B, Hkv, q_tiles, plan_cap, 4)
    int32_t *row_left;            // (B, Hkv, Sq)
    // The list rows that have entries left (row_left > 0), in no particular order, and their
    // number: the rows the combine merges (without o_f32; the others the Q-centric pass wrote).
    // merge_n[1]: 1 when some planned block leaves out a row of its tile (kv_plan.cu, step 6).
    int32_t *merge_rows, *merge_n; // (B, Hkv, Sq), 2
    float *shared_lse;            // (B, Hq, Sq)
    float *part_lse;    // (B, Hq, Sq, max_blocks)
    void *part_o;       // (B, Hq, Sq, max_blocks, D), FP32 or BF16
} kv_ws;

// Checks the arguments, not the lists (no CUDA call), in the order of every entry point: NULL
// pointers, the shape and the lists' sizes, then the options (SA_ERR_ARG), then what the kernels
// cannot run (SA_ERR_UNSUPPORTED: option pairs, head_dim, index limits, pointer alignment).
int kv_check_args(const sa_kv_params *p);
// SA_ERR_NO_DEVICE unless the current device is an sm_90 GPU (the kernels are built for sm_90a
// only): a few attribute reads, cheap enough for every call.
int kv_device_check(void);
// Checks the arguments, then the device (kv_device_check: CUB's size query needs one), and lays
// the workspace out; base may be NULL to size it. Every GPU entry point goes through it before
// any other CUDA call.
int kv_layout(const sa_kv_params *p, void *base, kv_ws *w);

// The hybrid schedule's plan (kv_plan.cu): per tile, the blocks that hybrid_share / 128 of the
// tile's queries list, into w->tile_idx / w->tile_cnt (ascending, at most plan_cap), their row
// masks into w->row_masks, and per query the entries left to the KV-centric part (w->row_left).
int kv_plan(const sa_kv_params *p, const kv_ws *w);
// Whether kv_plan plans this shape on the GPU (its per-tile histogram holds the KV blocks); if
// not, every entry is left to the KV-centric part and the plan's lists of rows are not written.
static inline bool kv_plan_fits(const sa_shape *s)
{
    return sa_kv_blocks(s) <= SA_KV_PLAN_MAX_BLOCKS;
}
// Its Q-centric pass: the default tile stage over the plan (with the row masks when
// hybrid_share < 128), into p->o and the shared LSE.
int kv_shared_pass(const sa_kv_params *p, const kv_ws *w);
static inline float *kv_shared_lse(const sa_kv_params *p, const kv_ws *w)
{
    return p->lse ? p->lse : w->shared_lse;
}

// sa_kv_build_index in two parts: the error word's reset and the hybrid's plan, then the index
// (the hybrid's Q-centric pass needs only the first; sa_kvcentric_attention runs it beside the
// second). sa_kv_attend without the hybrid's Q-centric pass: the KV-centric part alone.
int kv_index_begin(const sa_kv_params *p, const kv_ws &w);
int kv_index_rest(const sa_kv_params *p, const kv_ws &w);
int kv_attend_part(const sa_kv_params *p, const kv_ws &w);

// Part 2 on wgmma (kv_attention_wg.cu): the same tasks in, the same partials out.
int kv_attend_wgmma(const sa_kv_params *p, const kv_ws *w, int sms);

static inline cudaStream_t kv_stream(const sa_kv_params *p) { return (cudaStream_t)p->stream; }

#endif
