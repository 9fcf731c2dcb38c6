/* Synthetic workloads for selector quality: N(0, 1) noise everywhere plus a planted structure.
 * A component c * u (u a unit vector) added to both a query and a key adds c^2 / sqrt(D) to
 * their logit, so every knob is a logit bonus: c = sqrt(strength * sqrt(D)). Each (batch, KV
 * head) draws its structure and each head its noise from its own RNG stream, so the output does
 * not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sa_omp.h"
#include "sel_internal.h"

#define LOCAL_LENGTH 128.0   /* "local": correlation length in tokens */
#define SINK_TOKENS 4        /* "sink": sink keys per (batch, KV head) */
#define SINK_SPAN 512        /* ... drawn from the first 512 positions (token 0 always) */
#define NEEDLE_KEYS 2        /* "needle": planted keys per needle block */
#define NEEDLE_EVERY 2       /* ... one needle per 2 query tiles */
#define CLUSTERS 8           /* "clustered": directions per (batch, KV head) */
#define RUN_MIN 32           /* ... token runs sharing a direction: 32..256 tokens */
#define RUN_MAX 256

enum { W_GAUSSIAN, W_LOCAL, W_SINK, W_NEEDLE, W_CLUSTERED };

static const sa_workload workloads[] = {
    {"gaussian", "independent N(0,1) Q, K, V: no structure, every selector near random",
     "unused", 0.0},
    {"local", "keys near the query's position score higher (bonus decays over ~128 tokens)",
     "logit bonus of a key at the query's own position", 4.0},
    {"sink", "4 early keys (token 0 and 3 in the first 512) that every query attends to",
     "logit bonus of a sink key", 6.0},
    {"needle", "one query tile in 2 strongly matches 2 keys planted in one random block",
     "logit bonus of a planted key for its tile's queries", 8.0},
    {"clustered", "queries and keys in runs of 32..256 tokens around 8 shared directions",
     "logit bonus of a key in the query's cluster", 4.0},
};
#define NWORKLOADS (int)(sizeof workloads / sizeof workloads[0])

int sa_workload_count(void) { return NWORKLOADS; }
const sa_workload *sa_workload_at(int i) { return i >= 0 && i < NWORKLOADS ? &workloads[i] : NULL; }
const sa_workload *sa_workload_by_name(const char *name)
{
    for (int i = 0; name && i < NWORKLOADS; i++)
        if (!strcmp(workloads[i].name, name))
            return &workloads[i];
    return NULL;
}

/* One stream per (seed, group, role): distinct odd multipliers keep them apart. */
static void stream(sa_rng *r, uint64_t seed, uint64_t group, uint64_t role)
{
    sa_rng_seed(r, seed ^ (group + 1) * 0x9e3779b97f4a7c15ull ^ (role + 1) * 0xd1b54a32d192ed03ull);
}

static void fill_normal(sa_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)sa_rng_normal(r);
}

static void unit_vector(sa_rng *r, float *u, int d)
{
    double norm = 0;
    for (int i = 0; i < d; i++) {
        u[i] = (float)sa_rng_normal(r);
        norm += (double)u[i] * u[i];
    }
    for (int i = 0; i < d; i++)
        u[i] = (float)(u[i] / sqrt(norm));
}

static void axpy(float *x, const float *u, float c, int d)
{
    for (int i = 0; i < d; i++)
        x[i] += c * u[i];
}

/* Cluster ids for len positions in runs of RUN_MIN..RUN_MAX tokens. */
static void runs(sa_rng *r, int *id, int len)
{
    for (int i = 0; i < len;) {
        int n = RUN_MIN + (int)sa_rng_below(r, RUN_MAX - RUN_MIN + 1);
        int c = (int)sa_rng_below(r, CLUSTERS);
        for (int j = 0; j < n && i < len; j++)
            id[i++] = c;
    }
}

/* One thread's buffers, all taken before any output is written (a call out of memory writes
 * nothing): a group's Q, K, V in FP32 and what plant() needs. */
