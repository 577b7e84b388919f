/* What the safetensors writer and reader share: the format's dtype table,
 * jansson's allocator set-up and a strict UTF-8 check (JSON strings and the
 * reference implementation require valid UTF-8). */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "ckpt_impl.h"

/* Byte-sized dtypes of the safetensors format. The sub-byte ones (F4, F6_*)
 * are left out: they are not whole bytes per element, and fulgur has no use
 * for them; a file using them is refused with a message naming the dtype. */
static const fg__st_dtype k_st_dtypes[] = {
    {"BOOL", 1, FG_DTYPE_DEFAULT},
    {"U8", 1, FG_U8},
    {"I8", 1, FG_DTYPE_DEFAULT},
    {"F8_E5M2", 1, FG_DTYPE_DEFAULT},
    {"F8_E4M3", 1, FG_DTYPE_DEFAULT},
    {"F8_E8M0", 1, FG_DTYPE_DEFAULT},
    {"I16", 2, FG_DTYPE_DEFAULT},
    {"U16", 2, FG_U16},
    {"F16", 2, FG_F16},
    {"BF16", 2, FG_BF16},
    {"I32", 4, FG_I32},
    {"U32", 4, FG_DTYPE_DEFAULT},
    {"F32", 4, FG_F32},
    {"C64", 8, FG_DTYPE_DEFAULT},
    {"F64", 8, FG_F64},
    {"I64", 8, FG_I64},
    {"U64", 8, FG_DTYPE_DEFAULT},
};

const fg__st_dtype *fg__st_dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
        if (!strcmp(name, k_st_dtypes[i].name)) return &k_st_dtypes[i];
    return NULL;
}

/* jansson asks for plain malloc/free; fg_alloc's 64-byte alignment serves. */
static void *json_malloc(size_t n) { return fg_alloc(n); }
static void json_free(void *p) { fg_free(p); }
static void json_init_once(void) { json_set_alloc_funcs(json_malloc, json_free); }
static pthread_once_t g_json_once = PTHREAD_ONCE_INIT;

void fg__st_json_init(void) { pthread_once(&g_json_once, json_init_once); }

bool fg__utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp, min;
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

const char *fg__errstr(int e, char *buf, size_t cap) {
    /* GNU strerror_r (we build with _GNU_SOURCE) may return a static string. */
    return strerror_r(e, buf, cap);
}
