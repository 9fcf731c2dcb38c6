/* The activation-file reader (include/sa_activations.h, docs/activations.md) on small safetensors
 * files this test writes itself: layers, shapes, metadata, BF16 and F32 data, rank 3 and 4, then
 * every malformed file it must refuse with a message, a file cut short after it was opened, and
 * the reference run on what it read. */
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sa_activations.h"
#include "sa_test.h"

/* A file in the temporary folder, removed by the caller. */
static char *temp_path(void)
{
    const char *dir = getenv("TMPDIR");
    char *p = malloc(512);
    ck_assert_ptr_nonnull(p);
    snprintf(p, 512, "%s/sa_act_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(p);
    ck_assert_int_ge(fd, 0);
    close(fd);
    return p;
}

/* header length (8 bytes LE, or `len8` if not ~0), header, data. */
static void write_raw(const char *path, const char *hdr, size_t hlen, const void *data,
                      size_t dlen, unsigned long long len8)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    unsigned long long n = len8 != ~0ull ? len8 : hlen;
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(n >> (8 * i));
    ck_assert_uint_eq(fwrite(b, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(hdr, 1, hlen, f), hlen);
    if (dlen)
        ck_assert_uint_eq(fwrite(data, 1, dlen, f), dlen);
    fclose(f);
}

static void write_file(const char *path, const char *hdr, const void *data, size_t dlen)
{
    write_raw(path, hdr, strlen(hdr), data, dlen, ~0ull);
}

/* Little-endian bytes of BF16 values and of floats. */
static void put_bf16(unsigned char *dst, const uint16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = (unsigned char)(x[i] & 0xff);
        dst[2 * i + 1] = (unsigned char)(x[i] >> 8);
    }
}
static void put_f32(unsigned char *dst, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        for (int b = 0; b < 4; b++)
            dst[4 * i + b] = (unsigned char)(u >> (8 * b));
    }
}

/* Two layers: layer 3 (B 1, Hq 4, Hkv 2, S 130, D 64; BF16, rank 4), layer 11 (rank 3 q in F32,
 * rank-3 k, v in BF16; a sliding window of its own), plus a tensor that is not a layer. */
enum { HQ = 4, HKV = 2, S = 130, D = 64, NQ = HQ * S * D, NK = HKV * S * D };

typedef struct fixture {
    uint16_t q3[NQ], k3[NK], v3[NK], k11[NK], v11[NK];
    float q11[NQ];
    unsigned char *data;
    size_t dlen;
    char hdr[4096];
} fixture;

