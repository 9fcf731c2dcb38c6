/*
 * sparseattn: block-sparse attention, public C API.
 *
 * Conventions
 *   - Tensors are BF16 stored as uint16_t, layout BHSD: (batch, head, seq, head_dim), contiguous.
 *   - Query tiles and KV blocks are SA_TILE = 128 tokens. len_kv need not be a multiple of 128:
 *     the final block is then partial and its padding never enters the softmax.
 *   - Softmax scale is 1/sqrt(head_dim); LSE is FP32, natural log, per (batch, head_q, query).
 *   - Every entry point returns SA_OK (0) or a negative sa_status; sa_strerror() explains it.
 *   - Integer metadata (block indices, counts) is int32_t.
 */
#ifndef SPARSEATTN_H
#define SPARSEATTN_H

#include <stddef.h>
#include <stdint.h>

/* SA_API marks every function of the public API (the installed headers, include/ in the tree).
 * The library is built with hidden visibility, so what it exports is exactly what is declared
 * with SA_API, plus the SA_INTERNAL_API functions of its internal headers (for the project's own
 * tools and tests; not part of this API). A caller may define SA_API itself before including. */
#ifndef SA_API
#if defined(__GNUC__) || defined(__clang__)
#define SA_API __attribute__((visibility("default")))
#else
#define SA_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SA_TILE 128 /* tokens per query tile and per KV block */

/* ---------------------------------------------------------------- errors */
typedef enum sa_status {
    SA_OK = 0,
    SA_ERR_NULL = -1,         /* a required pointer is NULL */
    SA_ERR_SHAPE = -2,        /* a size is zero or negative */
    SA_ERR_GQA = -3,          /* heads_q is not a multiple of heads_kv */
    SA_ERR_HEAD_DIM = -4,     /* head_dim not supported */
    SA_ERR_INDEX = -5,        /* block index outside [0, kv_blocks) */
    SA_ERR_DUPLICATE = -6,    /* the same block twice in one row */
    SA_ERR_COUNT = -7,        /* count outside [0, max_blocks] */
    SA_ERR_EMPTY_ROW = -8,    /* a row of count 0 where empty rows are not allowed */
    SA_ERR_LIST_HEADS = -9,   /* list_heads is neither heads_kv nor heads_q */
    SA_ERR_MAX_BLOCKS = -10,  /* max_blocks <= 0 */
    SA_ERR_ARG = -11,         /* another argument is out of range (k, slots, options) */
    SA_ERR_NOMEM = -12,       /* host or device allocation failed */
    SA_ERR_UNSUPPORTED = -13, /* valid input, but this kernel does not support the shape */
    SA_ERR_NO_DEVICE = -14,   /* no usable CUDA device */
    SA_ERR_CUDA = -15,        /* a CUDA call or launch failed */
    SA_ERR_NOT_BUILT = -16,   /* the library was built without CUDA */
    SA_ERR_UNKNOWN = -17,     /* name not found in a registry */
    SA_ERR_FUTURE_BLOCK = -18, /* causal: a listed block lies wholly after the row's last visible key */
} sa_status;

/* One sentence naming the problem; never NULL. */
SA_API const char *sa_strerror(int code);

/* ---------------------------------------------------------------- shapes */
typedef struct sa_shape {
    int batch;
    int heads_q;
    int heads_kv; /* heads_q % heads_kv == 0; 1 means MQA */
    int len_q;
    int len_kv;
    int head_dim; /* 64, 128 or 256 in the reference; GPU stages say what they support */
} sa_shape;

