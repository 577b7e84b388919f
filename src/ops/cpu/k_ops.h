/* The CPU kernels of the table entries added for user models (elementwise
 * functions, layouts, indexing, losses): k_unary.c, k_index.c, k_loss.c.
 * Plain loops over T (float or double) that the compiler vectorises where
 * it can; they take no ISA table, so every ISA path runs the same code. */
#ifndef FULGUR_CPU_K_OPS_H
#define FULGUR_CPU_K_OPS_H

#include "cpu_impl.h"

/* k_unary.c */
FG_MUST_USE fg_status fg__cpu_unary_fwd(fg_unary_op op, const fg_tensor *x, double a, double b,
                                        fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_unary_bwd(fg_unary_op op, const fg_tensor *x, const fg_tensor *y,
                                        const fg_tensor *dy, double a, double b, fg_tensor *dx);

/* k_index.c */
FG_MUST_USE fg_status fg__cpu_add_strided(const fg_tensor *x, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_where(const fg_tensor *cond, const fg_tensor *a, const fg_tensor *b,
                                    double va, double vb, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_index_select(const fg_tensor *x, int dim, const fg_tensor *idx,
                                           fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_index_add(const fg_tensor *dy, int dim, const fg_tensor *idx,
                                        fg_tensor *dx);
FG_MUST_USE fg_status fg__cpu_gather(const fg_tensor *x, int dim, const fg_tensor *idx,
                                     fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_scatter_add(const fg_tensor *src, int dim, const fg_tensor *idx,
                                          fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_max_dim(const fg_tensor *x, int dim, bool is_min, fg_tensor *y,
                                      fg_tensor *idx);
FG_MUST_USE fg_status fg__cpu_cumsum(const fg_tensor *x, int dim, bool reverse, fg_tensor *y);

/* k_loss.c */
FG_MUST_USE fg_status fg__cpu_pointwise_loss_fwd(fg_loss_op op, const fg_tensor *x,
                                                 const fg_tensor *t, const fg_tensor *w, double p,
                                                 fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_pointwise_loss_bwd(fg_loss_op op, const fg_tensor *x,
                                                 const fg_tensor *t, const fg_tensor *w, double p,
                                                 const fg_tensor *dy, fg_tensor *dx, fg_tensor *dt);
FG_MUST_USE fg_status fg__cpu_nll_fwd(const fg_tensor *logp, const fg_tensor *t, const fg_tensor *w,
                                      int64_t ignore, double eps, fg_tensor *y, double *wsum);
FG_MUST_USE fg_status fg__cpu_nll_bwd(const fg_tensor *t, const fg_tensor *w, int64_t ignore,
                                      double eps, const fg_tensor *dy, fg_tensor *dlogp);

/* k_conv.c (oneDNN's primitives for f32 where built in, k_conv_dnnl.c;
 * im2col and the matrix product otherwise, and for f64) */
FG_MUST_USE fg_status fg__cpu_conv2d_fwd(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                                         const fg_conv_params *p, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w,
                                              const fg_conv_params *p, fg_tensor *dx);
FG_MUST_USE fg_status fg__cpu_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                                const fg_conv_params *p, fg_tensor *dw,
                                                fg_tensor *db);
/* k_pool.c */
FG_MUST_USE fg_status fg__cpu_pool2d_fwd(const fg_tensor *x, const fg_pool_params *p, fg_tensor *y,
                                         fg_tensor *idx);
FG_MUST_USE fg_status fg__cpu_pool2d_bwd(const fg_tensor *dy, const fg_tensor *idx,
                                         const fg_pool_params *p, fg_tensor *dx);

/* k_norm.c */
FG_MUST_USE fg_status fg__cpu_batch_norm_stats(const fg_tensor *x, double *mean, double *var);
FG_MUST_USE fg_status fg__cpu_batch_norm_fwd(const fg_tensor *x, const double *mean,
                                             const double *invstd, const fg_tensor *w,
                                             const fg_tensor *b, fg_tensor *y);
FG_MUST_USE fg_status fg__cpu_batch_norm_bwd(const fg_tensor *x, const fg_tensor *dy,
                                             const double *mean, const double *invstd,
                                             const fg_tensor *w, fg_tensor *dx, fg_tensor *dw,
                                             fg_tensor *db, bool dx_overwrite);

/* k_conv_dnnl.c: the same three on oneDNN's convolution primitive, f32,
 * all contiguous; FG_EUNSUPPORTED where oneDNN is not built in or refuses
 * (the caller then runs its im2col path). */
FG_MUST_USE fg_status fg__dnnl_conv2d_fwd(const fg_tensor *x, const fg_tensor *w,
                                          const fg_tensor *b, const fg_conv_params *p,
                                          fg_tensor *y);
FG_MUST_USE fg_status fg__dnnl_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w,
                                               const fg_conv_params *p, fg_tensor *dx);
FG_MUST_USE fg_status fg__dnnl_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                                 const fg_conv_params *p, fg_tensor *dw,
                                                 fg_tensor *db);
/* For tests: how many primitives this process made on Winograd (the
 * measurements' own excluded; fulgur's Winograd, below, included). */
int fg__dnnl_conv_winograd_made(void);

/* k_conv_wino.c: the same three by Winograd's F(4x4, 3x3) on the table's
 * matrix products, where oneDNN has no Winograd kernels; FG_EUNSUPPORTED
 * where fg__wino_conv_fits is false (f32, 3x3, stride 1, no dilation, one
 * group, padding <= 2, a vector ISA). */
bool fg__wino_conv_fits(const fg_tensor *x, const fg_tensor *w, const fg_conv_params *p);
FG_MUST_USE fg_status fg__wino_conv2d_fwd(const fg_tensor *x, const fg_tensor *w,
                                          const fg_tensor *b, const fg_conv_params *p,
                                          fg_tensor *y);
FG_MUST_USE fg_status fg__wino_conv2d_bwd_data(const fg_tensor *dy, const fg_tensor *w,
                                               const fg_conv_params *p, fg_tensor *dx);
FG_MUST_USE fg_status fg__wino_conv2d_bwd_weight(const fg_tensor *x, const fg_tensor *dy,
                                                 const fg_conv_params *p, fg_tensor *dw,
                                                 fg_tensor *db);
/* For tests: the bytes of a scratch buffer above which the work goes in
 * chunks of tiles and filter rows (0: the default, 8 MiB) */
void fg__wino_set_chunk(int64_t bytes);
/* Which convolution path runs f32: "onednn" (the default where built in;
 * the primitive's own layouts, Winograd (oneDNN's where it has it, else
 * fulgur's) or direct measured per shape), "onednn-direct" and
 * "onednn-winograd" (FULGUR_CONV=...: that algorithm wherever oneDNN
 * implements it), "winograd" (FULGUR_CONV=winograd: fulgur's Winograd
 * wherever it applies, the default elsewhere), "onednn-plain"
 * (FULGUR_CONV=onednn-plain: NCHW as it is, direct) or "im2col"
 * (FULGUR_CONV=im2col, or no oneDNN). */
const char *fg__cpu_conv_path(void);

/* conv_pick.c: whether a convolution shape (key: n <= FG_CONV_KEY values,
 * the direction, sizes, threads and what else makes its primitive) runs
 * oneDNN's Winograd algorithm: this process's or the machine's file's
 * choice, else measure(ud, t) now (t[0] the direct call's seconds, t[1]
 * Winograd's, INFINITY where it cannot run), kept in the file. An error of
 * measure is returned and nothing is kept. */
#define FG_CONV_KEY 32
typedef fg_status (*fg__conv_measure_fn)(void *ud, double *t);
FG_MUST_USE fg_status fg__conv_pick(const int64_t *key, int n, fg__conv_measure_fn measure,
                                    void *ud, bool *winograd);
/* "N shapes measured, W on winograd; cache PATH" */
const char *fg__conv_pick_info(char *buf, size_t cap);
/* For tests: read or write a choices file, forget every choice (and stop
 * using the machine's file), count the choices (on Winograd, from a file). */
FG_MUST_USE fg_status fg__conv_pick_cache_load(const char *path);
FG_MUST_USE fg_status fg__conv_pick_cache_save(const char *path);
void fg__conv_pick_forget(void);
int fg__conv_pick_count(int *winograd, int *cached);

#endif
