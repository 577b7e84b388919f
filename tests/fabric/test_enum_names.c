/* Every public enum with names: each value has a name of its own (never "?",
 * no two alike), which parses back to the value, in any case where the
 * header says case does not matter; every alias parses to its value; values
 * out of range name "?"; an unknown name, "" and NULL are FG_EINVAL (where
 * NULL is not a documented default) with a message naming the value given
 * and what is expected. The strategy table's rows and the precision table's
 * agree with the names and with what the other layers ask them. */
#include <ctype.h>
#include <string.h>

#include "fulgur/fabric.h"
#include "harness.h"

typedef const char *(*name_fn)(int);
typedef fg_status (*parse_fn)(const char *, int *);

/* The enum's parse, through an int. */
#define PARSER(fn, type)                                                                           \
    static fg_status fn##_i(const char *s, int *out) {                                             \
        type v;                                                                                    \
        fg_status st = fn(s, &v);                                                                  \
        if (st == FG_OK) *out = (int)v;                                                            \
        return st;                                                                                 \
    }
#define NAMER(fn, type)                                                                            \
    static const char *fn##_i(int v) { return fn((type)v); }

static fg_status strategy_parse(const char *s, fg_strategy_kind *out) {
    return fg_strategy_kind_parse(s, out, NULL, NULL);
}
PARSER(strategy_parse, fg_strategy_kind)
PARSER(fg_sharding_strategy_parse, fg_sharding_strategy)
PARSER(fg_offload_device_parse, fg_offload_device)
PARSER(fg_precision_parse, fg_precision_kind)
PARSER(fg_ddp_comm_hook_parse, fg_ddp_comm_hook)
PARSER(fg_ddp_comm_wrapper_parse, fg_ddp_comm_wrapper)
PARSER(fg_bagua_algorithm_parse, fg_bagua_algorithm)
PARSER(fg_bagua_peer_selection_parse, fg_bagua_peer_selection)
PARSER(fg_state_dict_type_parse, fg_state_dict_type)
PARSER(fg_dtype_parse, fg_dtype)
NAMER(fg_strategy_kind_name, fg_strategy_kind)
NAMER(fg_sharding_strategy_name, fg_sharding_strategy)
NAMER(fg_offload_device_name, fg_offload_device)
NAMER(fg_precision_kind_name, fg_precision_kind)
NAMER(fg_ddp_comm_hook_name, fg_ddp_comm_hook)
NAMER(fg_ddp_comm_wrapper_name, fg_ddp_comm_wrapper)
NAMER(fg_bagua_algorithm_name, fg_bagua_algorithm)
NAMER(fg_bagua_peer_selection_name, fg_bagua_peer_selection)
NAMER(fg_state_dict_type_name, fg_state_dict_type)
NAMER(fg_dtype_name, fg_dtype)
NAMER(fg_dtype_st_name, fg_dtype)
NAMER(fg_accelerator_name, fg_accelerator)
NAMER(fg_launcher_name, fg_launcher)
NAMER(fg_reduce_op_name, fg_reduce_op)
NAMER(fg_isa_name, fg_isa)

typedef struct enum_case {
    const char *what;
    name_fn name;
    parse_fn parse; /* NULL: names only */
    int lo, count;  /* the values lo..count-1 */
    bool null_ok;   /* NULL parses to a documented default */
    bool any_case;
} enum_case;

static void swap_case(const char *s, char *out, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        out[i] = (char)(islower((unsigned char)s[i]) ? toupper((unsigned char)s[i])
                                                     : tolower((unsigned char)s[i]));
    out[i] = '\0';
}

