/* fulgur fit's Hivemind flags (Lightning's HivemindStrategy arguments;
 * their rows are in fit_args.c's table): their parsing into
 * o->ddp.hivemind; any of them
 * without --strategy hivemind is a usage error, and so is --strategy
 * hivemind without --target-batch-size, --run-id or a secret. A hivemind
 * run logs the swarm's lines (this peer's address, each epoch, each
 * refusal) to stderr. */
#include <stdio.h>
#include <string.h>

#include "cli_flags.h"
#include "fit.h"

int fit_hivemind_args(fit_opts *o, cli_flag *flags, int n) {
    fit_hivemind *h = &o->hivemind;
    static const char *const own[] = {"target-batch-size",
                                      "initial-peers",
                                      "run-id",
                                      "run-secret",
                                      "run-secret-file",
                                      "matchmaking-time",
                                      "averaging-timeout",
                                      "grad-compression",
                                      "hivemind-host",
                                      "dht-port",
                                      "min-peers",
                                      "offload-optimizer",
                                      "delay-optimizer-step",
                                      "delay-grad-averaging",
                                      "delay-state-averaging",
                                      "reuse-grad-buffers"};
    fg_strategy_kind kind;
    bool hm = plan_kind(o, &kind) && kind == FG_STRATEGY_HIVEMIND;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!hm && cli_flag_given(cli_flags_find(flags, n, own[i]))) {
            cli_error("--%s is for --strategy hivemind; got --strategy %s", own[i], o->strategy);
            return FG_EXIT_USAGE;
        }
    if (!hm) return 0;
    if (h->run_secret_file) {
        FILE *f = fopen(h->run_secret_file, "r");
        if (!f || !fgets(h->secret_buf, sizeof h->secret_buf, f)) {
            cli_error("--run-secret-file %s: cannot read a line from it", h->run_secret_file);
            if (f) fclose(f);
            return FG_EXIT_USAGE;
        }
        fclose(f);
        h->secret_buf[strcspn(h->secret_buf, "\r\n")] = 0;
        h->run_secret = h->secret_buf;
    }
    if (h->target_batch_size <= 0 || !h->run_id || !*h->run_id || !h->run_secret ||
        !*h->run_secret) {
        cli_error("--strategy hivemind needs --target-batch-size N (> 0), --run-id ID and "
                  "--run-secret S (or --run-secret-file), the same on every peer");
        return FG_EXIT_USAGE;
    }
    if (h->matchmaking_time < 0 || h->averaging_timeout <= 0) {
        cli_error("--matchmaking-time %g, --averaging-timeout %g: expected >= 0 and > 0",
                  h->matchmaking_time, h->averaging_timeout);
        return FG_EXIT_USAGE;
    }
    fg_hivemind_strategy_opts *d = &o->ddp.hivemind;
    *d = (fg_hivemind_strategy_opts){.target_batch_size = h->target_batch_size,
                                     .run_id = h->run_id,
                                     .run_secret = h->run_secret,
                                     .batch_size = o->batch_size,
                                     .initial_peers = h->initial_peers,
                                     .host = h->host,
                                     .matchmaking_time = h->matchmaking_time,
                                     .averaging_timeout = h->averaging_timeout,
                                     .dht_port = (int)h->dht_port,
                                     .min_peers = (int)h->min_peers,
                                     .offload_optimizer = h->offload_optimizer,
                                     .delay_optimizer_step = h->delay_optimizer_step,
                                     .delay_grad_averaging = h->delay_grad_averaging,
                                     .delay_state_averaging = h->delay_state_averaging,
                                     .reuse_grad_buffers = h->reuse_grad_buffers};
    if (fg_hivemind_compression_parse(h->grad_compression, &d->grad_compression) != FG_OK) {
        cli_error("%s", fg_last_error());
        return FG_EXIT_USAGE;
    }
    /* the swarm's lines: this peer's address (what others pass), each epoch, refusals */
    fg_set_log(fg_log_file, stderr, FG_LOG_INFO);
    return 0;
}