/* Size limits, held by every entry point (docs/api.md, "Limits" and "Error codes"):
 *   - every field of a shape is a positive int;
 *   - rows: batch * heads_q * (len_q rounded up to a multiple of SA_TILE) <= SA_MAX_ROWS, and
 *     the same for batch, heads_kv, len_kv. So every count of rows, tiles, blocks or (batch,
 *     head) pairs of a valid shape fits int32, tile padding included;
 *   - elements: B*Hq*Sq*D and B*Hkv*Skv*D <= SA_MAX_ELEMS;
 *   - every other buffer an entry point reads, writes or allocates (list arrays, partials, index
 *     vectors, scratch, workspace) holds at most SA_MAX_ELEMS elements per dimension product
 *     that the caller chooses (rows * max_blocks for lists: SA_ERR_MAX_BLOCKS past it), and
 *     every byte count is computed in int64 with overflow checks (common/sa_checked.h).
 * sa_shape_check returns SA_ERR_SHAPE past the first two limits. GPU stages add their own
 * (32-bit TMA rows: SA_ERR_UNSUPPORTED). */
#define SA_MAX_ROWS 2147483647            /* INT32_MAX */
#define SA_MAX_ELEMS ((int64_t)1 << 40)   /* elements of one tensor or list array */

/* SA_OK, SA_ERR_NULL, SA_ERR_SHAPE, SA_ERR_GQA or SA_ERR_HEAD_DIM. Also rejects shapes past the
 * limits above (SA_ERR_SHAPE). */
SA_API int sa_shape_check(const sa_shape *s);
SA_API int sa_q_tiles(const sa_shape *s);   /* ceil(len_q / 128); 0 for len_q <= 0, never wraps */
SA_API int sa_kv_blocks(const sa_shape *s); /* ceil(len_kv / 128); 0 for len_kv <= 0, never wraps */
/* Valid keys in block `blk` (128 except for a partial final block); 0 outside [0, kv_blocks). */
SA_API int sa_block_len(const sa_shape *s, int blk);
/* Element counts; 0 unless the shape passes sa_shape_check. */
SA_API size_t sa_q_elems(const sa_shape *s);   /* B*Hq*Sq*D: Q and O */
SA_API size_t sa_kv_elems(const sa_shape *s);  /* B*Hkv*Skv*D: K and V */
SA_API size_t sa_lse_elems(const sa_shape *s); /* B*Hq*Sq */

/* ---------------------------------------------------------------- BF16 */
SA_API uint16_t sa_bf16_from_f32(float x); /* round to nearest even; NaN stays NaN */
SA_API float sa_bf16_to_f32(uint16_t x);   /* exact */
SA_API void sa_bf16_from_f32_array(uint16_t *dst, const float *src, size_t n);
SA_API void sa_bf16_to_f32_array(float *dst, const uint16_t *src, size_t n);

/* ---------------------------------------------------------------- block lists */
/* Q-centric lists: one row per (batch, list_head, q_tile).
 *   indices is (batch, list_heads, q_tiles, max_blocks); a row's first count entries are used.
 *   counts  is (batch, list_heads, q_tiles), or NULL: every row uses max_blocks.
 *   list_heads is heads_kv (a GQA group shares one list) or heads_q (one list per head).
 *   Query head h uses list head h / (heads_q / list_heads). */
typedef struct sa_tile_lists {
    const int32_t *indices;
    const int32_t *counts;
    int list_heads;
    int max_blocks;
} sa_tile_lists;

/* Per-query lists (KV-centric path): one row per (batch, head_kv, query).
 *   indices is (batch, heads_kv, len_q, max_blocks); counts (batch, heads_kv, len_q) or NULL. */
typedef struct sa_query_lists {
    const int32_t *indices;
    const int32_t *counts;
    int max_blocks;
} sa_query_lists;

/* Host-side validators (pointers are host memory). allow_empty = 0 turns a row of count 0 into
 * SA_ERR_EMPTY_ROW; allow_empty is a flag (0 or 1, else SA_ERR_ARG). Check the shape first;
 * these also call sa_shape_check. max_blocks must be positive and rows * max_blocks at most
 * SA_MAX_ELEMS (SA_ERR_MAX_BLOCKS). */
SA_API int sa_tile_lists_check(const sa_shape *s, const sa_tile_lists *l, int allow_empty);
SA_API int sa_query_lists_check(const sa_shape *s, const sa_query_lists *l, int allow_empty);
/* Row counts; 0 unless the shape passes sa_shape_check (and list_heads is heads_kv or
 * heads_q). */