static void walk(const enum_case *c) {
    for (int v = c->lo; v < c->count; v++) {
        const char *n = c->name(v);
        CHECK_MSG(n && *n && strcmp(n, "?"), "%s %d: name \"%s\"", c->what, v, n ? n : "(null)");
        for (int w = c->lo; w < v; w++)
            CHECK_MSG(strcmp(n, c->name(w)), "%s %d and %d: both \"%s\"", c->what, w, v, n);
        if (!c->parse) continue;
        int back = -1;
        CHECK_MSG(c->parse(n, &back) == FG_OK && back == v, "%s \"%s\": parses to %d (%s)", c->what,
                  n, back, fg_last_error());
        if (c->any_case) {
            char sw[64];
            swap_case(n, sw, sizeof sw);
            back = -1;
            CHECK_MSG(c->parse(sw, &back) == FG_OK && back == v, "%s \"%s\": parses to %d (%s)",
                      c->what, sw, back, fg_last_error());
        }
    }
    CHECK_MSG(!strcmp(c->name(c->count), "?"), "%s %d: \"%s\", want \"?\"", c->what, c->count,
              c->name(c->count));
    CHECK_MSG(!strcmp(c->name(-1), "?"), "%s -1: \"%s\", want \"?\"", c->what, c->name(-1));
    if (!c->parse) return;
    int out = 12345;
    static const char *const bad[] = {"no_such_name", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_status st = c->parse(bad[i], &out);
        CHECK_MSG(st == FG_EINVAL, "%s \"%s\": %s", c->what, bad[i], fg_status_str(st));
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
        CHECK_MSG(strstr(fg_last_error(), quoted), "%s \"%s\": the message does not name it: %s",
                  c->what, bad[i], fg_last_error());
        CHECK_MSG(strstr(fg_last_error(), "expect"),
                  "%s \"%s\": the message does not say what is expected: %s", c->what, bad[i],
                  fg_last_error());
        CHECK_MSG(out == 12345, "%s \"%s\": out set on failure", c->what, bad[i]);
    }
    if (!c->null_ok) {
        fg_status st = c->parse(NULL, &out);
        CHECK_MSG(st == FG_EINVAL, "%s NULL: %s", c->what, fg_status_str(st));
        CHECK_MSG(out == 12345, "%s NULL: out set on failure", c->what);
    }
}

