/* The loops of k_unary.c over one element type: included once with T float
 * and SUF f32, once with T double and SUF f64 (<tgmath.h> picks the libm
 * function of T's precision; vmath.h's FG_EXP and FG_NORMCDF its own f32
 * ones, libm's in f64). Each is one flat loop over n contiguous elements,
 * split across threads when large. The f32 exact GELU runs here on the
 * scalar path only: the vector tables have it (vk_t.h). */
#define KU_CAT2(a, b) a##b
#define KU_CAT(a, b) KU_CAT2(a, b)
#define KU_FN(name) KU_CAT(name, SUF)
#define KU_LOOP(body)                                                                              \
    do {                                                                                           \
        FG_PRAGMA(omp parallel for if (n > FG_PAR_MIN) schedule(static))                           \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T v = x[i];                                                                            \
            body;                                                                                  \
        }                                                                                          \
    } while (0)

static void KU_FN(un_fwd_)(fg_unary_op op, const T *x, T a, T b, T *y, int64_t n) {
    switch (op) {
    case FG_UN_EXP: KU_LOOP(y[i] = exp(v)); break;
    case FG_UN_LOG: KU_LOOP(y[i] = log(v)); break;
    case FG_UN_SQRT: KU_LOOP(y[i] = sqrt(v)); break;
    case FG_UN_RSQRT: KU_LOOP(y[i] = (T)1 / sqrt(v)); break;
    case FG_UN_POW:
        if (a == (T)2) KU_LOOP(y[i] = v * v);
        else KU_LOOP(y[i] = pow(v, a));
        break;
    case FG_UN_ABS: KU_LOOP(y[i] = fabs(v)); break;
    case FG_UN_CLAMP: /* NaN passes; min > max gives max, as PyTorch's */
        KU_LOOP(T u = v < a ? a : v; y[i] = u > b ? b : u);
        break;
    case FG_UN_SIGMOID: KU_LOOP(y[i] = (T)1 / ((T)1 + exp(-v))); break;
    case FG_UN_TANH: KU_LOOP(y[i] = tanh(v)); break;
    case FG_UN_SILU: KU_LOOP(y[i] = v / ((T)1 + exp(-v))); break;
    case FG_UN_GELU_ERF: KU_LOOP(y[i] = v * FG_NORMCDF(v)); break;
    case FG_UN_SOFTPLUS: KU_LOOP(T bx = v * a; y[i] = bx > b ? v : log1p(exp(bx)) / a); break;
    case FG_UN_LEAKY_RELU: KU_LOOP(y[i] = v > 0 ? v : v * a); break;
    case FG_UN_ELU: KU_LOOP(y[i] = v > 0 ? v : a * expm1(v)); break;
    }
}

static void KU_FN(un_bwd_)(fg_unary_op op, const T *x, const T *y, const T *g, T a, T b, T *dx,
                           int64_t n) {
    switch (op) {
    case FG_UN_EXP: KU_LOOP((void)v; dx[i] += g[i] * y[i]); break;
    case FG_UN_LOG: KU_LOOP(dx[i] += g[i] / v); break;
    case FG_UN_SQRT: KU_LOOP((void)v; dx[i] += g[i] / ((T)2 * y[i])); break;
    case FG_UN_RSQRT: KU_LOOP((void)v; T r = y[i]; dx[i] += (T)-0.5 * g[i] * r * r * r); break;
    case FG_UN_POW:
        if (a == 0) break; /* a constant: no gradient */
        if (a == (T)2) KU_LOOP(dx[i] += g[i] * (T)2 * v);
        else KU_LOOP(dx[i] += g[i] * a * pow(v, a - (T)1));
        break;
    case FG_UN_ABS: KU_LOOP(dx[i] += v > 0 ? g[i] : v < 0 ? -g[i] : (T)0); break;
    case FG_UN_CLAMP: KU_LOOP(dx[i] += v >= a && v <= b ? g[i] : (T)0); break;
    case FG_UN_SIGMOID: KU_LOOP((void)v; T s = y[i]; dx[i] += g[i] * s * ((T)1 - s)); break;
    case FG_UN_TANH: KU_LOOP((void)v; T t = y[i]; dx[i] += g[i] * ((T)1 - t * t)); break;
    case FG_UN_SILU:
        KU_LOOP(T s = (T)1 / ((T)1 + exp(-v)); dx[i] += g[i] * s * ((T)1 + v * ((T)1 - s)));
        break;
    case FG_UN_GELU_ERF:
        KU_LOOP(T pdf = FG_EXP((T)-0.5 * v * v) * (T)0.39894228040143267794;
                dx[i] += g[i] * (FG_NORMCDF(v) + v * pdf));
        break;
    case FG_UN_SOFTPLUS:
        KU_LOOP(T bx = v * a; dx[i] += bx > b ? g[i] : g[i] / ((T)1 + exp(-bx)));
        break;
    case FG_UN_LEAKY_RELU: KU_LOOP(dx[i] += v > 0 ? g[i] : g[i] * a); break;
    case FG_UN_ELU: KU_LOOP(dx[i] += v > 0 ? g[i] : g[i] * a * exp(v)); break;
    }
}

#undef KU_LOOP
#undef KU_FN
#undef KU_CAT
#undef KU_CAT2
