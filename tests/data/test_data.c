/* The data layer: text and token datasets, vocabulary, callback datasets,
 * subsets, IDX files, samplers and the loader (order, shuffle, drop_last,
 * workers == synchronous, resume, rank shards, errors from workers); files
 * that report 0 bytes but hold some (/proc/version) are read to their end. */
#include <limits.h>
#include <pthread.h>

#include "data/data_impl.h" /* fg__*_open: the exact status */
#include "data_test_util.h"
#include "fulgur/data.h"
#include "harness.h"

/* ---------------------------------------------------------------- text */

static const char *TEXT = "hello world, hello fulgur!\nthe quick brown fox\n";

TEST(text_windows_and_vocab) {
    tmp_new();
    size_t n = strlen(TEXT);
    tmp_write("t.txt", TEXT, n);
    int64_t ctx = 5;
    fg_dataset *ds = fg_text_dataset_new(tmp_path("t.txt"), ctx, NULL);
    CHECK(ds != NULL);
    if (!ds) goto out;
    CHECK(fg_dataset_len(ds) == (int64_t)(n - 1) / ctx);
    const fg_sample_spec *xs = fg_dataset_x_spec(ds), *ys = fg_dataset_y_spec(ds);
    CHECK(xs->dtype == FG_I32 && xs->ndim == 1 && xs->shape[0] == ctx);
    CHECK(ys->dtype == FG_I32 && ys->ndim == 1 && ys->shape[0] == ctx);
    CHECK(strcmp(fg_dataset_name(ds), "text") == 0);

    /* the vocabulary is the sorted set of distinct bytes */
    const fg_text_vocab *v = fg_text_dataset_vocab(ds);
    CHECK(v != NULL);
    bool seen[256] = {false};
    int distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (!seen[(uint8_t)TEXT[i]]) seen[(uint8_t)TEXT[i]] = true, distinct++;
    CHECK(fg_text_vocab_size(v) == distinct);
    CHECK(fg_dataset_vocab_size(ds) == distinct);
    const uint8_t *bytes = fg_text_vocab_bytes(v);
    for (int k = 1; k < distinct; k++) CHECK(bytes[k - 1] < bytes[k]);
    CHECK(bytes[0] == '\n');

    /* every window: x = tokens[s, s+ctx), y = tokens[s+1, s+ctx+1), s = i*ctx */
    int32_t x[5], y[5];
    for (int64_t i = 0; i < fg_dataset_len(ds); i++) {
        CHECK_OK(fg_dataset_get(ds, i, x, y));
        for (int k = 0; k < ctx; k++) {
            CHECK(bytes[x[k]] == (uint8_t)TEXT[i * ctx + k]);
            CHECK(bytes[y[k]] == (uint8_t)TEXT[i * ctx + k + 1]);
        }
    }
    CHECK_STATUS(fg_dataset_get(ds, fg_dataset_len(ds), x, y), FG_EINVAL);
    CHECK_STATUS(fg_dataset_get(ds, -1, x, y), FG_EINVAL);
    CHECK(fg_text_dataset_vocab(NULL) == NULL);
    fg_dataset_free(ds);
out:
    tmp_done();
}

/* /proc/version says it has 0 bytes (st_size) and holds a line of text:
 * the text reader and the file mapper read it to its end */