static fixture *make_fixture(void)
{
    fixture *x = calloc(1, sizeof *x);
    ck_assert_ptr_nonnull(x);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    sa_rng_fill_bf16(&r, x->q3, NQ, 1.0f);
    sa_rng_fill_bf16(&r, x->k3, NK, 1.0f);
    sa_rng_fill_bf16(&r, x->v3, NK, 1.0f);
    sa_rng_fill_bf16(&r, x->k11, NK, 1.0f);
    sa_rng_fill_bf16(&r, x->v11, NK, 1.0f);
    for (int i = 0; i < NQ; i++)
        x->q11[i] = (float)sa_rng_normal(&r);
    const size_t o1 = 2 * NQ, o2 = o1 + 2 * NK, o3 = o2 + 2 * NK, o4 = o3 + 4 * NQ,
                 o5 = o4 + 2 * NK, o6 = o5 + 2 * NK, o7 = o6 + 6;
    x->dlen = o7;
    x->data = calloc(1, o7);
    ck_assert_ptr_nonnull(x->data);
    put_bf16(x->data, x->q3, NQ);
    put_bf16(x->data + o1, x->k3, NK);
    put_bf16(x->data + o2, x->v3, NK);
    put_f32(x->data + o3, x->q11, NQ);
    put_bf16(x->data + o4, x->k11, NK);
    put_bf16(x->data + o5, x->v11, NK);
    /* The keys in an unusual order, an escaped key, whitespace, and padding at the end. */
    snprintf(x->hdr, sizeof x->hdr,
             "{\"layers.3.k\":{\"dtype\":\"BF16\",\"shape\":[1,%d,%d,%d],"
             "\"data_offsets\":[%zu,%zu]},"
             " \"__metadata__\" : {\"format\":\"sparseattn.activations\",\"heads_q\":\"4\","
             "\"heads_kv\":\"2\",\"head_dim\":\"64\",\"scale\":\"0.125\",\"causal\":\"1\","
             "\"sliding_window\":\"0\",\"rope_theta\":\"10000\",\"layers.11.sliding_window\":"
             "\"512\",\"layers.11.rope_theta\":\"1e6\",\"model\":\"caf\\u00e9 \\\"test\\\" "
             "\\ud83d\\ude00\"},\n"
             "\"layers.3.q\":{\"shape\":[1,%d,%d,%d],\"dtype\":\"BF16\",\"data_offsets\":[0,%zu]},"
             "\"layers.3.v\":{\"dtype\":\"BF16\",\"shape\":[1,%d,%d,%d],"
             "\"data_offsets\":[%zu,%zu]},"
             "\"layers.11.q\":{\"dtype\":\"F32\",\"shape\":[%d,%d,%d],\"data_offsets\":[%zu,%zu]},"
             "\"layers.11.k\":{\"dtype\":\"BF16\",\"shape\":[%d,%d,%d],\"data_offsets\":[%zu,%zu]},"
             "\"layers.11.v\":{\"dtype\":\"BF16\",\"shape\":[%d,%d,%d],\"data_offsets\":[%zu,%zu]},"
             "\"tokens\":{\"dtype\":\"I16\",\"shape\":[3],\"data_offsets\":[%zu,%zu],"
             "\"extra\":[true,false,null,-1.5e3,{\"a\":[]}]}}      ",
             HKV, S, D, o1, o2, HQ, S, D, o1, HKV, S, D, o2, o3, HQ, S, D, o3, o4, HKV, S, D, o4,
             o5, HKV, S, D, o5, o6, o6, o7);
    return x;
}

static void free_fixture(fixture *x)
{
    free(x->data);
    free(x);
}

/* The fixture written to a new temporary file, and that file opened. */
static sa_act_file *open_fixture(fixture **x, char **path)
{
    *x = make_fixture();
    *path = temp_path();
    write_file(*path, (*x)->hdr, (*x)->data, (*x)->dlen);
    char err[256];
    sa_act_file *f = NULL;
    ck_assert_msg(sa_act_open(*path, &f, err, sizeof err) == SA_OK, "open: %s", err);
    return f;
}

