/* The tool's metadata values in checkpoints: the text vocabulary as base64
 * ("vocab_b64") and the model/run config as a flat JSON object ("config"),
 * with a reader for the flat objects this tool writes. */
#ifndef FULGUR_CKPT_META_H
#define FULGUR_CKPT_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* base64 (RFC 4648, padded) of n bytes; malloc'ed, NUL-terminated. */
char *b64_encode(const uint8_t *src, size_t n);
/* Decodes into out (cap bytes); returns the byte count, or -1 on a bad
 * character or a result larger than cap. */
long b64_decode(const char *s, uint8_t *out, size_t cap);

/* In a flat JSON object (no nesting), the value of "key": a number into
 * *out (json_get_num) or a string without escapes into out (json_get_str,
 * cap bytes). Return false when absent or of another type. */
bool json_get_num(const char *json, const char *key, double *out);
bool json_get_str(const char *json, const char *key, char *out, size_t cap);

#endif
