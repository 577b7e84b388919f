// The losses' kernels beyond cross-entropy: the elementwise losses
// (fg_loss_op, unreduced) forward and backward, and the rows of the
// negative log-likelihood with class weights, ignore_index and label
// smoothing. One thread an element or a row, in f64 as the CPU's
// formulas (k_loss.c), each output rounded once.
#include <math.h>

#include "cu_common.cuh"

// fg_loss_op's numbers
enum { L_MSE, L_L1, L_SMOOTH_L1, L_HUBER, L_BCE, L_BCE_LOGITS, L_KL_DIV };

__device__ double softplus_d(double v) { return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)); }

__global__ void k_ploss_fwd(int op, int dt, const void *x, const void *t, const void *w, double p,
                            void *y, int64_t n) {
    FG_CU_LOOP(i, n) {
        double v = fg_ld(x, dt, i), tt = fg_ld(t, dt, i), d = v - tt, ad = fabs(d), r = 0;
        switch (op) {
        case L_MSE: r = d * d; break;
        case L_L1: r = ad; break;
        case L_SMOOTH_L1: r = ad < p ? 0.5 * d * d / p : ad - 0.5 * p; break;
        case L_HUBER: r = ad <= p ? 0.5 * d * d : p * (ad - 0.5 * p); break;
        case L_BCE: r = (tt - 1) * fmax(log1p(-v), -100.0) - tt * fmax(log(v), -100.0); break;
        case L_BCE_LOGITS: {
            double m = v < 0 ? -v : 0.0, sp = log(exp(-m) + exp(-v - m)) + m;
            double lw = w ? 1 + ((double)fg_ld(w, dt, i) - 1) * tt : 1.0;
            r = (1 - tt) * v + lw * sp;
            break;
        }
        case L_KL_DIV:
            r = p != 0 ? exp(tt) * (tt - v) : (tt == 0 ? 0.0 : tt * log(tt)) - tt * v;
            break;
        }
        fg_st(y, dt, i, (float)r);
    }
}

__global__ void k_ploss_bwd(int op, int dt, const void *x, const void *t, const void *w, double p,
                            const void *dy, void *dx, void *dtg, int64_t n) {
    FG_CU_LOOP(i, n) {
        double v = fg_ld(x, dt, i), tt = fg_ld(t, dt, i), g = fg_ld(dy, dt, i), d = v - tt;
        double sg = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0, gx = 0, gt = 0;
        switch (op) {
        case L_MSE: gx = 2 * d * g, gt = -gx; break;
        case L_L1: gx = sg * g, gt = -gx; break;
        case L_SMOOTH_L1: gx = (fabs(d) < p ? d / p : sg) * g, gt = -gx; break;
        case L_HUBER: gx = (d < -p ? -p : d > p ? p : d) * g, gt = -gx; break;
        case L_BCE:
            gx = g * (v - tt) / fmax((1 - v) * v, 1e-12);
            gt = g * (fmax(log1p(-v), -100.0) - fmax(log(v), -100.0));
            break;
        case L_BCE_LOGITS: {
            double pw = w ? (double)fg_ld(w, dt, i) : 1.0, s = 1 / (1 + exp(-v));
            gx = g * ((pw * tt + 1 - tt) * s - pw * tt);
            gt = g * (pw * softplus_d(-v) - softplus_d(v));
            break;
        }
        case L_KL_DIV:
            if (p != 0) {
                double e = exp(tt);
                gx = -e * g, gt = g * e * (tt - v + 1);
            } else {
                gx = -tt * g, gt = g * (tt > 0 ? log(tt) + 1 - v : -v);
            }
            break;
        }
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
