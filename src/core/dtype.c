/* dtypes: sizes, names and round-to-nearest-even conversions. Index 0 of
 * the table is FG_DTYPE_DEFAULT, which is no type: size 0, never valid. */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "core_impl.h"

static const struct {
    const char *name, *st;
    size_t size;
    bool is_float;
} k_dt[FG_DTYPE_COUNT] = {
    [FG_DTYPE_DEFAULT] = {"default", "?", 0, false},
    [FG_F64] = {"f64", "F64", 8, true},
    [FG_F32] = {"f32", "F32", 4, true},
    [FG_BF16] = {"bf16", "BF16", 2, true},
    [FG_F16] = {"f16", "F16", 2, true},
    [FG_I32] = {"i32", "I32", 4, false},
    [FG_I64] = {"i64", "I64", 8, false},
    [FG_U8] = {"u8", "U8", 1, false},
    [FG_U16] = {"u16", "U16", 2, false},
};

bool fg_dtype_valid(int dt) { return dt > FG_DTYPE_DEFAULT && dt < FG_DTYPE_COUNT; }
size_t fg_dtype_size(fg_dtype dt) { return fg_dtype_valid(dt) ? k_dt[dt].size : 0; }
const char *fg_dtype_name(fg_dtype dt) {
    return dt == FG_DTYPE_DEFAULT ? k_dt[0].name : fg_dtype_valid(dt) ? k_dt[dt].name : "?";
}
const char *fg_dtype_st_name(fg_dtype dt) { return fg_dtype_valid(dt) ? k_dt[dt].st : "?"; }
bool fg_dtype_is_float(fg_dtype dt) { return fg_dtype_valid(dt) && k_dt[dt].is_float; }

fg_status fg_dtype_parse(const char *name, fg_dtype *out) {
    for (int i = FG_DTYPE_DEFAULT + 1; name && i < FG_DTYPE_COUNT; i++)
        if (!strcasecmp(name, k_dt[i].name)) {
            *out = (fg_dtype)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL,
                    "dtype \"%s\": expected one of f64, f32, bf16, f16, i32, i64, u8, u16",
                    name ? name : "(null)");
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fg_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fg_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t fg_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (a < 0x38800000u) {                                   /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half the least */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

float fg_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

static double load(const void *p, fg_dtype dt, int64_t i) {
    switch (dt) {
    case FG_F64: return ((const double *)p)[i];
    case FG_F32: return ((const float *)p)[i];
    case FG_BF16: return fg_bf16_to_f32(((const uint16_t *)p)[i]);
    case FG_F16: return fg_f16_to_f32(((const uint16_t *)p)[i]);
    case FG_I32: return ((const int32_t *)p)[i];
    case FG_I64: return (double)((const int64_t *)p)[i];
    case FG_U8: return ((const uint8_t *)p)[i];
    case FG_U16: return ((const uint16_t *)p)[i];
    default: return 0;
    }
}

static void store(void *p, fg_dtype dt, int64_t i, double v) {
    switch (dt) {
    case FG_F64: ((double *)p)[i] = v; break;
    case FG_F32: ((float *)p)[i] = (float)v; break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_f32_to_bf16((float)v); break;
    case FG_F16: ((uint16_t *)p)[i] = fg_f32_to_f16((float)v); break;
    case FG_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case FG_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case FG_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case FG_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    default: break;
    }
}

fg_status fg_convert(void *dst, fg_dtype ddt, const void *src, fg_dtype sdt, int64_t n) {
    if (!fg_dtype_valid(ddt) || !fg_dtype_valid(sdt))
        return fg_error(FG_EINVAL,
                        "fg_convert: dtypes %d (%s) and %d (%s): both must be real dtypes "
                        "(FG_F64 .. FG_U16)",
                        (int)ddt, fg_dtype_name(ddt), (int)sdt, fg_dtype_name(sdt));
    if (n < 0) return fg_error(FG_EINVAL, "fg_convert: negative count %lld", (long long)n);
    if (n && (!dst || !src))
        return fg_error(FG_EINVAL, "fg_convert: NULL buffer with count %lld", (long long)n);
    if (ddt == sdt) {
        if (dst != src) memmove(dst, src, (size_t)n * fg_dtype_size(ddt));
        return FG_OK;
    }
    /* The hot pairs get direct loops; the rest go through double. */
    if (sdt == FG_F32 && ddt == FG_BF16) {
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = fg_f32_to_bf16(((const float *)src)[i]);
    } else if (sdt == FG_BF16 && ddt == FG_F32) {
        for (int64_t i = 0; i < n; i++)
            ((float *)dst)[i] = fg_bf16_to_f32(((const uint16_t *)src)[i]);
    } else if (sdt == FG_F32 && ddt == FG_F16) {
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = fg_f32_to_f16(((const float *)src)[i]);
    } else if (sdt == FG_F16 && ddt == FG_F32) {
        for (int64_t i = 0; i < n; i++)
            ((float *)dst)[i] = fg_f16_to_f32(((const uint16_t *)src)[i]);
    } else {
        for (int64_t i = 0; i < n; i++) store(dst, ddt, i, load(src, sdt, i));
    }
    return FG_OK;
}
