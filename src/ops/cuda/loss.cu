// The losses' kernels beyond cross-entropy: the elementwise losses
// (fg_loss_op, unreduced) forward and backward, and the rows of the
// negative log-likelihood with class weights, ignore_index and label
// smoothing. One thread an element or a row, in f64 as the CPU's
// formulas (k_loss.c, through shared_cnn.h), each output rounded once.
#include <math.h>

#include "cu_common.cuh"
#include "shared_cnn.h"

__global__ void k_ploss_fwd(int op, int dt, const void *x, const void *t, const void *w, double p,
                            void *y, int64_t n) {
    FG_CU_LOOP(i, n) {
        double wi = w ? (double)fg_ld(w, dt, i) : 1.0;
        fg_st(y, dt, i, (float)fg__sh_ploss(op, fg_ld(x, dt, i), fg_ld(t, dt, i), wi, p));
    }
}

__global__ void k_ploss_bwd(int op, int dt, const void *x, const void *t, const void *w, double p,
                            const void *dy, void *dx, void *dtg, int64_t n) {
    FG_CU_LOOP(i, n) {
        double wi = w ? (double)fg_ld(w, dt, i) : 1.0, gx, gt;
        fg__sh_ploss_grad(op, fg_ld(x, dt, i), fg_ld(t, dt, i), wi, p, fg_ld(dy, dt, i), &gx, &gt);
        if (dx) fg_st(dx, dt, i, fg_ld(dx, dt, i) + (float)gx);
        if (dtg) fg_st(dtg, dt, i, fg_ld(dtg, dt, i) + (float)gt);
    }
}

// one thread a row: y[m], its weight wrow[m] (0 for ignore), bad[m] = 1
// for a target outside [0, C) that is not ignore
__global__ void k_nll_fwd(int dt, const void *lp, const int32_t *t, const void *w, int64_t ignore,
                          double eps, void *y, double *wrow, int32_t *bad, int64_t M, int64_t C) {
    FG_CU_LOOP(m, M) {
        int32_t c0 = t[m];
        bad[m] = c0 != ignore && (c0 < 0 || c0 >= C);
        if (c0 == ignore || bad[m]) {
            fg_st(y, dt, m, 0.f);
            wrow[m] = 0;
            continue;
        }
        double wt = w ? (double)fg_ld(w, dt, c0) : 1.0, r = -wt * (double)fg_ld(lp, dt, m * C + c0);
        if (eps != 0) {
            double s = 0;
            for (int64_t c = 0; c < C; c++)
                s += (w ? (double)fg_ld(w, dt, c) : 1.0) * (double)fg_ld(lp, dt, m * C + c);
            r = (1 - eps) * r - eps / (double)C * s;
        }
        fg_st(y, dt, m, (float)r);
        wrow[m] = wt;
    }
}

__global__ void k_nll_bwd(int dt, const int32_t *t, const void *w, int64_t ignore, double eps,
                          const void *dy, void *dlp, int64_t M, int64_t C) {
    FG_CU_LOOP(m, M) {
        int32_t c0 = t[m];
        if (c0 == ignore || c0 < 0 || c0 >= C) continue;
        double g = fg_ld(dy, dt, m), wt = w ? (double)fg_ld(w, dt, c0) : 1.0;
        if (eps != 0) {
            double s = -eps / (double)C * g;
            for (int64_t c = 0; c < C; c++)
                fg_st(dlp, dt, m * C + c,
                      fg_ld(dlp, dt, m * C + c) + (float)(s * (w ? (double)fg_ld(w, dt, c) : 1.0)));
        }
        fg_st(dlp, dt, m * C + c0, fg_ld(dlp, dt, m * C + c0) + (float)(-(1 - eps) * wt * g));
    }
}

extern "C" int fg__cu_ploss_fwd(void *st, int op, int dt, const void *x, const void *t,
                                const void *w, double p, void *y, int64_t n) {
    if (n)
        k_ploss_fwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(op, dt, x, t, w, p, y, n);
    return fg_cu_err();
}
extern "C" int fg__cu_ploss_bwd(void *st, int op, int dt, const void *x, const void *t,
                                const void *w, double p, const void *dy, void *dx, void *dtg,
                                int64_t n) {
    if (n)
        k_ploss_bwd<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(op, dt, x, t, w, p, dy, dx,
                                                                        dtg, n);
    return fg_cu_err();
}
extern "C" int fg__cu_nll_rows_fwd(void *st, int dt, const void *lp, const int32_t *t,
                                   const void *w, int64_t ignore, double eps, void *y, double *wrow,
                                   int32_t *bad, int64_t M, int64_t C) {
    if (M)
        k_nll_fwd<<<fg_grid(M), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, lp, t, w, ignore, eps, y,
                                                                      wrow, bad, M, C);
    return fg_cu_err();
}
extern "C" int fg__cu_nll_rows_bwd(void *st, int dt, const int32_t *t, const void *w,
                                   int64_t ignore, double eps, const void *dy, void *dlp, int64_t M,
                                   int64_t C) {
    if (M)
        k_nll_bwd<<<fg_grid(M), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, t, w, ignore, eps, dy,
                                                                      dlp, M, C);
    return fg_cu_err();
}
