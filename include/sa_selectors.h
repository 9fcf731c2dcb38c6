/*
 * Selector (indexer) plug-in interface: a selector scores KV blocks and writes block lists; it
 * never computes attention output. Included by sparseattn.h.
 */
#ifndef SA_SELECTORS_H
#define SA_SELECTORS_H

#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h" /* SA_API, sa_shape; it includes this header at its end */

#ifdef __cplusplus
extern "C" {
#endif

struct sa_shape;
struct sa_attn_opts;

typedef struct sa_select_params {
    int k;             /* blocks chosen per row (default 16); k > kv_blocks is SA_ERR_ARG */
    int keep_diagonal; /* always keep the block holding the tile's own positions (len_q == len_kv) */
    int keep_sink;     /* always keep block 0 (attention sink) */
    /* Optional separate index vectors (as MSA's index heads); NULL means the attention's Q and K.
     * q_index is (B, Hq, Sq, index_dim), k_index (B, Hkv, Skv, index_dim), BF16. */
    const uint16_t *q_index;
    const uint16_t *k_index;
    int index_dim;
    void *stream; /* cudaStream_t for the CUDA function; NULL = default stream */
    uint64_t seed; /* the "random" selector's seed (default 0); others ignore it */
    /* 1: causal lists (docs/api.md, "Causal attention"): a row picks only among the blocks it
     * can see, keeps its diagonal block, and holds min(k, visible blocks) entries; counts is then
     * required, on the CPU and the GPU alike. Default 0. */
    int causal;
    /* Head layout of the index vectors (docs/selectors.md, "Index heads"). 0 (default): the
     * attention's layout above, q_index with Hq heads, k_index with Hkv. Hi > 0: Hi index heads
     * as in MiniMax's MSA, q_index (B, Hi, Sq, index_dim) and k_index (B, Hi, Skv, index_dim);
     * Hi divides Hq and divides Hkv or is a multiple of it (Hi = Hkv: one index head per KV
     * group). Query head hq maps to index head hq * Hi / Hq; a KV head's list scores the index
     * heads its query heads map to (max over them; nvfp4_mass adds their masses, as the oracle
     * adds a group's), so the KV heads that share one index head
     * get the same list. Needs index vectors (SA_ERR_ARG otherwise). Of the GPU functions, r1
     * and r4 return SA_ERR_UNSUPPORTED for Hi > 0; nvfp4 and nvfp4_query take it. */
    int index_heads;
    /* 1: always keep the block holding the row's own position, bottom-right aligned as in causal
     * attention: block (i + len_kv - len_q) / 128 for query i, that of the tile's last valid query
     * for a tile (sa_causal_query_blocks / sa_causal_tile_blocks minus 1). Needs len_q <= len_kv;
     * with len_q == len_kv it is keep_diagonal's block, with causal the diagonal that causal
     * already keeps. Default 0. The GPU functions take it only where len_q == len_kv or under
     * causal (SA_ERR_UNSUPPORTED otherwise). */
    int keep_local;
    /* GPU functions only (the CPU functions ignore it). NULL (default): the nvfp4 functions wait
     * for their work, to return SA_ERR_ARG for non-finite index values. A verdict
     * (sa_gpu_verdict_create) makes them record SA_ERR_ARG there instead and return SA_OK with
     * no host synchronization, so the selector and the attention after it queue back to back;
     * sa_gpu_verdict_read fetches the code later. Lists made from non-finite values are
     * well-formed (valid, sorted, distinct blocks) but meaningless. The other GPU selectors
     * never synchronize and never record. */
    struct sa_gpu_verdict *verdict;
    /* Which rows a tile-list selector writes (docs/selectors.md, "Head lists"):
     * SA_HEAD_LISTS_GROUP (default): one list per KV head, (B, Hkv, q_tiles, k), its GQA group's
     * heads scored together; SA_HEAD_LISTS_PER_HEAD: one list per query head, (B, Hq, q_tiles,
     * k), each scored from its own head alone; SA_HEAD_LISTS_POOLED: one list per query head,
     * (B, Hq, q_tiles, pool_cap), the group's budget shared out by score (below). Selectors
     * name the modes their CPU and GPU functions take (sa_selector.head_lists, .cuda_head_lists;
     * SA_ERR_UNSUPPORTED for another). */
    int head_lists;
    /* SA_HEAD_LISTS_POOLED only (0 otherwise, else SA_ERR_ARG): the most blocks one head's row
     * holds, k <= pool_cap <= kv_blocks (SA_ERR_ARG); 0 (default) means min(2 k, kv_blocks). */
    int pool_cap;
} sa_select_params;
SA_API void sa_select_params_default(sa_select_params *p);

/* head_lists modes. Pooled lists, per batch, KV head and query tile t: every head of the group
 * first takes its forced blocks (those the group mode forces: the diagonal, local and sink
 * blocks), or its best block where none is forced (no head goes empty), then the group's
 * remaining blocks, H * min(k, n) in all for H heads and n blocks the
 * tile may pick (sel_row_visible: kv_blocks, or its visible blocks under causal), go to the
 * (head, block) pairs of highest score, each head's row holding at most min(pool_cap, n); equal
 * scores go to the lower head, then the lower block; NaN ranks last. The attention over them
 * costs what per-head lists of k blocks cost, and a head whose attention is spread out takes
 * blocks a concentrated one does not need. It needs scores comparable across heads, so only
 * the selectors whose scores are attention mass take it (oracle, nvfp4_mass, nvfp4_mass_q8,
 * r4_mass). counts is required (SA_ERR_NULL); a row holds its count of blocks, sorted, then -1
 * up to pool_cap. */
#define SA_HEAD_LISTS_GROUP 0
#define SA_HEAD_LISTS_PER_HEAD 1
#define SA_HEAD_LISTS_POOLED 2
#define SA_HEAD_LISTS_BIT(mode) (1u << (mode))

/* Output format of a selector:
 *   per_query == 0: tile lists, indices (B, list_heads, q_tiles, row_width): list_heads Hkv and
 *                   row_width k by default (the GQA group shares a list); see head_lists and
 *                   sa_select_layout;
 *   per_query == 1: per-query lists, indices (B, Hkv, Sq, k).
 * counts (same leading shape) may be NULL unless causal or pooled. Rows are sorted by block
 * index. */
typedef int (*sa_select_fn)(const struct sa_shape *s, const uint16_t *q, const uint16_t *k,
                            const sa_select_params *p, int32_t *indices, int32_t *counts);

typedef struct sa_selector {
    const char *name;        /* "r1", "r4", "nvfp4", ... */
    const char *description; /* one line */
    int per_query;
    sa_select_fn cpu;  /* host pointers */
    sa_select_fn cuda; /* device pointers, or NULL where no GPU kernel exists; the GPU tests,
                        * select-eval --device cuda and bench selectors run every selector
                        * whose .cuda is set (NULL in a build without CUDA) */
    unsigned head_lists;      /* SA_HEAD_LISTS_BIT(mode) for each head_lists mode .cpu takes */
    unsigned cuda_head_lists; /* the same for .cuda (0 where .cuda is NULL) */
    int ignores_index; /* 1: never scores sa_select_params' index vectors (it still validates
                        * them): the oracle scores the attention's Q/K, random reads nothing.
                        * 0, the default of a new entry: scores q_index/k_index when given.
                        * select-eval --index runs its index choices only where this is 0. */
} sa_selector;

SA_API int sa_selector_count(void);
SA_API const sa_selector *sa_selector_at(int i);
SA_API const sa_selector *sa_selector_by_name(const char *name);

/* Rules every CPU selector follows (checked at its entry point, before any work):
 *   - s, q, k, indices non-NULL (SA_ERR_NULL; the "random" selector alone accepts NULL q, k);
 *     p may be NULL (defaults); the shape passes sa_shape_check.
 *   - 1 <= k <= kv_blocks, else SA_ERR_ARG; k == kv_blocks returns every block.
 *   - keep_diagonal and keep_sink are 0 or 1; keep_diagonal needs len_q == len_kv (a tile t's
 *     diagonal block is block t; for per-query lists, query i's is block i / 128); forced blocks
 *     count toward k, and k smaller than the forced blocks of some row is SA_ERR_ARG.
 *   - q_index and k_index are both NULL (index_dim and index_heads must then be 0) or both set
 *     (SA_ERR_NULL otherwise) with index_dim a positive multiple of 16, at most SA_MAX_INDEX_DIM,
 *     and index_heads 0 or a head count as described at the field (SA_ERR_ARG).
 *   - keep_local is 0 or 1 and needs len_q <= len_kv; with keep_sink, k < 2 and more than one KV
 *     block is SA_ERR_ARG (the last row's local block is the last block, not block 0).
 *   - Scores are FP32; a NaN score ranks below every number. Among equal scores the lower block
 *     index wins; rows come out sorted by block index, every row holds exactly k blocks, and
 *     counts (if not NULL) is filled with k.
 *   - causal is a flag. With causal = 1 (CPU and GPU functions give the same lists) a row's
 *     eligible blocks are those it can see,
 *     the prefix [0, n) with n = sa_causal_tile_blocks (tile lists: the tile's last valid query
 *     row decides) or sa_causal_query_blocks (per-query lists); block n - 1, the diagonal block
 *     (it holds the row's last visible key), is always kept; the row holds min(k, n) blocks, its
 *     count, and -1 in the slots past it (a row that sees nothing has count 0). counts must then
 *     be non-NULL (SA_ERR_NULL, checked last); keep_sink with k < 2 and more than one KV block is
 *     SA_ERR_ARG (the diagonal and the sink are two forced blocks). keep_diagonal keeps its rule
 *     and, with len_q == len_kv, names the same block. */
#define SA_MAX_INDEX_DIM 1024

/* Entries of `indices` a selector writes with group lists (the default head_lists):
 * B*Hkv*q_tiles*k (tile lists) or B*Hkv*Sq*k (per-query lists); sa_select_layout gives every
 * mode's. 0 if an argument is NULL. */
SA_API size_t sa_selector_list_len(const sa_selector *sel, const struct sa_shape *s, int k);

/* The list layout a selector writes under params p (NULL: defaults): *list_heads (Hkv, or Hq
 * with per-head or pooled lists), *rows per head (q_tiles, or Sq for a per-query selector) and
 * *row_width (k, or the pool cap); indices then holds B * list_heads * rows * row_width entries
 * and counts B * list_heads * rows. A tile-list layout is an sa_tile_lists {indices, counts,
 * list_heads, row_width}. SA_ERR_NULL, the shape's code, SA_ERR_ARG (k outside [1, kv_blocks],
 * head_lists not a mode, pool_cap out of range or set without pooling), SA_ERR_UNSUPPORTED (a
 * mode the selector's CPU function does not take). */
SA_API int sa_select_layout(const sa_selector *sel, const struct sa_shape *s,
                            const sa_select_params *p, int *list_heads, int *rows,
                            int *row_width);

/* Look a selector up by name and run its CPU function: what a caller such as `sparseattn run
 * --selector NAME` needs. SA_ERR_UNKNOWN for a name not in the registry. */
SA_API int sa_select_cpu(const char *name, const struct sa_shape *s, const uint16_t *q,
                         const uint16_t *k, const sa_select_params *p, int32_t *indices,
                         int32_t *counts);

/* ---------------------------------------------------------------- NVFP4
 * The format of the "nvfp4" scorer's index vectors, defined here so that a GPU quantizer can be
 * bit-identical to this one. A tensor of n elements (n a multiple of 16) is stored as
 *   values:       n/2 bytes, E2M1 codes, element 2i in the low nibble of byte i, 2i+1 in the high;
 *   scales:       n/16 bytes, one E4M3 (OCP "E4M3FN", bias 7, no infinities) per 16 consecutive
 *                 elements (blocks never straddle vectors when the vector length is a multiple
 *                 of 16);
 *   tensor_scale: one FP32 for the whole tensor.
 * Algorithm (every operation a single IEEE FP32 operation, round to nearest even):
 *   1. amax = max |x| over the tensor; tensor_scale = amax / 2688.0f (2688 = 6 * 448: E2M1's
 *      largest value times E4M3's). Non-finite input is SA_ERR_ARG. amax == 0 gives
 *      tensor_scale = 0, every scale byte 0 and every value code 0.
 *   2. per block of 16: bamax = max |x|; s = (bamax / 6.0f) / tensor_scale; the scale byte is
 *      E4M3(s) by round to nearest even, saturating to 448 (0x7E) for s >= 448; NaN (0x7F) is
 *      never produced. s below 2^-6 uses E4M3 subnormals (multiples of 2^-9); s <= 2^-10 rounds
 *      to 0 (ties to even).
 *   3. decoded scale d = E4M3 value of the byte; if d == 0 (all-zero or negligible block) every
 *      code of the block is 0 (+0). Else denom = d * tensor_scale; each code is
 *      E2M1(x / denom): magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} (codes 0..7), round to nearest
 *      even code on ties (values: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
 *      5 -> 4), saturating to 6 above 5; bit 3 is the sign of x, kept also when the magnitude
 *      rounds to 0 (so -0.0 and -0.1 give code 0x8, "negative zero", which decodes to -0.0).
 * Dequantization: x' = (E2M1(code) * d) * tensor_scale; the first product is exact. */
typedef struct sa_nvfp4 {
    uint8_t *values; /* n / 2 bytes */
    uint8_t *scales; /* n / 16 bytes */
    float tensor_scale;
    size_t n; /* elements; a positive multiple of 16 */
} sa_nvfp4;

SA_API uint8_t sa_e2m1_from_f32(float x); /* code of x (finite), rounded and saturated as above */
SA_API float sa_e2m1_to_f32(uint8_t code); /* low 4 bits */
SA_API uint8_t sa_e4m3_from_f32(float x);  /* x >= 0 finite: RNE, saturating to 448 */
SA_API float sa_e4m3_to_f32(uint8_t code); /* 0x7F / 0xFF decode to NaN */
/* q->values, q->scales must hold n/2 and n/16 bytes; q->n is set. SA_ERR_NULL, SA_ERR_SHAPE
 * (n == 0 or not a multiple of 16), SA_ERR_ARG (non-finite input). */
SA_API int sa_nvfp4_quantize_f32(const float *x, size_t n, sa_nvfp4 *q);
SA_API int sa_nvfp4_quantize_bf16(const uint16_t *x, size_t n, sa_nvfp4 *q);
SA_API int sa_nvfp4_dequantize(const sa_nvfp4 *q, float *x); /* x has q->n floats */

/* ---------------------------------------------------------------- exact block mass
 * mass is (B, Hq, Sq, kv_blocks) FP32: for each query, the dense softmax probability (scale
 * 1/sqrt(D)) that falls in each KV block; a row sums to 1. The oracle selector's scores and
 * select-eval's recall come from it. */
SA_API int sa_block_mass(const struct sa_shape *s, const uint16_t *q, const uint16_t *k,
                         float *mass);
/* sa_block_mass under options (NULL: defaults): only opts->causal is read (the other fields must
 * still be flags, SA_ERR_ARG). With causal the mass is that of causal dense attention: a query's
 * blocks past its last visible key get 0, its diagonal block only the mass of its visible keys,
 * and a query that sees no key gets a row of zeros (it sums to 0, not 1). */
SA_API int sa_block_mass_opts(const struct sa_shape *s, const uint16_t *q, const uint16_t *k,
                              const struct sa_attn_opts *opts, float *mass);

/* Recall of lists against a block mass: recall is (B, Hq, Sq), for each query the mass inside the
 * blocks of its list (its tile's list for tile lists, its own for per-query lists).
 * indices as a selector writes them (all rows hold k blocks). */
SA_API int sa_lists_recall(const struct sa_shape *s, const float *mass, int per_query,
                           const int32_t *indices, int k, float *recall);
/* The same with counts (the rows' leading shape, NULL: every row holds k): a row's first
 * counts[row] entries are read, as causal selectors write them. SA_ERR_COUNT for a count outside
 * [0, k]. */
SA_API int sa_lists_recall_counts(const struct sa_shape *s, const float *mass, int per_query,
                                  const int32_t *indices, const int32_t *counts, int k,
                                  float *recall);

/* ---------------------------------------------------------------- selection quality
 * What `sparseattn select-eval` and `sparseattn run` report, for a researcher's own harness
 * (docs/selectors.md, "Quality functions"; selectors/sel_quality.c). Lists are passed as a
 * selector writes them: per_query 0 for tile lists (B, Hkv, q_tiles, k), 1 for per-query lists
 * (B, Hkv, Sq, k); counts (the rows' leading shape) NULL means every row holds k, else a row's
 * first counts[row] entries are read. opts (NULL: defaults) is read for causal only, and must
 * pass sa_attn_opts_check (SA_ERR_ARG); with causal = 1 pass the opts the mass and the lists were
 * made under. */

/* Summary of per-query recalls (B, Hq, Sq), as sa_lists_recall_counts writes them: *mean over
 * the queries, *low the `percentile` quantile (the recalls sorted ascending, the entry at index
 * floor(percentile * (n - 1)); select-eval's recall_p5 is percentile 0.05), *queries (may be
 * NULL) the n queries counted. With opts->causal the queries that see no key (len_q > len_kv;
 * their recall is 0 of 0 mass) are left out; *mean and *low are NaN when no query is left.
 * recall is not modified. SA_ERR_NULL, the shape's code, SA_ERR_ARG for a percentile outside
 * [0, 1] or bad opts, SA_ERR_NOMEM. */
SA_API int sa_recall_summarize(const struct sa_shape *s, const float *recall,
                               const struct sa_attn_opts *opts, double percentile, double *mean,
                               double *low, size_t *queries);
/* sa_lists_recall_counts and sa_recall_summarize in one call (its codes, and theirs). */
SA_API int sa_lists_recall_stats(const struct sa_shape *s, const float *mass, int per_query,
                                 const int32_t *indices, const int32_t *counts, int k,
                                 const struct sa_attn_opts *opts, double percentile,
                                 double *mean, double *low, size_t *queries);

/* Overlap of lists with reference tile lists (the oracle's: (B, Hkv, q_tiles, ref_k) with
 * ref_counts or NULL): for every row holding at least one block, the share of its blocks that
 * the reference row of its tile also holds (a per-query row of query i is compared with tile
 * i / 128's row); *overlap is the mean over those rows (NaN when every row is empty). Rows are
 * expected without repeated blocks, as selectors write them. Every count and entry read is
 * checked first: SA_ERR_COUNT (outside [0, k] or [0, ref_k]), SA_ERR_INDEX (outside
 * [0, kv_blocks)); SA_ERR_ARG for k or ref_k outside [1, kv_blocks] or per_query not a flag. */
SA_API int sa_lists_overlap(const struct sa_shape *s, int per_query, const int32_t *indices,
                            const int32_t *counts, int k, const int32_t *ref,
                            const int32_t *ref_counts, int ref_k, double *overlap);

/* ||x - ref|| / ||ref|| (L2 over n floats, accumulated in double); ||x - ref|| when ref is all
 * zeros; NaN when x or ref is NULL. */
SA_API double sa_rel_l2(const float *x, const float *ref, size_t n);

/* Output error of attention over lists against dense attention, on the CPU reference: runs
 * sa_ref_tile_sparse / sa_ref_query_sparse over the lists (max_blocks entries per row) under opts
 * (NULL: the defaults). With opts->validate (the default) the lists are checked first under opts,
 * with the list validators' codes (SA_ERR_EMPTY_ROW unless allow_empty_rows, SA_ERR_FUTURE_BLOCK
 * for a causal list's future block unless allow_future_blocks); it then writes to *err the
 * sa_rel_l2 of its FP32 output against dense_f32, the FP32 output (B, Hq, Sq, D) of
 * sa_ref_dense_opts under the same opts. dense_f32 NULL computes it here, at a dense
 * attention's cost per call: pass it when scoring several lists on one input. */
SA_API int sa_lists_output_error(const struct sa_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, int per_query, const int32_t *indices,
                                 const int32_t *counts, int max_blocks,
                                 const struct sa_attn_opts *opts, const float *dense_f32,
                                 double *err);

/* The recall and the output error of tile lists of any layout: l->list_heads Hkv or Hq
 * (per-head and pooled lists, sa_select_layout), l->max_blocks the row width, l->counts NULL or
 * the rows' counts. Query head h reads list head h / (Hq / list_heads). The recall checks the
 * list first, with sa_tile_lists_check's codes (empty rows allowed), and writes recall
 * (B, Hq, Sq) as sa_lists_recall_counts does; the error is sa_lists_output_error's, checked
 * under opts as there. */
SA_API int sa_tile_lists_recall(const struct sa_shape *s, const float *mass,
                                const sa_tile_lists *l, float *recall);
SA_API int sa_tile_lists_output_error(const struct sa_shape *s, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v,
                                      const sa_tile_lists *l, const struct sa_attn_opts *opts,
                                      const float *dense_f32, double *err);

/* ---------------------------------------------------------------- workloads
 * Synthetic Q/K/V with structure a selector can find, reproducible from (name, shape, seed,
 * strength) on every machine. Q is (B, Hq, Sq, D), K and V (B, Hkv, Skv, D), BF16. The heads of
 * a GQA group share the planted structure; their noise is independent. */
typedef struct sa_workload {
    const char *name;
    const char *description; /* one line */
    const char *knob;        /* what strength means */
    double default_strength;
} sa_workload;
#define SA_STRENGTH_DEFAULT (-1.0) /* any negative strength selects the workload's default */
SA_API int sa_workload_count(void);
SA_API const sa_workload *sa_workload_at(int i);
SA_API const sa_workload *sa_workload_by_name(const char *name);
/* SA_ERR_UNKNOWN for an unknown name, SA_ERR_ARG for a non-finite strength; SA_ERR_NOMEM
 * leaves q, k and v as they were. */
SA_API int sa_workload_generate(const char *name, const struct sa_shape *s, uint64_t seed,
                                double strength, uint16_t *q, uint16_t *k, uint16_t *v);

/* Index vectors that predict a given Q/K's attention, in the index-head layout of
 * sa_select_params.index_heads = index_heads (> 0): q_index (B, Hi, Sq, index_dim) and k_index
 * (B, Hi, Skv, index_dim), BF16, from q (B, Hq, Sq, D) and k (B, Hkv, Skv, D). Index head h
 * stands for query heads [h Hq / Hi, (h + 1) Hq / Hi) and for KV heads
 * [h Hkv / Hi, (h + 1) Hkv / Hi) when Hi <= Hkv, for KV head h Hkv / Hi (integer division) when
 * Hi > Hkv; its vectors start from the mean (FP32, in head order) of those query heads' Q and of
 * those KV heads' K.
 *   method "qk":   the means themselves, rounded to BF16; index_dim must be head_dim. With one
 *                  index head per head (Hi == Hq == Hkv) that is Q and K, bit for bit.
 *   method "proj": the means times a Gaussian matrix R (D x index_dim, N(0, 1) entries, one per
 *                  index head, drawn from seed, shared by Q and K and by the batch), divided by
 *                  sqrt(index_dim): E[q' . k'] = q . k, so scores keep their order in
 *                  expectation (Johnson-Lindenstrauss). index_dim: a positive multiple of 16 up
 *                  to SA_MAX_INDEX_DIM.
 * The same arguments give the same bytes on any machine and thread count; non-finite input
 * propagates (the scorer then reports it). SA_ERR_NULL, the shape's code, SA_ERR_UNKNOWN for
 * another method, SA_ERR_ARG for index_heads or index_dim outside those rules or an index
 * tensor past SA_MAX_ELEMS, SA_ERR_NOMEM. */
SA_API int sa_index_generate(const char *method, const struct sa_shape *s, const uint16_t *q,
                             const uint16_t *k, int index_heads, int index_dim, uint64_t seed,
                             uint16_t *q_index, uint16_t *k_index);

#ifdef __cplusplus
}
#endif
#endif
