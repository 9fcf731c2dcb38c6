/* Activation files (include/sa_activations.h, docs/activations.md): a safetensors reader for
 * per-layer Q, K, V. Safetensors is 8 bytes of header length (little-endian), a JSON object and
 * raw data; the JSON parser below takes exactly what that header needs (objects, arrays,
 * strings with escapes, unsigned integers; other values are skipped) and rejects the rest. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sa_activations.h"

#define ACT_FORMAT "sparseattn.activations"
#define ACT_MAX_HEADER 100000000ull /* the safetensors limit */
#define ACT_MAX_RANK 8
#define ACT_MAX_DEPTH 64
#define ACT_MAX_LAYER 999999

/* Past a JSON number at s (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), or NULL: strtod takes
 * more (hexadecimal, inf, nan, leading zeros) and follows the locale's decimal point. */
static const char *json_number_end(const char *s)
{
    if (*s == '-')
        s++;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        while (*s >= '0' && *s <= '9')
            s++;
    else
        return NULL;
    if (*s == '.') {
        if (!(*++s >= '0' && *s <= '9'))
            return NULL;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!(*s >= '0' && *s <= '9'))
            return NULL;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    return s;
}

/* The value of the JSON number at s (json_number_end checked it), read in the "C" locale
 * whatever the program's LC_NUMERIC. */
static double json_number_value(const char *s)
{
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    const double x = c ? strtod_l(s, NULL, c) : strtod(s, NULL);
    if (c)
        freelocale(c);
    return x;
}

typedef struct act_tensor {
    char *name;
    int elem_bytes; /* 2: BF16, 4: F32, 0: another dtype (only outside layers) */
    int rank;
    uint64_t dims[ACT_MAX_RANK];
    uint64_t begin, end; /* from the first data byte */
} act_tensor;

typedef struct act_layer {
    sa_act_layer info;
    int t[3]; /* tensor indices of q, k, v; -1 until seen */
} act_layer;

struct sa_act_file {
    int fd;
    uint64_t data_start, data_len;
    int n_meta;
    char **meta_key, **meta_val;
    int n_tensors;
    act_tensor *tensors;
    int n_layers;
    act_layer *layers;
};

/* ---------------------------------------------------------------- errors */
typedef struct act_err {
    char *buf;
    size_t len;
} act_err;

