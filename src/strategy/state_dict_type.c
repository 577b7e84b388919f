/* state_dict_type's names (FSDPStrategy's argument): what a checkpoint save
 * writes. The fabric acts on it; this layer only names it. */
#include <strings.h>

#include "strategy_impl.h"

static const char *const k_names[FG_STATE_DICT_COUNT] = {"auto", "full", "sharded"};

const char *fg_state_dict_type_name(fg_state_dict_type t) {
    return (unsigned)t < FG_STATE_DICT_COUNT ? k_names[t] : "?";
}

fg_status fg_state_dict_type_parse(const char *name, fg_state_dict_type *out) {
    for (int i = 0; name && i < FG_STATE_DICT_COUNT; i++)
        if (!strcasecmp(name, k_names[i])) {
            *out = (fg_state_dict_type)i;
            return FG_OK;
        }
    return fg_error(FG_EINVAL, "state_dict_type=\"%s\": expected auto, full or sharded",
                    name ? name : "(null)");
}