TEST(files_reporting_no_size_are_read_whole) {
    FILE *fp = fopen("/proc/version", "rb");
    if (!fp) SKIP("no /proc/version");
    char want[4096];
    size_t n = fread(want, 1, sizeof want, fp);
    fclose(fp);
    struct stat sb;
    CHECK(stat("/proc/version", &sb) == 0 && sb.st_size == 0);
    CHECK(n > 8);
    fg_dataset *ds = fg_text_dataset_new("/proc/version", 4, NULL);
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (ds) {
        CHECK_MSG(fg_dataset_len(ds) == (int64_t)(n - 1) / 4, "%lld windows of %zu bytes",
                  (long long)fg_dataset_len(ds), n);
        const fg_text_vocab *v = fg_text_dataset_vocab(ds);
        CHECK(v && fg_text_vocab_id(v, (unsigned char)want[0]) >= 0);
    }
    fg_dataset_free(ds);
    fg__map m;
    CHECK_OK(fg__map_file("/proc/version", &m));
    CHECK(m.len == n && m.owned && m.p && !memcmp(m.p, want, n));
    fg__unmap(&m);
    CHECK(m.p == NULL);
    /* an empty file stays empty */
    tmp_new();
    tmp_write("empty", "", 0);
    CHECK_OK(fg__map_file(tmp_path("empty"), &m));
    CHECK(m.p == NULL && m.len == 0);
    /* a pipe is still refused (it could be read forever) */
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    char pth[64];
    snprintf(pth, sizeof pth, "/proc/self/fd/%d", pfd[0]);
    CHECK(fg_text_dataset_new(pth, 4, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "not a regular file");
    close(pfd[0]);
    close(pfd[1]);
}

TEST(text_exact_fit) {
    /* ntokens - 1 == ctx * k exactly: the last window's y ends on the last byte */
    tmp_new();
    tmp_write("t.txt", "abcdefg", 7);
    fg_dataset *ds = fg_text_dataset_new(tmp_path("t.txt"), 3, NULL);
    CHECK(ds && fg_dataset_len(ds) == 2);
    if (ds) {
        int32_t x[3], y[3];
        CHECK_OK(fg_dataset_get(ds, 1, x, y));
        CHECK(x[0] == 3 && x[2] == 5 && y[2] == 6); /* 'd','f' / 'g' */
    }
    fg_dataset_free(ds);
    tmp_done();
}

TEST(text_folder_concatenates_sorted) {
    const char *d = tmp_new();
    char sub[600];
    snprintf(sub, sizeof sub, "%s/sub", d);
    mkdir(sub, 0700);
    tmp_write("b", "BBBB\n", 5);
    tmp_write("a", "aaaa\n", 5);
    tmp_write("a.dat", "\x01\x02\x03zzzz", 7); /* fortune index: skipped */
    tmp_write("b.u8", "uuuu", 4);              /* fortune symlink name: skipped */
    tmp_write(".hidden", "hhhh", 4);
    tmp_write("sub/c", "cccc", 4); /* subfolders are not entered */
    fg_dataset *ds = fg_text_dataset_new(d, 3, NULL);
    CHECK(ds != NULL);
    if (ds) {
        const fg_text_vocab *v = fg_text_dataset_vocab(ds);
        CHECK(fg_text_vocab_size(v) == 3); /* '\n', 'B', 'a' */
        CHECK(fg_dataset_len(ds) == 3);    /* 10 tokens */
        char text[11];
        int32_t ids[10], x[3], y[3];
        for (int i = 0; i < 3; i++) {
            CHECK_OK(fg_dataset_get(ds, i, x, y));
            memcpy(ids + 3 * i, x, sizeof x);
            if (i == 2) ids[9] = y[2];
        }
        CHECK_OK(fg_text_vocab_decode(v, ids, 10, text));
        CHECK(strcmp(text, "aaaa\nBBBB\n") == 0);
    }
    fg_dataset_free(ds);
    tmp_write("empty-folder-marker", "", 0);
    tmp_done();
    tmp_new();
    CHECK(fg_text_dataset_new(tmp_dir_, 3, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "no text file");
    tmp_done();
}

TEST(text_vocab_encode_decode) {
    const char *s = "to be, or not to be";
    fg_text_vocab *v = fg_text_vocab_from_text(s, strlen(s));
    CHECK(v != NULL);
    if (!v) return;
    int32_t ids[64];
    char back[65];
    CHECK_OK(fg_text_vocab_encode(v, s, strlen(s), ids));
    CHECK_OK(fg_text_vocab_decode(v, ids, (int64_t)strlen(s), back));
    CHECK(strcmp(back, s) == 0);
    CHECK(fg_text_vocab_id(v, ' ') == 0 && fg_text_vocab_id(v, 'Z') == -1);
    CHECK_STATUS(fg_text_vocab_encode(v, "tox", 3, ids), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "'x' at position 2");
    int32_t bad[2] = {0, 99};
    CHECK_STATUS(fg_text_vocab_decode(v, bad, 2, back), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "id 99 at position 1");

    /* restore from the saved bytes (as a checkpoint would): same ids */
    fg_text_vocab *r = fg_text_vocab_new(fg_text_vocab_bytes(v), fg_text_vocab_size(v));
    CHECK(r && fg_text_vocab_size(r) == fg_text_vocab_size(v));
    int32_t ids2[64];
    if (r) CHECK_OK(fg_text_vocab_encode(r, s, strlen(s), ids2));
    CHECK(r && memcmp(ids, ids2, strlen(s) * sizeof(int32_t)) == 0);
    fg_text_vocab_free(r);
    /* any order of distinct bytes; duplicates and sizes are checked */
    fg_text_vocab *z = fg_text_vocab_new((const uint8_t *)"zab", 3);
    CHECK(z && fg_text_vocab_id(z, 'z') == 0 && fg_text_vocab_id(z, 'b') == 2);
    fg_text_vocab_free(z);
    CHECK(fg_text_vocab_new((const uint8_t *)"aba", 3) == NULL);
    CHECK_CONTAINS(fg_last_error(), "twice");
    CHECK(fg_text_vocab_new((const uint8_t *)"a", 0) == NULL);
    CHECK(fg_text_vocab_from_text("", 0) == NULL);
    fg_text_vocab_free(v);
    fg_text_vocab_free(NULL);
}

TEST(text_with_given_vocab_and_errors) {
    tmp_new();
    tmp_write("train.txt", "abcabcabc", 9);
    tmp_write("val.txt", "cab", 3);
    tmp_write("other.txt", "abz", 3);
    fg_dataset *tr = fg_text_dataset_new(tmp_path("train.txt"), 2, NULL);
    CHECK(tr != NULL);
    if (tr) {
        const fg_text_vocab *v = fg_text_dataset_vocab(tr);
        fg_dataset *va = fg_text_dataset_new(tmp_path("val.txt"), 2, v);
        CHECK(va && fg_dataset_len(va) == 1);
        int32_t x[2], y[2];
        if (va) CHECK_OK(fg_dataset_get(va, 0, x, y));
        CHECK(va && x[0] == 2 && x[1] == 0 && y[1] == 1);
        fg_dataset_free(va);
        CHECK(fg_text_dataset_new(tmp_path("other.txt"), 2, v) == NULL);
        CHECK_CONTAINS(fg_last_error(), "other.txt");
        CHECK_CONTAINS(fg_last_error(), "'z' at offset 2");
    }
    fg_dataset_free(tr);
    fg_dataset *ds = NULL;
    CHECK_STATUS(fg__text_dataset_open(tmp_path("missing.txt"), 2, NULL, &ds), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "missing.txt");
    CHECK_STATUS(fg__text_dataset_open(tmp_path("val.txt"), 3, NULL, &ds), FG_EINVAL); /* < ctx+1 */
    CHECK_CONTAINS(fg_last_error(), "fewer than ctx + 1");
    CHECK(fg_text_dataset_new(tmp_path("val.txt"), 0, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "ctx=0");
    tmp_done();
}

TEST(text_fortunes) {
    const char *dir = "/usr/share/games/fortunes";
    struct stat sb;
    if (stat(dir, &sb) != 0) SKIP("%s not installed (apt-get install fortunes)", dir);
    fg_dataset *ds = fg_text_dataset_new(dir, 64, NULL);
    CHECK(ds != NULL);
    if (!ds) return;
    CHECK(fg_dataset_len(ds) > 1000);
    const fg_text_vocab *v = fg_text_dataset_vocab(ds);
    CHECK(fg_text_vocab_size(v) > 60 && fg_text_vocab_size(v) <= 256);
    /* "art" sorts first: window 0 is its first 64 bytes */
    FILE *f = fopen("/usr/share/games/fortunes/art", "rb");
    if (f) {
        char want[65] = {0}, got[65];
        CHECK(fread(want, 1, 64, f) == 64);
        fclose(f);
        int32_t x[64], y[64];
        CHECK_OK(fg_dataset_get(ds, 0, x, y));
        CHECK_OK(fg_text_vocab_decode(v, x, 64, got));
        CHECK(memcmp(want, got, 64) == 0);
    }
    fg_dataset_free(ds);
}

/* ------------------------------------------------------------ tokens */

static void put16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

TEST(tokens_raw_and_llmc) {
    tmp_new();
    enum { N = 23 };
    unsigned ids[N];
    for (int i = 0; i < N; i++) ids[i] = (unsigned)(i * 2851) % 50257;
    uint8_t raw[2 * N], llmc[1024 + 2 * N];
    memset(llmc, 0, sizeof llmc);
    for (int i = 0; i < N; i++) put16(raw + 2 * i, ids[i]);
    put32(llmc, FG_LLMC_TOKEN_MAGIC);
    put32(llmc + 4, 1);
    put32(llmc + 8, N);
    memcpy(llmc + 1024, raw, sizeof raw);
    tmp_write("train.bin", raw, sizeof raw);
    tmp_write("train_llmc.bin", llmc, sizeof llmc);
    unsigned maxid = 0;
    for (int i = 0; i < N; i++) maxid = ids[i] > maxid ? ids[i] : maxid;
    const char *names[2] = {"train.bin", "train_llmc.bin"};
    for (int f = 0; f < 2; f++) {
        fg_dataset *ds = fg_token_dataset_new(tmp_path(names[f]), 4, 0);
        CHECK_MSG(ds != NULL, "%s: %s", names[f], fg_last_error());
        if (!ds) continue;
        CHECK(fg_dataset_len(ds) == (N - 1) / 4);
        CHECK(fg_dataset_vocab_size(ds) == maxid + 1);
        int32_t x[4], y[4];
        for (int64_t i = 0; i < fg_dataset_len(ds); i++) {
            CHECK_OK(fg_dataset_get(ds, i, x, y));
            for (int k = 0; k < 4; k++) {
                CHECK(x[k] == (int32_t)ids[4 * i + k]);
                CHECK(y[k] == (int32_t)ids[4 * i + k + 1]);
            }
        }
        fg_dataset_free(ds);
    }
    fg_dataset *ds = fg_token_dataset_new(tmp_path("train.bin"), 4, 50257);
    CHECK(ds && fg_dataset_vocab_size(ds) == 50257);
    fg_dataset_free(ds);
    /* an id outside the given vocabulary */
    CHECK_STATUS(fg__token_dataset_open(tmp_path("train.bin"), 4, 100, &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "train.bin");
    CHECK_CONTAINS(fg_last_error(), "token 1 is id 2851");
    /* an odd size */
    tmp_write("odd.bin", raw, sizeof raw - 1);
    CHECK_STATUS(fg__token_dataset_open(tmp_path("odd.bin"), 4, 0, &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "odd.bin");
    /* an llm.c header whose count disagrees with the size */
    tmp_write("short_llmc.bin", llmc, sizeof llmc - 2);
    CHECK_STATUS(fg__token_dataset_open(tmp_path("short_llmc.bin"), 4, 0, &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "short_llmc.bin: llm.c header says 23 tokens");
    put32(llmc + 4, 2);
    tmp_write("v2_llmc.bin", llmc, sizeof llmc);
    CHECK_STATUS(fg__token_dataset_open(tmp_path("v2_llmc.bin"), 4, 0, &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "version 2");
    tmp_write("hdr_only.bin", llmc, 100);
    CHECK_STATUS(fg__token_dataset_open(tmp_path("hdr_only.bin"), 4, 0, &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "shorter than its 1024-byte header");
    /* too few tokens, bad arguments, a missing file */
    CHECK_STATUS(fg__token_dataset_open(tmp_path("train.bin"), N, 0, &ds), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "fewer than ctx + 1");
    CHECK(fg_token_dataset_new(tmp_path("train.bin"), 0, 0) == NULL);
    CHECK(fg_token_dataset_new(tmp_path("train.bin"), 4, -1) == NULL);
    CHECK_STATUS(fg__token_dataset_open(tmp_path("nope.bin"), 4, 0, &ds), FG_EIO);
    CHECK(ds == NULL);
    CHECK_CONTAINS(fg_last_error(), "nope.bin");
    tmp_done();
}

/* ------------------------------------------------- callback datasets */

/* x = (i, i+0.5) f32, y = i * 10 i32; fails at index `fail_at` when >= 0 */
typedef struct cb {
    int64_t n, fail_at;
    int delay_us;
} cb;

static int64_t cb_len(void *ud) { return ((cb *)ud)->n; }
static void cb_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = 1, .shape = {2}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}
static fg_status cb_get(void *ud, int64_t i, void *xo, void *yo) {
    cb *c = ud;
    if (c->delay_us) usleep((useconds_t)c->delay_us);
    if (i == c->fail_at) return fg_error(FG_EIO, "disk on fire at %lld", (long long)i);
    float *x = xo;
    x[0] = (float)i;
    x[1] = (float)i + 0.5f;
    *(int32_t *)yo = (int32_t)(i * 10);
    return FG_OK;
}
static int cb_frees;
static void cb_free(void *ud) {
    cb_frees++;
    fg_free(ud);
}
static const fg_dataset_ops CB_OPS = {cb_len, cb_spec, cb_get, cb_free};

static fg_dataset *cb_new(int64_t n, int64_t fail_at, int delay_us) {
    cb *c = fg_alloc(sizeof *c);
    *c = (cb){n, fail_at, delay_us};
    return fg_dataset_new(&CB_OPS, c, "counting");
}

/* x's dtype left 0: the default, f32 */
static void default_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.ndim = 1, .shape = {2}};
    *y = (fg_sample_spec){.dtype = FG_I32, .ndim = 0};
}

TEST(spec_dtype_zero_is_f32) {
    fg_sample_spec s = {.ndim = 1, .shape = {3}};
    CHECK(fg_sample_spec_bytes(&s) == 12);
    fg_dataset_ops ops = CB_OPS;
    ops.spec = default_spec;
    cb *c = fg_alloc(sizeof *c);
    *c = (cb){4, -1, 0};
    fg_dataset *ds = fg_dataset_new(&ops, c, "default-dtype");
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (!ds) return;
    CHECK(fg_dataset_x_spec(ds)->dtype == FG_F32);
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2});
    fg_batch *b = dl ? fg_dataloader_next(dl) : NULL;
    CHECK(b && fg_tensor_dtype(b->x) == FG_F32 && fg_tensor_get(b->x, 3) == 1.5);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
}

static void bad_spec(void *ud, fg_sample_spec *x, fg_sample_spec *y) {
    (void)ud;
    *x = (fg_sample_spec){.dtype = FG_F32, .ndim = FG_MAX_DIMS};
    *y = (fg_sample_spec){.dtype = FG_I32};
}

TEST(callback_dataset_subset_split) {
    int frees0 = cb_frees;
    fg_dataset *ds = cb_new(10, -1, 0);
    CHECK(ds && fg_dataset_len(ds) == 10 && strcmp(fg_dataset_name(ds), "counting") == 0);
    CHECK(fg_sample_spec_bytes(fg_dataset_x_spec(ds)) == 8);
    CHECK(fg_sample_spec_bytes(fg_dataset_y_spec(ds)) == 4);
    CHECK(fg_dataset_vocab_size(ds) == 0);
    float x[2];
    int32_t y;
    CHECK_OK(fg_dataset_get(ds, 3, x, &y));
    CHECK(x[0] == 3.0f && x[1] == 3.5f && y == 30);

    fg_dataset *sub = fg_dataset_subset(ds, 2, 5);
    CHECK(sub && fg_dataset_len(sub) == 5);
    if (sub) CHECK_OK(fg_dataset_get(sub, 4, x, &y));
    CHECK(y == 60);
    CHECK_STATUS(fg_dataset_get(sub, 5, x, &y), FG_EINVAL);
    fg_dataset_free(sub);
    CHECK(fg_dataset_subset(ds, 8, 3) == NULL);
    CHECK_CONTAINS(fg_last_error(), "not inside [0, 10)");

    fg_dataset *tr, *va;
    CHECK_OK(fg_dataset_split(ds, 0.1, &tr, &va));
    CHECK(tr && va && fg_dataset_len(tr) == 9 && fg_dataset_len(va) == 1);
    if (va) CHECK_OK(fg_dataset_get(va, 0, x, &y));
    CHECK(y == 90);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    CHECK_OK(fg_dataset_split(ds, 0.25, &tr, &va)); /* ceil(2.5) = 3 */
    CHECK(tr && va && fg_dataset_len(tr) == 7 && fg_dataset_len(va) == 3);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    CHECK_OK(fg_dataset_split(ds, 0.0, &tr, &va));
    CHECK(fg_dataset_len(tr) == 10 && fg_dataset_len(va) == 0);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    CHECK_STATUS(fg_dataset_split(ds, 1.0, &tr, &va), FG_EINVAL);
    CHECK(tr == NULL && va == NULL);
    CHECK_STATUS(fg_dataset_split(ds, 0.95, &tr, &va), FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "no training sample");
    fg_dataset_free(ds);
    CHECK(cb_frees == frees0 + 1);

    /* a bad spec or missing function: NULL, and ud is freed */
    cb *c = fg_alloc(sizeof *c);
    *c = (cb){1, -1, 0};
    fg_dataset_ops bad = CB_OPS;
    bad.spec = bad_spec;
    CHECK(fg_dataset_new(&bad, c, "bad") == NULL);
    CHECK_CONTAINS(fg_last_error(), "dataset bad: x has 8 dims");
    CHECK(cb_frees == frees0 + 2);
    c = fg_alloc(sizeof *c);
    bad = CB_OPS;
    bad.get = NULL;
    CHECK(fg_dataset_new(&bad, c, NULL) == NULL);
    CHECK(cb_frees == frees0 + 3);
    fg_dataset_free(NULL);
}

TEST(text_split_keeps_vocab) {
    tmp_new();
    tmp_write("t.txt", TEXT, strlen(TEXT));
    fg_dataset *ds = fg_text_dataset_new(tmp_path("t.txt"), 4, NULL), *tr = NULL, *va = NULL;
    CHECK(ds != NULL);
    if (ds) CHECK_OK(fg_dataset_split(ds, 0.1, &tr, &va));
    if (tr && va) {
        int64_t n = fg_dataset_len(ds);
        CHECK(fg_dataset_len(va) == (n + 9) / 10 && fg_dataset_len(tr) + fg_dataset_len(va) == n);
        CHECK(fg_text_dataset_vocab(va) == fg_text_dataset_vocab(ds));
        CHECK(fg_dataset_vocab_size(tr) == fg_dataset_vocab_size(ds));
        int32_t a[4], b[4], c[4], d[4];
        CHECK_OK(fg_dataset_get(va, 0, a, b));
        CHECK_OK(fg_dataset_get(ds, n - fg_dataset_len(va), c, d));
        CHECK(memcmp(a, c, sizeof a) == 0 && memcmp(b, d, sizeof b) == 0);
    }
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_dataset_free(ds);
    tmp_done();
}

/* --------------------------------------------------------------- IDX */

TEST(idx_mnist_layout) {
    tmp_new();
    enum { N = 3, R = 2, C = 3 };
    uint8_t img[16 + N * R * C], lab[8 + N];
    uint8_t hdr[16] = {0, 0, 8, 3, 0, 0, 0, N, 0, 0, 0, R, 0, 0, 0, C};
    memcpy(img, hdr, 16);
    for (int i = 0; i < N * R * C; i++) img[16 + i] = (uint8_t)(i * 15);
    uint8_t lh[8] = {0, 0, 8, 1, 0, 0, 0, N};
    memcpy(lab, lh, 8);
    for (int i = 0; i < N; i++) lab[8 + i] = (uint8_t)(7 - i);
    tmp_write("img", img, sizeof img);
    tmp_write("lab", lab, sizeof lab);
    fg_dataset *ds = fg_idx_dataset_new(tmp_path("img"), tmp_path("lab"));
    CHECK(ds && fg_dataset_len(ds) == N);
    if (ds) {
        const fg_sample_spec *xs = fg_dataset_x_spec(ds);
        CHECK(xs->dtype == FG_F32 && xs->ndim == 1 && xs->shape[0] == R * C);
        float x[R * C];
        int32_t y;
        CHECK_OK(fg_dataset_get(ds, 2, x, &y));
        CHECK(y == 5);
        for (int k = 0; k < R * C; k++) CHECK_CLOSE(x[k], (2 * R * C + k) * 15 / 255.0, 1e-6, 0);
    }
    fg_dataset_free(ds);
    tmp_write("short", img, sizeof img - 1);
    CHECK_STATUS(fg__idx_dataset_open(tmp_path("short"), tmp_path("lab"), &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "short: truncated");
    uint8_t gz[4] = {0x1f, 0x8b, 8, 0};
    tmp_write("img.gz", gz, 4);
    CHECK_STATUS(fg__idx_dataset_open(tmp_path("img.gz"), tmp_path("lab"), &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "gunzip");
    lab[7] = N + 1;
    tmp_write("lab4", lab, sizeof lab);
    CHECK_STATUS(fg__idx_dataset_open(tmp_path("img"), tmp_path("lab4"), &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "lab4");
    tmp_done();
}

/* ------------------------------------------------------------ samplers */

static bool is_permutation(const int64_t *a, int64_t n) {
    bool *seen = calloc((size_t)n + 1, 1);
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) {
        if (a[i] < 0 || a[i] >= n || seen[a[i]]) ok = false;
        else seen[a[i]] = true;
    }
    free(seen);
    return ok;
}

TEST(sampler_sequential_and_random) {
    enum { N = 100 };
    int64_t a[N], b[N], c[N], d[N];
    fg_sampler *s = fg_sampler_sequential(N);
    CHECK(fg_sampler_len(s) == N && fg_sampler_num_real(s) == N);
    CHECK_OK(fg_sampler_indices(s, 3, a));
    for (int i = 0; i < N; i++) CHECK(a[i] == i);
    fg_sampler_free(s);

    fg_sampler *r1 = fg_sampler_random(N, 42), *r2 = fg_sampler_random(N, 42),
               *r3 = fg_sampler_random(N, 43);
    CHECK_OK(fg_sampler_indices(r1, 0, a));
    CHECK_OK(fg_sampler_indices(r2, 0, b));
    CHECK_OK(fg_sampler_indices(r1, 1, c));
    CHECK_OK(fg_sampler_indices(r3, 0, d));
    CHECK(is_permutation(a, N) && is_permutation(c, N) && is_permutation(d, N));
    CHECK(memcmp(a, b, sizeof a) == 0);                                /* same seed, epoch */
    CHECK(memcmp(a, c, sizeof a) != 0 && memcmp(a, d, sizeof a) != 0); /* epoch, seed */
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += a[i] == i;
    CHECK(fixed < 10);
    /* a fresh sampler asked for epoch 1 directly: depends on (seed, epoch) only */
    CHECK_OK(fg_sampler_indices(r2, 1, b));
    CHECK(memcmp(b, c, sizeof b) == 0);
    CHECK_STATUS(fg_sampler_indices(r1, -1, a), FG_EINVAL);
    fg_sampler_free(r1);
    fg_sampler_free(r2);
    fg_sampler_free(r3);
    fg_sampler *e = fg_sampler_random(0, 1);
    CHECK(e && fg_sampler_len(e) == 0);
    if (e) CHECK_OK(fg_sampler_indices(e, 0, NULL));
    fg_sampler_free(e);
    CHECK(fg_sampler_random(-1, 0) == NULL);
    fg_sampler_free(NULL);
}

/* What PyTorch's DistributedSampler(shuffle=False) gives, worked by hand from
 * its code: indices += indices[:padding] (cyclic), then [rank:total:world]. */
TEST(sampler_distributed_matches_pytorch_unshuffled) {
    struct {
        int64_t n;
        int world;
        bool drop;
        int64_t want[4][6];
        int per;
    } cases[] = {
        {10, 3, false, {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}, 4},
        {10, 3, true, {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}, 3},
        {2, 5, false, {{0}, {1}, {0}, {1}}, 1}, /* padding longer than the list */
        {2, 5, true, {{0}}, 0},
        {8, 4, false, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, 2},
        {5, 2, false, {{0, 2, 4}, {1, 3, 0}}, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int r = 0; r < cases[c].world && r < 4; r++) {
            fg_sampler *s = fg_sampler_distributed(
                cases[c].n, r, cases[c].world, &(fg_distributed_opts){.drop_last = cases[c].drop});
            CHECK(s && fg_sampler_len(s) == cases[c].per);
            CHECK(fg_sampler_rank(s) == r && fg_sampler_world(s) == cases[c].world);
            int64_t got[8];
            if (s) CHECK_OK(fg_sampler_indices(s, 5, got));
            for (int j = 0; j < cases[c].per; j++)
                CHECK_MSG(got[j] == cases[c].want[r][j], "case %zu rank %d [%d]: %lld, want %lld",
                          c, r, j, (long long)got[j], (long long)cases[c].want[r][j]);
            fg_sampler_free(s);
        }
    }
    /* n=10, world=3: padding is position 9 of ranks 1 and 2 */
    fg_sampler *s1 = fg_sampler_distributed(10, 1, 3, NULL),
               *s0 = fg_sampler_distributed(10, 0, 3, NULL);
    CHECK(fg_sampler_num_real(s0) == 4 && fg_sampler_num_real(s1) == 3);
    fg_sampler_free(s0);
    fg_sampler_free(s1);
    CHECK(fg_sampler_distributed(10, 3, 3, NULL) == NULL);
    CHECK_CONTAINS(fg_last_error(), "rank=3, world=3");
    CHECK(fg_sampler_distributed(10, 0, 0, NULL) == NULL);
}

TEST(sampler_distributed_structure) {
    int64_t ns[] = {0, 1, 2, 5, 10, 11, 13, 64, 97};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int world = 1; world <= 8; world++)
            for (int flags = 0; flags < 4; flags++) {
                int64_t n = ns[a];
                bool shuffle = flags & 1, drop = flags & 2;
                fg_distributed_opts o = {.shuffle = shuffle, .seed = 7, .drop_last = drop};
                int64_t *perm = malloc(sizeof(int64_t) * (size_t)(n + 1));
                fg_sampler *ref = shuffle ? fg_sampler_random(n, 7) : fg_sampler_sequential(n);
                CHECK_OK(fg_sampler_indices(ref, 3, perm));
                fg_sampler_free(ref);
                int64_t per = drop ? n / world : (n + world - 1) / world;
                int *count = calloc((size_t)n + 1, sizeof(int));
                for (int r = 0; r < world; r++) {
                    fg_sampler *s = fg_sampler_distributed(n, r, world, &o);
                    CHECK(s && fg_sampler_len(s) == per); /* equal counts on every rank */
                    if (!s) continue;
                    int64_t *got = malloc(sizeof(int64_t) * (size_t)(per + 1));
                    CHECK_OK(fg_sampler_indices(s, 3, got));
                    int64_t real = 0;
                    for (int64_t j = 0; j < per; j++) {
                        int64_t pos = r + j * world; /* position r + j*W of the padded list */
                        CHECK(got[j] == perm[pos % n]);
                        if (pos < n) {
                            count[got[j]]++;
                            real++;
                        }
                    }
                    CHECK_MSG(fg_sampler_num_real(s) == real,
                              "n %lld world %d rank %d: real %lld want %lld", (long long)n, world,
                              r, (long long)fg_sampler_num_real(s), (long long)real);
                    free(got);
                    fg_sampler_free(s);
                }
                /* the real samples of all ranks: each index once (all of them without drop_last) */
                int64_t covered = 0;
                for (int64_t i = 0; i < n; i++) {
                    CHECK(count[i] <= 1);
                    covered += count[i];
                }
                CHECK(covered == (drop ? per * world : n));
                free(count);
                free(perm);
            }
}

/* ---------------------------------------------------------------- loader */

/* All batches of one epoch as (index list, y values), for comparisons. */
typedef struct epoch_rec {
    int64_t nb, ns;
    int64_t idx[512];
    int32_t y[512];
    int64_t size[128];
} epoch_rec;

static fg_status run_epoch(fg_dataloader *dl, epoch_rec *r) {
    memset(r, 0, sizeof *r);
    for (fg_batch *b; (b = fg_dataloader_next(dl)) != NULL;) {
        r->size[r->nb++] = b->size;
        const int32_t *y = fg_tensor_data(b->y);
        const float *x = fg_tensor_data(b->x);
        for (int64_t j = 0; j < b->size; j++) {
            if (x[2 * j] != (float)b->indices[j] || y[j] != b->indices[j] * 10)
                return fg_error(FG_EINTERNAL, "batch content does not match its indices");
            r->idx[r->ns] = b->indices[j];
            r->y[r->ns++] = y[j];
        }
    }
    return fg_dataloader_status(dl);
}

TEST(loader_sequential_batches) {
    fg_dataset *ds = cb_new(10, -1, 0);
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 4});
    CHECK(dl && fg_dataloader_len(dl) == 3 && fg_dataloader_num_samples(dl) == 10);
    if (!dl) return;
    fg_batch *b = fg_dataloader_next(dl);
    CHECK(b && b->size == 4 && b->valid == 4 && b->index == 0 && b->epoch == 0);
    if (b) {
        CHECK(fg_tensor_ndim(b->x) == 2 && fg_tensor_dim(b->x, 0) == 4 &&
              fg_tensor_dim(b->x, 1) == 2);
        CHECK(fg_tensor_dtype(b->x) == FG_F32 && fg_tensor_dtype(b->y) == FG_I32);
        CHECK(fg_tensor_ndim(b->y) == 1 && fg_tensor_dim(b->y, 0) == 4);
        CHECK(fg_tensor_is_persistent(b->x));
        CHECK(fg_tensor_get(b->x, 3) == 1.5 && fg_tensor_get(b->y, 3) == 30);
    }
    b = fg_dataloader_next(dl);
    CHECK(b && b->index == 1 && b->indices[0] == 4);
    b = fg_dataloader_next(dl);
    CHECK(b && b->size == 2 && fg_tensor_dim(b->x, 0) == 2 && fg_tensor_numel(b->y) == 2);
    CHECK(b && b->indices[1] == 9 && fg_tensor_get(b->y, 1) == 90);
    int64_t e, k;
    fg_dataloader_position(dl, &e, &k);
    CHECK(e == 0 && k == 3);
    CHECK(fg_dataloader_next(dl) == NULL && fg_dataloader_status(dl) == FG_OK);
    CHECK(fg_dataloader_next(dl) == NULL); /* stays at the end */
    CHECK_OK(fg_dataloader_reset(dl));
    b = fg_dataloader_next(dl);
    CHECK(b && b->index == 0 && b->size == 4 && fg_tensor_dim(b->x, 0) == 4);
    fg_dataloader_free(dl);

    dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 4, .drop_last = true});
    CHECK(dl && fg_dataloader_len(dl) == 2);
    epoch_rec r;
    CHECK_OK(run_epoch(dl, &r));
    CHECK(r.nb == 2 && r.ns == 8 && r.idx[7] == 7);
    fg_dataloader_free(dl);

    dl = fg_dataloader_new(ds, NULL); /* batch 1 */
    CHECK(dl && fg_dataloader_len(dl) == 10);
    fg_dataloader_free(dl);
    CHECK(fg_dataloader_new(ds, &(fg_loader_opts){.batch = -1}) == NULL);
    CHECK(fg_dataloader_new(ds, &(fg_loader_opts){.num_workers = -1}) == NULL);
    CHECK(fg_dataloader_new(NULL, NULL) == NULL);
    fg_dataloader_free(NULL);
    fg_dataset_free(ds);
}