static int fail(act_err *e, int code, const char *fmt, ...)
{
    if (e->buf && e->len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->buf, e->len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---------------------------------------------------------------- JSON */
typedef struct js {
    const char *p, *end, *start;
    act_err *e;
} js;

static void js_ws(js *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* Skips white space, then c when it comes next (1), else leaves the text there (0). After a
 * member or an element, c = ',' says whether another one follows; after an opening bracket, its
 * closing one whether the container is empty. */
static int js_eat(js *j, char c)
{
    js_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int js_bad(js *j, const char *what)
{
    return fail(j->e, SA_ERR_ARG, "bad JSON header near byte %ld of %ld: %s",
                (long)(j->p - j->start), (long)(j->end - j->start), what);
}

static int js_expect(js *j, char c)
{
    js_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        return js_bad(j, what);
    }
    j->p++;
    return SA_OK;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* A JSON string into a fresh NUL-terminated UTF-8 buffer (*out NULL: validated and skipped). An
 * escaped NUL is refused (keys and values are C strings here). */
static int js_string(js *j, char **out)
{
    js_ws(j);
    if (j->p >= j->end || *j->p != '"')
        return js_bad(j, "expected a string");
    j->p++;
    const char *start = j->p;
    /* The decoded text is never longer than the source. */
    size_t cap = 0;
    while (start + cap < j->end && start[cap] != '"') {
        if (start[cap] == '\\' && start + cap + 1 < j->end)
            cap++;
        cap++;
    }
    if (start + cap >= j->end)
        return js_bad(j, "unterminated string");
    char *buf = out ? malloc(cap + 1) : NULL;
    if (out && !buf)
        return fail(j->e, SA_ERR_NOMEM, "out of memory");
    size_t n = 0;
    while (*j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) {
            free(buf);
            return js_bad(j, "control character in a string");
        }
        if (c != '\\') {
            if (buf)
                buf[n] = (char)c;
            n++;
            continue;
        }
        char esc = *j->p++;
        unsigned cp;
        switch (esc) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (j->end - j->p < 4 || !hex4(j->p, &cp)) {
                free(buf);
                return js_bad(j, "bad \\u escape");
            }
            j->p += 4;
            if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
                unsigned lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                    !hex4(j->p + 2, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                    free(buf);
                    return js_bad(j, "unpaired surrogate");
                }
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                free(buf);
                return js_bad(j, "unpaired surrogate");
            }
            break;
        default: free(buf); return js_bad(j, "bad escape");
        }
        if (cp == 0) {
            free(buf);
            return js_bad(j, "NUL in a string");
        }
        /* UTF-8: at most 4 bytes, never more than the 6 source bytes (12 for a pair) used. */
        unsigned char u[4];
        int m;
        if (cp < 0x80)
            u[0] = (unsigned char)cp, m = 1;
        else if (cp < 0x800)
            u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63)), m = 2;
        else if (cp < 0x10000)
            u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 63)),
            u[2] = (unsigned char)(0x80 | (cp & 63)), m = 3;
        else
            u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 63)),
            u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[3] = (unsigned char)(0x80 | (cp & 63)),
            m = 4;
        if (buf)
            memcpy(buf + n, u, (size_t)m);
        n += (size_t)m;
    }
    j->p++; /* the closing quote */
    if (buf) {
        buf[n] = 0;
        *out = buf;
    }
    return SA_OK;
}

/* An object member's name (into *key as js_string does; key NULL: skipped) and its ':'. On
 * failure *key is NULL: nothing stays allocated. */
static int js_key(js *j, char **key)
{
    if (key)
        *key = NULL;
    int rc = js_string(j, key);
    if (!rc && (rc = js_expect(j, ':')) && key) {
        free(*key);
        *key = NULL;
    }
    return rc;
}

/* An unsigned integer without sign, fraction or exponent, at most 2^63 - 1. */
static int js_uint(js *j, uint64_t *out)
{
    js_ws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return js_bad(j, "expected an unsigned integer");
    if (*j->p == '0' && j->p + 1 < j->end && j->p[1] >= '0' && j->p[1] <= '9')
        return js_bad(j, "leading zero");
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p++ - '0');
        if (v > (UINT64_C(0x7fffffffffffffff) - d) / 10)
            return js_bad(j, "integer too large");
        v = v * 10 + d;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return js_bad(j, "expected an integer");
    *out = v;
    return SA_OK;
}

static int js_literal(js *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n))
        return js_bad(j, "bad value");
    j->p += n;
    return SA_OK;
}

static int js_skip(js *j, int depth)
{
    if (depth > ACT_MAX_DEPTH)
        return js_bad(j, "nested too deeply");
    js_ws(j);
    if (j->p >= j->end)
        return js_bad(j, "expected a value");
    const char c = *j->p;
    int rc;
    if (c == '"')
        return js_string(j, NULL);
    if (c == '{' || c == '[') {
        const char close = c == '{' ? '}' : ']';
        j->p++;
        if (js_eat(j, close))
            return SA_OK;
        for (;;) {
            if (c == '{' && (rc = js_key(j, NULL)))
                return rc;
            if ((rc = js_skip(j, depth + 1)))
                return rc;
            if (js_eat(j, ','))
                continue;
            return js_expect(j, close);
        }
    }
    if (c == 't')
        return js_literal(j, "true");
    if (c == 'f')
        return js_literal(j, "false");
    if (c == 'n')
        return js_literal(j, "null");
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *e = json_number_end(j->p); /* the header is NUL-terminated past its end */
        if (!e || e > j->end)
            return js_bad(j, "bad number");
        j->p = e;
        return SA_OK;
    }
    return js_bad(j, "bad value");
}

