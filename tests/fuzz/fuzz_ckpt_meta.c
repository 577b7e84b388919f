/* libFuzzer target for the checkpoint counters a load reads
 * (fg__fabric_meta_read, src/fabric/fabric_meta.c): the input is lines
 * "<k><value>", each replacing the value of the fabric's key number k (one
 * byte, modulo the number of keys; value "\x7f" drops the key) in a whole
 * checkpoint's metadata; the file is packed in memory and its counters
 * read. Any values either pass, and then every counter is in its range and
 * agrees with the others, or fail with FG_EFORMAT and a message naming the
 * key; never a crash, an overflow (UBSan) or a leak.
 *
 * Build and run it with tests/fuzz/run.sh SECONDS ckpt_meta. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/fabric_impl.h"

static const char *const k_keys[] = {"step",
                                     "epoch",
                                     "batch_in_epoch",
                                     "seed",
                                     "world_size",
                                     "optimizer_steps",
                                     "lr",
                                     "samples_in_epoch",
                                     "global_batch",
                                     "deterministic",
                                     "loss_scale",
                                     "loss_scale_growth_tracker",
                                     "loss_scale_skipped"};
static const char *const k_good[] = {"12", "1", "2",    "7",     "2", "12", "0.003",
                                     "8",  "4", "true", "65536", "3", "0"};
#define NKEYS (sizeof k_keys / sizeof k_keys[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *md = json_object();
    for (size_t k = 0; k < NKEYS; k++) json_object_set_new(md, k_keys[k], json_string(k_good[k]));
    for (size_t i = 0; i < size;) {
        size_t end = i;
        while (end < size && data[end] != '\n') end++;
        if (end > i) {
            const char *key = k_keys[data[i] % NKEYS];
            const char *v = (const char *)data + i + 1;
            size_t n = end - i - 1;
            if (n == 1 && v[0] == 0x7f) json_object_del(md, key);
            else {
                json_t *s = json_stringn(v, n); /* NULL for bytes that are not UTF-8 */
                if (s && !memchr(v, 0, n)) json_object_set_new(md, key, s);
                else json_decref(s);
            }
        }
        i = end + 1;
    }
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", md);
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return 0;
    size_t hl = strlen(hdr);
    unsigned char *buf = malloc(8 + hl);
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)hl >> (8 * b));
    memcpy(buf + 8, hdr, hl);
    free(hdr);
    fg_st_file *f = fg_st_open_memory(buf, 8 + hl, "fuzz.safetensors");
    if (!f) abort(); /* a header of strings is always a file */
    fg__ckpt_counters c;
    fg_status s = fg__fabric_meta_read(f, "fuzz.safetensors", &c);
    if (s == FG_OK) {
        if (c.step < 0 || c.epoch < 0 || c.batch_in_epoch < 0 || c.optimizer_steps < 0) abort();
        if (c.world_size < 0 || c.world_size > (1 << 20)) abort();
        if ((c.global_batch > 0) != (c.samples_in_epoch >= 0)) abort();
        if (c.global_batch > 0 && c.world_size > 0 && c.global_batch % c.world_size) abort();
        if (c.has_lr && !(isfinite(c.lr) && c.lr >= 0)) abort();
        if (c.has_scaler && !(isfinite(c.loss_scale) && c.loss_scale > 0)) abort();
        if (c.growth_tracker < 0 || c.skipped < 0) abort();
    } else if (s != FG_EFORMAT || !strstr(fg_last_error(), "fuzz.safetensors: metadata \"")) {
        abort(); /* a refusal names the file and the key */
    }
    fg_st_close(f);
    free(buf);
    return 0;
}