typedef struct {
    float *qg, *kg, *vg;
    float *u;     /* CLUSTERS unit vectors of D */
    double *freq; /* D / 2 frequencies */
    int *ids;     /* max(Sq, Skv): the needle's tile order, the clusters' token ids */
} scratch;

static void scratch_free(scratch *sc)
{
    free(sc->qg);
    free(sc->kg);
    free(sc->vg);
    free(sc->u);
    free(sc->freq);
    free(sc->ids);
}

static int scratch_alloc(scratch *sc, const sa_shape *s, size_t qn, size_t kn)
{
    const int d = s->head_dim;
    *sc = (scratch){0};
    sc->qg = sa_sz_malloc((int64_t)qn, sizeof *sc->qg);
    sc->kg = sa_sz_malloc((int64_t)kn, sizeof *sc->kg);
    sc->vg = sa_sz_malloc((int64_t)kn, sizeof *sc->vg);
    sc->u = sa_sz_malloc((int64_t)CLUSTERS * d, sizeof *sc->u);
    sc->freq = sa_sz_malloc(d / 2, sizeof *sc->freq);
    sc->ids = sa_sz_malloc(s->len_q > s->len_kv ? s->len_q : s->len_kv, sizeof *sc->ids);
    return sc->qg && sc->kg && sc->vg && sc->u && sc->freq && sc->ids ? SA_OK : SA_ERR_NOMEM;
}

/* Adds workload w's structure to one group: qg is (group, Sq, D), kg (Skv, D). */
static void plant(int w, const sa_shape *s, sa_rng *r, double strength, float *qg, float *kg,
                  int group, const scratch *sc)
{
    const int d = s->head_dim, sq = s->len_q, skv = s->len_kv;
    const float c = (float)sqrt(strength * sqrt((double)d));
    float *u = sc->u;
    switch (w) {
    case W_LOCAL: {
        /* Random Fourier features: p(i) . p(j) = mean_r cos(w_r (i - j)) ~ exp(-(i-j)^2/2L^2). */
        int half = d / 2;
        double *freq = sc->freq;
        for (int m = 0; m < half; m++)
            freq[m] = sa_rng_normal(r) / LOCAL_LENGTH;
        const float amp = c / sqrtf((float)half);
        for (int side = 0; side < 2; side++) {
            int len = side ? skv : sq, copies = side ? 1 : group;
            for (int i = 0; i < len; i++)
                for (int m = 0; m < half; m++) {
                    float cs = amp * (float)cos(freq[m] * i), sn = amp * (float)sin(freq[m] * i);
                    for (int h = 0; h < copies; h++) {
                        float *x = (side ? kg : qg + (size_t)h * sq * d) + (size_t)i * d;
                        x[2 * m] += cs;
                        x[2 * m + 1] += sn;
                    }
                }
        }
        break;
    }
    case W_SINK: {
        unit_vector(r, u, d);
        int span = skv < SINK_SPAN ? skv : SINK_SPAN;
        axpy(kg, u, c, d); /* token 0 */
        for (int t = 1; t < SINK_TOKENS && span > 1; t++)
            axpy(kg + (size_t)(1 + sa_rng_below(r, (uint32_t)span - 1)) * d, u, c, d);
        for (int h = 0; h < group; h++)
            for (int i = 0; i < sq; i++)
                axpy(qg + ((size_t)h * sq + i) * d, u, c, d);
        break;
    }
    case W_NEEDLE: {
        int tiles = sa_q_tiles(s), blocks = sa_kv_blocks(s);
        int needles = tiles / NEEDLE_EVERY > 0 ? tiles / NEEDLE_EVERY : 1;
        int *perm = sc->ids; /* tiles <= Sq */
        for (int t = 0; t < tiles; t++)
            perm[t] = t;
        for (int nd = 0; nd < needles; nd++) {
            int j = nd + (int)sa_rng_below(r, (uint32_t)(tiles - nd)), t = perm[j];
            perm[j] = perm[nd];
            perm[nd] = t;
            int blk = (int)sa_rng_below(r, (uint32_t)blocks), len = sa_block_len(s, blk);
            unit_vector(r, u, d);
            for (int x = 0; x < NEEDLE_KEYS && x < len; x++) /* may repeat a key: harmless */
                axpy(kg + ((size_t)blk * SA_TILE + sa_rng_below(r, (uint32_t)len)) * d, u, c, d);
            int i1 = (t + 1) * SA_TILE < sq ? (t + 1) * SA_TILE : sq;
            for (int h = 0; h < group; h++)
                for (int i = t * SA_TILE; i < i1; i++)
                    axpy(qg + ((size_t)h * sq + i) * d, u, c, d);
        }
        break;
    }
    case W_CLUSTERED: {
        for (int m = 0; m < CLUSTERS; m++)
            unit_vector(r, u + (size_t)m * d, d);
        int *id = sc->ids;
        runs(r, id, skv);
        for (int j = 0; j < skv; j++)
            axpy(kg + (size_t)j * d, u + (size_t)id[j] * d, c, d);
        runs(r, id, sq);
        for (int h = 0; h < group; h++)
            for (int i = 0; i < sq; i++)
                axpy(qg + ((size_t)h * sq + i) * d, u + (size_t)id[i] * d, c, d);
        break;
    }
    default:
        break;
    }
}

