/* ops.h's fg_ops_cpu_exp: the exp of the row kernels and GELU alone, on the
 * vector path of the ISA in use (vk_t.h's v_exp_sat), or vmath.h's fg__expf
 * on the portable path. bench/ops_bench times it on data in L1 as the
 * compute bound of the exp kernels; the tests hold every path to expf. */
#include "cpu_impl.h"
#include "vmath.h"

fg_status fg_ops_cpu_exp(const float *x, float *y, int64_t n) {
    if (n < 0) return fg_error(FG_EINVAL, "fg_ops_cpu_exp: n = %lld: expected >= 0", (long long)n);
    const fg__vk *vk;
    FG_TRY(fg__vk_get(&vk));
    if (!n) return FG_OK;
    if (vk->exp) {
        vk->exp(x, y, n);
        return FG_OK;
    }
    FG_SIMD
    for (int64_t i = 0; i < n; i++) y[i] = fg__expf(x[i]);
    return FG_OK;
}
