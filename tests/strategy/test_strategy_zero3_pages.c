/* Stage 3's pages on a model whose flat buffers span many 2 MiB blocks (a
 * GPT of 3.2M parameters, 12.7 MB per buffer), where the strategy asks for
 * transparent huge pages: on 2 and 3 ranks, against ddp on the same global
 * batch, deepspeed_stage_3 ends with ddp's parameters bitwise; after every
 * backward the gradient outside a rank's shard reads zero and no more than
 * a few of its pages are resident (a huge page a gradient faulted in across
 * a bucket's bound is released with the bucket); after zero_grad none is,
 * and between steps none of the parameters' either (the pages two units
 * share included).
 * The last unit stays gathered from its forward to its backward (FSDP's
 * default), with nothing else but the root's part, and a forward without
 * grad leaves nothing gathered. The same with small pages only
 * (FULGUR_STAGE3_HUGE_PAGES=0, or a kernel with THP off). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fulgur/strategy.h"
#include "harness.h"
#include "mp/mp_join.h"
#include "nn/nn_impl.h"
#include "strategy/strategy_impl.h"

#define STEPS 3
#define B 2
#define T 8
#define MAXN (4 << 20)

typedef struct shared {
    char job[64];
    fg_strategy_kind kind;
    int world;
    float result[MAXN];
    int64_t numel;
    /* per rank: nonzero gradient elements outside the shard after a
     * backward; most gradient bytes resident outside it after a backward
     * and after zero_grad, and parameter bytes after a step; gathered elements after a forward with
     * grad, the root's and the last unit's outside parts, and after one without */
    int64_t nonzero[4], grad_resident[4], zeroed_resident[4], param_resident[4];
    int64_t gathered_fwd[4], expect_fwd[4], gathered_eval[4], gathered_bwd[4];
} shared;

static fg_module *make_model(void) {
    return fg_gpt_new(
        &(fg_gpt_config){.vocab = 33, .ctx = T, .layers = 4, .heads = 4, .embd = 256, .seed = 7});
}

static void batch(int step, int rank, fg_tensor **x, fg_tensor **y) {
    int64_t sh[2] = {B, T};
    *x = fg_empty(FG_I32, 2, sh);
    *y = fg_empty(FG_I32, 2, sh);
    for (int64_t i = 0; i < B * T; i++) {
        uint64_t k = (uint64_t)step * 1000003u + (uint64_t)(rank * B * T + i);
        ((int32_t *)fg_tensor_data(*x))[i] = (int32_t)(fg_rng_u32_at(21, k) % 33);
        ((int32_t *)fg_tensor_data(*y))[i] = (int32_t)(fg_rng_u32_at(22, k) % 33);
    }
}

/* Resident bytes of [p, p + n) (whole pages it touches). */
static int64_t resident(const char *p, size_t n) {
    if (n == 0) return 0;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(ps - 1), b = (uintptr_t)p + n;
    size_t pages = (b - a + ps - 1) / ps;
    unsigned char *vec = malloc(pages);
    int64_t r = 0;
    if (vec && mincore((void *)a, b - a, vec) == 0)
        for (size_t i = 0; i < pages; i++) r += (vec[i] & 1) ? (int64_t)ps : 0;
    free(vec);
    return r;
}

/* Resident bytes of the flat buffer f outside elements [lo, hi). */
static int64_t outside_resident(fg_tensor *f, int64_t lo, int64_t hi) {
    const char *d = fg_tensor_data(f);
    return resident(d, (size_t)lo * 4) +
           resident(d + (size_t)hi * 4, (size_t)(fg_tensor_numel(f) - hi) * 4);
}

/* Over the Blocks under m (the units): their elements outside [lo, hi)
 * added to *outside; the last one's range in last. */
static void count_blocks(fg_module *m, int64_t lo, int64_t hi, int64_t *outside, int64_t last[2]) {
    if (m->parent && !strcmp(m->type, "Block")) {
        int64_t a = m->p_off, b = m->p_off + m->p_numel;
        *outside += (b - a) - FG_MAX(0, FG_MIN(b, hi) - FG_MAX(a, lo));
        last[0] = a;
        last[1] = b;
        return;
    }
    for (int i = 0; i < m->nchild; i++) count_blocks(m->child[i], lo, hi, outside, last);
}

