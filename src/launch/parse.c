/* Parsing of what the user types: accelerator, devices (every form of
 * Lightning's devices table), strategy names and precision settings. Each
 * error names the value as given and says what is allowed; nothing is
 * guessed. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fulgur/device.h"
#include "launch_impl.h"

/* ---------------------------------------------------------- accelerator */

fg_status fg_launch_parse_accelerator(const char *s, fg_accelerator *out) {
    if (!out) return fg_error(FG_EINVAL, "accelerator: NULL output");
    char why[256];
    if (!s || !strcasecmp(s, "auto")) { /* a GPU when one answers, else the CPU */
        *out =
            fg_device_count(FG_CUDA, why, sizeof why) > 0 ? FG_ACCELERATOR_GPU : FG_ACCELERATOR_CPU;
        return FG_OK;
    }
    if (!strcasecmp(s, "cpu")) {
        *out = FG_ACCELERATOR_CPU;
        return FG_OK;
    }
    if (!strcasecmp(s, "guarded")) {
        *out = FG_ACCELERATOR_GUARDED;
        return FG_OK;
    }
    if (!strcasecmp(s, "gpu") || !strcasecmp(s, "cuda")) {
        if (fg_device_count(FG_CUDA, why, sizeof why) > 0) {
            *out = FG_ACCELERATOR_GPU;
            return FG_OK;
        }
        return fg_error(FG_EUNSUPPORTED,
                        "accelerator=\"%s\": %s; use \"cpu\" (or \"auto\", which takes a GPU "
                        "when one answers), or \"guarded\" to test that code is device-clean",
                        s, why);
    }
    static const char *const k_other[] = {"tpu", "ipu", "hpu", "mps", "xla", NULL};
    for (int i = 0; k_other[i]; i++)
        if (!strcasecmp(s, k_other[i]))
            return fg_error(FG_EUNSUPPORTED,
                            "accelerator=\"%s\": fulgur does not support it; use \"cpu\" or "
                            "\"auto\"",
                            s);
    return fg_error(FG_EINVAL, "accelerator=\"%s\": expected one of auto, cpu, gpu, cuda, guarded",
                    s);
}

const char *fg_accelerator_name(fg_accelerator a) {
    return a == FG_ACCELERATOR_GPU       ? "gpu"
           : a == FG_ACCELERATOR_CPU     ? "cpu"
           : a == FG_ACCELERATOR_GUARDED ? "guarded"
                                         : "?";
}

/* -------------------------------------------------------------- devices */

static const char *const k_devices_forms =
    "expected a count like \"2\", \"-1\" for all, or ids like \"1, 3\" / \"[1, 3]\"";

/* A count past what the machine has. `what` is "devices here", or "CPU
 * devices here (cores)" from the plan, which also gets the way to run more
 * ranks than cores. */
/* `what` in the singular ("CPU device here (cores)"). */
static const char *singular(const char *what, char *buf, size_t cap) {
    const char *p = strstr(what, "devices");
    if (!p) return what;
    snprintf(buf, cap, "%.*sdevice%s", (int)(p - what), what, p + 7);
    return buf;
}

static FG_MUST_USE fg_status count_error(const char *given, long k, int available,
                                         const char *what) {
    char hint[96] = "", one[96];
    if (strstr(what, "(cores)"))
        snprintf(hint, sizeof hint, " (FULGUR_CPU_DEVICES=%ld runs more ranks than cores)", k);
    if (available == 1)
        return fg_error(FG_EINVAL, "devices=%s: only 1 %s; use 1 or -1%s", given,
                        singular(what, one, sizeof one), hint);
    return fg_error(FG_EINVAL, "devices=%s: only %d %s; use 1..%d or -1%s", given, available, what,
                    available, hint);
}

static FG_MUST_USE fg_status devices_count(long k, const char *given, int available,
                                           const char *what, fg_devices *out) {
    memset(out, 0, sizeof *out);
    out->available = available;
    if (k == -1) {
        out->all = true;
        out->count = available;
    } else if (k == 0) {
        return fg_error(FG_EINVAL,
                        "devices=%s: at least one device is needed; use 1..%d or -1 "
                        "(all %d)",
                        given, available, available);
    } else if (k < 0) {
        return fg_error(FG_EINVAL, "devices=%s: a count must be positive, or -1 for all; %s", given,
                        k_devices_forms);
    } else if (k > available) {
        return count_error(given, k, available, what);
    } else {
        out->count = (int)k;
    }
    for (int i = 0; i < out->count; i++) out->ids[i] = i;
    return FG_OK;
}