int sa_workload_generate(const char *name, const sa_shape *s, uint64_t seed, double strength,
                         uint16_t *q, uint16_t *k, uint16_t *v)
{
    if (!name || !s || !q || !k || !v)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    const sa_workload *wl = sa_workload_by_name(name);
    if (!wl)
        return SA_ERR_UNKNOWN;
    if (!isfinite(strength))
        return SA_ERR_ARG;
    if (strength < 0)
        strength = wl->default_strength;
    const int w = (int)(wl - workloads), group = s->heads_q / s->heads_kv, d = s->head_dim;
    const size_t qn = (size_t)group * s->len_q * d, kn = (size_t)s->len_kv * d;
    const int groups = s->batch * s->heads_kv;
    int oom = 0;
    /* No more threads than groups: each thread takes a whole group's buffers up front. */
    const int team = groups < omp_get_max_threads() ? groups : omp_get_max_threads();
#pragma omp parallel num_threads(team)
    {
        scratch sc;
        const int failed = sa_omp_any_failed(&oom, scratch_alloc(&sc, s, qn, kn) != SA_OK);
        if (!failed) {
#pragma omp for schedule(dynamic, 1)
            for (int g = 0; g < groups; g++) {
                sa_rng r;
                for (int h = 0; h < group; h++) {
                    stream(&r, seed, (uint64_t)g, 3 + (uint64_t)h);
                    fill_normal(&r, sc.qg + (size_t)h * s->len_q * d, (size_t)s->len_q * d);
                }
                stream(&r, seed, (uint64_t)g, 1);
                fill_normal(&r, sc.kg, kn);
                stream(&r, seed, (uint64_t)g, 2);
                fill_normal(&r, sc.vg, kn);
                stream(&r, seed, (uint64_t)g, 0);
                plant(w, s, &r, strength, sc.qg, sc.kg, group, &sc);
                /* Q of (b, hkv) group is heads hkv*group .. +group-1 of batch b: contiguous. */
                sa_bf16_from_f32_array(q + (size_t)g * qn, sc.qg, qn);
                sa_bf16_from_f32_array(k + (size_t)g * kn, sc.kg, kn);
                sa_bf16_from_f32_array(v + (size_t)g * kn, sc.vg, kn);
            }
        }
        scratch_free(&sc);
    }
    return oom ? SA_ERR_NOMEM : SA_OK;
}

/* ---------------------------------------------------------------- index vectors
 * sa_index_generate (sa_selectors.h): index vectors in the index-head layout from the
 * attention's own Q and K, "qk" (the heads' mean) or "proj" (that mean through a Gaussian
 * projection). Every output element is one fixed-order computation, so the bytes do not depend
 * on the thread count. */

#define INDEX_ROLE 0x1d3e /* the projection's RNG role, apart from the workloads' 0..group+2 */
#define INDEX_MAX_D 256   /* the largest head_dim sa_shape_check takes (64, 128, 256) */