SA_API size_t sa_tile_rows(const sa_shape *s, const sa_tile_lists *l); /* B*list_heads*q_tiles */
SA_API size_t sa_query_rows(const sa_shape *s);                        /* B*Hkv*Sq */

/* ---------------------------------------------------------------- RNG */
/* xoshiro256** seeded through splitmix64: the same seed gives the same stream everywhere. */
typedef struct sa_rng {
    uint64_t s[4];
} sa_rng;
SA_API void sa_rng_seed(sa_rng *r, uint64_t seed);
SA_API uint64_t sa_rng_u64(sa_rng *r);
SA_API double sa_rng_uniform(sa_rng *r);       /* [0, 1) */
SA_API double sa_rng_normal(sa_rng *r);        /* N(0, 1) */
SA_API uint32_t sa_rng_below(sa_rng *r, uint32_t n); /* uniform in [0, n), n > 0 */
/* Fill n BF16 values with N(0, 1) * scale. */
SA_API void sa_rng_fill_bf16(sa_rng *r, uint16_t *dst, size_t n, float scale);
/* A seed from the clock and the process, for tests that draw fresh inputs each run. */
SA_API uint64_t sa_fresh_seed(void);

/* Random lists, sorted by block index within each row, no duplicates.
 * pattern SA_LISTS_INDEPENDENT: every row drawn independently;
 * SA_LISTS_PAIRED: tiles 2t and 2t+1 share one list (what a two-tile CTA can reuse). */
enum { SA_LISTS_INDEPENDENT = 0, SA_LISTS_PAIRED = 1 };
SA_API int sa_random_tile_lists(const sa_shape *s, int list_heads, int k, int pattern,
                                uint64_t seed, int32_t *indices /* (B, list_heads, q_tiles, k) */);
SA_API int sa_random_query_lists(const sa_shape *s, int k, uint64_t seed,
                                 int32_t *indices /* (B, Hkv, Sq, k) */);

/* ---------------------------------------------------------------- outputs and options */
typedef struct sa_outputs {
    uint16_t *o;  /* BF16 (B, Hq, Sq, D), required */
    float *o_f32; /* FP32 (B, Hq, Sq, D), optional */
    float *lse;   /* FP32 (B, Hq, Sq), optional; -inf for a query with no selected key */
} sa_outputs;

typedef struct sa_attn_opts {
    int allow_empty_rows; /* 1: a row of count 0 gives O = 0, LSE = -inf (default 1) */
    int validate;         /* 1: validate lists at the entry point (default 1) */
    /* 1: causal, bottom-right aligned: query i sees key j only when j <= i + (len_kv - len_q)
     * (docs/api.md, "Causal attention"). Default 0. */
    int causal;
    /* With causal = 1: 1 lets a list name a block that lies wholly after its row's last visible
     * key (it contributes nothing); 0 (default) makes validation report SA_ERR_FUTURE_BLOCK. */
    int allow_future_blocks;
} sa_attn_opts;
SA_API void sa_attn_opts_default(sa_attn_opts *o);
/* The option rule of every entry point, CPU and GPU: a flag is 0 or 1, an enum lies in its
 * range; anything else is SA_ERR_ARG. SA_OK, SA_ERR_NULL (o NULL) or SA_ERR_ARG. The GPU stages
 * apply the same rule to sa_gpu_attn's validate, allow_empty_rows, causal and
 * allow_future_blocks, KV-centric to every flag and enum of sa_kv_params. */
SA_API int sa_attn_opts_check(const sa_attn_opts *o);

/* ---------------------------------------------------------------- CPU reference */
/* q is (B, Hq, Sq, D), k and v are (B, Hkv, Skv, D); outputs as in sa_outputs. opts may be NULL
 * (defaults). OpenMP across (batch, head, tile); GEMMs through OpenBLAS. */
SA_API int sa_ref_dense(const sa_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                        const sa_outputs *out);
SA_API int sa_ref_tile_sparse(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const sa_tile_lists *l, const sa_attn_opts *opts,
                              const sa_outputs *out);