START_TEST(test_read)
{
    fixture *x;
    char *path;
    sa_act_file *f = open_fixture(&x, &path);
    ck_assert_int_eq(sa_act_layer_count(f), 2);
    ck_assert_int_eq(sa_act_find_layer(f, 3), 0);
    ck_assert_int_eq(sa_act_find_layer(f, 11), 1);
    ck_assert_int_eq(sa_act_find_layer(f, 4), -1);
    ck_assert_str_eq(sa_act_meta(f, "model"), "caf\xc3\xa9 \"test\" \xf0\x9f\x98\x80");
    ck_assert_ptr_null(sa_act_meta(f, "absent"));
    ck_assert_int_eq(sa_act_meta_count(f), 11);
    ck_assert_str_eq(sa_act_meta_key(f, 0), "format");
    ck_assert_ptr_null(sa_act_meta_key(f, 11));

    sa_act_layer l;
    ck_assert_int_eq(sa_act_layer_info(f, 0, &l), SA_OK);
    ck_assert_int_eq(l.layer, 3);
    const sa_shape want = {1, HQ, HKV, S, S, D};
    ck_assert(!memcmp(&l.shape, &want, sizeof want));
    ck_assert(l.scale == 0.125 && l.causal == 1 && l.sliding_window == 0 && l.rope_theta == 1e4);
    ck_assert_int_eq(sa_act_layer_info(f, 1, &l), SA_OK);
    ck_assert_int_eq(l.layer, 11);
    ck_assert(!memcmp(&l.shape, &want, sizeof want));
    ck_assert(l.sliding_window == 512 && l.rope_theta == 1e6 && l.causal == 1);
    ck_assert_str_eq(sa_act_layer_meta(f, 1, "sliding_window"), "512");
    ck_assert_str_eq(sa_act_layer_meta(f, 0, "sliding_window"), "0");
    ck_assert_int_eq(sa_act_layer_info(f, 2, &l), SA_ERR_ARG);
    ck_assert_int_eq(sa_act_layer_info(f, 0, NULL), SA_ERR_NULL);

    uint16_t *q = malloc(NQ * 2), *k = malloc(NK * 2), *v = malloc(NK * 2);
    ck_assert(q && k && v);
    ck_assert_int_eq(sa_act_read(f, 0, q, k, v), SA_OK);
    ck_assert(!memcmp(q, x->q3, NQ * 2) && !memcmp(k, x->k3, NK * 2) && !memcmp(v, x->v3, NK * 2));
    memset(k, 0, NK * 2);
    ck_assert_int_eq(sa_act_read(f, 1, q, NULL, v), SA_OK); /* k not read */
    for (int i = 0; i < NQ; i++)
        ck_assert_uint_eq(q[i], sa_bf16_from_f32(x->q11[i]));
    ck_assert(!memcmp(v, x->v11, NK * 2));
    for (int i = 0; i < NK; i++)
        ck_assert_uint_eq(k[i], 0);
    ck_assert_int_eq(sa_act_read(f, 1, NULL, NULL, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_act_read(f, 2, q, k, v), SA_ERR_ARG);

    /* What was read is attention input as any other: causal dense on layer 3. */
    ck_assert_int_eq(sa_act_read(f, 0, q, k, v), SA_OK);
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = 1;
    uint16_t *out = malloc(NQ * 2);
    ck_assert_int_eq(sa_ref_dense_opts(&want, q, k, v, &o, &(sa_outputs){.o = out}), SA_OK);
    free(out);
    free(q);
    free(k);
    free(v);
    sa_act_close(f);
    sa_act_close(NULL);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

/* A header edit that must be refused, and a word its message must hold. */
typedef struct bad_case {
    const char *from, *to, *why;
} bad_case;

static const bad_case bad_cases[] = {
    {"sparseattn.activations", "other", "format"},
    {"\"format\":\"sparseattn.activations\",", "", "format"},
    {"\"heads_kv\":\"2\"", "\"heads_kv\":\"1\"", "heads_kv"},
    {"\"head_dim\":\"64\"", "\"head_dim\":\"6x\"", "head_dim"},
    {"\"causal\":\"1\"", "\"causal\":\"2\"", "causal"},
    {"\"scale\":\"0.125\"", "\"scale\":\"0\"", "scale"},
    {"\"scale\":\"0.125\"", "\"scale\":\"0x1p-3\"", "scale"}, /* JSON numbers only */
    {"\"scale\":\"0.125\"", "\"scale\":\"0,125\"", "scale"},
    {"\"layers.11.sliding_window\":\"512\"", "\"layers.11.sliding_window\":\"-1\"",
     "sliding_window"},
    {"\"layers.3.v\"", "\"layers.3.w\"", "layers.3.v"},
    {"\"layers.3.q\":{\"shape\":[1,", "\"layers.3.q\":{\"shape\":[2,", "data bytes"},
    {"\"layers.3.q\":{\"shape\":[1,4,130", "\"layers.3.q\":{\"shape\":[1,1,520", "multiple"},
    {"\"shape\":[1,2,130,64],\"data_offsets\":[", "\"shape\":[1,2,130,64],\"data_offsets\":[1",
     "data_offsets"},
    {"\"dtype\":\"F32\"", "\"dtype\":\"F16\"", "dtype"},
    {"\"dtype\":\"F32\"", "\"dtypo\":\"F32\"", "dtype"},
    {"\"shape\":[4,130,64]", "\"shape\":[4,130,0,64]", "dimension"},
    {"\"shape\":[4,130,64]", "\"shape\":[4,130,64,1,1]", "rank"},
    {"\"model\":\"caf", "\"model\":7,\"x\":\"", "not a string"},
    {"\"heads_q\":\"4\"", "\"heads_q\":\"4\",\"heads_q\":\"4\"", "twice"},
    {"\"layers.11.q\"", "\"layers.3.q\"", "twice"},
    {"\\ud83d\\ude00", "\\ud83d", "surrogate"},
    {"\\u00e9", "\\u00g9", "escape"},
    {"\\u00e9", "\\u0000", "NUL"},
    {"[true,false,null", "[true,fals,null", "value"},
    {"-1.5e3", "007", "expected"}, /* the number 0, then garbage */
    {"-1.5e3", "-1.5e", "number"},
    {"-1.5e3", "-nan", "number"},
    {"\"a\":[]}]}}", "\"a\":[]}]}", "expected"},
    {"\"a\":[]}]}}", "\"a\":[]}]}},", "after"},
    {"[1,2,130,64],\"data_offsets\"", "[1,2,130,064],\"data_offsets\"", "zero"},
    {"[1,2,130,64],\"data_offsets\"", "[1,2,130,64.0],\"data_offsets\"", "integer"},
    {"[1,2,130,64],\"data_offsets\"", "[1,2,130,99999999999999999999],\"data_offsets\"",
     "large"},
    {"\"tokens\":{", "\"__metadata__\":{\"format\":\"sparseattn.activations\"},\"tokens\":{",
     "__metadata__ given twice"},
    {"\"shape\":[4,130,64]", "\"shape\":[2147483647,2147483647,2147483647]", "too many elements"},
    /* the same element counts, other shapes */
    {"\"layers.11.v\":{\"dtype\":\"BF16\",\"shape\":[2,130,64]",
     "\"layers.11.v\":{\"dtype\":\"BF16\",\"shape\":[2,65,128]", "k and v differ"},
    {"\"shape\":[4,130,64]", "\"shape\":[4,65,128]", "q and k differ"},
};
#define NBAD (int)(sizeof bad_cases / sizeof bad_cases[0])

START_TEST(test_malformed)
{
    const bad_case *b = &bad_cases[_i];
    fixture *x = make_fixture();
    char *at = strstr(x->hdr, b->from);
    ck_assert_msg(at != NULL, "case %d: '%s' not in the header", _i, b->from);
    char hdr[4200];
    snprintf(hdr, sizeof hdr, "%.*s%s%s", (int)(at - x->hdr), x->hdr, b->to,
             at + strlen(b->from));
    char *path = temp_path();
    write_file(path, hdr, x->data, x->dlen);
    char err[256] = "untouched";
    sa_act_file *f = (sa_act_file *)1;
    const int rc = sa_act_open(path, &f, err, sizeof err);
    ck_assert_msg(rc == SA_ERR_ARG, "case %d (%s -> %s): rc %d, %s", _i, b->from, b->to, rc, err);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err, b->why), "case %d: message '%s' lacks '%s'", _i, err, b->why);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

/* Broken framing: no file, a short file, a header length past the end or over the limit, NUL in
 * the header, data shorter than the offsets say; and NULL arguments. */
START_TEST(test_framing)
{
    fixture *x = make_fixture();
    char *path = temp_path();
    char err[256];
    sa_act_file *f;
    const size_t hl = strlen(x->hdr);
    struct {
        const char *what;
        size_t hlen, dlen;
        unsigned long long len8;
        int nul;
    } cases[] = {
        {"shorter", 0, 0, ~0ull, 0},
        {"does not fit", hl, x->dlen, hl + x->dlen + 1, 0},
        {"does not fit", hl, x->dlen, 200000000ull, 0},
        {"NUL", hl, x->dlen, ~0ull, 1},
        {"outside", hl, x->dlen - 1, ~0ull, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *h = strdup(x->hdr);
        ck_assert_ptr_nonnull(h);
        if (cases[c].nul)
            h[10] = 0;
        if (cases[c].hlen == 0) {
            FILE *fp = fopen(path, "wb");
            fwrite("abc", 1, 3, fp);
            fclose(fp);
        } else
            write_raw(path, h, cases[c].hlen, x->data, cases[c].dlen, cases[c].len8);
        free(h);
        ck_assert_int_eq(sa_act_open(path, &f, err, sizeof err), SA_ERR_ARG);
        ck_assert_msg(strstr(err, cases[c].what), "%s: '%s'", cases[c].what, err);
    }
    unlink(path);
    ck_assert_int_eq(sa_act_open(path, &f, err, sizeof err), SA_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_eq(sa_act_open(NULL, &f, err, sizeof err), SA_ERR_NULL);
    ck_assert_int_eq(sa_act_open(path, NULL, NULL, 0), SA_ERR_NULL);
    ck_assert_int_eq(sa_act_layer_count(NULL), -1);
    ck_assert_ptr_null(sa_act_meta(NULL, "format"));
    /* An empty object with the format is a valid file of no layers. */
    write_file(path, "{\"__metadata__\":{\"format\":\"sparseattn.activations\"}}", NULL, 0);
    ck_assert_int_eq(sa_act_open(path, &f, NULL, 0), SA_OK);
    ck_assert_int_eq(sa_act_layer_count(f), 0);
    sa_act_close(f);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

/* Metadata keys longer than any fixed buffer: each layer key finds its own entry (a 96-byte
 * buffer had cut "layers.11." + 90 letters short, to the key of another entry). */
/* Numbers in the metadata read the same under a locale whose decimal point is a comma (strtod
 * follows LC_NUMERIC). Skipped where no such locale is installed. */
START_TEST(test_numbers_ignore_locale)
{
    static const char *const comma[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8",
                                        "de_DE", "fr_FR"};
    int set = 0;
    for (size_t i = 0; i < sizeof comma / sizeof comma[0] && !set; i++)
        set = setlocale(LC_NUMERIC, comma[i]) != NULL;
    if (!set) {
        fprintf(stderr, "test_numbers_ignore_locale: skipped: no de_DE or fr_FR locale here\n");
        return;
    }
    fixture *x;
    char *path;
    sa_act_file *f = open_fixture(&x, &path);
    setlocale(LC_NUMERIC, "C");
    sa_act_layer l;
    ck_assert_int_eq(sa_act_layer_info(f, 0, &l), SA_OK);
    ck_assert(l.scale == 0.125 && l.rope_theta == 1e4);
    sa_act_close(f);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

START_TEST(test_long_layer_keys)
{
    fixture *x = make_fixture();
    char a90[91], a86[87], edit[400], hdr[4600];
    memset(a90, 'a', 90), a90[90] = 0;
    memset(a86, 'a', 86), a86[86] = 0;
    snprintf(edit, sizeof edit,
             "\"layers.11.%s\":\"long\",\"layers.11.%s\":\"short\",\"model\":", a90, a86);
    const char *at = strstr(x->hdr, "\"model\":");
    ck_assert_ptr_nonnull(at);
    snprintf(hdr, sizeof hdr, "%.*s%s%s", (int)(at - x->hdr), x->hdr, edit,
             at + strlen("\"model\":"));
    char *path = temp_path();
    write_file(path, hdr, x->data, x->dlen);
    char err[256];
    sa_act_file *f = NULL;
    ck_assert_msg(sa_act_open(path, &f, err, sizeof err) == SA_OK, "open: %s", err);
    ck_assert_str_eq(sa_act_layer_meta(f, 1, a90), "long");
    ck_assert_str_eq(sa_act_layer_meta(f, 1, a86), "short");
    ck_assert_ptr_null(sa_act_layer_meta(f, 0, a90));
    sa_act_close(f);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

/* A file cut short after it was opened (the reader checked the sizes then): every read of a
 * layer fails with SA_ERR_ARG, the BF16 tensors' and the F32 one's alike, and nothing crashes. */
START_TEST(test_read_after_truncation)
{
    fixture *x;
    char *path;
    sa_act_file *f = open_fixture(&x, &path);
    ck_assert_int_eq(truncate(path, (off_t)(8 + strlen(x->hdr) + 64)), 0);
    uint16_t *q = malloc(NQ * 2), *k = malloc(NK * 2), *v = malloc(NK * 2);
    ck_assert(q && k && v);
    ck_assert_int_eq(sa_act_read(f, 0, q, k, v), SA_ERR_ARG);    /* layer 3: BF16 */
    ck_assert_int_eq(sa_act_read(f, 1, q, NULL, NULL), SA_ERR_ARG); /* layer 11's q: F32 */
    ck_assert_int_eq(sa_act_read(f, 1, NULL, k, NULL), SA_ERR_ARG);
    free(q);
    free(k);
    free(v);
    sa_act_close(f);
    unlink(path);
    free(path);
    free_fixture(x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("activations");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, test_read);
    tcase_add_loop_test(tc, test_malformed, 0, NBAD);
    tcase_add_test(tc, test_framing);
    tcase_add_test(tc, test_read_after_truncation);
    tcase_add_test(tc, test_long_layer_keys);
    tcase_add_test(tc, test_numbers_ignore_locale);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