/* ---------------------------------------------------------------- the header */
static int dtype_bytes(const char *dt)
{
    if (!strcmp(dt, "BF16"))
        return 2;
    if (!strcmp(dt, "F32"))
        return 4;
    return 0;
}

static int parse_tensor(js *j, act_tensor *t)
{
    int rc, have_dtype = 0, have_shape = 0, have_off = 0;
    if ((rc = js_expect(j, '{')))
        return rc;
    js_ws(j);
    if (j->p < j->end && *j->p == '}')
        return js_bad(j, "empty tensor entry");
    for (;;) {
        char *key = NULL;
        if ((rc = js_key(j, &key)))
            return rc;
        if (!strcmp(key, "dtype")) {
            char *dt = NULL;
            if ((rc = js_string(j, &dt))) {
                free(key);
                return rc;
            }
            t->elem_bytes = dtype_bytes(dt);
            free(dt);
            have_dtype = 1;
        } else if (!strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
            const int shape = key[0] == 's';
            uint64_t v[ACT_MAX_RANK];
            int n = 0;
            if ((rc = js_expect(j, '['))) {
                free(key);
                return rc;
            }
            if (!js_eat(j, ']'))
                for (;;) {
                    if (n == ACT_MAX_RANK) {
                        free(key);
                        return js_bad(j, "too many dimensions");
                    }
                    if ((rc = js_uint(j, &v[n++]))) {
                        free(key);
                        return rc;
                    }
                    if (js_eat(j, ','))
                        continue;
                    if ((rc = js_expect(j, ']'))) {
                        free(key);
                        return rc;
                    }
                    break;
                }
            if (shape) {
                t->rank = n;
                memcpy(t->dims, v, (size_t)n * sizeof v[0]);
                have_shape = 1;
            } else {
                if (n != 2) {
                    free(key);
                    return js_bad(j, "data_offsets needs two numbers");
                }
                t->begin = v[0];
                t->end = v[1];
                have_off = 1;
            }
        } else if ((rc = js_skip(j, 1))) {
            free(key);
            return rc;
        }
        free(key);
        if (js_eat(j, ','))
            continue;
        if ((rc = js_expect(j, '}')))
            return rc;
        break;
    }
    if (!have_dtype || !have_shape || !have_off)
        return fail(j->e, SA_ERR_ARG, "tensor '%s' lacks %s", t->name,
                    !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return SA_OK;
}

static int parse_metadata(js *j, sa_act_file *f)
{
    int rc;
    if ((rc = js_expect(j, '{')))
        return rc;
    if (js_eat(j, '}'))
        return SA_OK;
    for (;;) {
        char *key = NULL, *val = NULL;
        if ((rc = js_key(j, &key)))
            return rc;
        js_ws(j);
        if (j->p >= j->end || *j->p != '"') {
            rc = fail(j->e, SA_ERR_ARG, "metadata '%s' is not a string", key);
            free(key);
            return rc;
        }
        if ((rc = js_string(j, &val))) {
            free(key);
            return rc;
        }
        for (int i = 0; i < f->n_meta; i++)
            if (!strcmp(f->meta_key[i], key)) {
                rc = fail(j->e, SA_ERR_ARG, "metadata '%s' given twice", key);
                free(key);
                free(val);
                return rc;
            }
        char **nk = realloc(f->meta_key, (size_t)(f->n_meta + 1) * sizeof *nk);
        if (nk)
            f->meta_key = nk;
        char **nv = nk ? realloc(f->meta_val, (size_t)(f->n_meta + 1) * sizeof *nv) : NULL;
        if (nv)
            f->meta_val = nv;
        if (!nk || !nv) {
            free(key);
            free(val);
            return fail(j->e, SA_ERR_NOMEM, "out of memory");
        }
        f->meta_key[f->n_meta] = key;
        f->meta_val[f->n_meta++] = val;
        if (js_eat(j, ','))
            continue;
        return js_expect(j, '}');
    }
}

static int parse_header(js *j, sa_act_file *f)
{
    int rc, have_meta = 0;
    if ((rc = js_expect(j, '{')))
        return rc;
    if (!js_eat(j, '}'))
        for (;;) {
            char *key = NULL;
            if ((rc = js_key(j, &key)))
                return rc;
            if (!strcmp(key, "__metadata__")) {
                free(key);
                if (have_meta)
                    return fail(j->e, SA_ERR_ARG, "__metadata__ given twice");
                have_meta = 1;
                if ((rc = parse_metadata(j, f)))
                    return rc;
            } else {
                for (int i = 0; i < f->n_tensors; i++)
                    if (!strcmp(f->tensors[i].name, key)) {
                        rc = fail(j->e, SA_ERR_ARG, "tensor '%s' given twice", key);
                        free(key);
                        return rc;
                    }
                act_tensor *nt = realloc(f->tensors, (size_t)(f->n_tensors + 1) * sizeof *nt);
                if (!nt) {
                    free(key);
                    return fail(j->e, SA_ERR_NOMEM, "out of memory");
                }
                f->tensors = nt;
                act_tensor *t = &f->tensors[f->n_tensors++];
                memset(t, 0, sizeof *t);
                t->name = key;
                if ((rc = parse_tensor(j, t)))
                    return rc;
            }
            if (js_eat(j, ','))
                continue;
            if ((rc = js_expect(j, '}')))
                return rc;
            break;
        }
    js_ws(j);
    if (j->p != j->end)
        return js_bad(j, "text after the header object");
    return SA_OK;
}

/* ---------------------------------------------------------------- layers */
/* "layers.<L>.q|k|v" -> L and 0/1/2, else -1. */
static int layer_tensor(const char *name, int *layer)
{
    if (strncmp(name, "layers.", 7))
        return -1;
    const char *p = name + 7;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > ACT_MAX_LAYER)
            return -1;
    }
    if (*p != '.' || !p[1] || p[2])
        return -1;
    const char *which = "qkv", *w = strchr(which, p[1]);
    if (!w)
        return -1;
    *layer = (int)v;
    return (int)(w - which);
}

