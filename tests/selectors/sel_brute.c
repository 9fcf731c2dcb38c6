/* Brute-force selector references for the tests: double precision, plain loops, no code shared
 * with selectors/. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

uint16_t *bf_random_bf16(sa_rng *r, size_t n, float scale)
{
    uint16_t *x = malloc(n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    sa_rng_fill_bf16(r, x, n, scale);
    return x;
}

uint16_t *bf_kv_per_head(const sa_shape *s, const uint16_t *k)
{
    const int group = s->heads_q / s->heads_kv;
    const size_t head = (size_t)s->len_kv * s->head_dim;
    uint16_t *out = malloc((size_t)s->batch * s->heads_q * head * sizeof *out);
    ck_assert_ptr_nonnull(out);
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads_q; h++)
            memcpy(out + ((size_t)b * s->heads_q + h) * head,
                   k + ((size_t)b * s->heads_kv + h / group) * head, head * sizeof *out);
    return out;
}

static double *to_double(const uint16_t *x, size_t n)
{
    double *d = malloc(n * sizeof *d);
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < n; i++)
        d[i] = sa_bf16_to_f32(x[i]);
    return d;
}

/* ---- NVFP4 by enumeration */
double bf_e2m1(uint8_t code)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8 ? -1 : 1) * mag[code & 7];
}

double bf_e4m3(uint8_t code)
{
    int e = (code >> 3) & 15, m = code & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return code & 0x80 ? -v : v;
}

/* Nearest of the candidates' values to x (x >= 0), ties to the even code, saturating. */
static uint8_t nearest_e4m3(float x)
{
    int best = 0;
    for (int c = 1; c <= 0x7E; c++) {
        double dc = fabs(bf_e4m3((uint8_t)c) - x), db = fabs(bf_e4m3((uint8_t)best) - x);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return (uint8_t)best;
}

static uint8_t nearest_e2m1(float x)
{
    double a = fabs(x);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double dc = fabs(bf_e2m1((uint8_t)c) - a), db = fabs(bf_e2m1((uint8_t)best) - a);
        if (dc < db || (dc == db && !(c & 1)))
            best = c;
    }
    return (uint8_t)(best | (signbit(x) ? 8 : 0));
}

