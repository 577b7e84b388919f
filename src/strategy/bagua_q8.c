/* 8-bit min-max quantisation (Bagua's MinMaxUInt8) and ByteGrad's
 * compressed scatter-gather average. A chunk record is [min f32][max f32]
 * [len bytes]; element i is q = round((x - min) * 255 / (max - min)) and
 * comes back as min + q * ((max - min) / 255), within (max - min) / 510 of
 * x. Decompression is a pure function of the record, so every rank that
 * holds a record gets the same floats from it. A chunk holding a NaN or an
 * infinity (or whose range overflows) comes back all NaN, so that a
 * non-finite gradient is not quantised away unseen. */
#include <math.h>
#include <string.h>

#include "bagua_impl.h"

void fg__q8_compress(const float *x, int64_t m, int64_t len, uint8_t *rec) {
    float lo = 0, hi = 0;
    bool finite = true;
    if (m > 0) lo = hi = x[0];
    for (int64_t i = 0; i < m; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        finite &= isfinite(x[i]) != 0;
    }
    if (!finite || !isfinite(hi - lo)) lo = hi = NAN; /* the whole chunk comes back NaN */
    memcpy(rec, &lo, 4);
    memcpy(rec + 4, &hi, 4);
    uint8_t *q = rec + FG_Q8_HEADER;
    float scale = hi > lo ? 255.0f / (hi - lo) : 0.0f;
    for (int64_t i = 0; i < m; i++) {
        float l = rintf((x[i] - lo) * scale);
        q[i] = l >= 0 && l <= 255 ? (uint8_t)l : l > 255 ? 255 : 0;
    }
    memset(q + m, 0, (size_t)(len - m));
}

void fg__q8_decompress(const uint8_t *rec, int64_t m, float *out) {
    float lo, hi;
    memcpy(&lo, rec, 4);
    memcpy(&hi, rec + 4, 4);
    float step = (hi - lo) / 255.0f;
    const uint8_t *q = rec + FG_Q8_HEADER;
    for (int64_t i = 0; i < m; i++) out[i] = lo + (float)q[i] * step;
}

fg_status fg__q8_reserve(fg__bagua_state *st, size_t rec_bytes, int64_t floats) {
    if (rec_bytes > st->rec_cap) {
        uint8_t *r = fg_realloc(st->rec, rec_bytes);
        if (!r) return fg_error_wrap(FG_ENOMEM, "bagua: %zu bytes of chunks", rec_bytes);
        st->rec = r;
        st->rec_cap = rec_bytes;
    }
    if (floats > st->acc_cap) {
        float *a = fg_realloc(st->acc, sizeof *a * (size_t)floats);
        if (!a) return fg_error_wrap(FG_ENOMEM, "bagua: %lld floats", (long long)floats);
        st->acc = a;
        st->acc_cap = floats;
    }
    return FG_OK;
}

/* elements of slice j when n elements are cut into slices of len */
static int64_t slice_len(int64_t n, int64_t len, int j) {
    int64_t lo = (int64_t)j * len;
    return lo >= n ? 0 : FG_MIN(len, n - lo);
}

fg_status fg__q8_average(fg__bagua_state *st, fg_comm *c, float *buf, int64_t n) {
    int p = fg_comm_size(c), k = fg_comm_rank(c);
    if (p < 2 || n == 0) return FG_OK;
    int64_t len = (n + p - 1) / p;
    size_t rb = FG_Q8_HEADER + (size_t)len;
    FG_TRY(fg__q8_reserve(st, 2 * (size_t)p * rb, len));
    uint8_t *ex = st->rec, *ga = st->rec + (size_t)p * rb;
    /* one chunk per rank's slice, exchanged: record j goes to rank j */
    for (int j = 0; j < p; j++)
        fg__q8_compress(buf + (int64_t)j * len, slice_len(n, len, j), len, ex + (size_t)j * rb);
    fg__bagua_count(st, (uint64_t)p * rb);
    FG_TRY(fg_comm_alltoall(c, ex, ex, (int64_t)rb, FG_U8));
    /* this rank's slice: the sum of the ranks' chunks in rank order, / p */
    int64_t mk = slice_len(n, len, k);
    float *acc = st->acc, *tmp = buf + (int64_t)k * len; /* own slice: free to scratch now */
    memset(acc, 0, sizeof *acc * (size_t)mk);
    for (int j = 0; j < p; j++) {
        fg__q8_decompress(ex + (size_t)j * rb, mk, tmp);
        for (int64_t i = 0; i < mk; i++) acc[i] += tmp[i];
    }
    for (int64_t i = 0; i < mk; i++) acc[i] /= (float)p;
    fg__q8_compress(acc, mk, len, ga + (size_t)k * rb);
    FG_TRY(fg_comm_allgather(c, ga + (size_t)k * rb, ga, (int64_t)rb, FG_U8));
    for (int j = 0; j < p; j++)
        fg__q8_decompress(ga + (size_t)j * rb, slice_len(n, len, j), buf + (int64_t)j * len);
    return FG_OK;
}