static FG_MUST_USE fg_status devices_list(const long *ids, int n, const char *given, int available,
                                          const char *what, fg_devices *out) {
    memset(out, 0, sizeof *out);
    out->available = available;
    out->listed = true;
    if (n < 1)
        return fg_error(FG_EINVAL, "devices=%s: no device given; %s", given, k_devices_forms);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= available) {
            char one[96];
            if (available == 1)
                return fg_error(FG_EINVAL,
                                "devices=%s: device %ld does not exist; the only one "
                                "is 0 (1 %s)",
                                given, ids[i], singular(what, one, sizeof one));
            return fg_error(FG_EINVAL,
                            "devices=%s: device %ld does not exist; ids go 0..%d (%d %s)", given,
                            ids[i], available - 1, available, what);
        }
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return fg_error(FG_EINVAL, "devices=%s: device %ld is listed twice", given, ids[i]);
        out->ids[i] = (int)ids[i];
    }
    out->count = n;
    return FG_OK;
}

static FG_MUST_USE fg_status check_available(int available) {
    if (available < 1 || available > FG_DEVICES_MAX)
        return fg_error(FG_EINVAL, "devices: %d available devices: expected 1..%d", available,
                        FG_DEVICES_MAX);
    return FG_OK;
}

/* Reads an optional '-' and digits at *p; false (and *p unmoved) if none. */
static bool read_int(const char **p, long *out) {
    const char *s = *p;
    bool neg = *s == '-';
    if (neg) s++;
    if (!isdigit((unsigned char)*s)) return false;
    long v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        if (v > 100000000L) return false; /* far past any machine; no overflow */
        v = v * 10 + (*s - '0');
    }
    *out = neg ? -v : v;
    *p = s;
    return true;
}

static const char *skip_space(const char *p) {
    while (isspace((unsigned char)*p)) p++;
    return p;
}

/* The parser behind fg_launch_parse_devices, with the words for "devices
 * here" (the plan says "CPU devices here (cores)"). */
fg_status fg__launch_parse_devices(const char *s, int available, const char *what,
                                   fg_devices *out) {
    FG_TRY(check_available(available));
    if (!out) return fg_error(FG_EINVAL, "devices: NULL output");
    char given[96];
    if (!s) s = "auto";
    snprintf(given, sizeof given, "\"%.90s\"", s);
    const char *p = skip_space(s);
    if (!*p) return fg_error(FG_EINVAL, "devices=\"%s\": no device given; %s", s, k_devices_forms);
    if (!strncasecmp(p, "auto", 4) && !*skip_space(p + 4))
        return devices_count(1, given, available, what, out);
    bool bracket = *p == '[';
    bool list = bracket || strchr(p, ',') != NULL;
    if (!list) {
        long k;
        if (!read_int(&p, &k) || *skip_space(p))
            return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, k_devices_forms);
        return devices_count(k, given, available, what, out);
    }
    if (bracket) p++;
    static _Thread_local long ids[FG_DEVICES_MAX];
    int n = 0;
    for (;;) {
        p = skip_space(p);
        if (*p == ']' || !*p) break; /* "[]", "0," and "[0,]": the list ends */
        long v;
        if (!read_int(&p, &v)) {
            if (n == 0 && !p[strspn(p, ", ]")]) /* "," or "[ , ]": nothing listed */
                return devices_list(ids, 0, given, available, what, out);
            return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, k_devices_forms);
        }
        if (v < 0)
            return fg_error(FG_EINVAL,
                            "devices=\"%s\": device %ld: ids are 0 or more (-1 means all "
                            "only on its own)",
                            s, v);
        if (n == FG_DEVICES_MAX)
            return fg_error(FG_EINVAL, "devices=\"%s\": more than %d ids", s, FG_DEVICES_MAX);
        ids[n++] = v;
        p = skip_space(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']' || !*p) break;
        return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, k_devices_forms);
    }
    if (bracket) {
        if (*p != ']')
            return fg_error(FG_EINVAL, "devices=\"%s\": missing \"]\"; %s", s, k_devices_forms);
        p++;
    } else if (*p == ']') {
        return fg_error(FG_EINVAL, "devices=\"%s\": \"]\" without \"[\"; %s", s, k_devices_forms);
    }
    if (*skip_space(p)) return fg_error(FG_EINVAL, "devices=\"%s\": %s", s, k_devices_forms);
    return devices_list(ids, n, given, available, what, out);
}

fg_status fg_launch_parse_devices(const char *s, int available, fg_devices *out) {
    return fg__launch_parse_devices(s, available, "devices here", out);
}

static FG_MUST_USE fg_status devices_count_int(int k, int available, const char *what,
                                               fg_devices *out) {
    FG_TRY(check_available(available));
    if (!out) return fg_error(FG_EINVAL, "devices: NULL output");
    char given[32];
    snprintf(given, sizeof given, "%d", k);
    return devices_count(k, given, available, what, out);
}

fg_status fg_launch_devices_count(int k, int available, fg_devices *out) {
    return devices_count_int(k, available, "devices here", out);
}