TEST(every_enum_round_trips_and_refuses_unknown_names) {
    const enum_case cases[] = {
        {"strategy", fg_strategy_kind_name_i, strategy_parse_i, 0, FG_STRATEGY_COUNT, false, true},
        {"sharding strategy", fg_sharding_strategy_name_i, fg_sharding_strategy_parse_i, 0,
         FG_SHARDING_COUNT, false, true},
        {"offload device", fg_offload_device_name_i, fg_offload_device_parse_i, 0, FG_OFFLOAD_COUNT,
         false, true},
        {"precision", fg_precision_kind_name_i, fg_precision_parse_i, 0, FG_PRECISION_COUNT, true,
         true},
        {"comm hook", fg_ddp_comm_hook_name_i, fg_ddp_comm_hook_parse_i, 0, FG_DDP_HOOK_COUNT,
         false, false},
        {"comm wrapper", fg_ddp_comm_wrapper_name_i, fg_ddp_comm_wrapper_parse_i, 0,
         FG_DDP_WRAPPER_COUNT, false, false},
        {"bagua algorithm", fg_bagua_algorithm_name_i, fg_bagua_algorithm_parse_i, 0,
         FG_BAGUA_ALGORITHM_COUNT, false, true},
        {"peer selection", fg_bagua_peer_selection_name_i, fg_bagua_peer_selection_parse_i, 0,
         FG_BAGUA_PEERS_COUNT, false, false},
        {"state dict type", fg_state_dict_type_name_i, fg_state_dict_type_parse_i, 0,
         FG_STATE_DICT_COUNT, false, true},
        {"dtype", fg_dtype_name_i, fg_dtype_parse_i, FG_F64, FG_DTYPE_COUNT, false, true},
        {"dtype (safetensors)", fg_dtype_st_name_i, fg_dtype_parse_i, FG_F64, FG_DTYPE_COUNT, false,
         true},
        {"accelerator", fg_accelerator_name_i, NULL, 0, FG_ACCELERATOR_GUARDED + 1, false, false},
        {"launcher", fg_launcher_name_i, NULL, 0, FG_LAUNCHER_THREADS + 1, false, false},
        {"reduce op", fg_reduce_op_name_i, NULL, 0, FG_REDUCE_OP_COUNT, false, false},
        {"isa", fg_isa_name_i, NULL, 0, FG_ISA_COUNT, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) walk(&cases[i]);
    /* fg_status_str: a distinct string per status, "?"-free */
    for (int s = 0; s < FG_STATUS_COUNT; s++) {
        CHECK(strcmp(fg_status_str((fg_status)s), "?"));
        for (int w = 0; w < s; w++)
            CHECK(strcmp(fg_status_str((fg_status)s), fg_status_str((fg_status)w)));
    }
}

TEST(aliases_parse_to_their_value) {
    /* every alias of the strategy table, in any case, with its offload */
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        const fg_strategy_info *r = fg_strategy_info_of((fg_strategy_kind)k);
        CHECK(r && !strcmp(r->name, fg_strategy_kind_name((fg_strategy_kind)k)));
        CHECK(r->naliases >= 0 && r->naliases <= FG_STRATEGY_ALIASES_MAX);
        for (int a = 0; a < r->naliases; a++) {
            fg_strategy_kind got = FG_STRATEGY_COUNT;
            fg_offload_device o = FG_OFFLOAD_COUNT, p = FG_OFFLOAD_COUNT;
            CHECK_OK(fg_strategy_kind_parse(r->aliases[a].name, &got, &o, &p));
            CHECK_MSG(got == (fg_strategy_kind)k, "%s -> %d", r->aliases[a].name, (int)got);
            CHECK(o == r->aliases[a].optimizer && p == r->aliases[a].params);
            /* the launch layer's parse and offload agree with the row */
            CHECK_OK(fg_launch_parse_strategy(r->aliases[a].name, 1, 1, &got));
            CHECK(got == (fg_strategy_kind)k);
            fg_launch_strategy_offload(r->aliases[a].name, &o, &p);
            CHECK(o == r->aliases[a].optimizer && p == r->aliases[a].params);
            CHECK(strstr(fg_strategy_names(), r->aliases[a].name));
        }
        CHECK(strstr(fg_strategy_names(), r->name));
    }
    static const struct {
        const char *name;
        fg_strategy_kind k;
    } seeds[] = {{"ddp_sharded", FG_STRATEGY_DEEPSPEED_STAGE_2},
                 {"DDP_SHARDED_SPAWN", FG_STRATEGY_DEEPSPEED_STAGE_2},
                 {"deepspeed", FG_STRATEGY_DEEPSPEED_STAGE_2},
                 {"ddp_notebook", FG_STRATEGY_DDP_FORK},
                 {"single_device", FG_STRATEGY_SINGLE}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        fg_strategy_kind got = FG_STRATEGY_COUNT;
        CHECK_OK(fg_strategy_kind_parse(seeds[i].name, &got, NULL, NULL));
        CHECK_MSG(got == seeds[i].k, "%s -> %d", seeds[i].name, (int)got);
    }
    /* precision aliases, and the default */
    for (int p = 0; p < FG_PRECISION_COUNT; p++) {
        const fg_precision_policy *pol = fg_precision_policy_of((fg_precision_kind)p);
        CHECK(pol && !strcmp(pol->name, fg_precision_kind_name((fg_precision_kind)p)));
        CHECK(pol->built == (strstr(fg_precision_available(), pol->name) != NULL));
        if (!pol->alias) continue;
        fg_precision_kind got = FG_PRECISION_COUNT;
        CHECK_OK(fg_precision_parse(pol->alias, &got));
        CHECK(got == (fg_precision_kind)p);
    }
    fg_precision_kind pk = FG_PRECISION_COUNT;
    CHECK_OK(fg_precision_parse(NULL, &pk));
    CHECK(pk == FG_PRECISION_32_TRUE);
    /* the wrappers' torch names, the hooks' "none" */
    fg_ddp_comm_wrapper w = FG_DDP_WRAPPER_COUNT;
    CHECK_OK(fg_ddp_comm_wrapper_parse("fp16_compress_wrapper", &w));
    CHECK(w == FG_DDP_WRAPPER_FP16);
    CHECK_OK(fg_ddp_comm_wrapper_parse("bf16_compress_wrapper", &w));
    CHECK(w == FG_DDP_WRAPPER_BF16);
    fg_ddp_comm_hook h = FG_DDP_HOOK_COUNT;
    CHECK_OK(fg_ddp_comm_hook_parse("none", &h));
    CHECK(h == FG_DDP_HOOK_NONE);
    /* accelerators: auto and NULL are the CPU here, gpu is known but not built */
    fg_accelerator a = FG_ACCELERATOR_GPU;
    CHECK_OK(fg_launch_parse_accelerator("AUTO", &a));
    CHECK(a == FG_ACCELERATOR_CPU);
    CHECK_STATUS(fg_launch_parse_accelerator("cuda", &a), FG_EUNSUPPORTED);
    CHECK_OK(fg_launch_parse_accelerator(fg_accelerator_name(FG_ACCELERATOR_CPU), &a));
    CHECK(a == FG_ACCELERATOR_CPU);
    CHECK_STATUS(fg_launch_parse_accelerator("no_such_name", &a), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "accelerator=\"no_such_name\": expected one of");
    CHECK(!strcmp(fg_accelerator_name(FG_ACCELERATOR_GPU), "gpu"));
    CHECK_OK(fg_launch_parse_accelerator(fg_accelerator_name(FG_ACCELERATOR_GUARDED), &a));
    CHECK(a == FG_ACCELERATOR_GUARDED);
}