/* One side: x is (B, heads, len, d) BF16, out (B, hi, len, dout). Index head h averages heads
 * [h * heads / hi, + max(1, heads / hi)) in FP32, in head order, then rounds to BF16 (proj NULL,
 * dout == d) or projects: out = (mean . R_h) / sqrt(dout) in double, one rounding to FP32 and
 * one to BF16, with R_h the (d, dout) matrix proj + h * d * dout. */
static void index_side(const uint16_t *x, int batch, int heads, int len, int d, int hi,
                       const float *proj, int dout, uint16_t *out)
{
    const int nh = heads >= hi ? heads / hi : 1;
    const double inv = 1.0 / sqrt((double)dout);
    const long long rows = (long long)batch * hi * len;
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < rows; r++) {
        const int i = (int)(r % len), h = (int)(r / len % hi), b = (int)(r / len / hi);
        const int h0 = (int)((long long)h * heads / hi);
        float m[INDEX_MAX_D];
        for (int e = 0; e < d; e++)
            m[e] = 0.0f;
        for (int j = 0; j < nh; j++) {
            const uint16_t *src = x + (((size_t)b * heads + h0 + j) * len + i) * d;
            for (int e = 0; e < d; e++)
                m[e] += sa_bf16_to_f32(src[e]);
        }
        if (nh > 1)
            for (int e = 0; e < d; e++)
                m[e] /= (float)nh;
        uint16_t *dst = out + (size_t)r * dout;
        if (!proj) {
            for (int e = 0; e < d; e++)
                dst[e] = sa_bf16_from_f32(m[e]);
            continue;
        }
        const float *rh = proj + (size_t)h * d * dout;
        for (int o = 0; o < dout; o++) {
            double acc = 0.0;
            for (int e = 0; e < d; e++)
                acc += (double)m[e] * rh[(size_t)e * dout + o];
            dst[o] = sa_bf16_from_f32((float)(acc * inv));
        }
    }
}

int sa_index_generate(const char *method, const sa_shape *s, const uint16_t *q,
                      const uint16_t *k, int index_heads, int index_dim, uint64_t seed,
                      uint16_t *q_index, uint16_t *k_index)
{
    if (!method || !s || !q || !k || !q_index || !k_index)
        return SA_ERR_NULL;
    int err = sa_shape_check(s);
    if (err)
        return err;
    const int is_qk = !strcmp(method, "qk"), is_proj = !strcmp(method, "proj");
    if (!is_qk && !is_proj)
        return SA_ERR_UNKNOWN;
    int qh, kh;
    if (index_heads <= 0 || sel_index_heads(s, index_heads, &qh, &kh))
        return SA_ERR_ARG;
    if (is_qk ? index_dim != s->head_dim
              : index_dim <= 0 || index_dim % 16 || index_dim > SA_MAX_INDEX_DIM)
        return SA_ERR_ARG;
    if (!sa_sz_within(sa_sz_mul4(s->batch, index_heads, s->len_q, index_dim), SA_MAX_ELEMS) ||
        !sa_sz_within(sa_sz_mul4(s->batch, index_heads, s->len_kv, index_dim), SA_MAX_ELEMS))
        return SA_ERR_ARG;
    const int d = s->head_dim;
    if (d > INDEX_MAX_D)
        return SA_ERR_HEAD_DIM; /* not reached while sa_shape_check keeps its head dims */
    float *proj = NULL;
    if (is_proj) {
        const size_t per = (size_t)d * index_dim;
        proj = malloc((size_t)index_heads * per * sizeof *proj);
        if (!proj)
            return SA_ERR_NOMEM;
        for (int h = 0; h < index_heads; h++) { /* one stream per index head */
            sa_rng r;
            stream(&r, seed, (uint64_t)h, INDEX_ROLE);
            fill_normal(&r, proj + (size_t)h * per, per);
        }
    }
    index_side(q, s->batch, s->heads_q, s->len_q, d, index_heads, proj, index_dim, q_index);
    index_side(k, s->batch, s->heads_kv, s->len_kv, d, index_heads, proj, index_dim, k_index);
    free(proj);
    return SA_OK;
}