TEST(loader_text_batch_shapes) {
    tmp_new();
    tmp_write("t.txt", TEXT, strlen(TEXT));
    fg_dataset *ds = fg_text_dataset_new(tmp_path("t.txt"), 8, NULL);
    fg_dataloader *dl = ds ? fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2}) : NULL;
    CHECK(dl != NULL);
    fg_batch *b = dl ? fg_dataloader_next(dl) : NULL;
    CHECK(b != NULL);
    if (b) {
        CHECK(fg_tensor_dtype(b->x) == FG_I32 && fg_tensor_ndim(b->x) == 2);
        CHECK(fg_tensor_dim(b->x, 0) == 2 && fg_tensor_dim(b->x, 1) == 8);
        CHECK(fg_tensor_dim(b->y, 0) == 2 && fg_tensor_dim(b->y, 1) == 8);
        /* row 1 is window 1: y[1][k] == x[1][k+1] and x[1][0] == y[0][7] */
        const int32_t *x = fg_tensor_data(b->x), *y = fg_tensor_data(b->y);
        for (int k = 0; k < 7; k++) CHECK(y[8 + k] == x[8 + k + 1]);
        CHECK(x[8] == y[7]);
    }
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
    tmp_done();
}

TEST(loader_shuffle_reproducible_and_workers_equal_sync) {
    fg_dataset *ds = cb_new(103, -1, 0);
    fg_loader_opts base = {.batch = 8, .shuffle = true, .seed = 1234};
    fg_dataloader *ref = fg_dataloader_new(ds, &base);
    epoch_rec e0, e1, r;
    CHECK_OK(run_epoch(ref, &e0));
    CHECK(e0.nb == 13 && e0.ns == 103 && e0.size[12] == 7);
    CHECK(is_permutation(e0.idx, 103));
    CHECK_OK(fg_dataloader_set_epoch(ref, 1));
    CHECK_OK(run_epoch(ref, &e1));
    CHECK(is_permutation(e1.idx, 103) && memcmp(e0.idx, e1.idx, sizeof e0.idx) != 0);
    /* the shuffle is the random sampler's permutation of (seed, epoch) */
    fg_sampler *s = fg_sampler_random(103, 1234);
    int64_t perm[103];
    CHECK_OK(fg_sampler_indices(s, 1, perm));
    CHECK(memcmp(perm, e1.idx, sizeof perm) == 0);
    fg_sampler_free(s);
    fg_dataloader_free(ref);

    struct {
        int workers, prefetch, delay;
    } cfg[] = {{1, 0, 0}, {1, 1, 0}, {2, 0, 0}, {3, 1, 0}, {4, 16, 0}, {2, 3, 200}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        fg_dataset *d2 = cfg[c].delay ? cb_new(103, -1, cfg[c].delay) : ds;
        fg_loader_opts o = base;
        o.num_workers = cfg[c].workers;
        o.prefetch = cfg[c].prefetch;
        fg_dataloader *dl = fg_dataloader_new(d2, &o);
        CHECK(dl != NULL);
        if (!dl) continue;
        CHECK_OK(run_epoch(dl, &r));
        CHECK_MSG(r.nb == e0.nb && memcmp(r.idx, e0.idx, sizeof r.idx) == 0 &&
                      memcmp(r.y, e0.y, sizeof r.y) == 0,
                  "workers %d prefetch %d: epoch 0 differs from synchronous", cfg[c].workers,
                  cfg[c].prefetch);
        CHECK_OK(fg_dataloader_set_epoch(dl, 1));
        CHECK_OK(run_epoch(dl, &r));
        CHECK(memcmp(r.idx, e1.idx, sizeof r.idx) == 0);
        /* switching epochs in the middle of one, with workers running ahead */
        CHECK_OK(fg_dataloader_set_epoch(dl, 0));
        CHECK(fg_dataloader_next(dl) != NULL && fg_dataloader_next(dl) != NULL);
        CHECK_OK(fg_dataloader_set_epoch(dl, 1));
        CHECK_OK(run_epoch(dl, &r));
        CHECK(memcmp(r.idx, e1.idx, sizeof r.idx) == 0);
        fg_dataloader_free(dl);
        if (d2 != ds) fg_dataset_free(d2);
    }
    /* free while workers are mid-epoch: joins without hanging */
    fg_loader_opts o = base;
    o.num_workers = 2;
    fg_dataloader *dl = fg_dataloader_new(ds, &o);
    CHECK(dl && fg_dataloader_next(dl) != NULL);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
}