/* What the rows say agrees with the kinds' predicates and with themselves. */
TEST(strategy_rows_agree) {
    for (int k = 0; k < FG_STRATEGY_COUNT; k++) {
        fg_strategy_kind kind = (fg_strategy_kind)k;
        const fg_strategy_info *r = fg_strategy_info_of(kind);
        CHECK(fg_strategy_kind_is_ddp(kind) == (r->ranks == FG_RANKS_PER_DEVICE));
        CHECK(fg_strategy_kind_is_sharded(kind) == (r->shards != 0));
        /* replicas on threads are started as threads, a forking kind forks */
        if (r->replica_threads) CHECK(r->launcher == FG_LAUNCHER_THREADS);
        if (r->ranks == FG_RANKS_PER_DEVICE)
            CHECK(r->launcher == FG_LAUNCHER_REEXEC || r->launcher == FG_LAUNCHER_FORK);
        /* a kind that shards gradients shards the state; parameters, both */
        if (r->shards & FG_SHARDS_GRADS) CHECK(r->shards & FG_SHARDS_OPTIM_STATE);
        if (r->shards & FG_SHARDS_PARAMS) CHECK(r->shards & FG_SHARDS_GRADS);
        CHECK(r->summary && *r->summary);
    }
    CHECK(fg_strategy_info_of(FG_STRATEGY_COUNT) == NULL);
    CHECK(fg_strategy_info_of((fg_strategy_kind)-1) == NULL);
    /* fsdp by its sharding strategy */
    CHECK(fg_strategy_algorithm(FG_STRATEGY_FSDP, FG_SHARDING_NO_SHARD) == FG_STRATEGY_DDP);
    CHECK(fg_strategy_algorithm(FG_STRATEGY_FSDP, FG_SHARDING_SHARD_GRAD_OP) ==
          FG_STRATEGY_DEEPSPEED_STAGE_2);
    CHECK(fg_strategy_algorithm(FG_STRATEGY_FSDP, FG_SHARDING_HYBRID_SHARD) ==
          FG_STRATEGY_DEEPSPEED_STAGE_3);
    CHECK(fg_strategy_shards(FG_STRATEGY_FSDP, FG_SHARDING_NO_SHARD) == 0);
    CHECK(fg_strategy_takes(FG_STRATEGY_FSDP, FG_SHARDING_NO_SHARD) & FG_TAKES_COMM_HOOK);
    CHECK(!(fg_strategy_takes(FG_STRATEGY_FSDP, FG_SHARDING_FULL_SHARD) & FG_TAKES_COMM_HOOK));
    CHECK(fg_strategy_takes(FG_STRATEGY_FSDP, FG_SHARDING_FULL_SHARD) & FG_TAKES_WRAP_POLICY);
    CHECK(!(fg_strategy_takes(FG_STRATEGY_FSDP, FG_SHARDING_SHARD_GRAD_OP) & FG_TAKES_WRAP_POLICY));
    CHECK(!strcmp(fg_strategy_kinds_taking(FG_TAKES_COMM_HOOK), "ddp, ddp_spawn, ddp_fork"));
    CHECK(!strcmp(fg_strategy_kinds_taking(FG_TAKES_DETERMINISTIC),
                  "single, ddp, ddp_spawn, ddp_fork"));
    CHECK(!strcmp(fg_strategy_kinds_taking(FG_TAKES_HOROVOD), "horovod"));
}
