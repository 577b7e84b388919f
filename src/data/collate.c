/* Collate: the batch's named tensors (fg_collate_tensor hands out loader-owned
 * tensors, reusing their memory from batch to batch) and the default collate
 * (stack fixed fields; pad variable ones to the batch's longest, with a mask).
 * Invariant: out->t[k] holds at least capb[k] bytes, and names[0, n) are
 * distinct within a batch. */
#include <stdio.h>
#include <string.h>

#include "data_impl.h"
#include "tensor/tensor_impl.h"

void fg__collate_out_free(fg_collate_out *out) {
    for (int k = 0; k < out->cap; k++) {
        if (out->names) fg_free(out->names[k]);
        if (out->t) fg_tensor_free(out->t[k]);
    }
    fg_free(out->names);
    fg_free(out->t);
    fg_free(out->capb);
    *out = (fg_collate_out){0};
}

fg_tensor *fg_collate_tensor(fg_collate_out *out, const char *name, fg_dtype dt, int ndim,
                             const int64_t *shape) {
    if (!out || !name) {
        fg_error(FG_EINVAL, "fg_collate_tensor: NULL %s", out ? "name" : "output");
        return NULL;
    }
    for (int k = 0; k < out->n; k++)
        if (strcmp(out->names[k], name) == 0) {
            fg_error(FG_EINVAL, "collate: the batch already has a field '%s'", name);
            return NULL;
        }
    fg_tensor probe = {0};
    if (fg__tensor_init_shape(&probe, dt, ndim, shape) != FG_OK) {
        fg_error_wrap(FG_EINVAL, "collate: field '%s'", name);
        return NULL;
    }
    size_t need = (size_t)probe.numel * fg_dtype_size(dt);
    if (out->n == out->cap) {
        int nc = out->cap ? 2 * out->cap : 8;
        char **nn = fg_realloc(out->names, (size_t)nc * sizeof *nn);
        if (nn) out->names = nn;
        fg_tensor **nt = nn ? fg_realloc(out->t, (size_t)nc * sizeof *nt) : NULL;
        if (nt) out->t = nt;
        size_t *nb = nt ? fg_realloc(out->capb, (size_t)nc * sizeof *nb) : NULL;
        if (!nb) return NULL;
        out->capb = nb;
        for (int k = out->cap; k < nc; k++) {
            out->names[k] = NULL;
            out->t[k] = NULL;
            out->capb[k] = 0;
        }
        out->cap = nc;
    }
    int k = out->n;
    if (!out->names[k] || strcmp(out->names[k], name) != 0) {
        char *s = fg_strdup(name);
        if (!s) return NULL;
        fg_free(out->names[k]);
        out->names[k] = s;
    }
    if (!out->t[k] || out->capb[k] < need) {
        fg_tensor *t = fg_tensor_new(dt, ndim, shape);
        if (!t) return NULL;
        fg_tensor_free(out->t[k]);
        out->t[k] = t;
        out->capb[k] = need;
    } else if (fg__tensor_init_shape(out->t[k], dt, ndim, shape) != FG_OK) {
        return NULL;
    }
    out->n++;
    return out->t[k];
}

/* Writes `count` elements of value v as dtype dt at p. */
static void fill_value(void *p, fg_dtype dt, double v, int64_t count) {
    if (count <= 0) return;
    uint8_t one[8];
    switch (dt) {
    case FG_F64: memcpy(one, &(double){v}, 8); break;
    case FG_F32: memcpy(one, &(float){(float)v}, 4); break;
    case FG_BF16: memcpy(one, &(uint16_t){fg_f32_to_bf16((float)v)}, 2); break;
    case FG_F16: memcpy(one, &(uint16_t){fg_f32_to_f16((float)v)}, 2); break;
    case FG_I32: memcpy(one, &(int32_t){(int32_t)(int64_t)v}, 4); break;
    case FG_I64: memcpy(one, &(int64_t){(int64_t)v}, 8); break;
    case FG_U8: one[0] = (uint8_t)(int64_t)v; break; /* -1 wraps as in C */
    case FG_U16: memcpy(one, &(uint16_t){(uint16_t)(int64_t)v}, 2); break;
    default: return;
    }
    size_t es = fg_dtype_size(dt);
    uint8_t *q = p;
    for (int64_t i = 0; i < count; i++) memcpy(q + (size_t)i * es, one, es);
}

fg_status fg_collate_default(void *ud, const fg_fields_dataset *fd, const fg_sample_field *samples,
                             int64_t n, fg_collate_out *out) {
    static const fg_collate_opts zero = {0};
    const fg_collate_opts *o = ud ? ud : &zero;
    int nf = fd->nfields;
    for (int k = 0; k < nf; k++) {
        const fg_field_spec *s = &fd->fields[k];
        bool var = s->ndim > 0 && s->shape[0] == FG_FIELD_VAR;
        int64_t shape[FG_MAX_DIMS] = {n};
        memcpy(shape + 1, s->shape, (size_t)s->ndim * sizeof(int64_t));
        int64_t L = 0;
        if (var) {
            for (int64_t j = 0; j < n; j++) L = FG_MAX(L, samples[j * nf + k].len);
            shape[1] = L;
        }
        fg_tensor *t = fg_collate_tensor(out, s->name, s->dtype, s->ndim + 1, shape);
        if (!t) return fg_last_status() ? fg_last_status() : FG_ENOMEM;
        uint8_t *dst = fg_tensor_data(t);
        size_t row = fd->row[k], es = fg_dtype_size(s->dtype);
        size_t stride = var ? row * (size_t)L : fd->bytes[k];
        for (int64_t j = 0; j < n; j++) {
            const fg_sample_field *f = &samples[j * nf + k];
            size_t have = var ? row * (size_t)f->len : fd->bytes[k];
            if (have) memcpy(dst + (size_t)j * stride, f->data, have);
            if (var)
                fill_value(dst + (size_t)j * stride + have, s->dtype, o->pad_value,
                           (int64_t)((stride - have) / es));
        }
        if (!var || o->no_mask) continue;
        char mname[256];
        snprintf(mname, sizeof mname, "%s_mask", s->name);
        int64_t mshape[2] = {n, L};
        fg_tensor *m = fg_collate_tensor(out, mname, FG_U8, 2, mshape);
        if (!m) return fg_last_status() ? fg_last_status() : FG_ENOMEM;
        uint8_t *mp = fg_tensor_data(m);
        for (int64_t j = 0; j < n; j++) {
            int64_t len = samples[j * nf + k].len;
            memset(mp + j * L, 1, (size_t)len);
            memset(mp + j * L + len, 0, (size_t)(L - len));
        }
    }
    return FG_OK;
}
