/* The wire format of the swarm's messages: a fixed header, the payload (a
 * part encoded as f32, f16 or uniform 8-bit, or raw state bytes) and
 * libsodium's crypto_auth tag over both, under a key derived from the run's
 * secret and id. A message is checked in this order before anything of it
 * is used: its length (nng refused anything over the bound before
 * allocating), the tag, the header's fields, the payload's exact length for
 * its part, and every decoded value finite. */
#include "hivemind_impl.h"

#ifdef FULGUR_HAVE_HIVEMIND
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void fg__hm_key(unsigned char key[crypto_auth_KEYBYTES], const char *run_id, const char *secret) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, crypto_auth_KEYBYTES);
    static const char ctx[] = "fulgur-hivemind-v1";
    crypto_generichash_update(&st, (const unsigned char *)ctx, sizeof ctx);
    crypto_generichash_update(&st, (const unsigned char *)run_id, strlen(run_id) + 1);
    crypto_generichash_update(&st, (const unsigned char *)secret, strlen(secret));
    crypto_generichash_final(&st, key, crypto_auth_KEYBYTES);
}

size_t fg__hm_payload_bytes(fg_hivemind_compression c, int64_t n) {
    switch (c) {
    case FG_HIVEMIND_COMPRESSION_FP16: return (size_t)n * 2;
    case FG_HIVEMIND_COMPRESSION_8BIT: return n ? 8 + (size_t)n : 0;
    default: return (size_t)n * 4;
    }
}

void fg__hm_part_bounds(int64_t n, int nparts, int part, int64_t *lo, int64_t *hi) {
    *lo = n * part / nparts;
    *hi = n * (part + 1) / nparts;
}

static void encode(fg_hivemind_compression c, const float *v, int64_t n, unsigned char *out) {
    if (c == FG_HIVEMIND_COMPRESSION_NONE) {
        memcpy(out, v, (size_t)n * 4);
    } else if (c == FG_HIVEMIND_COMPRESSION_FP16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t x = fg_f32_to_f16(v[i]);
            memcpy(out + 2 * i, &x, 2);
        }
    } else if (n > 0) {
        float lo = v[0], hi = v[0];
        for (int64_t i = 1; i < n; i++) {
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        float scale = (hi - lo) / 255.0f;
        memcpy(out, &lo, 4);
        memcpy(out + 4, &scale, 4);
        for (int64_t i = 0; i < n; i++) {
            float q = scale > 0 ? (v[i] - lo) / scale : 0.0f;
            long r = lrintf(q);
            out[8 + i] = (unsigned char)(r < 0 ? 0 : r > 255 ? 255 : r);
        }
    }
}

fg_status fg__hm_frame(const fg_hivemind *h, fg__hm_hdr hd, const float *vals, int64_t nvals,
                       const void *raw, size_t raw_bytes, nng_msg **out) {
    size_t pb = vals ? fg__hm_payload_bytes((fg_hivemind_compression)hd.codec, nvals) : raw_bytes;
    hd.magic = FG__HM_MAGIC;
    hd.version = FG__HM_VERSION;
    hd.sender = h->id;
    hd.payload_bytes = pb;
    nng_msg *m;
    if (nng_msg_alloc(&m, sizeof hd + pb + FG__HM_TAG) != 0)
        return fg_error(FG_ENOMEM, "hivemind: a message of %zu bytes", sizeof hd + pb);
    unsigned char *b = nng_msg_body(m);
    memcpy(b, &hd, sizeof hd);
    if (vals) encode((fg_hivemind_compression)hd.codec, vals, nvals, b + sizeof hd);
    else if (pb) memcpy(b + sizeof hd, raw, pb);
    crypto_auth(b + sizeof hd + pb, b, sizeof hd + pb, h->key);
    *out = m;
    return FG_OK;
}

