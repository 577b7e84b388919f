/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3"): a keyed bijection of a 128-bit counter. Draw i of a stream is word
 * i%4 of the block at counter i/4, so any thread or rank can produce any
 * slice of a stream without producing what comes before it. */
#include <math.h>

#include "core_impl.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void fg_philox(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint32_t fg_rng_u32_at(uint64_t seed, uint64_t index) {
    uint32_t b[4];
    fg_philox(seed, index >> 2, b);
    return b[index & 3];
}

uint32_t fg_rng_u32(fg_rng *r) { return fg_rng_u32_at(r->seed, r->offset++); }

static float u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

float fg_rng_uniform(fg_rng *r) { return u32_to_unit(fg_rng_u32(r)); }

double fg_rng_normal(fg_rng *r) {
    /* u1 in (0, 1] so that log never sees 0 */
    double u1 = ((double)(fg_rng_u32(r) >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(fg_rng_u32(r) >> 8) / 16777216.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t fg_rng_below(fg_rng *r, uint64_t n) {
    /* Lemire's multiply-shift on 64 bits made of two draws, with rejection. */
    for (;;) {
        uint64_t x = ((uint64_t)fg_rng_u32(r) << 32) | fg_rng_u32(r);
        __extension__ typedef unsigned __int128 u128;
        u128 m = (u128)x * n;
        uint64_t lo = (uint64_t)m;
        if (lo >= n || lo >= (uint64_t)(-n) % n) return (uint64_t)(m >> 64);
    }
}

void fg_rng_fill_uniform(uint64_t seed, uint64_t offset, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = u32_to_unit(fg_rng_u32_at(seed, offset + (uint64_t)i));
}

void fg_rng_fill_normal(uint64_t seed, uint64_t offset, float *out, int64_t n, float mean,
                        float std) {
    /* Element i uses draws 2(offset+i) and 2(offset+i)+1. */
    for (int64_t i = 0; i < n; i++) {
        fg_rng r = {seed, 2 * (offset + (uint64_t)i)};
        out[i] = mean + std * (float)fg_rng_normal(&r);
    }
}

static _Atomic uint64_t g_default_seed;

void fg_set_default_seed(uint64_t seed) { g_default_seed = seed; }
uint64_t fg_default_seed(void) { return g_default_seed; }

uint64_t fg_rng_derive(uint64_t seed, uint64_t stream) {
    uint32_t b[4];
    fg_philox(seed ^ 0x5DEECE66DULL, stream ^ 0xA5A5A5A5A5A5A5A5ULL, b);
    return ((uint64_t)b[0] << 32) | b[1];
}