TEST(loader_resume_same_batches) {
    fg_dataset *ds = cb_new(50, -1, 0);
    for (int workers = 0; workers <= 2; workers++) {
        fg_loader_opts o = {.batch = 6, .shuffle = true, .seed = 99, .num_workers = workers};
        fg_dataloader *a = fg_dataloader_new(ds, &o);
        epoch_rec full;
        CHECK_OK(fg_dataloader_set_epoch(a, 2));
        CHECK_OK(run_epoch(a, &full));
        /* the first loader stops after 3 batches of epoch 2 and saves its position */
        CHECK_OK(fg_dataloader_set_epoch(a, 2));
        for (int i = 0; i < 3; i++) CHECK(fg_dataloader_next(a) != NULL);
        int64_t e, k;
        fg_dataloader_position(a, &e, &k);
        CHECK(e == 2 && k == 3);
        fg_dataloader_free(a);
        /* a new loader resumes there and gives exactly the rest */
        fg_dataloader *b = fg_dataloader_new(ds, &o);
        CHECK_OK(fg_dataloader_set_position(b, e, k));
        epoch_rec rest;
        CHECK_OK(run_epoch(b, &rest));
        CHECK(rest.nb == full.nb - 3 && rest.ns == full.ns - 18);
        CHECK(memcmp(rest.idx, full.idx + 18, (size_t)rest.ns * sizeof(int64_t)) == 0);
        /* resuming at the end of an epoch: nothing left, then the next epoch */
        CHECK_OK(fg_dataloader_set_position(b, 2, fg_dataloader_len(b)));
        CHECK(fg_dataloader_next(b) == NULL && fg_dataloader_status(b) == FG_OK);
        CHECK_STATUS(fg_dataloader_set_position(b, 2, fg_dataloader_len(b) + 1), FG_EINVAL);
        CHECK_CONTAINS(fg_last_error(), "outside [0, 9]");
        CHECK_STATUS(fg_dataloader_set_position(b, -1, 0), FG_EINVAL);
        fg_dataloader_free(b);
    }
    fg_dataset_free(ds);
}

