/* The callback and logger objects: a copied table of hooks, the user data
 * they get, and for callbacks a state key and a kind (the built-in ones are
 * made through fg__callback_make by their own files). */
#include <string.h>

#include "trainer_impl.h"

fg_callback *fg__callback_make(const fg_callback_ops *ops, void *ud, fg__cb_kind kind,
                               const char *state_key) {
    fg_callback *cb = fg_calloc(1, sizeof *cb);
    char *key = fg_strdup(state_key);
    if (!cb || !key) {
        fg_free(cb);
        fg_free(key);
        if (ops->free) ops->free(ud);
        return NULL;
    }
    cb->ops = *ops;
    cb->ud = ud;
    cb->kind = kind;
    cb->state_key = key;
    return cb;
}

fg_callback *fg_callback_new(const fg_callback_ops *ops, void *ud) {
    if (!ops) {
        fg_error(FG_EINVAL, "fg_callback_new: NULL ops");
        return NULL;
    }
    if (ops->name && !ops->name[0]) {
        if (ops->free) ops->free(ud);
        fg_error(FG_EINVAL, "fg_callback_new: an empty name (NULL means \"Callback\")");
        return NULL;
    }
    return fg__callback_make(ops, ud, FG__CB_USER, ops->name ? ops->name : "Callback");
}

void fg_callback_free(fg_callback *cb) {
    if (!cb) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (cb->ops.free) cb->ops.free(cb->ud);
    fg_free(cb->state_key);
    fg_free(cb);
    fg_error_restore(&kept);
}

const char *fg_callback_state_key(const fg_callback *cb) { return cb ? cb->state_key : NULL; }

fg_logger *fg_logger_new(const fg_logger_ops *ops, void *ud) {
    if (!ops) {
        fg_error(FG_EINVAL, "fg_logger_new: NULL ops");
        return NULL;
    }
    fg_logger *lg = fg_calloc(1, sizeof *lg);
    if (!lg) {
        if (ops->free) ops->free(ud);
        return NULL;
    }
    lg->ops = *ops;
    lg->ud = ud;
    return lg;
}

void fg_logger_free(fg_logger *lg) {
    if (!lg) return;
    fg_error_kept kept; /* a _free never changes the caller's error (core.h) */
    fg_error_keep(&kept);
    if (lg->ops.free) lg->ops.free(lg->ud);
    fg_free(lg);
    fg_error_restore(&kept);
}
