// The GPU bench harness of the sparseattn program: see bench_harness.h. Its core times a callback
// with a context (bh_time, bh_time_parts); a registered stage is one such callback
// (bh_time_stage). Built into the program, not the library (tools/meson.build).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "bench_harness.h"

namespace {

// Free memory the harness leaves to the stages' own scratch buffers and the driver.
constexpr size_t kAllocReserve = size_t(512) << 20;
// Threads per block and a grid cap for the grid-stride utility kernels.
constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 8;

thread_local char last_err[512] = "no error";

void set_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
}

// Every CUDA call goes through CK: on failure it records the call and returns SA_ERR_CUDA.
#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            set_err("%s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__);         \
            return SA_ERR_CUDA;                                                                   \
        }                                                                                         \
    } while (0)

int grid_for(size_t work)
{
    size_t b = (work + kThreads - 1) / kThreads;
    return (int)std::max<size_t>(1, std::min<size_t>(b, kMaxBlocks));
}

// splitmix64's finaliser: a good 64-bit mix, so (seed, index) -> independent-looking bits.
__host__ __device__ inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Box-Muller on one 64-bit draw per pair of outputs (24 bits per uniform is plenty for BF16).
__global__ void fill_normal_bf16(uint16_t *p, size_t n, uint64_t seed, float scale)
{
    const size_t pairs = (n + 1) / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed ^ mix64(i));
        float u1 = (float)((r >> 40) + 1) * 0x1p-24f; // (0, 1]: log is finite
        float u2 = (float)((r >> 16) & 0xffffff) * 0x1p-24f;
        float rad = sqrtf(-2.0f * logf(u1)) * scale;
        float sn, cs;
        sincospif(2.0f * u2, &sn, &cs);
        p[2 * i] = __bfloat16_as_ushort(__float2bfloat16_rn(rad * cs));
        if (2 * i + 1 < n)
            p[2 * i + 1] = __bfloat16_as_ushort(__float2bfloat16_rn(rad * sn));
    }
}

__global__ void count_bad(const uint16_t *b, size_t nb, const float *f, size_t nf,
                          unsigned long long *out /* [2] */)
{
    unsigned long long cb = 0, cf = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nb; i += stride)
        cb += (b[i] & 0x7f80u) == 0x7f80u; // exponent all ones: inf or NaN
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nf; i += stride)
        cf += isnan(f[i]);
    if (cb)
        atomicAdd(&out[0], cb);
    if (cf)
        atomicAdd(&out[1], cf);
}

} // namespace

struct bh_gpu {
    cudaStream_t stream;
    bh_device dev;
};

extern "C" const char *bh_last_error(void) { return last_err; }

extern "C" int bh_open(bh_gpu **g, bh_device *info)
{
    if (!g)
        return SA_ERR_NULL;
    *g = nullptr;
    if (!sa_gpu_available()) {
        set_err("no usable CUDA device (the stages need compute capability 9.0)");
        return SA_ERR_NO_DEVICE;
    }
    CK(cudaSetDevice(0));
    bh_gpu *c = (bh_gpu *)calloc(1, sizeof *c);
    if (!c) {
        set_err("out of host memory");
        return SA_ERR_NOMEM;
    }
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    if (e == cudaSuccess)
        e = cudaStreamCreate(&c->stream);
    if (e != cudaSuccess) {
        set_err("bh_open: %s", cudaGetErrorString(e));
        free(c);
        return SA_ERR_CUDA;
    }
    snprintf(c->dev.name, sizeof c->dev.name, "%s", p.name);
    c->dev.cc_major = p.major;
    c->dev.cc_minor = p.minor;
    c->dev.sms = p.multiProcessorCount;
    c->dev.l2_bytes = (size_t)p.l2CacheSize;
    int clk = 0;
    if (cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0) != cudaSuccess) {
        cudaGetLastError();
        clk = 0;
    }
    c->dev.sm_clock_khz = clk;
    if (cudaMemGetInfo(&c->dev.mem_free, &c->dev.mem_total) != cudaSuccess) {
        set_err("cudaMemGetInfo failed");
        cudaStreamDestroy(c->stream);
        free(c);
        return SA_ERR_CUDA;
    }
    if (info)
        *info = c->dev;
    *g = c;
    return SA_OK;
}

