// Layout and indexing kernels of the CUDA op table: the strided add (the
// views' backward), where, index_select / index_add (deterministic: each
// thread adds its positions in order), max/min along a dim, cumsum.
#include <math.h>

#include "cu_common.cuh"

typedef struct strided {
    int nd;
    int64_t shape[FG_CU_MAX_DIMS], sx[FG_CU_MAX_DIMS], sy[FG_CU_MAX_DIMS];
} strided;

__global__ void k_add_strided(int dt, const void *x, void *y, strided s, int64_t n) {
    FG_CU_LOOP(i, n) {
        int64_t ox = 0, oy = 0, r = i;
        for (int d = s.nd - 1; d >= 0; d--) {
            int64_t k = r % s.shape[d];
            r /= s.shape[d];
            ox += k * s.sx[d];
            oy += k * s.sy[d];
        }
        fg_st(y, dt, oy, fg_ld(y, dt, oy) + fg_ld(x, dt, ox));
    }
}
extern "C" int fg__cu_add_strided(void *st, int dt, const void *x, void *y, int nd,
                                 const int64_t *shape, const int64_t *sx, const int64_t *sy,
                                 int64_t n) {
    strided s;
    s.nd = nd;
    for (int d = 0; d < nd; d++) {
        s.shape[d] = shape[d];
        s.sx[d] = sx[d];
        s.sy[d] = sy[d];
    }
    if (n) k_add_strided<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, x, y, s, n);
    return fg_cu_err();
}

__global__ void k_where(int dt, int c8, const void *cond, const void *a, const void *b, float va,
                        float vb, void *y, int64_t n) {
    FG_CU_LOOP(i, n) {
        bool c = c8 ? ((const uint8_t *)cond)[i] != 0 : ((const int32_t *)cond)[i] != 0;
        float v = c ? (a ? fg_ld(a, dt, i) : va) : (b ? fg_ld(b, dt, i) : vb);
        fg_st(y, dt, i, v);
    }
}
extern "C" int fg__cu_where(void *st, int dt, int c8, const void *cond, const void *a, const void *b,
                           float va, float vb, void *y, int64_t n) {
    if (n)
        k_where<<<fg_grid(n), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, c8, cond, a, b, va, vb, y,
                                                                    n);
    return fg_cu_err();
}

__global__ void k_index_select(int dt, const void *x, const int32_t *idx, void *y, int64_t outer,
                               int64_t n, int64_t k, int64_t inner, int64_t *bad) {
    FG_CU_LOOP(i, outer * k * inner) {
        int64_t c = i % inner, j = (i / inner) % k, o = i / (inner * k), s = idx[j];
        if (s < 0 || s >= n) {
            atomicMin((unsigned long long *)bad, (unsigned long long)j);
            fg_st(y, dt, i, 0.f);
        } else {
            fg_st(y, dt, i, fg_ld(x, dt, (o * n + s) * inner + c));
        }
    }
}
extern "C" int fg__cu_index_select(void *st, int dt, const void *x, const int32_t *idx, void *y,
                                  int64_t outer, int64_t n, int64_t k, int64_t inner,
                                  int64_t *bad) {
    cudaStream_t s = (cudaStream_t)st;
    cudaMemsetAsync(bad, 0xff, sizeof *bad, s); // unsigned max: "none" for atomicMin
    int64_t m = outer * k * inner;
    if (m)
        k_index_select<<<fg_grid(m), FG_CU_THREADS, 0, s>>>(dt, x, idx, y, outer, n, k, inner, bad);
    return fg_cu_err();
}

__global__ void k_index_add(int dt, const void *dy, const int32_t *idx, void *dx, int64_t outer,
                            int64_t n, int64_t k, int64_t inner) {
    FG_CU_LOOP(t, outer * inner) {
        int64_t o = t / inner, c = t % inner;
        for (int64_t j = 0; j < k; j++) {
            int64_t off = (o * n + idx[j]) * inner + c;
            fg_st(dx, dt, off, fg_ld(dx, dt, off) + fg_ld(dy, dt, (o * k + j) * inner + c));
        }
    }
}
extern "C" int fg__cu_index_add(void *st, int dt, const void *dy, const int32_t *idx, void *dx,
                               int64_t outer, int64_t n, int64_t k, int64_t inner) {
    int64_t m = outer * inner;
    if (m)
        k_index_add<<<fg_grid(m), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, dy, idx, dx, outer, n,
                                                                        k, inner);
    return fg_cu_err();
}

