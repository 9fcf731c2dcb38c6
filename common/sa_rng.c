#include <math.h>
#include <time.h>
#include <unistd.h>

#include "sparseattn.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sa_rng_seed(sa_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sa_rng_u64(sa_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double sa_rng_uniform(sa_rng *r) { return (double)(sa_rng_u64(r) >> 11) * 0x1.0p-53; }

double sa_rng_normal(sa_rng *r)
{
    /* Box-Muller; 1 - u keeps the log argument in (0, 1]. */
    double u = 1.0 - sa_rng_uniform(r), v = sa_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

uint32_t sa_rng_below(sa_rng *r, uint32_t n)
{
    /* Lemire's multiply-shift; the bias is below 2^-32 and irrelevant for test data. */
    return (uint32_t)(((sa_rng_u64(r) >> 32) * (uint64_t)n) >> 32);
}

void sa_rng_fill_bf16(sa_rng *r, uint16_t *dst, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sa_bf16_from_f32((float)sa_rng_normal(r) * scale);
}

uint64_t sa_fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 32);
    return splitmix64(&x);
}
