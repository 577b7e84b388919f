/* TFRecord framing, the container of TensorBoard's event files: each record
 * is its length (uint64), the masked CRC-32C of those 8 bytes (uint32), the
 * data, and the masked CRC-32C of the data (uint32), all little-endian. The
 * mask is TensorFlow's ((crc >> 15 | crc << 17) + 0xa282ead8), so that a
 * CRC of data holding CRCs does not degenerate. CRC-32C is the Castagnoli
 * polynomial (reflected 0x82f63b78) by a table built once, thread-safely. */
#include <pthread.h>
#include <string.h>

#include "trainer_impl.h"

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t fg__crc32c(const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t fg__crc32c_masked(const void *data, size_t n) {
    uint32_t c = fg__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(unsigned char *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(v >> (8 * i));
}

fg_status fg__tfrecord_write(FILE *fp, const void *data, size_t n) {
    unsigned char head[12], tail[4];
    put_le(head, (uint64_t)n, 8);
    put_le(head + 8, fg__crc32c_masked(head, 8), 4);
    put_le(tail, fg__crc32c_masked(data, n), 4);
    if (fwrite(head, 1, sizeof head, fp) != sizeof head || fwrite(data, 1, n, fp) != n ||
        fwrite(tail, 1, sizeof tail, fp) != sizeof tail)
        return FG_EIO;
    return FG_OK;
}