float bf_nvfp4_quantize(const float *x, size_t n, uint8_t *values, uint8_t *scales)
{
    float amax = 0;
    for (size_t i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float ts = amax / 2688.0f;
    memset(values, 0, n / 2);
    for (size_t b = 0; b < n / 16; b++) {
        float bamax = 0;
        for (int i = 0; i < 16; i++)
            bamax = fabsf(x[b * 16 + i]) > bamax ? fabsf(x[b * 16 + i]) : bamax;
        uint8_t sc = ts > 0 ? nearest_e4m3((bamax / 6.0f) / ts) : 0;
        scales[b] = sc;
        float d = (float)bf_e4m3(sc);
        if (d == 0)
            continue;
        float denom = d * ts;
        for (int i = 0; i < 16; i++) {
            size_t j = b * 16 + i;
            values[j / 2] |= (uint8_t)(nearest_e2m1(x[j] / denom) << (j % 2 ? 4 : 0));
        }
    }
    return ts;
}

static double *nvfp4_dequant(const uint16_t *x, size_t n)
{
    float *f = calloc(n, sizeof *f);
    uint8_t *v = calloc(n / 2, 1), *sc = calloc(n / 16, 1);
    double *d = calloc(n, sizeof *d);
    ck_assert(f && v && sc && d);
    for (size_t i = 0; i < n; i++)
        f[i] = sa_bf16_to_f32(x[i]);
    float ts = bf_nvfp4_quantize(f, n, v, sc);
    for (size_t i = 0; i < n; i++)
        d[i] = bf_e2m1((uint8_t)(v[i / 2] >> (i % 2 ? 4 : 0) & 15)) * bf_e4m3(sc[i / 16]) * ts;
    free(f);
    free(v);
    free(sc);
    return d;
}

/* ---- scores */
static double dotd(const double *a, const double *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Mean of tokens [i0, i1) of a (len, dim) matrix. */
static void mean_rows(const double *x, int i0, int i1, int dim, double *out)
{
    for (int d = 0; d < dim; d++) {
        double s = 0;
        for (int i = i0; i < i1; i++)
            s += x[(size_t)i * dim + d];
        out[d] = s / (i1 - i0);
    }
}

static int imin(int a, int b) { return a < b ? a : b; }

double *bf_scores(const char *name, const sa_shape *s, const uint16_t *q16, const uint16_t *k16,
                  int dim)
{
    return bf_scores_causal(name, s, q16, k16, dim, 0);
}

double *bf_scores_causal(const char *name, const sa_shape *s, const uint16_t *q16,
                         const uint16_t *k16, int dim, int causal)
{
    const int n = sa_kv_blocks(s), tiles = sa_q_tiles(s), group = s->heads_q / s->heads_kv;
    const int per_query = !strcmp(name, "nvfp4_query");
    const int per = per_query ? s->len_q : tiles;
    const size_t nq = (size_t)s->batch * s->heads_q * s->len_q * dim;
    const size_t nk = (size_t)s->batch * s->heads_kv * s->len_kv * dim;
    int nv = !strncmp(name, "nvfp4", 5);
    double *q = nv ? nvfp4_dequant(q16, nq) : to_double(q16, nq);
    double *k = nv ? nvfp4_dequant(k16, nk) : to_double(k16, nk);
    double *out = malloc((size_t)s->batch * s->heads_kv * per * n * sizeof *out);
    double *a = malloc((size_t)dim * sizeof *a), *c = malloc((size_t)dim * sizeof *c);
    double *row = malloc((size_t)s->len_kv * sizeof *row);
    ck_assert(out && a && c && row);
    for (size_t i = 0; i < (size_t)s->batch * s->heads_kv * per * n; i++)
        out[i] = !strcmp(name, "oracle") || !strncmp(name, "nvfp4_mass", 10) ||
                         !strcmp(name, "r4_mass")
                     ? 0.0
                     : -INFINITY;
    int span = !strcmp(name, "r4") ? 32 : 128;
    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->heads_q; hq++) {
            int hkv = hq / group;
            const double *qh = q + ((size_t)b * s->heads_q + hq) * s->len_q * dim;
            const double *kh = k + ((size_t)b * s->heads_kv + hkv) * s->len_kv * dim;
            double *o = out + ((size_t)b * s->heads_kv + hkv) * per * n;
            if (!strcmp(name, "r1") || !strcmp(name, "r4")) {
                for (int t = 0; t < tiles; t++)
                    for (int qa = t * 128; qa < imin((t + 1) * 128, s->len_q); qa += span) {
                        mean_rows(qh, qa, imin(qa + span, s->len_q), dim, a);
                        for (int ka = 0; ka < s->len_kv; ka += span) {
                            mean_rows(kh, ka, imin(ka + span, s->len_kv), dim, c);
                            double v = dotd(a, c, dim);
                            double *dst = &o[(size_t)t * n + ka / 128];
                            *dst = v > *dst ? v : *dst;
                        }
                    }
            } else if (!strcmp(name, "gauss")) {
                /* The tile's query mean; the block's key mean c and per-channel doubled
                 * semivariance on a_d's side: a.c + (scale / 2) sum a_d^2 var_d + log(n) / scale. */
                const double sc = 1.0 / sqrt((double)dim);
                for (int t = 0; t < tiles; t++) {
                    mean_rows(qh, t * 128, imin((t + 1) * 128, s->len_q), dim, a);
                    for (int blk = 0; blk < n; blk++) {
                        const int k0 = blk * 128, k1 = imin(k0 + 128, s->len_kv);
                        mean_rows(kh, k0, k1, dim, c);
                        double v = dotd(a, c, dim) + log((double)(k1 - k0)) / sc;
                        for (int d = 0; d < dim; d++) {
                            double var = 0;
                            for (int i = k0; i < k1; i++) {
                                const double e = kh[(size_t)i * dim + d] - c[d];
                                if (a[d] > 0 ? e > 0 : e <= 0)
                                    var += e * e;
                            }
                            v += 0.5 * sc * a[d] * a[d] * 2 * var / (k1 - k0);
                        }
                        double *dst = &o[(size_t)t * n + blk];
                        *dst = v > *dst ? v : *dst;
                    }
                }
            } else if (!strcmp(name, "r4_mass")) {
                /* Per 32-query group a softmax over two vectors per 32-key group: the key
                 * farthest from the group's mean (the first of equals) and the mean of the
                 * others, each weighted by the (query, key) pairs it stands for that are visible,
                 * over the group's queries; a block gets its key groups' mass times the query
                 * group's size. */
                const double sc = 1.0 / sqrt((double)dim);
                const int kg = (s->len_kv + 31) / 32;
                double *lg = malloc((size_t)kg * 4 * sizeof *lg);
                double *rest = malloc((size_t)kg * dim * sizeof *rest);
                int *opos = malloc((size_t)kg * sizeof *opos);
                ck_assert(lg && rest && opos);
                for (int e = 0; e < kg; e++) {
                    const int j0 = e * 32, j1 = imin(j0 + 32, s->len_kv);
                    mean_rows(kh, j0, j1, dim, c);
                    double far = -1;
                    for (int j = j0; j < j1; j++) {
                        double d2 = 0;
                        for (int d = 0; d < dim; d++)
                            d2 += (kh[(size_t)j * dim + d] - c[d]) * (kh[(size_t)j * dim + d] - c[d]);
                        if (d2 > far) {
                            far = d2;
                            opos[e] = j;
                        }
                    }
                    for (int d = 0; d < dim; d++)
                        rest[(size_t)e * dim + d] =
                            j1 - j0 > 1 ? ((j1 - j0) * c[d] - kh[(size_t)opos[e] * dim + d]) /
                                              (j1 - j0 - 1)
                                        : kh[(size_t)opos[e] * dim + d];
                }
                for (int qa = 0; qa < s->len_q; qa += 32) {
                    const int qa1 = imin(qa + 32, s->len_q), nq = qa1 - qa;
                    mean_rows(qh, qa, qa1, dim, a);
                    double m = -INFINITY, z = 0;
                    double *lr = lg, *wr = lg + kg, *lo = lg + 2 * kg, *wo = lg + 3 * kg;
                    for (int e = 0; e < kg; e++) {
                        const int j0 = e * 32, j1 = imin(j0 + 32, s->len_kv);
                        double seen = 0, seen_o = 0;
                        for (int i = qa; i < qa1; i++)
                            for (int j = j0; j < j1; j++) {
                                const int vis = !causal || j <= i + s->len_kv - s->len_q;
                                seen += vis && j != opos[e];
                                seen_o += vis && j == opos[e];
                            }
                        wr[e] = seen / nq;
                        wo[e] = seen_o / nq;
                        lr[e] = dotd(a, rest + (size_t)e * dim, dim) * sc;
                        lo[e] = dotd(a, kh + (size_t)opos[e] * dim, dim) * sc;
                        if (wr[e] > 0)
                            m = lr[e] > m ? lr[e] : m;
                        if (wo[e] > 0)
                            m = lo[e] > m ? lo[e] : m;
                    }
                    if (m == -INFINITY)
                        continue; /* the group sees no key */
                    for (int e = 0; e < kg; e++)
                        z += (wr[e] > 0 ? wr[e] * exp(lr[e] - m) : 0) +
                             (wo[e] > 0 ? wo[e] * exp(lo[e] - m) : 0);
                    for (int e = 0; e < kg; e++)
                        o[(size_t)(qa / 128) * n + e / 4] +=
                            nq * ((wr[e] > 0 ? wr[e] * exp(lr[e] - m) : 0) +
                                  (wo[e] > 0 ? wo[e] * exp(lo[e] - m) : 0)) / z;
                }
                free(lg);
                free(rest);
                free(opos);
            } else if (!strcmp(name, "oracle") || !strncmp(name, "nvfp4_mass", 10)) {
                /* The exact softmax mass per block (nvfp4_mass: of the dequantized vectors;
                 * nvfp4_mass_q8: of a tile's queries m - 1, m - 9, ..., m valid ones). */
                const int q8 = !strcmp(name, "nvfp4_mass_q8");
                for (int i = 0; i < s->len_q; i++) {
                    const int m_t = imin(128, s->len_q - i / 128 * 128);
                    if (q8 && (m_t - 1 - i % 128) % 8 != 0)
                        continue;
                    double m = -INFINITY, z = 0;
                    const int nk = !causal ? s->len_kv : i + s->len_kv - s->len_q + 1;
                    if (nk <= 0)
                        continue; /* sees no key: no mass */
                    for (int j = 0; j < nk; j++) {
                        row[j] = dotd(qh + (size_t)i * dim, kh + (size_t)j * dim, dim) /
                                 sqrt((double)dim);
                        m = row[j] > m ? row[j] : m;
                    }
                    for (int j = 0; j < nk; j++)
                        z += exp(row[j] - m);
                    for (int j = 0; j < nk; j++)
                        o[(size_t)(i / 128) * n + j / 128] += exp(row[j] - m) / z;
                }
            } else if (nv) {
                for (int i = 0; i < s->len_q; i++)
                    for (int j = 0; j < s->len_kv && (!causal || j <= i + s->len_kv - s->len_q);
                         j++) {
                        double v = dotd(qh + (size_t)i * dim, kh + (size_t)j * dim, dim);
                        double *dst = &o[(size_t)(per_query ? i : i / 128) * n + j / 128];
                        *dst = v > *dst ? v : *dst;
                    }
            } else {
                ck_abort_msg("no brute force for selector %s", name);
            }
        }
    free(q);
    free(k);
    free(a);
    free(c);
    free(row);
    return out;
}

const char *bf_check_row(const double *score, int n, int k, int diag, int sink,
                         const int32_t *row)
{
    for (int j = 0; j < k; j++) {
        if (row[j] < 0 || row[j] >= n)
            return "block index out of range";
        if (j && row[j] <= row[j - 1])
            return "row not strictly increasing";
    }
    unsigned char *chosen = calloc((size_t)n, 1);
    ck_assert_ptr_nonnull(chosen);
    for (int j = 0; j < k; j++)
        chosen[row[j]] = 1;
    const char *msg = NULL;
    if (diag >= 0 && !chosen[diag])
        msg = "diagonal block missing";
    if (sink && !chosen[0])
        msg = "sink block missing";
    double big = 0, min_in = INFINITY, max_out = -INFINITY;
    for (int b = 0; b < n; b++) {
        big = fabs(score[b]) > big ? fabs(score[b]) : big;
        if (b == diag || (sink && b == 0))
            continue;
        if (chosen[b])
            min_in = score[b] < min_in ? score[b] : min_in;
        else
            max_out = score[b] > max_out ? score[b] : max_out;
    }
    if (!msg && min_in < max_out - (1e-4 * big + 1e-12))
        msg = "a block outside the list scores higher than one inside";
    free(chosen);
    return msg;
}

const char *bf_check_pooled(const sa_shape *s, const double *sc, const sa_select_params *p,
                            const int32_t *idx, const int32_t *cnt, int cap, int *moved)
{
    const int n_all = sa_kv_blocks(s), tiles = sa_q_tiles(s), h = s->heads_q / s->heads_kv;
    unsigned char *in = malloc((size_t)n_all);
    ck_assert_ptr_nonnull(in);
    const char *msg = NULL;
    for (int g = 0; g < s->batch * s->heads_kv && !msg; g++)
        for (int t = 0; t < tiles && !msg; t++) {
            const int n = p->causal ? sa_causal_tile_blocks(s, t) : n_all;
            const int kq = p->k < n ? p->k : n, hi = cap < n ? cap : n;
            int total = 0;
            double min_in = INFINITY, max_out = -INFINITY, big = 0;
            for (int j = 0; j < h && !msg; j++) {
                const size_t row = ((size_t)g * h + j) * tiles + t;
                const int32_t *lr = idx + row * cap;
                const double *srow = sc + row * n_all;
                const int c = cnt[row];
                *moved += c != kq;
                if (c < (kq > 0) || c > hi) {
                    msg = "a row's count is outside [1, min(cap, n)]";
                    break;
                }
                total += c;
                memset(in, 0, (size_t)n_all);
                for (int e = 0; e < c; e++) {
                    if (lr[e] < 0 || lr[e] >= n || (e && lr[e] <= lr[e - 1]))
                        msg = "a row is not sorted, distinct and visible";
                    else
                        in[lr[e]] = 1;
                }
                for (int e = c; e < cap; e++)
                    if (lr[e] != -1)
                        msg = "a slot past the count is not -1";
                /* Forced: the diagonal (causal or keep_diagonal), the sink, else the head's
                 * best block (the first of the largest). */
                int diag = p->causal ? n - 1 : p->keep_diagonal ? t : -1;
                if (msg || n == 0)
                    continue;
                if ((diag >= 0 && !in[diag]) || (p->keep_sink && !in[0])) {
                    msg = "a forced block is missing";
                    break;
                }
                if (diag < 0 && !p->keep_sink) {
                    diag = 0;
                    for (int b = 1; b < n; b++)
                        diag = srow[b] > srow[diag] ? b : diag;
                }
                for (int b = 0; b < n; b++) {
                    big = fabs(srow[b]) > big ? fabs(srow[b]) : big;
                    if (b == diag || (p->keep_sink && b == 0))
                        continue;
                    if (in[b])
                        min_in = srow[b] < min_in ? srow[b] : min_in;
                    else if (c < hi)
                        max_out = srow[b] > max_out ? srow[b] : max_out;
                }
            }
            if (!msg && total != h * kq)
                msg = "the group's rows do not hold H * min(k, n) blocks";
            if (!msg && min_in < max_out - (1e-4 * big + 1e-12))
                msg = "a block left out of a head with room scores above a chosen one";
        }
    free(in);
    return msg;
}
