/* The tool's metadata in checkpoints, stored through fg_train_state.meta as
 * plain key/value strings (what `fulgur ckpt show` and Python's safetensors
 * read):
 *   "config"     the model and run configuration, a JSON object (jansson)
 *                written by fit_model_cfg_json and read back by `sample`;
 *   "vocab_b64"  a text model's vocabulary: its bytes in id order, base64.
 * Checkpoints from before fg_train_state carried key/value pairs used these
 * same keys and JSON objects of the same shape, so they read alike. */
#ifndef FULGUR_CKPT_META_H
#define FULGUR_CKPT_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_META_CONFIG "config"
#define CKPT_META_VOCAB "vocab_b64"

/* base64 (RFC 4648, padded) of n bytes; malloc'ed, NUL-terminated. */
char *b64_encode(const uint8_t *src, size_t n);
/* Decodes into out (cap bytes); returns the byte count, or -1 on a bad
 * character or a result larger than cap. */
long b64_decode(const char *s, uint8_t *out, size_t cap);

#endif