TEST(loader_rank_shards_cover_epoch) {
    enum { N = 37, W = 4, B = 3 };
    fg_dataset *ds = cb_new(N, -1, 0);
    int count[N] = {0};
    int64_t len0 = -1;
    for (int r = 0; r < W; r++) {
        fg_dataloader *dl =
            fg_dataloader_new(ds, &(fg_loader_opts){.batch = B, .num_workers = r % 2});
        CHECK_OK(fg_dataloader_set_sampler(
            dl,
            fg_sampler_distributed(N, r, W, &(fg_distributed_opts){.shuffle = true, .seed = 5})));
        CHECK_OK(fg_dataloader_set_epoch(dl, 4));
        CHECK(fg_sampler_rank(fg_dataloader_sampler(dl)) == r);
        CHECK(fg_dataloader_num_samples(dl) == 10); /* ceil(37 / 4) */
        if (len0 < 0) len0 = fg_dataloader_len(dl);
        CHECK(fg_dataloader_len(dl) == len0 && len0 == 4); /* same steps on every rank */
        int64_t nb = 0, valid = 0;
        for (fg_batch *b; (b = fg_dataloader_next(dl)) != NULL; nb++) {
            for (int64_t j = 0; j < b->valid; j++) count[b->indices[j]]++;
            valid += b->valid;
            CHECK(b->valid == b->size || b->index == len0 - 1);
        }
        CHECK(nb == len0 && fg_dataloader_status(dl) == FG_OK);
        CHECK(valid == (r == 0 ? 10 : 9)); /* 37 = 10 + 9 + 9 + 9: 3 padding samples */
        fg_dataloader_free(dl);
    }
    for (int i = 0; i < N; i++) CHECK_MSG(count[i] == 1, "index %d seen %d times", i, count[i]);
    fg_dataset_free(ds);
}

