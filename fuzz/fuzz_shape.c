/* Fuzz target: sa_shape_check, the counts derived from a shape and the GPU stages' shared
 * argument check (sa_gpu_attn_check_common) and the GPU backward's (bwd_check_args, through
 * sa_gpu_backward_workspace_size of a build without CUDA), against the limits of sparseattn.h
 * recomputed in 128-bit arithmetic. Input: six int32 shape fields, then validate,
 * allow_empty_rows, list_heads, max_blocks (int32), a block index (int32) and one byte of flags
 * (bit 0: sparse stage, bit 1: a misaligned q, bit 2: the stage queues the GPU list check). */
#include "fuzz_util.h"
#include "sa_checked.h"
#include "sa_internal.h"

/* The backward's reverse index runs on this shape (backward/bwd_check.c, bwd_index_shape). */
static int index_shape_code(const sa_shape *s, int list_heads)
{
    const sa_shape st = {s->batch, list_heads, list_heads, (int)fuzz_ceil128(s->len_q), s->len_kv,
                         s->head_dim};
    return fuzz_expected_shape_code(&st);
}

/* The index's int32 limits on that shape (kvcentric/kv_limits.c, kv_index_limits), its
 * group being 1 (128 queries a task): entries, tasks and their sum, buckets, an int per
 * (bucket, stand-in Q tile), and max_blocks below SA_KV_MAX_BLOCKS. */
static int index_limits_ok(const sa_shape *s, int list_heads, int max_blocks)
{
    const i128 qt = fuzz_ceil128(s->len_q), buckets = (i128)s->batch * list_heads *
                                                      fuzz_ceil128(s->len_kv);
    const i128 entries = (i128)s->batch * list_heads * qt * max_blocks;
    const i128 tasks = entries / SA_TILE + buckets;
    return entries < INT32_MAX && tasks < INT32_MAX && entries + tasks <= INT32_MAX - 1 &&
           buckets < INT32_MAX - 1 && buckets * fuzz_ceil128(qt) <= INT32_MAX - 1 &&
           max_blocks < SA_KV_MAX_BLOCKS;
}