extern "C" void bh_close(bh_gpu *g)
{
    if (!g)
        return;
    cudaStreamSynchronize(g->stream);
    cudaStreamDestroy(g->stream);
    free(g);
}

extern "C" void *bh_stream(bh_gpu *g) { return g ? (void *)g->stream : nullptr; }

extern "C" int bh_alloc(void **p, size_t bytes)
{
    if (!p)
        return SA_ERR_NULL;
    *p = nullptr;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    if (bytes + kAllocReserve > free_b) {
        set_err("need %.1f MiB of device memory, %.1f MiB free", bytes / 1048576.0,
                free_b / 1048576.0);
        return SA_ERR_NOMEM;
    }
    CK(cudaMalloc(p, bytes ? bytes : 1));
    return SA_OK;
}

extern "C" void bh_free(void *p)
{
    if (p)
        cudaFree(p);
}

extern "C" int bh_upload(void *dev, const void *host, size_t bytes)
{
    if (!dev || !host)
        return SA_ERR_NULL;
    CK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return SA_OK;
}

extern "C" int bh_download(void *host, const void *dev, size_t bytes)
{
    if (!dev || !host)
        return SA_ERR_NULL;
    CK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return SA_OK;
}

extern "C" int bh_fill_bf16(bh_gpu *g, uint16_t *dev, size_t n, uint64_t seed, float scale)
{
    if (!g || !dev)
        return SA_ERR_NULL;
    if (!n)
        return SA_OK;
    fill_normal_bf16<<<grid_for((n + 1) / 2), kThreads, 0, g->stream>>>(dev, n, mix64(seed),
                                                                         scale);
    CK(cudaGetLastError());
    return SA_OK;
}

extern "C" int bh_poison(bh_gpu *g, void *dev, size_t bytes)
{
    if (!g || !dev)
        return SA_ERR_NULL;
    CK(cudaMemsetAsync(dev, 0xff, bytes, g->stream));
    return SA_OK;
}

