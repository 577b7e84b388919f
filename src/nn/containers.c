/* ModuleList and ModuleDict: containers without a forward of their own
 * (torch.nn.ModuleList, torch.nn.ModuleDict), whose children's parameters
 * are named "<index>.<name>" and "<key>.<name>" as PyTorch's. Running them
 * is the owner's forward: fg_module_child / fg_module_child_at reach the
 * children. */
#include <stdio.h>

#include "nn_impl.h"

static const char kind_list[] = "ModuleList", kind_dict[] = "ModuleDict";

fg_module *fg_module_list_new(void) {
    fg_module *m = fg_module_new("ModuleList", NULL, NULL, NULL);
    if (m) m->kind = kind_list;
    return m;
}

fg_status fg_module_list_append(fg_module *list, fg_module *child) {
    if (!list || list->kind != kind_list) {
        fg_module_free(child);
        return fg_error(FG_EINVAL, "module_list_append: %s is not a ModuleList",
                        list ? list->type : "(null)");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", list->nchild);
    return fg_module_add_child(list, name, child);
}

fg_module *fg_module_dict_new(void) {
    fg_module *m = fg_module_new("ModuleDict", NULL, NULL, NULL);
    if (m) m->kind = kind_dict;
    return m;
}

fg_status fg_module_dict_set(fg_module *dict, const char *key, fg_module *child) {
    if (!dict || dict->kind != kind_dict) {
        fg_module_free(child);
        return fg_error(FG_EINVAL, "module_dict_set: %s is not a ModuleDict",
                        dict ? dict->type : "(null)");
    }
    return fg_module_add_child(dict, key, child);
}
