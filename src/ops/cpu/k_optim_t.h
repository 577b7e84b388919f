/* The optimizer and clipping kernels for one float type, included twice by
 * kernels.c: once with T = float, SQRT = sqrtf, SUF = f32, once with
 * T = double, SQRT = sqrt, SUF = f64. Plain loops over a range of the flat
 * buffers that the compiler vectorises, split over OpenMP threads when the
 * range is large; every element is independent, so the result does not
 * depend on the thread count. The arithmetic is in T, as PyTorch's. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)

/* p -= lr * (g + wd p), or with momentum: d = g + wd p; buf = d at the first
 * step, else mu buf + damp d; p -= lr * (nesterov ? d + mu buf : buf) */
static void FN(sgd)(T *restrict p, const T *restrict g, T *restrict buf, int64_t n, T lr, T wd,
                    T mu, T damp, bool first, bool nesterov) {
    if (!buf) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
    /* four loops rather than tests inside one: each vectorises */
    if (first && !nesterov) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T d = g[i] + wd * p[i];
            buf[i] = d;
            p[i] -= lr * d;
        }
    } else if (first) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T d = g[i] + wd * p[i];
            buf[i] = d;
            p[i] -= lr * (d + mu * d);
        }
    } else if (!nesterov) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T b = mu * buf[i] + damp * (g[i] + wd * p[i]);
            buf[i] = b;
            p[i] -= lr * b;
        }
    } else {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T d = g[i] + wd * p[i];
            T b = mu * buf[i] + damp * d;
            buf[i] = b;
            p[i] -= lr * (d + mu * b);
        }
    }
}

/* p *= decay; m1 = b1 m1 + c1 g; m2 = b2 m2 + c2 g^2;
 * p -= step * m1 / (sqrt(m2) / rb + eps) */
static void FN(adamw)(T *restrict p, const T *restrict g, T *restrict m1, T *restrict m2, int64_t n,
                      T decay, T b1, T c1, T b2, T c2, T step, T rb, T eps) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T gi = g[i];
        T a = m1[i] * b1 + c1 * gi;
        T v = m2[i] * b2 + c2 * gi * gi;
        m1[i] = a;
        m2[i] = v;
        p[i] = p[i] * decay - step * (a / (SQRT(v) / rb + eps));
    }
}

/* Adam: d = g + wd p; m1 = b1 m1 + c1 d; m2 = b2 m2 + c2 d^2; amsgrad:
 * m3 = max(m3, m2) is the denominator's; p -= step * m1 / (sqrt(.) / rb + eps) */
static void FN(adam)(T *restrict p, const T *restrict g, T *restrict m1, T *restrict m2,
                     T *restrict m3, int64_t n, T wd, T b1, T c1, T b2, T c2, T step, T rb, T eps) {
    if (!m3) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T d = g[i] + wd * p[i];
            T a = m1[i] * b1 + c1 * d;
            T v = m2[i] * b2 + c2 * d * d;
            m1[i] = a;
            m2[i] = v;
            p[i] = p[i] - step * (a / (SQRT(v) / rb + eps));
        }
        return;
    }
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T d = g[i] + wd * p[i];
        T a = m1[i] * b1 + c1 * d;
        T v = m2[i] * b2 + c2 * d * d;
        T w = m3[i] > v ? m3[i] : v;
        m1[i] = a;
        m2[i] = v;
        m3[i] = w;
        p[i] = p[i] - step * (a / (SQRT(w) / rb + eps));
    }
}

/* RMSprop: d = g + wd p; sq = alpha sq + c d^2; centered: ga = alpha ga +
 * c d, avg = sqrt(sq - ga^2) + eps, else sqrt(sq) + eps; with momentum
 * buf = mu buf + d / avg, p -= lr buf; else p -= lr d / avg */
static void FN(rmsprop)(T *restrict p, const T *restrict g, T *restrict sq, T *restrict buf,
                        T *restrict ga, int64_t n, T lr, T wd, T alpha, T c, T eps, T mu) {
    if (!buf && !ga) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            T d = g[i] + wd * p[i];
            T s = sq[i] * alpha + c * d * d;
            sq[i] = s;
            p[i] = p[i] - lr * (d / (SQRT(s) + eps));
        }
        return;
    }
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T d = g[i] + wd * p[i];
        T s = sq[i] * alpha + c * d * d;
        sq[i] = s;
        T avg;
        if (ga) {
            T a = ga[i] * alpha + c * d;
            ga[i] = a;
            avg = SQRT(s + (T)-1 * a * a) + eps;
        } else {
            avg = SQRT(s) + eps;
        }
        if (buf) {
            T b = buf[i] * mu + d / avg;
            buf[i] = b;
            p[i] = p[i] - lr * b;
        } else {
            p[i] = p[i] - lr * (d / avg);
        }
    }
}

/* Adagrad: d = g + wd p; sum += d^2; p -= clr d / (sqrt(sum) + eps) */
static void FN(adagrad)(T *restrict p, const T *restrict g, T *restrict sum, int64_t n, T clr, T wd,
                        T eps) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T d = g[i] + wd * p[i];
        T s = sum[i] + d * d;
        sum[i] = s;
        p[i] = p[i] - clr * (d / (SQRT(s) + eps));
    }
}

/* Lion: p *= decay; p -= lr sign(b1 m + c1 g); m = b2 m + c2 g */
static void FN(lion)(T *restrict p, const T *restrict g, T *restrict m, int64_t n, T lr, T decay,
                     T b1, T c1, T b2, T c2) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T gi = g[i];
        T u = m[i] * b1 + c1 * gi;
        T s = u > 0 ? (T)1 : u < 0 ? (T)-1 : (T)0;
        p[i] = p[i] * decay - lr * s;
        m[i] = m[i] * b2 + c2 * gi;
    }
}

/* Sum of squares of each FG_OPTIM_BLOCK-element block into part[] (eight
 * lanes per block, added in a fixed order). */
static void FN(sumsq_blocks)(const T *restrict x, int64_t n, double *restrict part) {
    int64_t nb = (n + FG_OPTIM_BLOCK - 1) / FG_OPTIM_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 8)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * FG_OPTIM_BLOCK, hi = FG_MIN(n, lo + FG_OPTIM_BLOCK), i = lo;
        double acc[8] = {0};
        for (; i + 8 <= hi; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
        for (; i < hi; i++) acc[0] += (double)x[i] * (double)x[i];
        part[b] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
}

static void FN(scale)(T *restrict x, int64_t n, T s) {
#pragma omp parallel for simd schedule(static) if (n > FG_OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

#undef FN
#undef CAT
#undef CAT_