extern "C" int bh_count_bad(bh_gpu *g, const uint16_t *bf16, size_t n_bf16, const float *f32,
                            size_t n_f32, size_t *bad_bf16, size_t *bad_f32)
{
    if (!g || (!bf16 && n_bf16) || (!f32 && n_f32))
        return SA_ERR_NULL;
    unsigned long long *d = nullptr, h[2] = {0, 0};
    CK(cudaMalloc(&d, sizeof h));
    cudaError_t e = cudaMemsetAsync(d, 0, sizeof h, g->stream);
    if (e == cudaSuccess) {
        count_bad<<<grid_for(std::max(n_bf16, n_f32)), kThreads, 0, g->stream>>>(bf16, n_bf16, f32,
                                                                                 n_f32, d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, g->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(g->stream);
    cudaFree(d);
    if (e != cudaSuccess) {
        set_err("bh_count_bad: %s", cudaGetErrorString(e));
        return SA_ERR_CUDA;
    }
    if (bad_bf16)
        *bad_bf16 = (size_t)h[0];
    if (bad_f32)
        *bad_f32 = (size_t)h[1];
    return SA_OK;
}

namespace {

// Median, min and max of n times (sorted in place); host_us left 0.
void sorted_stats(std::vector<float> &ms, bh_timing *t)
{
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    t->reps = (int)n;
    t->min_ms = ms.front();
    t->max_ms = ms.back();
    t->median_ms = n % 2 ? ms[n / 2] : 0.5 * ((double)ms[n / 2 - 1] + ms[n / 2]);
    t->host_us = 0;
}

// Median of the elapsed times between event pairs (ev[2i], ev[2i+1]).
int event_stats(const std::vector<cudaEvent_t> &ev, int reps, bh_timing *t)
{
    std::vector<float> ms((size_t)reps);
    for (int r = 0; r < reps; r++)
        CK(cudaEventElapsedTime(&ms[(size_t)r], ev[2 * (size_t)r], ev[2 * (size_t)r + 1]));
    sorted_stats(ms, t);
    return SA_OK;
}

struct Events {
    std::vector<cudaEvent_t> ev;
    ~Events()
    {
        for (cudaEvent_t e : ev)
            cudaEventDestroy(e);
    }
    int create(int n)
    {
        for (int i = 0; i < n; i++) {
            cudaEvent_t e;
            CK(cudaEventCreate(&e));
            ev.push_back(e);
        }
        return SA_OK;
    }
};

// The least work that reads two buffers once: every 16-byte word with a streaming load, XORed
// together, and nothing written unless the result is one particular value (so no load can be
// optimised away). Eight loads per thread in flight (the unrolled grid-stride loop).
__device__ unsigned read_once_sink;
__global__ void __launch_bounds__(kThreads) read_once(const uint4 *a, size_t na, const uint4 *b,
                                                      size_t nb)
{
    unsigned x = 0;
    const size_t i0 = (size_t)blockIdx.x * kThreads + threadIdx.x,
                 step = (size_t)gridDim.x * kThreads;
#pragma unroll 8
    for (size_t i = i0; i < na; i += step) {
        const uint4 v = __ldcs(a + i);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
#pragma unroll 8
    for (size_t i = i0; i < nb; i += step) {
        const uint4 v = __ldcs(b + i);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u)
        read_once_sink = x;
}

} // namespace

extern "C" int bh_copy_bandwidth(bh_gpu *g, size_t bytes, int reps, double *bytes_per_s)
{
    if (!g || !bytes_per_s)
        return SA_ERR_NULL;
    if (!bytes || reps <= 0)
        return SA_ERR_ARG;
    void *a = nullptr, *b = nullptr;
    int rc = bh_alloc(&a, bytes);
    if (!rc)
        rc = bh_alloc(&b, bytes);
    // Non-zero contents (the copy engine does not care, but never measure on zeros).
    if (!rc)
        rc = bh_fill_bf16(g, (uint16_t *)a, bytes / 2, 0x5eed, 1.0f);
    Events ev;
    if (!rc)
        rc = ev.create(2 * reps);
    for (int w = 0; !rc && w < 3; w++)
        if (cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g->stream) != cudaSuccess) {
            set_err("cudaMemcpyAsync D2D: %s", cudaGetErrorString(cudaGetLastError()));
            rc = SA_ERR_CUDA;
        }
    for (int r = 0; !rc && r < reps; r++) {
        cudaError_t e = cudaEventRecord(ev.ev[2 * (size_t)r], g->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice,
                                g->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(ev.ev[2 * (size_t)r + 1], g->stream);
        if (e != cudaSuccess) {
            set_err("copy bandwidth: %s", cudaGetErrorString(e));
            rc = SA_ERR_CUDA;
        }
    }
    if (!rc && cudaStreamSynchronize(g->stream) != cudaSuccess) {
        set_err("copy bandwidth: %s", cudaGetErrorString(cudaGetLastError()));
        rc = SA_ERR_CUDA;
    }
    bh_timing t;
    if (!rc)
        rc = event_stats(ev.ev, reps, &t);
    if (!rc)
        *bytes_per_s = 2.0 * (double)bytes / (t.median_ms * 1e-3);
    bh_free(a);
    bh_free(b);
    return rc;
}

extern "C" int bh_set_create(bh_gpu *g, const sa_shape *s, uint64_t seed, bh_set *set)
{
    if (!g || !s || !set)
        return SA_ERR_NULL;
    memset(set, 0, sizeof *set);
    int rc = sa_shape_check(s);
    if (rc)
        return rc;
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s), nl = sa_lse_elems(s);
    void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
    rc = bh_alloc(&q, nq * 2);
    if (!rc)
        rc = bh_alloc(&k, nkv * 2);
    if (!rc)
        rc = bh_alloc(&v, nkv * 2);
    if (!rc)
        rc = bh_alloc(&o, nq * 2);
    if (!rc)
        rc = bh_alloc(&lse, nl * 4);
    if (!rc)
        rc = bh_fill_bf16(g, (uint16_t *)q, nq, seed * 3 + 0, 1.0f);
    if (!rc)
        rc = bh_fill_bf16(g, (uint16_t *)k, nkv, seed * 3 + 1, 1.0f);
    if (!rc)
        rc = bh_fill_bf16(g, (uint16_t *)v, nkv, seed * 3 + 2, 1.0f);
    if (!rc)
        rc = bh_poison(g, o, nq * 2);
    if (!rc)
        rc = bh_poison(g, lse, nl * 4);
    if (!rc && cudaStreamSynchronize(g->stream) != cudaSuccess) {
        set_err("filling inputs: %s", cudaGetErrorString(cudaGetLastError()));
        rc = SA_ERR_CUDA;
    }
    if (rc) {
        bh_free(q), bh_free(k), bh_free(v), bh_free(o), bh_free(lse);
        return rc;
    }
    sa_gpu_attn_default(&set->a);
    set->a.shape = *s;
    set->a.q = (const uint16_t *)q;
    set->a.k = (const uint16_t *)k;
    set->a.v = (const uint16_t *)v;
    set->a.o = (uint16_t *)o;
    set->a.lse = (float *)lse;
    set->a.stream = g->stream;
    set->bytes = (2 * nq + 2 * nkv) * 2 + nl * 4;
    return SA_OK;
}

static void free_lists(bh_set *set)
{
    if (set->a.lists.indices) {
        const size_t rows = sa_tile_rows(&set->a.shape, &set->a.lists);
        set->bytes -= rows * (size_t)set->a.lists.max_blocks * 4 +
                      (set->a.lists.counts ? rows * 4 : 0);
    }
    bh_free((void *)set->a.lists.indices);
    bh_free((void *)set->a.lists.counts);
    memset(&set->a.lists, 0, sizeof set->a.lists);
}

extern "C" int bh_set_lists(bh_set *set, const int32_t *indices, const int32_t *counts,
                            int list_heads, int max_blocks)
{
    if (!set || !indices)
        return SA_ERR_NULL;
    if (max_blocks <= 0)
        return SA_ERR_MAX_BLOCKS;
    free_lists(set);
    sa_tile_lists l = {nullptr, nullptr, list_heads, max_blocks};
    const size_t rows = sa_tile_rows(&set->a.shape, &l);
    void *di = nullptr, *dc = nullptr;
    int rc = bh_alloc(&di, rows * (size_t)max_blocks * 4);
    if (!rc)
        rc = bh_upload(di, indices, rows * (size_t)max_blocks * 4);
    if (!rc && counts) {
        rc = bh_alloc(&dc, rows * 4);
        if (!rc)
            rc = bh_upload(dc, counts, rows * 4);
    }
    if (rc) {
        bh_free(di);
        bh_free(dc);
        return rc;
    }
    set->a.lists.indices = (const int32_t *)di;
    set->a.lists.counts = (const int32_t *)dc;
    set->a.lists.list_heads = list_heads;
    set->a.lists.max_blocks = max_blocks;
    set->bytes += rows * (size_t)max_blocks * 4 + (counts ? rows * 4 : 0);
    return SA_OK;
}

extern "C" void bh_set_destroy(bh_set *set)
{
    if (!set)
        return;
    free_lists(set);
    bh_free((void *)set->a.q);
    bh_free((void *)set->a.k);
    bh_free((void *)set->a.v);
    bh_free(set->a.o);
    bh_free(set->a.lse);
    memset(set, 0, sizeof *set);
}

extern "C" int bh_sets_needed(const bh_device *d, size_t set_bytes, int max_sets)
{
    const size_t l2 = d && d->l2_bytes ? d->l2_bytes : (size_t)60 << 20;
    size_t n = 2;
    if (set_bytes)
        n = std::max<size_t>(2, 1 + (2 * l2 + set_bytes - 1) / set_bytes);
    return (int)std::min<size_t>(n, (size_t)std::max(2, max_sets));
}

namespace {

double now_s()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One call; a failure is recorded as "<name>: <why>".
int call_checked(const char *name, bh_fn fn, void *ctx, cudaStream_t s)
{
    int rc = fn(ctx, (void *)s);
    if (rc)
        set_err("%s: %s", name ? name : "call", sa_strerror(rc));
    return rc;
}

} // namespace

extern "C" int bh_time(bh_gpu *g, const char *name, bh_fn fn, void *const *ctx, int nctx,
                       int sync_each, int warmup, int reps, bh_timing *t)
{
    if (!g || !fn || !ctx || !t)
        return SA_ERR_NULL;
    if (nctx <= 0 || reps <= 0 || warmup < 0)
        return SA_ERR_ARG;
    Events ev;
    int rc = ev.create(2 * reps);
    if (rc)
        return rc;
    // The warm-up calls, queued back to back on an idle GPU, also give the host time per call.
    const int warm = std::max(warmup, nctx);
    const double h0 = now_s();
    for (int w = 0; w < warm; w++)
        if ((rc = call_checked(name, fn, ctx[w % nctx], g->stream)))
            return rc;
    const double host_s = now_s() - h0;
    CK(cudaStreamSynchronize(g->stream));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(ev.ev[2 * (size_t)r], g->stream));
        if ((rc = call_checked(name, fn, ctx[r % nctx], g->stream))) {
            cudaStreamSynchronize(g->stream);
            return rc;
        }
        if (sync_each)
            CK(cudaStreamSynchronize(g->stream));
        CK(cudaEventRecord(ev.ev[2 * (size_t)r + 1], g->stream));
    }
    CK(cudaStreamSynchronize(g->stream));
    CK(cudaGetLastError());
    if ((rc = event_stats(ev.ev, reps, t)))
        return rc;
    t->host_us = host_s * 1e6 / warm;
    return SA_OK;
}