SA_API int sa_ref_query_sparse(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                               const uint16_t *v, const sa_query_lists *l,
                               const sa_attn_opts *opts, const sa_outputs *out);
/* Partials: for each (b, hq, query, slot) the attention of the query over the single block in its
 * list's slot. part_o is (B, Hq, Sq, max_blocks, D) FP32, part_lse (B, Hq, Sq, max_blocks);
 * slots at or past the row's count get O = 0, LSE = -inf. */
SA_API int sa_ref_query_partials(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, const sa_query_lists *l, float *part_o,
                                 float *part_lse);
/* Combine: per (b, hq, query), merge `slots` partials by their LSE weights:
 *   lse = log(sum_j exp(lse_j)), o = sum_j exp(lse_j - lse) * o_j.
 * part_o is (B, Hq, Sq, slots, D), part_lse (B, Hq, Sq, slots). All -inf gives O = 0, LSE = -inf. */
SA_API int sa_ref_combine(const sa_shape *s, int slots, const float *part_o, const float *part_lse,
                          const sa_outputs *out);

/* ---------------------------------------------------------------- causal (docs/api.md)
 * Bottom-right aligned: query i (0-based within len_q) sees key j only when
 * j <= i + (len_kv - len_q), its "last visible key"; negative when it sees none (len_q > len_kv).
 * A tile's last visible key is that of its last valid query row, min(128 t + 127, len_q - 1).
 * The blocks a row may see are always a prefix [0, n): the *_blocks helpers return n (the
 * diagonal block, which holds the last visible key, is n - 1). Out-of-range arguments or a shape
 * failing sa_shape_check give -1 (last key) and 0 (blocks). */
SA_API int sa_causal_last_key(const sa_shape *s, int query);
SA_API int sa_causal_query_blocks(const sa_shape *s, int query);
SA_API int sa_causal_tile_blocks(const sa_shape *s, int tile);
/* The host validators under options (opts NULL: defaults): allow_empty_rows is their
 * allow_empty; with causal = 1 they also report SA_ERR_FUTURE_BLOCK for an entry wholly after
 * its row's last visible key unless allow_future_blocks = 1 (per entry: SA_ERR_INDEX, then
 * SA_ERR_DUPLICATE, then SA_ERR_FUTURE_BLOCK), and a row that sees no key at all may be empty
 * even with allow_empty_rows = 0. validate is not read. Options not flags: SA_ERR_ARG, after the
 * argument checks of sa_tile_lists_check. With causal = 0 they are exactly
 * sa_tile_lists_check / sa_query_lists_check. */
SA_API int sa_tile_lists_check_opts(const sa_shape *s, const sa_tile_lists *l,
                                    const sa_attn_opts *opts);
SA_API int sa_query_lists_check_opts(const sa_shape *s, const sa_query_lists *l,
                                     const sa_attn_opts *opts);
/* sa_ref_dense with options: only causal is read (the other fields must still be flags);
 * opts NULL is sa_ref_dense. sa_ref_tile_sparse and sa_ref_query_sparse honour opts->causal and
 * allow_future_blocks themselves (validating with the *_check_opts above). */
SA_API int sa_ref_dense_opts(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const sa_attn_opts *opts, const sa_outputs *out);
/* sa_ref_query_partials with options: validate, allow_empty_rows, causal, allow_future_blocks as
 * in sa_ref_query_sparse; opts NULL is sa_ref_query_partials (validated, empty rows allowed).
 * With causal a slot holds its block's keys visible to the query; a slot with none (or past the
 * count) gets O = 0, LSE = -inf, so sa_ref_combine of causal partials is causal attention. */
SA_API int sa_ref_query_partials_opts(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                      const uint16_t *v, const sa_query_lists *l,
                                      const sa_attn_opts *opts, float *part_o, float *part_lse);