fg_status fg__hm_open(const fg_hivemind *h, const void *buf, size_t len, fg__hm_hdr *hd) {
    const unsigned char *b = buf;
    if (len < sizeof *hd + FG__HM_TAG)
        return fg_error(FG_EFORMAT, "a message of %zu bytes (at least %zu)", len,
                        sizeof *hd + FG__HM_TAG);
    if (crypto_auth_verify(b + len - FG__HM_TAG, b, len - FG__HM_TAG, h->key) != 0)
        return fg_error(FG_EFORMAT, "its tag does not verify (another run's secret or id)");
    memcpy(hd, b, sizeof *hd);
    if (hd->magic != FG__HM_MAGIC || hd->version != FG__HM_VERSION)
        return fg_error(FG_EFORMAT, "magic %08x version %u (fulgur's %08x, %d)", hd->magic,
                        hd->version, FG__HM_MAGIC, FG__HM_VERSION);
    if (hd->payload_bytes != len - sizeof *hd - FG__HM_TAG)
        return fg_error(FG_EFORMAT, "payload of %llu bytes announced, %zu came",
                        (unsigned long long)hd->payload_bytes, len - sizeof *hd - FG__HM_TAG);
    if (hd->kind == FG__HM_PART || hd->kind == FG__HM_REDUCED) {
        if (hd->codec >= FG_HIVEMIND_COMPRESSION_COUNT || hd->nparts < 1 ||
            hd->nparts > FG__HM_MAX_GROUP || hd->part >= hd->nparts || hd->n_total < 0 ||
            (uint64_t)hd->n_total > h->o.max_message_bytes)
            return fg_error(FG_EFORMAT, "codec %u, part %u of %u, %lld values: out of range",
                            hd->codec, hd->part, hd->nparts, (long long)hd->n_total);
        int64_t lo, hi;
        fg__hm_part_bounds(hd->n_total, (int)hd->nparts, (int)hd->part, &lo, &hi);
        size_t want = fg__hm_payload_bytes((fg_hivemind_compression)hd->codec, hi - lo);
        if (hd->payload_bytes != want)
            return fg_error(
                FG_EFORMAT, "part %u of %u of %lld values is %llu bytes, %zu expected (%s)",
                hd->part, hd->nparts, (long long)hd->n_total, (unsigned long long)hd->payload_bytes,
                want, fg_hivemind_compression_name((fg_hivemind_compression)hd->codec));
        if (!(hd->weight > 0) || !isfinite(hd->weight))
            return fg_error(FG_EFORMAT, "weight %g (expected > 0 and finite)", hd->weight);
    } else if (hd->kind == FG__HM_VIEW) {
        if (hd->nparts < 1 || hd->nparts > FG__HM_MAX_GROUP || hd->part != 0 ||
            hd->payload_bytes != (uint64_t)hd->nparts * sizeof(fg__hm_member))
            return fg_error(FG_EFORMAT, "a group view of %u members in %llu bytes (%zu each)",
                            hd->nparts, (unsigned long long)hd->payload_bytes,
                            sizeof(fg__hm_member));
        if (!(hd->weight > 0) || !isfinite(hd->weight))
            return fg_error(FG_EFORMAT, "weight %g (expected > 0 and finite)", hd->weight);
    }
    return FG_OK;
}

fg_status fg__hm_decode(const fg__hm_hdr *hd, const unsigned char *p, float *v, int64_t n) {
    fg_hivemind_compression c = (fg_hivemind_compression)hd->codec;
    if (fg__hm_payload_bytes(c, n) != hd->payload_bytes)
        return fg_error(FG_EFORMAT, "%llu bytes for %lld values",
                        (unsigned long long)hd->payload_bytes, (long long)n);
    if (c == FG_HIVEMIND_COMPRESSION_NONE) {
        memcpy(v, p, (size_t)n * 4);
    } else if (c == FG_HIVEMIND_COMPRESSION_FP16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
            v[i] = fg_f16_to_f32(x);
        }
    } else if (n > 0) {
        float lo, scale;
        memcpy(&lo, p, 4);
        memcpy(&scale, p + 4, 4);
        for (int64_t i = 0; i < n; i++) v[i] = lo + scale * (float)p[8 + i];
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return fg_error(FG_EFORMAT, "%s at element %lld of the part",
                            isnan(v[i]) ? "NaN" : "inf", (long long)i);
    return FG_OK;
}

void fg__hm_refuse(fg_hivemind *h, uint64_t from, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&h->mu);
    h->refused++;
    if (from) h->refused_from = from;
    snprintf(h->last_refusal, sizeof h->last_refusal, "peer %016llx: %s", (unsigned long long)from,
             why);
    pthread_mutex_unlock(&h->mu);
    fg_log(FG_LOG_WARN, "hivemind: refused from peer %016llx: %s", (unsigned long long)from, why);
}
#endif
