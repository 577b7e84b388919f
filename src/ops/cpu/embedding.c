/* Embedding lookup y (N, C) = weight (V, C)[idx (N)] and its backward, the
 * scatter-add dweight[idx[n]] += dy[n].
 *
 * Every index is checked before any work: one outside [0, V) is FG_EINVAL
 * naming it, its position and V, and nothing is written. idx may have any
 * shape with N elements (the rows of y).
 *
 * The backward is split across threads by column blocks, not rows: two
 * rows with the same token write the same dweight row, so a row split
 * would race or need atomics. Each thread owns its columns and adds the
 * rows in order, which also makes the result independent of the thread
 * count. */
#include <string.h>

#include "cpu_impl.h"
#include "vmath.h"

/* Columns one backward task owns. */
#define EMB_COLS 64

static FG_MUST_USE fg_status check(const char *kernel, const fg_tensor *idx,
                                   const fg_tensor *weight, const fg_tensor *rows) {
    char a[96], b[96], c[96];
    FG_TRY(fg__expect_contiguous(kernel, idx));
    FG_TRY(fg__expect_contiguous(kernel, weight));
    FG_TRY(fg__expect_contiguous(kernel, rows));
    if (idx->dtype != FG_I32 || weight->ndim != 2 || rows->dtype != weight->dtype ||
        rows->ndim != 2 || rows->shape[0] != idx->numel || rows->shape[1] != weight->shape[1])
        return fg_error(FG_EINVAL,
                        "%s: idx %s, weight %s, rows %s: expected i32 idx (N), "
                        "weight (V, C) and rows (N, C)",
                        kernel, fg_tensor_describe(idx, a, sizeof a),
                        fg_tensor_describe(weight, b, sizeof b),
                        fg_tensor_describe(rows, c, sizeof c));
    int64_t V = weight->shape[0];
    const int32_t *p = idx->data;
    for (int64_t i = 0; i < idx->numel; i++)
        if (p[i] < 0 || p[i] >= V)
            return fg_error(FG_EINVAL,
                            "%s: index %d at position %lld is out of range for a "
                            "vocabulary of %lld (expected 0..%lld)",
                            kernel, (int)p[i], (long long)i, (long long)V, (long long)V - 1);
    return FG_OK;
}

fg_status fg__cpu_embedding_fwd(const fg_tensor *idx, const fg_tensor *weight, fg_tensor *y) {
    FG_TRY(check("embedding_fwd", idx, weight, y));
    int64_t N = y->shape[0], C = y->shape[1], work = y->numel;
    const int32_t *p = idx->data;
    size_t esz = fg_dtype_size(y->dtype), row = esz * (size_t)C;
    const char *pw = weight->data;
    char *py = y->data;
    FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
    for (int64_t i = 0; i < N; i++) memcpy(py + (size_t)i * row, pw + (size_t)p[i] * row, row);
    return FG_OK;
}

fg_status fg__cpu_embedding_bwd(const fg_tensor *idx, const fg_tensor *dy, fg_tensor *dweight) {
    FG_TRY(check("embedding_bwd", idx, dweight, dy));
    int64_t N = dy->shape[0], C = dy->shape[1], work = dy->numel;
    int64_t nb = (C + EMB_COLS - 1) / EMB_COLS;
    const int32_t *p = idx->data;
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    bool vadd = dy->dtype == FG_F32 && vk->add_row;
    FG_FLOAT_DISPATCH("embedding_bwd", dy->dtype, {
        const T *pg = dy->data;
        T *pd = dweight->data;
        FG_PRAGMA(omp parallel for if (work > FG_PAR_MIN) schedule(static))
        for (int64_t blk = 0; blk < nb; blk++) {
            int64_t c0 = blk * EMB_COLS, nc = FG_MIN(EMB_COLS, C - c0);
            for (int64_t i = 0; i < N; i++) {
                const T *g = pg + i * C + c0;
                T *d = pd + (int64_t)p[i] * C + c0;
                if (vadd) {
                    vk->add_row((float *)d, (const float *)g, nc);
                    continue;
                }
                FG_SIMD
                for (int64_t k = 0; k < nc; k++) d[k] += g[k];
            }
        }
    });
    return FG_OK;
}