/* ---------------------------------------------------------------- CPU reference, backward
 * The exact gradients of the forward reference calls above (docs/reference.md, "Backward"):
 * same s, q, k, v, lists and opts as the forward call (same validation, same error codes, same
 * masking: keys past len_kv, blocks a row does not list, causal), plus
 *   o   FP32 (B, Hq, Sq, D): the forward's o_f32;
 *   lse FP32 (B, Hq, Sq): the forward's lse (-inf marks a query with no key);
 *   d_o BF16 (B, Hq, Sq, D): dL/dO, in the format of the forward's O.
 * Outputs, FP32, every element written: dq (B, Hq, Sq, D); dk, dv (B, Hkv, Skv, D), summed over
 * the query heads of each KV head's group. With D_i = rowsum(dO_i * O_i),
 * P = exp(scale Q K^T - LSE) on the selected keys: dV = P^T dO, dS = P * (dO V^T - D),
 * dQ = scale dS K, dK = scale dS^T Q. A query with no key gets dQ = 0 and adds nothing. Every
 * pointer is required (SA_ERR_NULL); nothing is written when a call fails. */
SA_API int sa_ref_dense_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, const sa_attn_opts *opts, const float *o,
                                 const float *lse, const uint16_t *d_o, float *dq, float *dk,
                                 float *dv);
SA_API int sa_ref_tile_sparse_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                       const uint16_t *v, const sa_tile_lists *l,
                                       const sa_attn_opts *opts, const float *o, const float *lse,
                                       const uint16_t *d_o, float *dq, float *dk, float *dv);
SA_API int sa_ref_query_sparse_backward(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                        const uint16_t *v, const sa_query_lists *l,
                                        const sa_attn_opts *opts, const float *o,
                                        const float *lse, const uint16_t *d_o, float *dq,
                                        float *dk, float *dv);

/* ---------------------------------------------------------------- GPU stages */
/* 1 when the library was built with CUDA and the first CUDA device is an sm_90 GPU, else 0. */
SA_API int sa_gpu_available(void);

/* Arguments of one GPU attention launch; all pointers are device memory. */
typedef struct sa_gpu_attn {
    sa_shape shape;
    const uint16_t *q, *k, *v; /* BF16 BHSD */
    sa_tile_lists lists;       /* device pointers; ignored by dense stages */
    uint16_t *o;               /* BF16 (B, Hq, Sq, D) */
    float *lse;                /* FP32 (B, Hq, Sq) */
    int validate;              /* 1 (default): check the lists on the GPU (see verdict) */
    int allow_empty_rows;      /* 1 (default) */
    void *stream;              /* cudaStream_t; NULL is the default stream */
    /* With validate = 1: NULL (default) makes the call wait for the check and return its code.
     * A verdict (sa_gpu_verdict_create) instead makes a stage with the role SA_ROLE_GPU_VERDICT
     * record the code in device memory and return SA_OK at once (no host synchronization, so
     * the call can be captured in a CUDA graph); sa_gpu_verdict_read fetches it later. Stages
     * without that role check synchronously and also record the code there. */
    struct sa_gpu_verdict *verdict;
    int causal;              /* as sa_attn_opts.causal (default 0); stages say if they support it */
    int allow_future_blocks; /* as sa_attn_opts.allow_future_blocks (default 0) */
    /* Optional (default NULL), stages with SA_ROLE_ROW_MASKS only: which rows of its Q tile each
     * list entry serves, so that tile lists express per-query lists exactly (a tile's union, each
     * block masked to the queries that chose it). Four words per entry, 16-byte aligned: entry j of
     * list row r has words row_masks[(r * max_blocks + j) * 4 + w], w = 0..3, whose bit b says
     * whether row 32 w + b of the tile sees the block (bits of rows past len_q are ignored). A
     * row masked out of every block of its list gives O = 0, LSE = -inf, like an empty row. */
    const uint32_t *row_masks;
} sa_gpu_attn;
SA_API void sa_gpu_attn_default(sa_gpu_attn *a);

/* A verdict: one word of device memory where validated GPU calls record bad metadata. It holds
 * the most negative code recorded since it was last read (SA_OK when none), the same code the
 * synchronous check returns for the same lists. One verdict may serve many calls and streams. */
