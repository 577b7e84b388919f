/* Where `fulgur fit` puts its checkpoints and how the commands find them:
 *   <ckpt-dir>/step-<8 digits>.safetensors   one per save (state_dict_type full)
 *   <ckpt-dir>/step-<8 digits>.safetensors/  one per save (sharded: a file per
 *                                            rank and model.safetensors.index.json)
 *   <ckpt-dir>/last.safetensors              symlink to the newest whole one
 * A user may name a checkpoint by its file, by a sharded checkpoint's
 * folder, by a run's checkpoint folder (its last.safetensors), or, for fit
 * --resume, by the word "last". */
#ifndef FULGUR_CKPT_PATHS_H
#define FULGUR_CKPT_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_LAST_NAME "last.safetensors"

/* "<dir>/step-00000040.safetensors" into out ("<dir>/step-00000040" when
 * sharded). */
void ckpt_step_path(const char *dir, int64_t step, bool sharded, char *out, size_t cap);
/* "step-00000040.safetensors" (the link target, relative to the folder;
 * "step-00000040" when sharded). */
void ckpt_step_name(int64_t step, bool sharded, char *out, size_t cap);
/* The step of a checkpoint name of either form, or -1 for other names. */
int64_t ckpt_step_of(const char *name);
/* "<dir>/last.safetensors" into out. */
void ckpt_last_path(const char *dir, char *out, size_t cap);

/* Resolves what the user typed into a checkpoint to open: a sharded
 * checkpoint's folder (holding model.safetensors.index.json) stays itself,
 * another folder becomes its last.safetensors; "last" (when ckpt_dir is not NULL) becomes
 * <ckpt_dir>/last.safetensors; a symlink made by fg_st_set_last is followed.
 * Returns 0, or -1 after printing why (nothing there) with cli_error. */
int ckpt_resolve(const char *arg, const char *ckpt_dir, char *out, size_t cap);

#endif