static act_layer *layer_slot(sa_act_file *f, int layer)
{
    for (int i = 0; i < f->n_layers; i++)
        if (f->layers[i].info.layer == layer)
            return &f->layers[i];
    act_layer *nl = realloc(f->layers, (size_t)(f->n_layers + 1) * sizeof *nl);
    if (!nl)
        return NULL;
    f->layers = nl;
    act_layer *l = &f->layers[f->n_layers++];
    memset(l, 0, sizeof *l);
    l->info.layer = layer;
    l->t[0] = l->t[1] = l->t[2] = -1;
    return l;
}

static int cmp_layer(const void *a, const void *b)
{
    const int x = ((const act_layer *)a)->info.layer, y = ((const act_layer *)b)->info.layer;
    return (x > y) - (x < y);
}

static const char *meta_get(const sa_act_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_key[i], key))
            return f->meta_val[i];
    return NULL;
}

/* "layers.L.key" compared in its parts, so no key is too long to look up (a fixed buffer had cut
 * long keys short and matched another entry). */
static const char *layer_meta(const sa_act_file *f, int layer, const char *key)
{
    char prefix[32];
    const int np = snprintf(prefix, sizeof prefix, "layers.%d.", layer);
    for (int i = 0; i < f->n_meta; i++)
        if (!strncmp(f->meta_key[i], prefix, (size_t)np) && !strcmp(f->meta_key[i] + np, key))
            return f->meta_val[i];
    return meta_get(f, key);
}