static int64_t bad_len(void *ud) {
    (void)ud;
    return 3;
}
static fg_status bad_indices(void *ud, int64_t epoch, int64_t *out) {
    (void)ud;
    (void)epoch;
    out[0] = 0;
    out[1] = 1;
    out[2] = 1000;
    return FG_OK;
}

TEST(loader_set_sampler_checks_indices) {
    fg_dataset *ds = cb_new(10, -1, 0);
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2});
    CHECK_STATUS(fg_dataloader_set_sampler(
                     dl, fg_sampler_new(&(fg_sampler_ops){bad_len, bad_indices, NULL}, NULL)),
                 FG_EINVAL);
    CHECK_CONTAINS(fg_last_error(), "index 1000 at position 2");
    CHECK(fg_dataloader_len(dl) == 5); /* the old sampler is kept */
    CHECK_STATUS(fg_dataloader_set_sampler(dl, NULL), FG_EINVAL);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);
}

TEST(loader_worker_error_reaches_caller) {
    for (int workers = 0; workers <= 3; workers++) {
        fg_dataset *ds = cb_new(20, 13, 0);
        fg_dataloader *dl = fg_dataloader_new(
            ds, &(fg_loader_opts){.batch = 4, .num_workers = workers, .prefetch = 4});
        int got = 0;
        fg_batch *b;
        while ((b = fg_dataloader_next(dl)) != NULL) got++;
        CHECK_MSG(got == 3, "workers %d: %d batches before the failing one", workers, got);
        CHECK(fg_dataloader_status(dl) == FG_EIO);
        CHECK_CONTAINS(fg_last_error(), "disk on fire at 13");
        CHECK_CONTAINS(fg_last_error(), "sample 13 (batch 3 of epoch 0)");
        fg_clear_error();
        CHECK(fg_dataloader_next(dl) == NULL && fg_dataloader_status(dl) == FG_EIO);
        CHECK_CONTAINS(fg_last_error(), "disk on fire"); /* repeated on later calls */
        CHECK_OK(fg_dataloader_reset(dl));
        CHECK(fg_dataloader_status(dl) == FG_OK);
        CHECK(fg_dataloader_next(dl) != NULL);
        fg_dataloader_free(dl);
        fg_dataset_free(ds);
    }
}