static _Alignas(16) uint16_t dev_buf[64];
static _Alignas(16) int32_t dev_lists[4];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    sa_shape s = fuzz_shape(&in);
    const int validate = fuzz_i32(&in), allow_empty = fuzz_i32(&in);
    const int list_heads = fuzz_i32(&in), max_blocks = fuzz_i32(&in), blk = fuzz_i32(&in);
    const uint8_t flags = fuzz_u8(&in);

    const int code = sa_shape_check(&s), want = fuzz_expected_shape_code(&s);
    FUZZ_REQUIRE(code == want, "shape (%d,%d,%d,%d,%d,%d): %d, want %d", s.batch, s.heads_q,
                 s.heads_kv, s.len_q, s.len_kv, s.head_dim, code, want);

    /* Derived counts: never negative, never wrapped, valid shape or not. */
    const int qt = sa_q_tiles(&s), kb = sa_kv_blocks(&s);
    FUZZ_REQUIRE(qt == (s.len_q > 0 ? (int)fuzz_ceil128(s.len_q) : 0), "q_tiles %d", qt);
    FUZZ_REQUIRE(kb == (s.len_kv > 0 ? (int)fuzz_ceil128(s.len_kv) : 0), "kv_blocks %d", kb);
    const int bl = sa_block_len(&s, blk);
    if (blk >= 0 && blk < kb) {
        i128 rest = (i128)s.len_kv - (i128)blk * SA_TILE;
        FUZZ_REQUIRE(bl == (rest < SA_TILE ? (int)rest : SA_TILE), "block_len %d", bl);
        FUZZ_REQUIRE(bl >= 1 && bl <= SA_TILE, "block_len %d", bl);
    } else {
        FUZZ_REQUIRE(bl == 0, "block_len %d of block %d outside [0, %d)", bl, blk, kb);
    }
    sa_tile_lists l = {dev_lists, NULL, list_heads, max_blocks};
    const size_t tr = sa_tile_rows(&s, &l), qr = sa_query_rows(&s);
    if (code != SA_OK) {
        FUZZ_REQUIRE(sa_q_elems(&s) == 0 && sa_kv_elems(&s) == 0 && sa_lse_elems(&s) == 0,
                     "element counts of a rejected shape");
        FUZZ_REQUIRE(tr == 0 && qr == 0, "row counts of a rejected shape");
    } else {
        FUZZ_REQUIRE(sa_q_elems(&s) == (size_t)((i128)s.batch * s.heads_q * s.len_q * s.head_dim),
                     "q_elems");
        FUZZ_REQUIRE(sa_kv_elems(&s) ==
                         (size_t)((i128)s.batch * s.heads_kv * s.len_kv * s.head_dim),
                     "kv_elems");
        FUZZ_REQUIRE(sa_lse_elems(&s) == (size_t)((i128)s.batch * s.heads_q * s.len_q),
                     "lse_elems");
        FUZZ_REQUIRE(qr == (size_t)((i128)s.batch * s.heads_kv * s.len_q) && qr <= SA_MAX_ROWS,
                     "query_rows");
        const int lh_ok = list_heads == s.heads_kv || list_heads == s.heads_q;
        FUZZ_REQUIRE(tr == (lh_ok ? (size_t)((i128)s.batch * list_heads * qt) : 0), "tile_rows");
        /* The list arguments: the codes of sa_tile_lists_check_args. */
        int la = sa_tile_lists_check_args(&s, &l);
        int lwant = !lh_ok ? SA_ERR_LIST_HEADS
                    : max_blocks <= 0 || (i128)tr * max_blocks > SA_MAX_ELEMS ? SA_ERR_MAX_BLOCKS
                                                                              : SA_OK;
        FUZZ_REQUIRE(la == lwant, "tile list args %d, want %d", la, lwant);
    }

    /* The GPU stages' shared check. */
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = s;
    a.q = (flags & 2) ? dev_buf + 1 : dev_buf;
    a.k = a.v = dev_buf;
    a.o = dev_buf;
    a.lists = l;
    a.validate = validate;
    a.allow_empty_rows = allow_empty;
    const int sparse = flags & 1, pad = sparse ? SA_TILE : 0;
    const int what = sparse | ((flags & 4) ? SA_CHECK_GPU_VALIDATOR : 0);
    const int g = sa_gpu_attn_check_common(&a, what, 128, pad);
    if (g == SA_OK) {
        FUZZ_REQUIRE(!(what & SA_CHECK_GPU_VALIDATOR) || !validate ||
                         kb <= SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS,
                     "GPU check accepted %d blocks for the GPU list check", kb);
        FUZZ_REQUIRE(code == SA_OK && s.head_dim == 128, "GPU check accepted a bad shape");
        FUZZ_REQUIRE((validate == 0 || validate == 1) && (allow_empty == 0 || allow_empty == 1),
                     "GPU check accepted options %d %d", validate, allow_empty);
        FUZZ_REQUIRE((i128)s.batch * s.heads_q * s.len_q + pad <= INT32_MAX &&
                         (i128)s.batch * s.heads_kv * s.len_kv + pad <= INT32_MAX,
                     "GPU check accepted rows past int32");
        FUZZ_REQUIRE(!(flags & 2), "GPU check accepted a misaligned q");
        FUZZ_REQUIRE(!sparse || sa_tile_lists_check_args(&s, &l) == SA_OK, "GPU check lists");
    } else if (code != SA_OK) {
        FUZZ_REQUIRE(g == code, "GPU check %d, shape check %d", g, code);
    }

    /* The GPU backward's argument checks: without CUDA a call they accept is SA_ERR_NOT_BUILT. */
    sa_gpu_attn_bwd b;
    sa_gpu_attn_bwd_default(&b);
    b.shape = s;
    b.q = a.q;
    b.k = b.v = b.o = b.d_o = dev_buf;
    b.lse = (const float *)dev_buf;
    b.dq = b.dk = b.dv = (float *)dev_buf;
    b.lists = l;
    b.validate = validate;
    b.allow_empty_rows = allow_empty;
    size_t bytes = 1;
    const int bw = sa_gpu_backward_workspace_size(&b, &bytes);
    FUZZ_REQUIRE(bytes == 0, "backward size query left bytes at %zu", bytes);
    if (bw == SA_ERR_NOT_BUILT) {
        FUZZ_REQUIRE(code == SA_OK && s.head_dim == 128, "backward accepted a bad shape");
        FUZZ_REQUIRE(sa_tile_lists_check_args(&s, &l) == SA_OK, "backward accepted bad lists");
        FUZZ_REQUIRE((validate == 0 || validate == 1) && (allow_empty == 0 || allow_empty == 1),
                     "backward accepted options %d %d", validate, allow_empty);
        FUZZ_REQUIRE(!(flags & 2), "backward accepted a misaligned q");
        FUZZ_REQUIRE((i128)s.batch * s.heads_q * fuzz_ceil128(s.len_q) * SA_TILE <= INT32_MAX &&
                         (i128)s.batch * s.heads_kv * fuzz_ceil128(s.len_kv) * SA_TILE <=
                             INT32_MAX &&
                         (i128)tr * max_blocks <= INT32_MAX / 2,
                     "backward accepted rows or entries past int32");
        FUZZ_REQUIRE(!validate || kb <= SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS,
                     "backward accepted %d blocks for the GPU list check", kb);
        FUZZ_REQUIRE(index_shape_code(&s, list_heads) == SA_OK && index_limits_ok(&s, list_heads,
                                                                               max_blocks),
                     "backward accepted lists its reverse index refuses");
    } else if (code != SA_OK) {
        FUZZ_REQUIRE(bw == code, "backward check %d, shape check %d", bw, code);
    }
    return 0;
}
