/* base64 and a flat-JSON reader for the metadata the tool stores (see
 * ckpt_meta.h). The JSON here is only what fit_model.c writes: one flat
 * object of numbers and plain strings; anything else reads as absent. */
#include "ckpt_meta.h"

#include <stdlib.h>
#include <string.h>

static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *b64_encode(const uint8_t *src, size_t n) {
    char *out = malloc(4 * ((n + 2) / 3) + 1), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16;
        if (i + 1 < n) v |= (uint32_t)src[i + 1] << 8;
        if (i + 2 < n) v |= src[i + 2];
        *p++ = k_b64[v >> 18 & 63];
        *p++ = k_b64[v >> 12 & 63];
        *p++ = i + 1 < n ? k_b64[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? k_b64[v & 63] : '=';
    }
    *p = '\0';
    return out;
}

long b64_decode(const char *s, uint8_t *out, size_t cap) {
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *c = strchr(k_b64, *s);
        if (!c || !*s) return -1;
        acc = acc << 6 | (uint32_t)(c - k_b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= cap) return -1;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)n;
}

/* Points just after "key": (whitespace skipped), or NULL. */
static const char *find_value(const char *json, const char *key) {
    size_t kl = strlen(key);
    for (const char *p = json; p && (p = strchr(p, '"')); p++) {
        if (!strncmp(p + 1, key, kl) && p[1 + kl] == '"') {
            const char *q = p + 2 + kl;
            while (*q == ' ') q++;
            if (*q != ':') continue;
            q++;
            while (*q == ' ') q++;
            return q;
        }
    }
    return NULL;
}

bool json_get_num(const char *json, const char *key, double *out) {
    const char *v = json ? find_value(json, key) : NULL;
    if (!v) return false;
    char *end;
    double d = strtod(v, &end);
    if (end == v) return false;
    *out = d;
    return true;
}

bool json_get_str(const char *json, const char *key, char *out, size_t cap) {
    const char *v = json ? find_value(json, key) : NULL;
    if (!v || *v != '"') return false;
    const char *e = strchr(v + 1, '"');
    if (!e || (size_t)(e - v - 1) >= cap) return false;
    memcpy(out, v + 1, (size_t)(e - v - 1));
    out[e - v - 1] = '\0';
    return true;
}