static int num_meta(const sa_act_file *f, act_err *e, int layer, const char *key, double lo,
                    double hi, int integer, double *out)
{
    const char *v = layer_meta(f, layer, key);
    if (!v)
        return 0;
    const char *end = json_number_end(v);
    const double x = end && !*end ? json_number_value(v) : NAN;
    if (!end || *end || !isfinite(x) || x < lo || x > hi || (integer && x != floor(x)))
        return fail(e, SA_ERR_ARG, "layer %d: metadata %s = '%s' is not %s in [%g, %g]", layer,
                    key, v, integer ? "an integer" : "a number", lo, hi);
    *out = x;
    return 1;
}

static int build_layers(sa_act_file *f, act_err *e)
{
    static const char *const which[3] = {"q", "k", "v"};
    for (int i = 0; i < f->n_tensors; i++) {
        act_tensor *t = &f->tensors[i];
        if (t->begin > t->end || t->end > f->data_len)
            return fail(e, SA_ERR_ARG, "tensor '%s': data_offsets [%llu, %llu) outside the %llu "
                        "data bytes", t->name, (unsigned long long)t->begin,
                        (unsigned long long)t->end, (unsigned long long)f->data_len);
        int layer, w = layer_tensor(t->name, &layer);
        if (w < 0)
            continue; /* not ours */
        if (!t->elem_bytes)
            return fail(e, SA_ERR_ARG, "tensor '%s': dtype is neither BF16 nor F32", t->name);
        if (t->rank != 3 && t->rank != 4)
            return fail(e, SA_ERR_ARG, "tensor '%s': rank %d, expected 4 (B, H, S, D) or 3",
                        t->name, t->rank);
        uint64_t n = 1;
        for (int d = 0; d < t->rank; d++) {
            if (t->dims[d] == 0 || t->dims[d] > INT_MAX)
                return fail(e, SA_ERR_ARG, "tensor '%s': dimension %d is %llu", t->name, d,
                            (unsigned long long)t->dims[d]);
            if (n > UINT64_MAX / 8 / t->dims[d])
                return fail(e, SA_ERR_ARG, "tensor '%s': too many elements", t->name);
            n *= t->dims[d];
        }
        if (t->end - t->begin != n * (uint64_t)t->elem_bytes)
            return fail(e, SA_ERR_ARG, "tensor '%s': %llu data bytes for %llu elements of %d bytes",
                        t->name, (unsigned long long)(t->end - t->begin), (unsigned long long)n,
                        t->elem_bytes);
        act_layer *l = layer_slot(f, layer);
        if (!l)
            return fail(e, SA_ERR_NOMEM, "out of memory");
        l->t[w] = i;
    }
    if (f->n_layers > 1)
        qsort(f->layers, (size_t)f->n_layers, sizeof *f->layers, cmp_layer);
    for (int i = 0; i < f->n_layers; i++) {
        act_layer *l = &f->layers[i];
        const int L = l->info.layer;
        for (int w = 0; w < 3; w++)
            if (l->t[w] < 0)
                return fail(e, SA_ERR_ARG, "layer %d has no tensor layers.%d.%s", L, L, which[w]);
        uint64_t dim[3][4]; /* B, H, S, D of q, k, v */
        for (int w = 0; w < 3; w++) {
            const act_tensor *t = &f->tensors[l->t[w]];
            const int off = 4 - t->rank;
            dim[w][0] = 1;
            for (int d = 0; d < t->rank; d++)
                dim[w][off + d] = t->dims[d];
        }
        if (memcmp(dim[1], dim[2], sizeof dim[1]))
            return fail(e, SA_ERR_ARG, "layer %d: k and v differ in shape", L);
        if (dim[0][0] != dim[1][0] || dim[0][3] != dim[1][3])
            return fail(e, SA_ERR_ARG, "layer %d: q and k differ in batch or head_dim", L);
        if (dim[0][1] % dim[1][1])
            return fail(e, SA_ERR_ARG, "layer %d: %llu query heads are not a multiple of %llu KV "
                        "heads", L, (unsigned long long)dim[0][1], (unsigned long long)dim[1][1]);
        sa_shape *s = &l->info.shape;
        s->batch = (int)dim[0][0];
        s->heads_q = (int)dim[0][1];
        s->heads_kv = (int)dim[1][1];
        s->len_q = (int)dim[0][2];
        s->len_kv = (int)dim[1][2];
        s->head_dim = (int)dim[0][3];
        const struct {
            const char *key;
            int value;
        } geo[3] = {{"heads_q", s->heads_q}, {"heads_kv", s->heads_kv}, {"head_dim", s->head_dim}};
        for (int g = 0; g < 3; g++) {
            double x;
            int rc = num_meta(f, e, L, geo[g].key, 1, INT_MAX, 1, &x);
            if (rc < 0)
                return rc;
            if (rc && (int)x != geo[g].value)
                return fail(e, SA_ERR_ARG, "layer %d: metadata %s = %d, the tensors have %d", L,
                            geo[g].key, (int)x, geo[g].value);
        }
        double x;
        int rc;
        l->info.scale = 1.0 / sqrt((double)s->head_dim);
        if ((rc = num_meta(f, e, L, "scale", 0, 1e30, 0, &x)) < 0)
            return rc;
        if (rc) {
            if (!(x > 0))
                return fail(e, SA_ERR_ARG, "layer %d: scale must be positive", L);
            l->info.scale = x;
        }
        if ((rc = num_meta(f, e, L, "causal", 0, 1, 1, &x)) < 0)
            return rc;
        l->info.causal = rc ? (int)x : 0;
        if ((rc = num_meta(f, e, L, "sliding_window", 0, INT_MAX, 1, &x)) < 0)
            return rc;
        l->info.sliding_window = rc ? (int)x : 0;
        if ((rc = num_meta(f, e, L, "rope_theta", 0, 1e30, 0, &x)) < 0)
            return rc;
        l->info.rope_theta = rc ? x : 0;
    }
    return SA_OK;
}