/* Records the worker info seen for each sample. */
static uint64_t info_sample_seed[64];
static uint64_t info_seed[64];
static int info_id[64];
static fg_status info_get(void *ud, int64_t i, void *xo, void *yo) {
    const fg_worker_info *w = fg_data_worker_info();
    if (!w) return fg_error(FG_EINTERNAL, "no worker info inside get");
    info_sample_seed[i] = w->sample_seed;
    info_seed[i] = w->seed;
    info_id[i] = w->id;
    return cb_get(ud, i, xo, yo);
}

TEST(loader_worker_info_seeds) {
    fg_dataset_ops ops = CB_OPS;
    ops.get = info_get;
    cb *c = fg_alloc(sizeof *c);
    *c = (cb){64, -1, 0};
    fg_dataset *ds = fg_dataset_new(&ops, c, "info");
    uint64_t ref[64];
    for (int workers = 0; workers <= 3; workers++) {
        fg_dataloader *dl = fg_dataloader_new(
            ds, &(fg_loader_opts){.batch = 4, .seed = 77, .num_workers = workers});
        epoch_rec r;
        CHECK_OK(run_epoch(dl, &r));
        if (workers == 0) memcpy(ref, info_sample_seed, sizeof ref);
        CHECK(memcmp(ref, info_sample_seed, sizeof ref) == 0); /* any worker count */
        for (int i = 0; i < 64; i++) {
            CHECK(info_id[i] >= 0 && info_id[i] < (workers ? workers : 1));
            CHECK(info_seed[i] == fg_rng_derive(fg_rng_derive(77, 0), (uint64_t)info_id[i]));
        }
        CHECK_OK(fg_dataloader_set_epoch(dl, 1));
        CHECK_OK(run_epoch(dl, &r));
        CHECK(memcmp(ref, info_sample_seed, sizeof ref) != 0); /* epoch changes them */
        fg_dataloader_free(dl);
    }
    CHECK(fg_data_worker_info() == NULL);
    float x[2];
    int32_t y;
    CHECK_STATUS(fg_dataset_get(ds, 0, x, &y), FG_EINTERNAL); /* outside a loader: NULL */
    fg_dataset_free(ds);
}

/* Fails the n-th allocation for every n along a whole run (datasets,
 * samplers, a loader with workers, an epoch): every step either works or
 * fails cleanly with a message, and nothing leaks. */