__global__ void k_max_dim(int dt, const void *x, int is_min, void *y, int32_t *idx, int64_t outer,
                          int64_t n, int64_t inner) {
    FG_CU_LOOP(t, outer * inner) {
        int64_t o = t / inner, c = t % inner, base = o * n * inner + c;
        float best = fg_ld(x, dt, base);
        int64_t bi = 0;
        for (int64_t r = 1; r < n && !isnan(best); r++) {
            float v = fg_ld(x, dt, base + r * inner);
            if (isnan(v) || (is_min ? v < best : v > best)) {
                best = v;
                bi = r;
            }
        }
        fg_st(y, dt, t, best);
        if (idx) idx[t] = (int32_t)bi;
    }
}
extern "C" int fg__cu_max_dim(void *st, int dt, const void *x, int is_min, void *y, int32_t *idx,
                             int64_t outer, int64_t n, int64_t inner) {
    int64_t m = outer * inner;
    if (m)
        k_max_dim<<<fg_grid(m), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, x, is_min, y, idx, outer,
                                                                      n, inner);
    return fg_cu_err();
}

__global__ void k_cumsum(int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                         int reverse) {
    FG_CU_LOOP(t, outer * inner) {
        int64_t o = t / inner, c = t % inner;
        double acc = 0;
        for (int64_t r = 0; r < n; r++) {
            int64_t rr = reverse ? n - 1 - r : r, off = (o * n + rr) * inner + c;
            acc += (double)fg_ld(x, dt, off);
            fg_st(y, dt, off, (float)acc);
        }
    }
}
extern "C" int fg__cu_cumsum(void *st, int dt, const void *x, void *y, int64_t outer, int64_t n,
                            int64_t inner, int reverse) {
    int64_t m = outer * inner;
    if (m)
        k_cumsum<<<fg_grid(m), FG_CU_THREADS, 0, (cudaStream_t)st>>>(dt, x, y, outer, n, inner,
                                                                     reverse);
    return fg_cu_err();
}

typedef struct gview {
    int nd, dim;
    int64_t sx[FG_CU_MAX_DIMS], ish[FG_CU_MAX_DIMS], so[FG_CU_MAX_DIMS];
} gview;

// gather: one thread per element of idx
__global__ void k_gather(int dt, const void *x, const int32_t *idx, void *y, gview g, int64_t n,
                         int64_t nx, int64_t *bad) {
    FG_CU_LOOP(i, n) {
        int64_t rem = i, a = 0, b = 0, v = idx[i];
        for (int d = g.nd - 1; d >= 0; d--) {
            int64_t c = rem % g.ish[d];
            rem /= g.ish[d];
            a += (d == g.dim ? v : c) * g.sx[d];
            b += c * g.so[d];
        }
        if (v < 0 || v >= nx) {
            atomicMin((unsigned long long *)bad, (unsigned long long)i);
            fg_st(y, dt, b, 0.f);
        } else {
            fg_st(y, dt, b, fg_ld(x, dt, a));
        }
    }
}
// scatter_add: one thread per line (every coordinate of idx but dim's)
__global__ void k_scatter_add(int dt, void *x, const int32_t *idx, const void *src, gview g,
                              int64_t lines) {
    int64_t len = g.ish[g.dim], sidx = 1;
    for (int d = g.dim + 1; d < g.nd; d++) sidx *= g.ish[d]; // idx's stride along dim
    FG_CU_LOOP(l, lines) {
        int64_t rem = l, base_x = 0, base_o = 0, base_i = 0, st_i = 1;
        for (int d = g.nd - 1; d >= 0; d--) {
            if (d == g.dim) {
                st_i *= g.ish[d];
                continue;
            }
            int64_t c = rem % g.ish[d];
            rem /= g.ish[d];
            base_x += c * g.sx[d];
            base_o += c * g.so[d];
            base_i += c * st_i;
            st_i *= g.ish[d];
        }
        for (int64_t r = 0; r < len; r++) {
            int64_t v = idx[base_i + r * sidx];
            int64_t ox = base_x + v * g.sx[g.dim], os = base_o + r * g.so[g.dim];
            fg_st(x, dt, ox, fg_ld(x, dt, ox) + fg_ld(src, dt, os));
        }
    }
}
extern "C" int fg__cu_gather(void *st, int dt, int scatter, void *x, const int64_t *sx,
                            const int32_t *idx, const int64_t *ishape, void *y, const int64_t *so,
                            int nd, int dim, int64_t nx, int64_t *bad) {
    cudaStream_t s = (cudaStream_t)st;
    gview g;
    g.nd = nd;
    g.dim = dim;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        g.sx[d] = sx[d];
        g.ish[d] = ishape[d];
        g.so[d] = so[d];
        n *= ishape[d];
    }
    if (!scatter) {
        cudaMemsetAsync(bad, 0xff, sizeof *bad, s);
        if (n) k_gather<<<fg_grid(n), FG_CU_THREADS, 0, s>>>(dt, x, idx, y, g, n, nx, bad);
    } else if (n) {
        int64_t lines = n / ishape[dim];
        k_scatter_add<<<fg_grid(lines), FG_CU_THREADS, 0, s>>>(dt, x, idx, y, g, lines);
    }
    return fg_cu_err();
}
