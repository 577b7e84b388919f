/* Which modules of a tree run their forward through fg_checkpoint
 * (fg_module.checkpoint, read by fg_module_forward). */
#include <string.h>

#include "nn_impl.h"

static int mark(fg_module *m, const char *type, bool on) {
    int n = 0;
    if (!strcmp(m->type, type)) {
        m->checkpoint = on;
        n++;
    }
    for (int i = 0; i < m->nchild; i++) n += mark(m->child[i], type, on);
    return n;
}

fg_status fg_module_set_activation_checkpointing(fg_module *m, const char *type, bool on,
                                                 int *count) {
    if (count) *count = 0;
    if (!m) return fg_error(FG_EINVAL, "activation checkpointing: NULL module");
    const char *t = type ? type : "Block";
    int n = mark(m, t, on);
    if (count) *count = n;
    if (!n)
        return fg_error(FG_EINVAL,
                        "activation checkpointing: the model (%s) has no module of type \"%s\" "
                        "to checkpoint%s",
                        m->type, t, type ? "" : " (the blocks of a GPT)");
    return FG_OK;
}