static int train_rank(int rank, int n, void *arg) {
    shared *sh = arg;
    fg_comm *c = mp_join_shm(rank, n, sh->job, 60);
    if (!c) return 1;
    CHECK_OK(fg_set_num_threads(1));
    fg_module *m = make_model();
    fg_optimizer *o = fg_adamw_new(m, &(fg_adamw_opts){.lr = 1e-3, .weight_decay = 0.1});
    fg_strategy *st = fg_strategy_new(sh->kind, c, m, o, NULL, NULL, 0);
    if (!st) {
        fprintf(stderr, "rank %d: %s\n", rank, fg_last_error());
        return 1;
    }
    bool s3 = sh->kind != FG_STRATEGY_DDP;
    int64_t lo = 0, hi = 0;
    CHECK_OK(fg_strategy_param_range(st, rank, &lo, &hi));
    fg_tensor *g = fg_module_flat_grads(m);
    const float *gd = fg_tensor_data(g);
    int64_t numel = fg_tensor_numel(g);
    int bad = 0;
    for (int step = 0; step < STEPS && !bad; step++) {
        fg_optimizer_zero_grad(o);
        if (s3) {
            int64_t z = outside_resident(g, lo, hi);
            if (z > sh->zeroed_resident[rank]) sh->zeroed_resident[rank] = z;
        }
        fg_tensor *x, *y;
        batch(step, rank, &x, &y);
        fg_tensor *out = fg_module_forward(m, x);
        bad |= !out;
        if (s3 && out && step == STEPS - 1) sh->gathered_fwd[rank] = fg__zero3_gathered(st);
        fg_tensor *l = out ? fg_cross_entropy(out, y, -100) : NULL;
        bad |= !l || fg_strategy_backward(st, l) != FG_OK;
        if (s3 && !bad) {
            /* resident pages first: reading the rest maps the zero page */
            int64_t r = outside_resident(g, lo, hi);
            if (r > sh->grad_resident[rank]) sh->grad_resident[rank] = r;
            for (int64_t i = 0; i < numel; i++)
                if ((i < lo || i >= hi) && gd[i] != 0) sh->nonzero[rank]++;
            sh->gathered_bwd[rank] += fg__zero3_gathered(st);
        }
        if (!bad) bad |= fg_optimizer_step(o) != FG_OK;
        if (s3 && !bad) {
            int64_t p = outside_resident(fg_module_flat_params(m), lo, hi);
            if (p > sh->param_resident[rank]) sh->param_resident[rank] = p;
        }
        if (bad) fprintf(stderr, "rank %d step %d: %s\n", rank, step, fg_last_error());
        fg_step_reset();
    }
    if (s3 && !bad) {
        /* a forward with grad leaves gathered the root's part (what no
         * Block holds) and the last Block's, outside the shard */
        int64_t blocks = 0, last[2] = {0, 0};
        count_blocks(m, lo, hi, &blocks, last);
        int64_t outside = (numel - (hi - lo)) - blocks;
        sh->expect_fwd[rank] = outside + FG_MAX(0, FG_MIN(last[1], lo) - last[0]) +
                               FG_MAX(0, last[1] - FG_MAX(last[0], hi));
        bool was = fg_set_grad_enabled(false);
        fg_tensor *x, *y;
        batch(0, rank, &x, &y);
        bad |= !fg_module_forward(m, x);
        fg_set_grad_enabled(was);
        sh->gathered_eval[rank] = fg__zero3_gathered(st);
        fg_step_reset();
    }
    bad |= !bad && fg_strategy_gather_params(st) != FG_OK;
    fg_tensor *flat = fg_module_flat_params(m);
    sh->numel = fg_tensor_numel(flat);
    if (rank == 0) memcpy(sh->result, fg_tensor_data(flat), sizeof(float) * (size_t)sh->numel);
    bad |= mp_differs_from_rank0(c, rank, fg_tensor_data(flat), sh->numel);
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

static shared *run(fg_strategy_kind kind, int world) {
    shared *sh =
        mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return NULL;
    memset(sh, 0, sizeof *sh);
    sh->kind = kind;
    sh->world = world;
    snprintf(sh->job, sizeof sh->job, "t-z3p-%d-%d-%d", getpid(), (int)kind, world);
    int failed = fg_test_fork_ranks(world, train_rank, sh, 180);
    CHECK_MSG(failed == 0, "%s on %d ranks: %d ranks failed", fg_strategy_kind_name(kind), world,
              failed);
    if (failed) {
        munmap(sh, sizeof *sh);
        return NULL;
    }
    return sh;
}

TEST(stage3_huge_buffers_bitwise_ddp_and_released) {
    FILE *fp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char thp[128] = "";
    if (fp) {
        if (!fgets(thp, sizeof thp, fp)) thp[0] = 0;
        fclose(fp);
    }
    fprintf(stderr, "  transparent huge pages: %s", thp[0] ? thp : "unknown\n");
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    for (int k = 0; k < 4; k++) {
        int w = 2 + k % 2;
        /* huge pages where the kernel gives them, then small pages only */
        setenv("FULGUR_STAGE3_HUGE_PAGES", k < 2 ? "1" : "0", 1);
        shared *ref = run(FG_STRATEGY_DDP, w), *sh = run(FG_STRATEGY_DEEPSPEED_STAGE_3, w);
        if (ref && sh) {
            int64_t first = -1;
            for (int64_t i = 0; i < ref->numel && first < 0; i++)
                if (memcmp(&sh->result[i], &ref->result[i], sizeof(float))) first = i;
            CHECK_MSG(first < 0,
                      "%d ranks, huge pages %d: parameter %lld is %.9g, ddp's %.9g (bitwise "
                      "expected)",
                      w, k < 2, (long long)first, first < 0 ? 0 : sh->result[first],
                      first < 0 ? 0 : ref->result[first]);
            for (int r = 0; r < w; r++) {
                CHECK_MSG(sh->nonzero[r] == 0,
                          "rank %d of %d: %lld gradient elements outside the shard are not zero", r,
                          w, (long long)sh->nonzero[r]);
                /* the pages the shard's bounds and the buffer's ends cut (the
                 * ones zero_grad clears by writing), no more: none of a huge
                 * page's */
                CHECK_MSG(sh->grad_resident[r] <= (int64_t)(4 * ps),
                          "rank %d of %d: %lld gradient bytes outside the shard resident after "
                          "backward",
                          r, w, (long long)sh->grad_resident[r]);
                CHECK_MSG(sh->zeroed_resident[r] <= (int64_t)(4 * ps),
                          "rank %d of %d: %lld gradient bytes outside the shard resident after "
                          "zero_grad",
                          r, w, (long long)sh->zeroed_resident[r]);
                /* between steps the parameters outside the shard are gone,
                 * the pages two units share included */
                CHECK_MSG(sh->param_resident[r] <= (int64_t)(4 * ps),
                          "rank %d of %d: %lld parameter bytes outside the shard resident "
                          "between steps",
                          r, w, (long long)sh->param_resident[r]);
                CHECK_MSG(sh->gathered_bwd[r] == 0,
                          "rank %d of %d: %lld elements gathered after "
                          "backward",
                          r, w, (long long)sh->gathered_bwd[r]);
                CHECK_MSG(sh->expect_fwd[r] > 0 && sh->gathered_fwd[r] == sh->expect_fwd[r],
                          "rank %d of %d: %lld elements gathered after forward, expected %lld "
                          "(the root's and the last unit's)",
                          r, w, (long long)sh->gathered_fwd[r], (long long)sh->expect_fwd[r]);
                CHECK_MSG(sh->gathered_eval[r] == 0,
                          "rank %d of %d: %lld elements gathered after a forward without grad", r,
                          w, (long long)sh->gathered_eval[r]);
            }
        }
        if (ref) munmap(ref, sizeof *ref);
        if (sh) munmap(sh, sizeof *sh);
    }
    unsetenv("FULGUR_STAGE3_HUGE_PAGES");
}

static int bad_env_rank(int rank, int n, void *arg) {
    fg_comm *c = mp_join_shm(rank, n, arg, 60);
    if (!c) return 1;
    fg_module *m = make_model();
    fg_optimizer *o = fg_sgd_new(m, &(fg_sgd_opts){.lr = 0.1});
    setenv("FULGUR_STAGE3_HUGE_PAGES", "yes", 1);
    fg_strategy *st = fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_3, c, m, o, NULL, NULL, 0);
    int bad = st != NULL || fg_last_status() != FG_EINVAL ||
              !strstr(fg_last_error(), "FULGUR_STAGE3_HUGE_PAGES=\"yes\"");
    if (bad) fprintf(stderr, "setup with a bad setting: %s\n", st ? "succeeded" : fg_last_error());
    unsetenv("FULGUR_STAGE3_HUGE_PAGES");
    /* the model is whole and trains under another setup */
    if (!bad) st = fg_strategy_new(FG_STRATEGY_DEEPSPEED_STAGE_3, c, m, o, NULL, NULL, 0);
    bad |= st == NULL;
    fg_strategy_free(st);
    fg_optimizer_free(o);
    fg_module_free(m);
    fg_comm_free(c);
    return bad;
}

TEST(stage3_huge_pages_setting_checked) {
    char job[64];
    snprintf(job, sizeof job, "t-z3p-env-%d", getpid());
    CHECK(fg_test_fork_ranks(1, bad_env_rank, job, 120) == 0);
}
