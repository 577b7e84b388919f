// Multi-tensor optimizer steps of the CUDA backend: one launch updates
// every tensor of a group (the pointer and length tables copied to the
// device first), as PyTorch's foreach/fused AdamW and SGD.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cu_common.cuh"

typedef struct multi {
    float **p, **g, **m, **v;
    int64_t *len;
} multi;

// blockIdx.y: the tensor; x: a grid-stride over its elements
__global__ void k_adamw(multi t, float lr, float b1, float b2, float eps, float wd, float bc1,
                        float bc2) {
    int k = blockIdx.y;
    float *p = t.p[k], *m = t.m[k], *v = t.v[k];
    const float *g = t.g[k];
    FG_CU_LOOP(i, t.len[k]) {
        float gi = g[i];
        float pi = p[i] * (1.f - lr * wd);
        float mi = b1 * m[i] + (1.f - b1) * gi;
        float vi = b2 * v[i] + (1.f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}
__global__ void k_sgd(multi t, float lr, float mu, float damp, float wd, int nesterov, int first) {
    int k = blockIdx.y;
    float *p = t.p[k], *b = t.m[k];
    const float *g = t.g[k];
    FG_CU_LOOP(i, t.len[k]) {
        float gi = g[i] + wd * p[i];
        if (mu != 0.f) {
            float bi = first ? gi : mu * b[i] + (1.f - damp) * gi;
            b[i] = bi;
            gi = nesterov ? gi + mu * bi : bi;
        }
        p[i] -= lr * gi;
    }
}

extern "C" int64_t fg__cu_multi_scratch_bytes(int n) {
    return (int64_t)n * (4 * (int64_t)sizeof(float *) + (int64_t)sizeof(int64_t));
}

// the tables go to scratch (device) through one copy from the host
static int upload(cudaStream_t s, int n, float *const *p, const float *const *g, float *const *m,
                  float *const *v, const int64_t *len, void *scratch, multi *t, int64_t *maxlen) {
    size_t np = (size_t)n * sizeof(float *);
    char *host = (char *)malloc((size_t)fg__cu_multi_scratch_bytes(n));
    if (!host) return (int)cudaErrorMemoryAllocation;
    memcpy(host, p, np);
    memcpy(host + np, g, np);
    memcpy(host + 2 * np, m, np);
    if (v) memcpy(host + 3 * np, v, np);
    else memset(host + 3 * np, 0, np);
    memcpy(host + 4 * np, len, (size_t)n * sizeof(int64_t));
    *maxlen = 0;
    for (int i = 0; i < n; i++)
        if (len[i] > *maxlen) *maxlen = len[i];
    // a synchronous copy: the host table is freed at once
    cudaError_t e = cudaMemcpyAsync(scratch, host, (size_t)fg__cu_multi_scratch_bytes(n),
                                    cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    free(host);
    char *d = (char *)scratch;
    t->p = (float **)d;
    t->g = (float **)(d + np);
    t->m = (float **)(d + 2 * np);
    t->v = (float **)(d + 3 * np);
    t->len = (int64_t *)(d + 4 * np);
    return (int)e;
}

extern "C" int fg__cu_adamw_multi(void *st, int n, float *const *p, const float *const *g,
                                 float *const *m, float *const *v, const int64_t *len, float lr,
                                 float b1, float b2, float eps, float wd, float bc1, float bc2,
                                 void *dev_scratch) {
    if (n <= 0) return 0;
    cudaStream_t s = (cudaStream_t)st;
    multi t;
    int64_t maxlen;
    int e = upload(s, n, p, g, m, v, len, dev_scratch, &t, &maxlen);
    if (e) return e;
    dim3 grid(fg_grid(maxlen), (unsigned)n);
    k_adamw<<<grid, FG_CU_THREADS, 0, s>>>(t, lr, b1, b2, eps, wd, bc1, bc2);
    return fg_cu_err();
}

extern "C" int fg__cu_sgd_multi(void *st, int n, float *const *p, const float *const *g,
                               float *const *buf, const int64_t *len, float lr, float mu,
                               float damp, float wd, int nesterov, int first, void *dev_scratch) {
    if (n <= 0) return 0;
    cudaStream_t s = (cudaStream_t)st;
    multi t;
    int64_t maxlen;
    int e = upload(s, n, p, g, buf, NULL, len, dev_scratch, &t, &maxlen);
    if (e) return e;
    dim3 grid(fg_grid(maxlen), (unsigned)n);
    k_sgd<<<grid, FG_CU_THREADS, 0, s>>>(t, lr, mu, damp, wd, nesterov, first);
    return fg_cu_err();
}