extern "C" int bh_time_parts(bh_gpu *g, const char *name, const bh_fn *parts, int nparts,
                             void *ctx, int reps, bh_timing *t)
{
    if (!g || !parts || !t)
        return SA_ERR_NULL;
    if (nparts <= 0 || reps <= 0)
        return SA_ERR_ARG;
    for (int i = 0; i < nparts; i++)
        if (!parts[i])
            return SA_ERR_NULL;
    Events ev; // ev[i] before part i, ev[nparts] after the last; reused by every rep
    int rc = ev.create(nparts + 1);
    if (rc)
        return rc;
    std::vector<std::vector<float>> ms((size_t)nparts + 1, std::vector<float>((size_t)reps));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(ev.ev[0], g->stream));
        for (int i = 0; i < nparts; i++) {
            if ((rc = parts[i](ctx, (void *)g->stream))) {
                set_err("%s, part %d: %s", name ? name : "call", i, sa_strerror(rc));
                cudaStreamSynchronize(g->stream);
                return rc;
            }
            CK(cudaEventRecord(ev.ev[(size_t)i + 1], g->stream));
        }
        CK(cudaEventSynchronize(ev.ev[(size_t)nparts]));
        for (int i = 0; i < nparts; i++)
            CK(cudaEventElapsedTime(&ms[(size_t)i][(size_t)r], ev.ev[(size_t)i],
                                    ev.ev[(size_t)i + 1]));
        CK(cudaEventElapsedTime(&ms[(size_t)nparts][(size_t)r], ev.ev[0],
                                ev.ev[(size_t)nparts]));
    }
    CK(cudaGetLastError());
    for (int i = 0; i <= nparts; i++)
        sorted_stats(ms[(size_t)i], &t[i]);
    return SA_OK;
}