typedef struct sa_gpu_verdict sa_gpu_verdict;
/* SA_OK, SA_ERR_NULL, SA_ERR_NOMEM, SA_ERR_NO_DEVICE or SA_ERR_NOT_BUILT. */
SA_API int sa_gpu_verdict_create(sa_gpu_verdict **out);
/* Waits for the work queued on `stream` (NULL: the default stream; the caller orders any other
 * streams that recorded into it), returns the recorded code and resets the verdict to SA_OK. */
SA_API int sa_gpu_verdict_read(sa_gpu_verdict *v, void *stream);
SA_API void sa_gpu_verdict_destroy(sa_gpu_verdict *v); /* NULL is a no-op */

/* The library keeps a few GPU resources per host thread and CUDA context between calls, made on
 * first use (docs/api.md, "Resources kept between calls"). This frees the calling thread's ones
 * in its current context, after the device work that uses them; the next call makes them again.
 * Call it before cudaDeviceReset (after a reset the library makes new ones in the new context
 * and forgets the old, whose memory the reset freed) or when a thread is done with the library.
 * SA_OK (also without CUDA, where nothing is kept), or SA_ERR_CUDA if a free failed. */
SA_API int sa_gpu_thread_release(void);

/* Validate lists that live in device memory, with a small GPU kernel (the shape and the list
 * struct are host memory). Same codes as the host validators, and SA_ERR_UNSUPPORTED past
 * SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS KV blocks; synchronizes `stream`. With several bad rows the
 * most negative code comes back (the host validators: the first bad row's). SA_ERR_NOT_BUILT
 * without CUDA. */
SA_API int sa_gpu_tile_lists_check(const sa_shape *s, const sa_tile_lists *device_lists,
                                   int allow_empty, void *stream);
SA_API int sa_gpu_query_lists_check(const sa_shape *s, const sa_query_lists *device_lists,
                                    int allow_empty, void *stream);

/* What a stage is for, so that tests, tools and benches pick stages by role, never by id. */
enum {
    SA_ROLE_SPARSE = 1u << 0,        /* consumes tile lists */
    SA_ROLE_DEFAULT_DENSE = 1u << 1, /* the dense stage that tools run by default */
    SA_ROLE_DEFAULT_TILE = 1u << 2,  /* the tile-list stage that tools run by default */
    SA_ROLE_GPU_VERDICT = 1u << 3,   /* validates inside its kernel and honours a->verdict */
    SA_ROLE_ROW_MASKS = 1u << 4,     /* honours a->row_masks (per-entry row masks of tile lists) */
};

/* The stage registry: written once, read by tests, the CLI, the benchmarks and the docs. */
typedef struct sa_stage {
    int id;              /* the number of its file, cuda/NN_name.cu; only stages.c writes it */
    const char *name;    /* e.g. "dense_persistent" */
    const char *summary; /* one line */
    unsigned roles;      /* SA_ROLE_* bits (SA_ROLE_SPARSE: consumes tile lists) */
    int (*check)(const sa_gpu_attn *a);  /* SA_OK or why the stage cannot run it; no launch */
    int (*launch)(const sa_gpu_attn *a); /* validates (check) then launches */
} sa_stage;
/* What every stage's check() verifies before its own assumptions, in this order (no CUDA call,
 * no device needed): a non-NULL (SA_ERR_NULL); the shape (sa_shape_check); q, k, v, o non-NULL,
 * with SA_CHECK_SPARSE lists.indices too (SA_ERR_NULL); with SA_CHECK_SPARSE list_heads,
 * max_blocks and the list array's size (the codes of sa_tile_lists_check); validate,
 * allow_empty_rows, causal and allow_future_blocks are flags (SA_ERR_ARG); causal = 1 only with
 * SA_CHECK_CAUSAL (else SA_ERR_UNSUPPORTED); head_dim equal to `head_dim` (SA_ERR_UNSUPPORTED);
 * B*Hq*Sq + row_pad and B*Hkv*Skv + row_pad at most INT32_MAX, TMA coordinates and the kernels'
 * row arithmetic being 32-bit (row_pad: how far past the last row a partial tile's load may
 * reach, 0 when every length is a multiple of the tile; SA_ERR_UNSUPPORTED); q, k, v, o 16-byte
 * aligned, lse and the lists 4-byte aligned (SA_ERR_UNSUPPORTED); row_masks NULL unless
 * SA_CHECK_ROW_MASKS (SA_ERR_UNSUPPORTED), and then 16-byte aligned (SA_ERR_UNSUPPORTED); with
 * SA_CHECK_GPU_VALIDATOR and validate = 1, at most SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS KV blocks
 * (SA_ERR_UNSUPPORTED), so that check() refuses what the validated launch would.
 * `what` is a set of: */