static fg_status alloc_run(void) {
    fg_status st = FG_OK;
    fg_dataset *ds = fg_text_dataset_new(tmp_path("t.txt"), 4, NULL), *tr = NULL, *va = NULL;
    fg_dataset *tok = fg_token_dataset_new(tmp_path("tok.bin"), 4, 0);
    fg_dataloader *dl = NULL;
    if (!ds || !tok) goto fail;
    if ((st = fg_dataset_split(ds, 0.2, &tr, &va)) != FG_OK) goto fail;
    if (!(dl = fg_dataloader_new(tr,
                                 &(fg_loader_opts){.batch = 2, .shuffle = true, .num_workers = 2})))
        goto fail;
    if ((st = fg_dataloader_set_sampler(
             dl, fg_sampler_distributed(fg_dataset_len(tr), 1, 2,
                                        &(fg_distributed_opts){.shuffle = true}))) != FG_OK)
        goto fail;
    if ((st = fg_dataloader_set_epoch(dl, 1)) != FG_OK) goto fail;
    while (fg_dataloader_next(dl)) {
    }
    st = fg_dataloader_status(dl);
    fg_dataloader_free(dl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_dataset_free(ds);
    fg_dataset_free(tok);
    return st;
fail:
    if (fg_last_error()[0] == '\0') st = FG_EINTERNAL; /* a failure must leave a message */
    fg_dataloader_free(dl);
    fg_dataset_free(tr);
    fg_dataset_free(va);
    fg_dataset_free(ds);
    fg_dataset_free(tok);
    return st == FG_OK ? FG_ENOMEM : st;
}

TEST(alloc_failures_never_leak) {
    tmp_new();
    tmp_write("t.txt", TEXT, strlen(TEXT));
    uint8_t raw[64];
    for (int i = 0; i < 64; i++) raw[i] = (uint8_t)(i % 7);
    tmp_write("tok.bin", raw, sizeof raw);
    int fails = 0;
    for (long n = 0; n < 10000; n++) {
        fg_clear_error();
        fx_alloc_begin(n);
        fg_status st = alloc_run();
        long live = fx_alloc_end();
        CHECK_MSG(live == 0, "failing allocation %ld: %ld blocks leaked", n, live);
        bool passed_up = st == FG_ENOMEM && strstr(fg_last_error(), "NULL sampler: out of memory");
        CHECK_MSG(st == FG_OK || st == FG_ENOMEM || passed_up, "failing allocation %ld: %s (%s)", n,
                  fg_status_str(st), fg_last_error());
        if (st == FG_OK) break;
        fails++;
    }
    CHECK(fails > 10);
    tmp_done();
}

/* ------------------------------------------------------------- ownership */

/* The user data of fg_dataset_new and fg_sampler_new and the sampler of
 * fg_dataloader_set_sampler are consumed, also when the call fails: each is
 * freed exactly once on every path (a bad argument, each failed allocation),
 * and nothing else is left behind. The user data is malloc'ed so that the
 * count of frees, the live blocks of the failing allocator and ASan's leak
 * check all see it. */
static int g_ud_frees;
static void ud_free(void *ud) {
    g_ud_frees++;
    free(ud);
}
static cb *cb_malloc(int64_t n) {
    cb *c = malloc(sizeof *c);
    *c = (cb){n, -1, 0};
    return c;
}
static int64_t four_len(void *ud) {
    (void)ud;
    return 4;
}
static int64_t negative_len(void *ud) {
    (void)ud;
    return -1;
}
static fg_status reversed(void *ud, int64_t epoch, int64_t *out) {
    (void)ud;
    (void)epoch;
    for (int i = 0; i < 4; i++) out[i] = 3 - i;
    return FG_OK;
}

TEST(consumed_arguments_are_freed_on_every_failure) {
    fg_dataset_ops dops = CB_OPS;
    dops.free = ud_free;
    /* bad arguments */
    g_ud_frees = 0;
    fg_dataset_ops no_get = dops;
    no_get.get = NULL;
    CHECK(fg_dataset_new(&no_get, cb_malloc(4), "x") == NULL && g_ud_frees == 1);
    fg_dataset_ops bad = dops;
    bad.spec = bad_spec;
    CHECK(fg_dataset_new(&bad, cb_malloc(4), "x") == NULL && g_ud_frees == 2);
    CHECK(fg_last_status() == FG_EINVAL);
    fg_sampler_ops sops = {four_len, reversed, ud_free};
    fg_sampler_ops no_indices = {four_len, NULL, ud_free};
    fg_sampler_ops negative = {negative_len, reversed, ud_free};
    CHECK(fg_sampler_new(&no_indices, malloc(8)) == NULL && g_ud_frees == 3);
    CHECK(fg_sampler_new(&negative, malloc(8)) == NULL && g_ud_frees == 4);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK_STATUS(fg_dataloader_set_sampler(NULL, fg_sampler_new(&sops, malloc(8))), FG_EINVAL);
    CHECK(g_ud_frees == 5);
    fg_dataset *ds = cb_new(4, -1, 0);
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2});
    fg_sampler_ops wrong = {bad_len, bad_indices, ud_free};
    CHECK_STATUS(fg_dataloader_set_sampler(dl, fg_sampler_new(&wrong, malloc(8))), FG_EINVAL);
    CHECK(g_ud_frees == 6);
    fg_dataloader_free(dl);
    fg_dataset_free(ds);

    /* every failed allocation of fg_dataset_new and fg_sampler_new */
    for (int which = 0; which < 2; which++) {
        int fails = 0;
        for (long n = 0; n < 1000; n++) {
            int before = g_ud_frees;
            void *ud = which == 0 ? (void *)cb_malloc(4) : malloc(8);
            fg_clear_error();
            fx_alloc_begin(n);
            void *obj;
            if (which == 0) {
                fg_dataset *d = fg_dataset_new(&dops, ud, "counting");
                obj = d;
                fg_dataset_free(d);
            } else {
                fg_sampler *s = fg_sampler_new(&sops, ud);
                obj = s;
                fg_sampler_free(s);
            }
            long live = fx_alloc_end();
            CHECK_MSG(live == 0, "%s, failing allocation %ld: %ld blocks leaked",
                      which ? "sampler" : "dataset", n, live);
            CHECK_MSG(g_ud_frees == before + 1, "%s, failing allocation %ld: ud freed %d times",
                      which ? "sampler" : "dataset", n, g_ud_frees - before);
            if (obj) break;
            CHECK(fg_last_status() == FG_ENOMEM);
            fails++;
        }
        CHECK(fails > 0);
    }

    /* every failed allocation of fg_dataloader_set_sampler: the sampler is
     * freed, the loader keeps its previous one and still works */
    int fails = 0;
    for (long n = 0; n < 1000; n++) {
        fx_alloc_begin(LONG_MAX);
        ds = cb_new(4, -1, 0);
        dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2});
        fg_sampler *s = fg_sampler_new(&sops, malloc(8));
        CHECK(ds && dl && s);
        int before = g_ud_frees;
        fx_alloc_limit(fx_alloc_count() + n);
        fg_status st = fg_dataloader_set_sampler(dl, s);
        fx_alloc_limit(LONG_MAX);
        if (st != FG_OK) {
            CHECK(st == FG_ENOMEM && g_ud_frees == before + 1);
            fails++;
        }
        fg_batch *b = fg_dataloader_next(dl);
        CHECK(b && b->size == 2);
        /* the reversed order when the new sampler took, else 0, 1 */
        CHECK(b && b->indices[0] == (st == FG_OK ? 3 : 0));
        fg_dataloader_free(dl);
        fg_dataset_free(ds);
        long live = fx_alloc_end();
        CHECK_MSG(live == 0, "set_sampler, failing allocation %ld: %ld blocks leaked", n, live);
        if (st == FG_OK) {
            CHECK(g_ud_frees == before + 1); /* by fg_dataloader_free */
            break;
        }
    }
    CHECK(fails > 0);
}
