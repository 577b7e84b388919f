/* netdelay: a fixed one-way delay for the test hosts' links on a kernel
 * without sch_netem (tests/hosts/shape.sh). An iptables rule sends the
 * packets that enter a host to NFQUEUE queue Q; this program, run inside
 * that host's network namespace, reads each packet's id (the metadata only,
 * never the payload) through Debian's libnetfilter-queue, holds it, and
 * accepts it DELAY_MS after it arrived. The delay is the same for every
 * packet, so the held packets leave in the order they came: one batch
 * verdict accepts every packet that is due at once.
 *
 *   netdelay -q Q -d DELAY_MS
 *
 * It prints "netdelay: queue Q, DELAY_MS ms" on stdout once the queue is
 * bound (the caller waits for that line before it adds the rule) and runs
 * until SIGTERM or SIGINT. Errors go to stderr with exit status 1. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* packets held at once: 100 Mbit/s of 1500-byte packets for 40 ms is ~340 */
#define RING 65536

typedef struct {
    uint32_t id[RING];
    int64_t due[RING];
    size_t head, n;
    int64_t delay_ns;
    size_t dropped; /* packets the ring had no room for (accepted at once) */
} held;

static volatile sig_atomic_t g_stop;
static void on_signal(int s) {
    (void)s;
    g_stop = 1;
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *ud) {
    (void)msg;
    held *h = ud;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (h->n == RING) { /* never seen at these rates: let it through undelayed */
        h->dropped++;
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL) < 0 ? -1 : 0;
    }
    size_t k = (h->head + h->n) % RING;
    h->id[k] = id;
    h->due[k] = now_ns() + h->delay_ns;
    h->n++;
    return 0;
}

/* accepts every held packet that is due, in one verdict */
static int release(struct nfq_q_handle *qh, held *h) {
    int64_t t = now_ns();
    size_t k = 0;
    while (k < h->n && h->due[(h->head + k) % RING] <= t) k++;
    if (!k) return 0;
    uint32_t last = h->id[(h->head + k - 1) % RING];
    h->head = (h->head + k) % RING;
    h->n -= k;
    return nfq_set_verdict_batch(qh, last, NF_ACCEPT);
}

int main(int argc, char **argv) {
    int queue = -1;
    double delay_ms = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-q")) queue = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-d")) delay_ms = atof(argv[i + 1]);
    }
    if (queue < 0 || queue > 65535 || delay_ms < 0 || argc != 5) {
        fprintf(stderr, "usage: netdelay -q QUEUE(0-65535) -d DELAY_MS(>= 0)\n");
        return 1;
    }
    static held h;
    h.delay_ns = (int64_t)(delay_ms * 1e6);
    struct nfq_handle *nh = nfq_open();
    if (!nh) {
        fprintf(stderr, "netdelay: nfq_open: %s (needs root and nfnetlink_queue)\n",
                strerror(errno));
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(nh, (uint16_t)queue, on_packet, &h);
    if (!qh) {
        fprintf(stderr, "netdelay: cannot bind queue %d: %s (another netdelay on it?)\n", queue,
                strerror(errno));
        nfq_close(nh);
        return 1;
    }
    /* the metadata only; a GSO packet is cut into its segments by the kernel
     * (no NFQA_CFG_F_GSO), so every packet on the wire is held alike */
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(qh, RING) < 0) {
        fprintf(stderr, "netdelay: configuring queue %d: %s\n", queue, strerror(errno));
        nfq_destroy_queue(qh);
        nfq_close(nh);
        return 1;
    }
    int fd = nfq_fd(nh);
    nfnl_rcvbufsiz(nfq_nfnlh(nh), 16u << 20);
    int one = 1; /* an overrun loses notices, not the socket */
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("netdelay: queue %d, %g ms\n", queue, delay_ms);
    fflush(stdout);
    static char buf[1 << 16];
    int rc = 0;
    while (!g_stop) {
        struct timespec to = {1, 0}, *top = NULL;
        if (h.n) {
            int64_t d = h.due[h.head] - now_ns();
            if (d < 0) d = 0;
            to.tv_sec = d / 1000000000;
            to.tv_nsec = d % 1000000000;
            top = &to;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = ppoll(&p, 1, top, NULL);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "netdelay: poll: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        if (r > 0) {
            for (;;) {
                ssize_t len = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (len < 0) {
                    if (errno == EAGAIN || errno == EINTR || errno == ENOBUFS) break;
                    fprintf(stderr, "netdelay: recv: %s\n", strerror(errno));
                    rc = 1;
                    break;
                }
                nfq_handle_packet(nh, buf, (int)len);
            }
            if (rc) break;
        }
        if (release(qh, &h) < 0) {
            fprintf(stderr, "netdelay: verdict: %s\n", strerror(errno));
            rc = 1;
            break;
        }
    }
    if (h.dropped)
        fprintf(stderr, "netdelay: %zu packets passed undelayed (ring full)\n", h.dropped);
    nfq_destroy_queue(qh);
    nfq_close(nh);
    return rc;
}