extern "C" int bh_smoke(bh_gpu *g, const char *name, bh_fn fn, void *ctx,
                        const sa_gpu_attn *out, size_t *bad)
{
    if (!g || !fn || !out || !bad)
        return SA_ERR_NULL;
    const sa_shape *s = &out->shape;
    int rc = bh_poison(g, out->o, sa_q_elems(s) * 2);
    if (!rc)
        rc = bh_poison(g, out->lse, sa_lse_elems(s) * 4);
    if (!rc)
        rc = call_checked(name, fn, ctx, g->stream);
    if (rc)
        return rc;
    CK(cudaStreamSynchronize(g->stream));
    CK(cudaGetLastError());
    size_t bo = 0, bl = 0;
    rc = bh_count_bad(g, out->o, sa_q_elems(s), out->lse, sa_lse_elems(s), &bo, &bl);
    if (!rc)
        *bad = bo + bl;
    return rc;
}

namespace {

// A registered stage as a callback: its context is the stage and the set's sa_gpu_attn, whose
// stream bh_time_stage / bh_smoke_stage set to the harness's (the one the callback is handed).
struct StageCall {
    const sa_stage *st;
    const sa_gpu_attn *a;
};

int stage_call(void *ctx, void *stream)
{
    (void)stream;
    const StageCall *c = (const StageCall *)ctx;
    return c->st->launch(c->a);
}

void stage_name(const sa_stage *st, char *buf, size_t n)
{
    snprintf(buf, n, "stage %d (%s) launch", st->id, st->name);
}

} // namespace

