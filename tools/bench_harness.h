/*
 * The GPU bench harness of the sparseattn program (tools/bench_harness.cu): device buffers,
 * random BF16 inputs, the copy-bandwidth ceiling, and CUDA-event timing of a callback with a
 * context. It lives in the program, not in libsparseattn: the program links the CUDA runtime
 * itself (tools/meson.build) and reaches the library only through its API (sparseattn.h and the
 * SA_INTERNAL_API headers). Only built with CUDA (SA_HAVE_CUDA); callers guard with
 * #ifdef SA_HAVE_CUDA.
 *
 * Plain C (extern "C" in the .cu file), without the CUDA headers: a stream is a void * holding a
 * cudaStream_t, as in sa_gpu_attn.stream. The program links the CUDA runtime through the same
 * dependency as the library (cuda_deps; with meson 1.0 and nvcc 13 both end up on the shared
 * libcudart, one runtime in the process). Were they two copies, they would still share the
 * device's primary context, so device pointers, streams and events pass between them either way;
 * the library's entry points return their own launch errors, and a fault inside any kernel is
 * sticky and shows at the harness's next synchronization.
 *
 * Every function returns SA_OK or a negative sa_status; after SA_ERR_CUDA or SA_ERR_NOMEM,
 * bh_last_error() says which call failed and why.
 */
#ifndef SA_BENCH_HARNESS_H
#define SA_BENCH_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "sparseattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Detail of the last failure in the harness ("cudaMalloc: out of memory"); never NULL. */
const char *bh_last_error(void);

/* The device everything runs on (device 0), read once. */
typedef struct bh_device {
    char name[256];
    int cc_major, cc_minor;
    int sms;
    size_t l2_bytes;
    size_t mem_total, mem_free;
    int sm_clock_khz; /* as reported by the driver (may be 0) */
} bh_device;

/* A harness context: device 0 and one stream every timed call goes to. The stream is a blocking
 * one (it waits for the legacy default stream), so a call that wrongly launches on stream 0 is
 * still inside the events that time it. */
typedef struct bh_gpu bh_gpu;
int bh_open(bh_gpu **g, bh_device *info /* may be NULL */);
void bh_close(bh_gpu *g);
void *bh_stream(bh_gpu *g); /* cudaStream_t */
/* Queues a kernel that spins for `us` microseconds on the stream, so that the calls queued
 * behind it are all in the stream before the first starts (no host gap inside them). */
int bh_spin_us(bh_gpu *g, int us);
int bh_sync(bh_gpu *g); /* waits for the stream */

/* Device memory. bh_alloc checks free memory first and returns SA_ERR_NOMEM with a message
 * rather than failing inside the driver. */
int bh_alloc(void **p, size_t bytes);
void bh_free(void *p); /* NULL is fine */
int bh_upload(void *dev, const void *host, size_t bytes);
int bh_download(void *host, const void *dev, size_t bytes);

/* n BF16 values N(0,1) * scale from a counter-based hash of (seed, index): the same seed gives
 * the same tensor on every run and any device. Not the host sa_rng stream. */
int bh_fill_bf16(bh_gpu *g, uint16_t *dev, size_t n, uint64_t seed, float scale);
/* Fill with all-ones bytes: NaN in both BF16 and FP32, so unwritten outputs show. */
int bh_poison(bh_gpu *g, void *dev, size_t bytes);
/* Count NaN/inf in a BF16 buffer and NaN (only; -inf is a legal LSE) in an FP32 buffer.
 * Synchronizes the stream. */
int bh_count_bad(bh_gpu *g, const uint16_t *bf16, size_t n_bf16, const float *f32, size_t n_f32,
                 size_t *bad_bf16, size_t *bad_f32);

/* Device-to-device copy bandwidth: cudaMemcpyAsync of `bytes` (>= 1 GiB advised) between two
 * buffers, median of reps after warm-up. *bytes_per_s counts bytes read plus bytes written
 * (2 * bytes per copy), the number a kernel's own traffic compares to. */
int bh_copy_bandwidth(bh_gpu *g, size_t bytes, int reps, double *bytes_per_s);

/* Queues a kernel that reads a_bytes at a and b_bytes at b once (16-byte streaming loads, both
 * 16-byte aligned multiples of 16) and writes nothing: timed like any call, it is the measured
 * floor of a kernel that must read those bytes, launch and ramp-up included, next to the
 * bytes-over-bandwidth floor. `stream` is a cudaStream_t. */
