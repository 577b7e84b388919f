/* fulgur fit's Bagua flags (Lightning's BaguaStrategy(algorithm=, ...) with
 * Bagua's option names): parsed into o->ddp.bagua; a flag that belongs to
 * another algorithm, or any of them without --strategy bagua, is a usage
 * error naming both. --bagua-warmup-steps carries the prefix because
 * --warmup-steps is the learning-rate schedule's. */
#include <stdlib.h>
#include <string.h>

#include "cli_flags.h"
#include "fit.h"

int fit_bagua_args(fit_opts *o, cli_flag *flags, int n) {
    fg_bagua_opts *b = &o->ddp.bagua;
    if (fg_bagua_algorithm_parse(o->bagua_algorithm, &b->algorithm) != FG_OK ||
        fg_bagua_peer_selection_parse(o->peer_selection_mode, &b->peer_selection_mode) != FG_OK) {
        cli_error("%s", fg_last_error()); /* the table's choices caught these already */
        return FG_EXIT_USAGE;
    }
    fg_strategy_kind kind;
    bool bagua = plan_kind(o, &kind) && fg_strategy_takes(kind, 0) & FG_TAKES_BAGUA;
    static const struct {
        const char *flag;
        unsigned algos; /* bit per fg_bagua_algorithm; 0: every one */
    } k_own[] = {
        {"bagua-algorithm", 0},
        {"hierarchical", ~(1u << FG_BAGUA_ASYNC)},
        {"peer-selection-mode", 1u << FG_BAGUA_DECENTRALIZED},
        {"communication-interval",
         1u << FG_BAGUA_DECENTRALIZED | 1u << FG_BAGUA_LOW_PRECISION_DECENTRALIZED},
        {"bagua-warmup-steps", 1u << FG_BAGUA_QADAM | 1u << FG_BAGUA_ASYNC},
        {"sync-interval-ms", 1u << FG_BAGUA_ASYNC},
    };
    for (size_t i = 0; i < sizeof k_own / sizeof k_own[0]; i++) {
        if (!cli_flag_given(cli_flags_find(flags, n, k_own[i].flag))) continue;
        if (!bagua) {
            cli_error("--%s is for --strategy bagua; got --strategy %s", k_own[i].flag,
                      o->strategy);
            return FG_EXIT_USAGE;
        }
        if (k_own[i].algos && !(k_own[i].algos & (1u << b->algorithm))) {
            cli_error("--%s does not apply to --bagua-algorithm %s", k_own[i].flag,
                      o->bagua_algorithm);
            return FG_EXIT_USAGE;
        }
    }
    if (!bagua) return 0;
    if (o->ddp.comm_hook != FG_DDP_HOOK_NONE || o->ddp.comm_wrapper != FG_DDP_WRAPPER_NONE) {
        cli_error("--ddp-comm-hook and --ddp-comm-wrapper are ddp's; under --strategy bagua the "
                  "algorithm (--bagua-algorithm) is the communication");
        return FG_EXIT_USAGE;
    }
    b->hierarchical = !strcmp(o->hierarchical, "true")    ? 1
                      : !strcmp(o->hierarchical, "false") ? -1
                                                          : 0;
    b->communication_interval = o->communication_interval;
    b->sync_interval_ms = o->sync_interval_ms;
    /* -1 leaves Bagua's default; 0 means none, which for qadam the library refuses */
    b->warmup_steps = o->bagua_warmup_steps < 0 ? 0
                      : o->bagua_warmup_steps   ? o->bagua_warmup_steps
                                                : -1;
    if (b->algorithm == FG_BAGUA_QADAM && b->warmup_steps < 0) {
        cli_error("--bagua-warmup-steps 0: QAdam freezes the variance of its warm-up, so it "
                  "needs at least 1 step of it");
        return FG_EXIT_USAGE;
    }
    if (b->algorithm == FG_BAGUA_QADAM && strcmp(o->optimizer, "adamw")) {
        cli_error("--bagua-algorithm qadam is Adam with compressed momentum: it needs "
                  "--optimizer adamw; got --optimizer %s",
                  o->optimizer);
        return FG_EXIT_USAGE;
    }
    return 0;
}