#define SA_CHECK_SPARSE 1    /* the stage reads tile lists */
#define SA_CHECK_CAUSAL 2    /* the stage masks causally */
#define SA_CHECK_ROW_MASKS 4 /* the stage reads a->row_masks */
#define SA_CHECK_GPU_VALIDATOR 8 /* validate = 1 runs sa_gpu_tile_lists_check's kernel */
/* KV blocks per row that the GPU list validators take (sa_gpu_tile_lists_check and
 * sa_gpu_query_lists_check, and the stages and the backward that queue their kernel): one bit a
 * block per warp in 48 KiB of shared memory, 12.5M keys. Past it: SA_ERR_UNSUPPORTED. */
#define SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS 98304
SA_API int sa_gpu_attn_check_common(const sa_gpu_attn *a, int what, int head_dim, int row_pad);
SA_API int sa_stage_count(void);
SA_API const sa_stage *sa_stage_at(int i);
SA_API const sa_stage *sa_stage_by_id(int id);
SA_API const sa_stage *sa_stage_by_name(const char *name);
/* The first stage with every bit of `roles`, or NULL. */
SA_API const sa_stage *sa_stage_with(unsigned roles);

/* ---------------------------------------------------------------- GPU backward (docs/backward.md)
 * The gradients of tile-list attention on the GPU, for the forward of any tile-list stage: the
 * same shape, q, k, v, lists and options as that call, its outputs o (BF16) and lse, and dL/dO.
 * Exact masked-softmax gradients as sa_ref_tile_sparse_backward (whose FP32 o the GPU replaces
 * by the forward's BF16 o in D_i = rowsum(dO_i * O_i)); head_dim 128, GQA by index (dK, dV
 * summed over the group's heads), per-head or group-shared lists, counts NULL = max_blocks, empty
 * rows, partial blocks, causal. Deterministic: no atomics, the same inputs give the same bits.
 * Every output element is written (a query with no key gets dQ = 0, a key no query chose dK =
 * dV = 0).
 *
 * dQ comes from one of two passes (dq_pass), both deterministic. SA_BWD_DQ_STORED: the dK/dV
 * kernel stores dS^T (BF16, TILE x TILE per query head, tile and list slot) in the workspace and
 * dQ = dS K reads it back, one GEMM per listed block (5 in all); the workspace grows by
 * B * Hq * q_tiles * max_blocks * 32 KiB. SA_BWD_DQ_RECOMPUTE: dQ's pass recomputes S and dP (7
 * GEMMs in all) in a small workspace. SA_BWD_DQ_AUTO (default): stored when that buffer is at
 * most SA_BWD_STORED_DS_AUTO_MAX bytes, else recompute. The two give dQ equal up to FP32
 * rounding (dS is summed in another order before its BF16 rounding). */