int bh_read_once(const void *a, size_t a_bytes, const void *b, size_t b_bytes, void *stream);

/* One input set for a stage: Q, K, V random (seeded), O and LSE allocated (poisoned), optional
 * tile lists on the device. `a` is ready to pass to a stage (stream set to the context's). */
typedef struct bh_set {
    sa_gpu_attn a;
    size_t bytes; /* device bytes this set occupies (Q, K, V, O, LSE, lists) */
} bh_set;
int bh_set_create(bh_gpu *g, const sa_shape *s, uint64_t seed, bh_set *set);
/* Upload (replacing any earlier) host lists: indices (B, list_heads, q_tiles, max_blocks),
 * counts NULL or (B, list_heads, q_tiles). */
int bh_set_lists(bh_set *set, const int32_t *indices, const int32_t *counts, int list_heads,
                 int max_blocks);
void bh_set_destroy(bh_set *set);

/* How many input sets to rotate among so that between two calls on one set at least twice the
 * L2 of other data passes through (>= 2, <= max_sets). */
int bh_sets_needed(const bh_device *d, size_t set_bytes, int max_sets);

/* ---------------------------------------------------------------- timing a callback */

/* One call of the thing timed: queues its work on `stream` (a cudaStream_t, the context's) and
 * returns SA_OK or a negative sa_status. It must not synchronize unless that is what is being
 * measured (a validated stage call returns its check's code, so it waits). */
typedef int (*bh_fn)(void *ctx, void *stream);

typedef struct bh_timing {
    double median_ms, min_ms, max_ms; /* over the reps' event pairs */
    int reps;
    /* Host time per call: wall time of queuing the untimed warm-up calls (back to back on an idle
     * GPU, before the timed ones) over their number. A call that waits for the GPU counts its
     * wait. Not part of the GPU times above. 0 from bh_time_parts. */
    double host_us;
} bh_timing;

/* Times fn with CUDA events on the context's stream. Call i gets ctx[i % nctx] (nctx input sets
 * rotated, so that each call reads inputs the previous ones pushed out of the L2): first
 * max(warmup, nctx) untimed calls, a synchronization, then `reps` calls each bracketed by its own
 * pair of events, with no host synchronization between them (sync_each: the stream is
 * synchronized after each call, inside its events). Every call's return code is checked (a
 * failure names `name`), and a CUDA error after the run is reported. Median, min and max of the
 * reps' elapsed times. */
int bh_time(bh_gpu *g, const char *name, bh_fn fn, void *const *ctx, int nctx, int sync_each,
            int warmup, int reps, bh_timing *t);

/* Times a call made of nparts parts in sequence on one context: per rep an event before each part
 * and one after the last, then the host waits for that last event before the next rep (so each
 * rep starts on an idle GPU and its first part counts its launch). No warm-up (the caller's).
 * t[i] (i < nparts) is part i's time, t[nparts] the whole rep's (first event to last): nparts + 1
 * entries. */
int bh_time_parts(bh_gpu *g, const char *name, const bh_fn *parts, int nparts, void *ctx,
                  int reps, bh_timing *t);

/* Poison out->o and out->lse, make one call, synchronize, and count outputs left NaN/inf: a call
 * that leaves outputs unwritten is not worth timing. *bad is O's count plus LSE's (NaN only:
 * -inf is the LSE of an empty row). */
int bh_smoke(bh_gpu *g, const char *name, bh_fn fn, void *ctx, const sa_gpu_attn *out,
             size_t *bad);

/* ---------------------------------------------------------------- a registered stage */

/* bh_time of st->launch on the sets (call i: sets[i % nsets].a, stream set to the context's).
 * Sets each set's validate to `validate`; with validate = 1 a stage with SA_ROLE_GPU_VERDICT runs
 * as it is meant to be called, with a device verdict read once after the timed calls
 * (sparseattn.h), not a synchronization per call. BH_SYNC_ONLY instead runs without validation
 * but synchronizes the stream after every call, as a synchronously validated call does, to tell
 * the round trip from the check's own cost. The sets' verdict is NULL again on return. */
#define BH_SYNC_ONLY 2
int bh_time_stage(bh_gpu *g, const sa_stage *st, bh_set *sets, int nsets, int validate,
                  int warmup, int reps, bh_timing *t);

/* bh_smoke of st->launch on the set, with validation on (the default path, and the lists get
 * checked at least once). */
int bh_smoke_stage(bh_gpu *g, const sa_stage *st, bh_set *set, size_t *bad);

#ifdef __cplusplus
}
#endif
#endif