/* ---------------------------------------------------------------- open, close */
static int read_at(int fd, void *dst, size_t n, uint64_t off)
{
    char *p = dst;
    while (n) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

void sa_act_close(sa_act_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->meta_key);
    free(f->meta_val);
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->layers);
    free(f);
}

int sa_act_open(const char *path, sa_act_file **out, char *err, size_t errlen)
{
    act_err e = {err, errlen};
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return fail(&e, SA_ERR_NULL, "out is NULL");
    *out = NULL;
    if (!path)
        return fail(&e, SA_ERR_NULL, "path is NULL");
    sa_act_file *f = calloc(1, sizeof *f);
    if (!f)
        return fail(&e, SA_ERR_NOMEM, "out of memory");
    int rc = SA_OK;
    char *hdr = NULL;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    unsigned char len8[8];
    if (f->fd < 0 || fstat(f->fd, &st) || !S_ISREG(st.st_mode)) {
        rc = fail(&e, SA_ERR_ARG, "%s: %s", path, f->fd < 0 ? strerror(errno) : "not a file");
        goto done;
    }
    if (st.st_size < 8 || read_at(f->fd, len8, 8, 0)) {
        rc = fail(&e, SA_ERR_ARG, "%s: shorter than the 8-byte header length", path);
        goto done;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    if (n < 2 || n > ACT_MAX_HEADER || n > (uint64_t)st.st_size - 8) {
        rc = fail(&e, SA_ERR_ARG, "%s: header length %llu does not fit the file (%lld bytes) or "
                  "the format's limit", path, (unsigned long long)n, (long long)st.st_size);
        goto done;
    }
    if (!(hdr = malloc((size_t)n + 1))) {
        rc = fail(&e, SA_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (read_at(f->fd, hdr, (size_t)n, 8)) {
        rc = fail(&e, SA_ERR_ARG, "%s: cannot read the header", path);
        goto done;
    }
    hdr[n] = 0;
    if (memchr(hdr, 0, (size_t)n)) {
        rc = fail(&e, SA_ERR_ARG, "%s: NUL byte in the JSON header", path);
        goto done;
    }
    f->data_start = 8 + n;
    f->data_len = (uint64_t)st.st_size - f->data_start;
    js j = {hdr, hdr + n, hdr, &e};
    if ((rc = parse_header(&j, f)))
        goto done;
    const char *fmt = meta_get(f, "format");
    if (!fmt || strcmp(fmt, ACT_FORMAT)) {
        rc = fail(&e, SA_ERR_ARG, "%s: metadata format is %s%s%s, expected '" ACT_FORMAT "'",
                  path, fmt ? "'" : "missing", fmt ? fmt : "", fmt ? "'" : "");
        goto done;
    }
    rc = build_layers(f, &e);
done:
    free(hdr);
    if (rc) {
        sa_act_close(f);
        return rc;
    }
    *out = f;
    return SA_OK;
}

/* ---------------------------------------------------------------- access */
int sa_act_layer_count(const sa_act_file *f)
{
    return f ? f->n_layers : -1;
}

int sa_act_layer_info(const sa_act_file *f, int i, sa_act_layer *info)
{
    if (!f || !info)
        return SA_ERR_NULL;
    if (i < 0 || i >= f->n_layers)
        return SA_ERR_ARG;
    *info = f->layers[i].info;
    return SA_OK;
}

int sa_act_find_layer(const sa_act_file *f, int layer)
{
    if (f)
        for (int i = 0; i < f->n_layers; i++)
            if (f->layers[i].info.layer == layer)
                return i;
    return -1;
}

static int host_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static int read_tensor(const sa_act_file *f, const act_tensor *t, uint16_t *dst)
{
    const size_t n = (size_t)((t->end - t->begin) / (uint64_t)t->elem_bytes);
    if (t->elem_bytes == 2) {
        if (read_at(f->fd, dst, n * 2, f->data_start + t->begin))
            return SA_ERR_ARG;
        if (!host_little_endian())
            for (size_t i = 0; i < n; i++)
                dst[i] = (uint16_t)(dst[i] << 8 | dst[i] >> 8);
        return SA_OK;
    }
    enum { CHUNK = 1 << 14 };
    unsigned char *buf = malloc(CHUNK * 4);
    if (!buf)
        return SA_ERR_NOMEM;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        const size_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        if (read_at(f->fd, buf, m * 4, f->data_start + t->begin + i0 * 4)) {
            free(buf);
            return SA_ERR_ARG;
        }
        for (size_t i = 0; i < m; i++) {
            const unsigned char *b = buf + 4 * i;
            uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                         (uint32_t)b[3] << 24;
            float x;
            memcpy(&x, &u, 4);
            dst[i0 + i] = sa_bf16_from_f32(x);
        }
    }
    free(buf);
    return SA_OK;
}

int sa_act_read(const sa_act_file *f, int i, uint16_t *q, uint16_t *k, uint16_t *v)
{
    if (!f || (!q && !k && !v))
        return SA_ERR_NULL;
    if (i < 0 || i >= f->n_layers)
        return SA_ERR_ARG;
    uint16_t *dst[3] = {q, k, v};
    for (int w = 0; w < 3; w++)
        if (dst[w]) {
            int rc = read_tensor(f, &f->tensors[f->layers[i].t[w]], dst[w]);
            if (rc)
                return rc;
        }
    return SA_OK;
}

const char *sa_act_meta(const sa_act_file *f, const char *key)
{
    return f && key ? meta_get(f, key) : NULL;
}

const char *sa_act_layer_meta(const sa_act_file *f, int i, const char *key)
{
    if (!f || !key || i < 0 || i >= f->n_layers)
        return NULL;
    return layer_meta(f, f->layers[i].info.layer, key);
}

int sa_act_meta_count(const sa_act_file *f)
{
    return f ? f->n_meta : -1;
}

const char *sa_act_meta_key(const sa_act_file *f, int n)
{
    return f && n >= 0 && n < f->n_meta ? f->meta_key[n] : NULL;
}