#define SA_BWD_DQ_AUTO 0
#define SA_BWD_DQ_RECOMPUTE 1
#define SA_BWD_DQ_STORED 2
#define SA_BWD_STORED_DS_AUTO_MAX ((size_t)2 << 30) /* 2 GiB */
typedef struct sa_gpu_attn_bwd {
    sa_shape shape;            /* head_dim 128 */
    const uint16_t *q, *k, *v; /* device BF16, BHSD */
    const uint16_t *o;         /* device BF16 (B, Hq, Sq, D): the forward's O */
    const float *lse;          /* device FP32 (B, Hq, Sq): the forward's LSE */
    const uint16_t *d_o;       /* device BF16 (B, Hq, Sq, D): dL/dO */
    sa_tile_lists lists;       /* device pointers: the forward's lists */
    float *dq;                 /* device FP32 (B, Hq, Sq, D) */
    float *dk, *dv;            /* device FP32 (B, Hkv, Skv, D); every tensor 16-byte aligned */
    /* 1 (default): the lists are checked on the GPU with the forward's rules and codes (those of
     * sa_tile_lists_check_opts) before any kernel of the backward; the call then synchronizes
     * the stream once.
     * 0: unchecked; a count outside [0, max_blocks] is an empty row and an index outside
     * [0, kv_blocks) is skipped (wrong gradients for bad lists, never a bad access). */
    int validate;
    int allow_empty_rows;    /* as sa_attn_opts (default 1) */
    int causal;              /* as sa_attn_opts (default 0) */
    int allow_future_blocks; /* as sa_attn_opts (default 0) */
    void *workspace;         /* device, 16-byte aligned, sa_gpu_backward_workspace_size bytes;
                                NULL: allocated per call */
    size_t workspace_bytes;
    void *stream;            /* cudaStream_t; NULL is the default stream */
    int dq_pass;             /* SA_BWD_DQ_AUTO (default), _RECOMPUTE or _STORED (above) */
    /* With validate = 1: NULL (default) makes the call wait for the check and return its code.
     * A verdict (sa_gpu_verdict_create) instead gets the check's code recorded in device memory
     * and the call returns SA_OK with no host synchronization (so it can be captured in a CUDA
     * graph); sa_gpu_verdict_read fetches the code later. The kernels run either way: for bad
     * lists they give the unchecked call's defined, wrong gradients (validate = 0 above). */
    struct sa_gpu_verdict *verdict;
} sa_gpu_attn_bwd;
SA_API void sa_gpu_attn_bwd_default(sa_gpu_attn_bwd *a);
/* Device workspace of a call: D (B * Hq * Sq floats), the reverse index of the lists, the dK/dV
 * split sums (GQA) and, on the stored path, dS^T. The call's argument errors first (as below),
 * then SA_ERR_NO_DEVICE: the index's scratch is sized on the device. */
SA_API int sa_gpu_backward_workspace_size(const sa_gpu_attn_bwd *a, size_t *bytes);
/* Checks the arguments (and the lists when a->validate), then queues its kernels (the reverse
 * index of the lists, D, dK/dV, dQ) on a->stream. The argument checks, none of which needs a
 * device: NULL pointers, the shape, the lists' arguments, flags and dq_pass (SA_ERR_ARG), then
 * SA_ERR_UNSUPPORTED for alignment, head_dim other than 128, rows or entries past int32, with
 * validate more than SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS KV blocks, lists the reverse index cannot
 * take (its shape: batch, list_heads heads, q_tiles queries, len_kv keys; max_blocks below
 * SA_KV_MAX_BLOCKS) and a workspace not 16-byte aligned. Then SA_ERR_NO_DEVICE without an sm_90
 * GPU; SA_ERR_NOT_BUILT without CUDA (after the argument checks). docs/api.md has every code. */
SA_API int sa_gpu_tile_sparse_backward(const sa_gpu_attn_bwd *a);

/* ---------------------------------------------------------------- ABI check */
/* For bindings that mirror the public structs (python/sparseattn checks them at import):
 * sa_abi_sizeof("sa_gpu_attn") is sizeof(sa_gpu_attn), 0 for a name it does not know;
 * sa_abi_offsetof("sa_gpu_attn", "verdict") is offsetof(sa_gpu_attn, verdict), (size_t)-1 for
 * an unknown struct or field. Every public struct of this header and of the two it includes is
 * known (common/sa_abi.c). */
SA_API size_t sa_abi_sizeof(const char *struct_name);
SA_API size_t sa_abi_offsetof(const char *struct_name, const char *field);

#ifdef __cplusplus
}
#endif

#include "sa_selectors.h"
#include "sa_kvcentric.h"
#endif
