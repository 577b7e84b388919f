/* Checkpoint folders written as a whole: every file goes into a hidden
 * temporary folder beside the target, which is then renamed into place
 * (exchanged with a previous checkpoint of that name, which is removed
 * after). Until the rename the target is untouched; a process killed before
 * it leaves only the temporary folder, which fg_st_remove_stale_tmp
 * removes once its pid runs no more. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"

fg_status fg_st_folder_begin(const char *path, char *tmp, size_t cap) {
    char eb[128];
    if (!path || !*path || !tmp || path[strlen(path) - 1] == '/')
        return fg_error(FG_EINVAL, "folder_begin: expected a folder path not ending in '/', got %s",
                        path ? path : "NULL");
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        char *t = fg__path_tmp(path, attempt);
        if (!t) return FG_ENOMEM;
        if (strlen(t) >= cap) {
            fg_free(t);
            return fg_error(FG_EINVAL, "%s: the temporary folder's path does not fit %zu bytes",
                            path, cap);
        }
        int rc = mkdir(t, 0777), e = errno;
        if (rc == 0) memcpy(tmp, t, strlen(t) + 1);
        fg_free(t);
        if (rc == 0) return FG_OK;
        if (e != EEXIST)
            return fg_error(FG_EIO, "%s: cannot create a temporary folder beside it: %s", path,
                            fg__errstr(e, eb, sizeof eb));
    }
    return fg_error(FG_EIO, "%s: cannot find a free temporary folder name", path);
}

fg_status fg_st_folder_commit(const char *tmp, const char *path) {
    char eb[128];
    if (!tmp || !path) return fg_error(FG_EINVAL, "folder_commit: NULL path");
    if (fg__fsync_dir(tmp) != 0)
        return fg_error(FG_EIO, "%s: fsync of the temporary folder %s failed: %s", path, tmp,
                        fg__errstr(errno, eb, sizeof eb));
    struct stat sb;
    bool exists = lstat(path, &sb) == 0;
    if (!exists) {
        if (rename(tmp, path) != 0)
            return fg_error(FG_EIO, "%s: cannot rename the temporary folder %s to it: %s", path,
                            tmp, fg__errstr(errno, eb, sizeof eb));
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) != 0) {
        int e = errno;
        if (e != EINVAL && e != ENOSYS && e != ENOTSUP)
            return fg_error(FG_EIO, "%s: cannot exchange it with the temporary folder %s: %s", path,
                            tmp, fg__errstr(e, eb, sizeof eb));
        /* a file system without the exchange: the old one aside, the new
         * one in, so that for a moment nothing is at path (a "last" link
         * still names the previous checkpoint, which is not this one) */
        char *old = fg__path_tmp(path, 0);
        if (!old) return FG_ENOMEM;
        fg_status st = FG_OK;
        if (rename(path, old) != 0)
            st = fg_error(FG_EIO, "%s: cannot move it aside to %s: %s", path, old,
                          fg__errstr(errno, eb, sizeof eb));
        else if (rename(tmp, path) != 0) {
            st = fg_error(FG_EIO, "%s: cannot rename the temporary folder %s to it: %s", path, tmp,
                          fg__errstr(errno, eb, sizeof eb));
            rename(old, path);              /* put the previous one back */
        } else if (rename(old, tmp) != 0) { /* where the exchange would have left it */
            if (fg_st_remove(old) != FG_OK) {
                /* best effort: the new folder is in place */
            }
        }
        fg_free(old);
        if (st != FG_OK) return st;
    }
    char *dir = fg__path_dir(path);
    if (!dir) return FG_ENOMEM;
    fg_status st = FG_OK;
    if (fg__fsync_dir(dir) != 0)
        st = fg_error(FG_EIO, "%s: moved into place, but fsync of folder \"%s\" failed: %s", path,
                      dir, fg__errstr(errno, eb, sizeof eb));
    fg_free(dir);
    /* what was there before now sits at tmp */
    if (exists && st == FG_OK) st = fg_st_remove(tmp);
    return st;
}

fg_status fg_st_remove(const char *path) {
    char eb[128];
    if (!path) return fg_error(FG_EINVAL, "remove: NULL path");
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return FG_OK;
        return fg_error(FG_EIO, "%s: %s", path, fg__errstr(errno, eb, sizeof eb));
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return fg_error(FG_EIO, "%s: cannot remove it: %s", path,
                            fg__errstr(errno, eb, sizeof eb));
        return FG_OK;
    }
    DIR *d = opendir(path);
    if (!d)
        return fg_error(FG_EIO, "%s: cannot list it: %s", path, fg__errstr(errno, eb, sizeof eb));
    fg_status st = FG_OK;
    for (struct dirent *e; st == FG_OK && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
            st = fg_error(FG_EIO, "%s/%s: cannot remove it%s: %s", path, e->d_name,
                          errno == EISDIR ? " (a folder inside a checkpoint folder)" : "",
                          fg__errstr(errno, eb, sizeof eb));
    }
    closedir(d);
    if (st == FG_OK && rmdir(path) != 0 && errno != ENOENT)
        st = fg_error(FG_EIO, "%s: cannot remove the folder: %s", path,
                      fg__errstr(errno, eb, sizeof eb));
    return st;
}
