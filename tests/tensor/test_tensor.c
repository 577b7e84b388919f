/* tensor: a tensor always has a real dtype. Every constructor refuses
 * FG_DTYPE_DEFAULT (0) and out-of-range dtypes with FG_EINVAL and a message
 * that says what to pass, and takes every real dtype. */
#include "fulgur/tensor.h"
#include "harness.h"

TEST(constructors_refuse_dtype_zero) {
    int64_t shape[2] = {2, 3};
    float data[6] = {0};
    fg_clear_error();
    CHECK(fg_tensor_new(FG_DTYPE_DEFAULT, 2, shape) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "FG_DTYPE_DEFAULT");
    CHECK_CONTAINS(fg_last_error(), "FG_F32");
    fg_clear_error();
    CHECK(fg_tensor_wrap(data, FG_DTYPE_DEFAULT, 2, shape) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    fg_clear_error();
    CHECK(fg_zeros(FG_DTYPE_DEFAULT, 2, shape) == NULL && fg_last_status() == FG_EINVAL);
    fg_clear_error();
    CHECK(fg_from_data(FG_DTYPE_DEFAULT, 2, shape, data) == NULL && fg_last_status() == FG_EINVAL);
    fg_clear_error();
    CHECK(fg_scalar(FG_DTYPE_DEFAULT, 1.0) == NULL && fg_last_status() == FG_EINVAL);
    fg_clear_error();
    CHECK(fg_empty(FG_DTYPE_COUNT, 2, shape) == NULL && fg_last_status() == FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "invalid dtype");
    fg_step_reset();
}

TEST(every_real_dtype_makes_a_tensor) {
    int64_t shape[1] = {3};
    for (int dt = FG_DTYPE_DEFAULT + 1; dt < FG_DTYPE_COUNT; dt++) {
        fg_tensor *t = fg_tensor_new((fg_dtype)dt, 1, shape);
        CHECK_MSG(t != NULL, "%s: %s", fg_dtype_name((fg_dtype)dt), fg_last_error());
        if (!t) continue;
        CHECK(fg_tensor_dtype(t) == (fg_dtype)dt);
        CHECK(fg_tensor_nbytes(t) == 3 * fg_dtype_size((fg_dtype)dt));
        fg_tensor_free(t);
    }
}