extern "C" int bh_time_stage(bh_gpu *g, const sa_stage *st, bh_set *sets, int nsets,
                             int validate, int warmup, int reps, bh_timing *t)
{
    if (!g || !st || !st->launch || !sets || !t)
        return SA_ERR_NULL;
    if (nsets <= 0 || reps <= 0 || warmup < 0)
        return SA_ERR_ARG;
    const int sync_each = validate == BH_SYNC_ONLY;
    // A stage that validates inside its kernel is timed as it is meant to be called: with a
    // verdict, read once after the run (sparseattn.h), not with a synchronization per call.
    sa_gpu_verdict *verdict = nullptr;
    int rc;
    if (validate == 1 && (st->roles & SA_ROLE_GPU_VERDICT) &&
        (rc = sa_gpu_verdict_create(&verdict)) != SA_OK) {
        set_err("sa_gpu_verdict_create: %s", sa_strerror(rc));
        return rc;
    }
    struct VerdictGuard { // on every return: the sets outlive this verdict
        sa_gpu_verdict *v;
        bh_set *sets;
        int n;
        ~VerdictGuard()
        {
            for (int i = 0; i < n; i++)
                sets[i].a.verdict = nullptr;
            sa_gpu_verdict_destroy(v);
        }
    } guard{verdict, sets, nsets};
    std::vector<StageCall> calls((size_t)nsets);
    std::vector<void *> ctx((size_t)nsets);
    for (int i = 0; i < nsets; i++) {
        sets[i].a.validate = sync_each ? 0 : validate;
        sets[i].a.stream = g->stream;
        sets[i].a.verdict = verdict;
        calls[(size_t)i] = {st, &sets[i].a};
        ctx[(size_t)i] = &calls[(size_t)i];
    }
    char name[160];
    stage_name(st, name, sizeof name);
    if ((rc = bh_time(g, name, stage_call, ctx.data(), nsets, sync_each, warmup, reps, t)))
        return rc;
    if (verdict && (rc = sa_gpu_verdict_read(verdict, g->stream)) != SA_OK) {
        set_err("stage %d (%s): the verdict of the timed calls: %s", st->id, st->name,
                sa_strerror(rc));
        return rc;
    }
    return SA_OK;
}

extern "C" int bh_smoke_stage(bh_gpu *g, const sa_stage *st, bh_set *set, size_t *bad)
{
    if (!g || !st || !st->launch || !set || !bad)
        return SA_ERR_NULL;
    set->a.stream = g->stream;
    set->a.validate = 1; // the default path, and the lists get checked at least once
    StageCall c = {st, &set->a};
    char name[160];
    stage_name(st, name, sizeof name);
    return bh_smoke(g, name, stage_call, &c, &set->a, bad);
}

extern "C" int bh_read_once(const void *a, size_t a_bytes, const void *b, size_t b_bytes,
                            void *stream)
{
    if ((a_bytes && !a) || (b_bytes && !b))
        return SA_ERR_NULL;
    if ((a_bytes | b_bytes) % 16 || (uintptr_t)a % 16 || (uintptr_t)b % 16) {
        set_err("read_once: buffers must be 16-byte aligned multiples of 16 bytes");
        return SA_ERR_ARG;
    }
    // 16 CTAs of 256 threads per SM: on the H200 the fastest of 4, 8 and 16 per SM.
    static int sms;
    if (!sms) {
        int dev = 0, n = 0;
        CK(cudaGetDevice(&dev));
        CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
        sms = n;
    }
    read_once<<<16 * sms, kThreads, 0, (cudaStream_t)stream>>>(
        (const uint4 *)a, a_bytes / 16, (const uint4 *)b, b_bytes / 16);
    CK(cudaGetLastError());
    return SA_OK;
}

namespace {
// Spins on the global timer for ns nanoseconds (bh_spin_us).
__global__ void spin_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
} // namespace

extern "C" int bh_spin_us(bh_gpu *g, int us)
{
    if (!g)
        return SA_ERR_NULL;
    if (us < 0)
        return SA_ERR_ARG;
    spin_kernel<<<1, 1, 0, g->stream>>>((unsigned long long)us * 1000ull);
    CK(cudaGetLastError());
    return SA_OK;
}

extern "C" int bh_sync(bh_gpu *g)
{
    if (!g)
        return SA_ERR_NULL;
    CK(cudaStreamSynchronize(g->stream));
    return SA_OK;
}
