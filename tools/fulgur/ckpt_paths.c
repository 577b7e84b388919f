/* Checkpoint file names of the fulgur tool and their resolution (see
 * ckpt_paths.h). The "last" link is only ever read through fg_st_get_last, so
 * a reader sees the target of one complete save. */
#include "ckpt_paths.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

void ckpt_step_name(int64_t step, bool sharded, char *out, size_t cap) {
    snprintf(out, cap, "step-%08" PRId64 "%s", step, sharded ? "" : ".safetensors");
}

void ckpt_step_path(const char *dir, int64_t step, bool sharded, char *out, size_t cap) {
    char name[64];
    ckpt_step_name(step, sharded, name, sizeof name);
    snprintf(out, cap, "%s/%s", dir, name);
}

int64_t ckpt_step_of(const char *name) {
    long long st;
    int used = 0;
    if (sscanf(name, "step-%lld%n", &st, &used) != 1 || st < 0 || name[5] < '0' || name[5] > '9')
        return -1;
    if (name[used] == '\0' || !strcmp(name + used, ".safetensors")) return st;
    return -1;
}

void ckpt_last_path(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", dir, CKPT_LAST_NAME);
}

int ckpt_resolve(const char *arg, const char *ckpt_dir, char *out, size_t cap) {
    char path[4096];
    struct stat st;
    if (ckpt_dir && !strcmp(arg, "last")) ckpt_last_path(ckpt_dir, path, sizeof path);
    else if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        char index[4200];
        snprintf(index, sizeof index, "%s/%s", arg, FG_ST_INDEX_NAME);
        if (stat(index, &st) == 0) snprintf(path, sizeof path, "%s", arg); /* sharded */
        else ckpt_last_path(arg, path, sizeof path);
    } else snprintf(path, sizeof path, "%s", arg);

    struct stat lst;
    if (lstat(path, &lst) != 0) {
        if (ckpt_dir && !strcmp(arg, "last"))
            cli_error("--ckpt-path last: no checkpoint yet in %s (no %s)", ckpt_dir, path);
        else cli_error("checkpoint \"%s\": no such file", path);
        return -1;
    }
    if (S_ISLNK(lst.st_mode)) {
        if (fg_st_get_last(path, out, cap) != FG_OK) {
            cli_error("checkpoint \"%s\": %s", path, fg_last_error());
            return -1;
        }
        return 0;
    }
    if (strlen(path) >= cap) {
        cli_error("checkpoint path too long: %s", path);
        return -1;
    }
    strcpy(out, path);
    return 0;
}