fg_status fg_launch_devices_list(const int *ids, int n, int available, fg_devices *out) {
    FG_TRY(check_available(available));
    if (!out || (!ids && n > 0)) return fg_error(FG_EINVAL, "devices: NULL list or output");
    if (n > FG_DEVICES_MAX)
        return fg_error(FG_EINVAL, "devices: %d ids, at most %d", n, FG_DEVICES_MAX);
    static _Thread_local long l[FG_DEVICES_MAX];
    char given[96];
    size_t len = (size_t)snprintf(given, sizeof given, "[");
    for (int i = 0; i < n; i++) {
        l[i] = ids[i];
        if (len < sizeof given)
            len += (size_t)snprintf(given + len, sizeof given - len, "%s%d", i ? ", " : "", ids[i]);
    }
    if (len < sizeof given) snprintf(given + len, sizeof given - len, "]");
    return devices_list(l, n, given, available, "devices here", out);
}

char *fg_devices_format(const fg_devices *d, char *buf, size_t cap) {
    if (!buf || !cap) return buf;
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; d && i < d->count && len < cap; i++) {
        if (len + 16 >= cap && i + 1 < d->count) {
            snprintf(buf + len, cap - len, "...");
            len = cap;
            break;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", d->ids[i]);
    }
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* ------------------------------------------------------------- strategy */

/* Names fulgur builds under another spelling: fsdp's sharding strategy is
 * an option of "fsdp", as in Lightning's FSDPStrategy. Every name that is a
 * kind is in the strategy table (kinds.c). */
static const struct {
    const char *name, *use;
} k_spelled[] = {
    {"fsdp_shard_grad_op", "strategy \"fsdp\" with sharding_strategy SHARD_GRAD_OP"},
    {"fsdp_no_shard", "strategy \"fsdp\" with sharding_strategy NO_SHARD"},
    {"fsdp_full_shard", "strategy \"fsdp\" (its default sharding_strategy FULL_SHARD)"},
    {"fsdp_hybrid_shard", "strategy \"fsdp\" with sharding_strategy HYBRID_SHARD"},
    {"hybrid", "strategy \"fsdp\" with sharding_strategy HYBRID_SHARD (sharded in a node, "
               "replicated across), or \"ddp2\" (dp in a node, ddp across)"},
};

fg_status fg_launch_parse_strategy(const char *s, int ndevices, int num_nodes,
                                   fg_strategy_kind *out) {
    if (!out) return fg_error(FG_EINVAL, "strategy: NULL output");
    if (ndevices < 1) ndevices = 1;
    if (num_nodes < 1) num_nodes = 1;
    if (!s || !strcasecmp(s, "auto")) {
        *out = ndevices * (long)num_nodes > 1 ? FG_STRATEGY_DDP : FG_STRATEGY_SINGLE;
        return FG_OK;
    }
    for (size_t i = 0; i < sizeof k_spelled / sizeof k_spelled[0]; i++)
        if (!strcasecmp(s, k_spelled[i].name))
            return fg_error(FG_EINVAL, "strategy=\"%s\": fulgur spells it %s", s, k_spelled[i].use);
    fg_strategy_kind st;
    FG_TRY(fg_strategy_kind_parse(s, &st, NULL, NULL));
    const fg_strategy_info *row = fg_strategy_info_of(st);
    if (row->ranks == FG_RANKS_ONE_PROCESS && !row->replica_threads && ndevices > 1)
        return fg_error(FG_EINVAL,
                        "strategy=\"%s\" runs on one device, but devices gives %d; "
                        "use ddp (or dp) for several",
                        s, ndevices);
    if (row->ranks == FG_RANKS_ONE_PROCESS && num_nodes > 1)
        return fg_error(FG_EINVAL,
                        "strategy=\"%s\" runs in one process, but num_nodes=%d; use "
                        "ddp across nodes",
                        s, num_nodes);
    *out = st;
    return FG_OK;
}

void fg_launch_strategy_offload(const char *s, fg_offload_device *optimizer,
                                fg_offload_device *params) {
    fg_offload_device o = FG_OFFLOAD_NONE, p = FG_OFFLOAD_NONE;
    if (s && fg_strategy_kind_parse(s, NULL, &o, &p) != FG_OK) {
        fg_clear_error();
        o = p = FG_OFFLOAD_NONE;
    }
    if (optimizer) *optimizer = o;
    if (params) *params = p;
}

/* ------------------------------------------------------------ precision */

fg_status fg_launch_parse_precision(const char *s, fg_precision_kind *out) {
    if (!out) return fg_error(FG_EINVAL, "precision: NULL output");
    fg_precision_kind k;
    FG_TRY(fg_precision_parse(s, &k));
    if (!fg_precision_policy_of(k)->built)
        return fg_error(FG_EUNSUPPORTED,
                        "precision=\"%s\": not built yet in this fulgur; available: %s", s,
                        fg_precision_available());
    *out = k;
    return FG_OK;
}
