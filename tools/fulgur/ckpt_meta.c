/* base64 for the vocabulary the tool stores in checkpoints (see
 * ckpt_meta.h). */
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
