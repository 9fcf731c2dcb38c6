/*
 * GPU benchmark harness (internal, not part of the public API): device buffers, random BF16
 * inputs, the copy-bandwidth ceiling and CUDA-event timing of any registered stage.
 *
 * Everything here is plain C callable (extern "C" in sa_gpu_bench.cu) so the CLI, which links
 * only libsparseattn, can use it. Only compiled when the library is built with CUDA
 * (SA_HAVE_CUDA); callers guard with #ifdef SA_HAVE_CUDA.
 *
 * Every function returns SA_OK or a negative sa_status; after SA_ERR_CUDA, sa_gb_last_error()
 * names the CUDA call and its error string.
 */
#ifndef SA_GPU_BENCH_H
#define SA_GPU_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "sa_internal_api.h" /* SA_INTERNAL_API; includes sparseattn.h */

#ifdef __cplusplus
extern "C" {
#endif

/* Detail of the last failure in this file ("cudaMalloc: out of memory"); never NULL. */
SA_INTERNAL_API const char *sa_gb_last_error(void);

/* The device the stages run on (device 0), read once. */
typedef struct sa_gb_device {
    char name[256];
    int cc_major, cc_minor;
    int sms;
    size_t l2_bytes;
    size_t mem_total, mem_free;
    int sm_clock_khz; /* as reported by the driver (may be 0) */
} sa_gb_device;

/* A bench context: device 0 and one stream every launch goes to. The stream is a blocking one
 * (it waits for the legacy default stream), so a stage that wrongly launches on stream 0 is
 * still inside the events that time it. */
typedef struct sa_gb sa_gb;
SA_INTERNAL_API int sa_gb_open(sa_gb **g, sa_gb_device *info /* may be NULL */);
SA_INTERNAL_API void sa_gb_close(sa_gb *g);
SA_INTERNAL_API void *sa_gb_stream(sa_gb *g); /* cudaStream_t, for sa_gpu_attn.stream */

/* Device memory. sa_gb_alloc checks free memory first and returns SA_ERR_NOMEM with a message
 * rather than failing inside the driver. */
SA_INTERNAL_API int sa_gb_alloc(void **p, size_t bytes);
SA_INTERNAL_API void sa_gb_free(void *p); /* NULL is fine */
SA_INTERNAL_API int sa_gb_upload(void *dev, const void *host, size_t bytes);
SA_INTERNAL_API int sa_gb_download(void *host, const void *dev, size_t bytes);

/* n BF16 values N(0,1) * scale from a counter-based hash of (seed, index): the same seed gives
 * the same tensor on every run and any device. Not the host sa_rng stream. */
SA_INTERNAL_API int sa_gb_fill_bf16(sa_gb *g, uint16_t *dev, size_t n, uint64_t seed, float scale);
/* Fill with all-ones bytes: NaN in both BF16 and FP32, so unwritten outputs show. */
SA_INTERNAL_API int sa_gb_poison(sa_gb *g, void *dev, size_t bytes);
/* Count NaN/inf in a BF16 buffer and NaN (only; -inf is a legal LSE) in an FP32 buffer. */
SA_INTERNAL_API int sa_gb_count_bad(sa_gb *g, const uint16_t *bf16, size_t n_bf16,
                                    const float *f32, size_t n_f32, size_t *bad_bf16,
                                    size_t *bad_f32);

/* Device-to-device copy bandwidth: cudaMemcpyAsync of `bytes` (>= 1 GiB advised) between two
 * buffers, median of reps after warm-up. *bytes_per_s counts bytes read plus bytes written
 * (2 * bytes per copy), the number a kernel's own traffic compares to. */
SA_INTERNAL_API int sa_gb_copy_bandwidth(sa_gb *g, size_t bytes, int reps, double *bytes_per_s);

/* Queues a kernel that reads a_bytes at a and b_bytes at b once (16-byte streaming loads, both
 * 16-byte aligned multiples of 16) and writes nothing: timed like a stage, it is the measured
 * floor of a kernel that must read those bytes, launch and ramp-up included, next to the
 * bytes-over-bandwidth floor. `stream` is a cudaStream_t. */
SA_INTERNAL_API int sa_gb_read_once(const void *a, size_t a_bytes, const void *b, size_t b_bytes,
                                    void *stream);

/* One input set for a launch: Q, K, V random (seeded), O and LSE allocated, optional tile lists
 * on the device. `a` is ready to pass to a stage (stream set to the context's). */
typedef struct sa_gb_set {
    sa_gpu_attn a;
    size_t bytes; /* device bytes this set occupies (Q, K, V, O, LSE, lists) */
} sa_gb_set;
SA_INTERNAL_API int sa_gb_set_create(sa_gb *g, const sa_shape *s, uint64_t seed, sa_gb_set *set);
/* Upload (replacing any earlier) host lists: indices (B, list_heads, q_tiles, max_blocks),
 * counts NULL or (B, list_heads, q_tiles). */
SA_INTERNAL_API int sa_gb_set_lists(sa_gb_set *set, const int32_t *indices,
                                    const int32_t *counts, int list_heads, int max_blocks);
SA_INTERNAL_API void sa_gb_set_destroy(sa_gb_set *set);

/* How many input sets to rotate among so that between two launches on one set at least twice
 * the L2 of other data passes through (>= 2, <= max_sets). */
SA_INTERNAL_API int sa_gb_sets_needed(const sa_gb_device *d, size_t set_bytes, int max_sets);

/* Timing of one stage. */
typedef struct sa_gb_timing {
    double median_ms, min_ms, max_ms;
    int reps;
} sa_gb_timing;

/* Times st->launch with CUDA events on the context's stream. Launch i uses sets[i % nsets];
 * `warmup` untimed launches first (at least one per set), then `reps` launches each bracketed by
 * its own pair of events, with no host synchronisation between reps. Every launch's return code
 * is checked, and a CUDA error after the run is reported. Overrides each set's validate with
 * `validate`; SA_GB_SYNC_ONLY instead runs without validation but synchronizes the stream after
 * every launch, as a validated call does, to tell the round trip from the check's own cost. */
#define SA_GB_SYNC_ONLY 2
SA_INTERNAL_API int sa_gb_time_stage(sa_gb *g, const sa_stage *st, sa_gb_set *sets, int nsets,
                                     int validate, int warmup, int reps, sa_gb_timing *t);

/* Poison O and LSE of `set`, launch once with validation on, synchronise, and count outputs
 * left NaN/inf: a stage that leaves outputs unwritten is not worth timing. *bad is O's count
 * plus LSE's (NaN only: -inf is the LSE of an empty row). */
SA_INTERNAL_API int sa_gb_smoke(sa_gb *g, const sa_stage *st, sa_gb_set *set, size_t *bad);

#ifdef __cplusplus
}
#endif
#endif
