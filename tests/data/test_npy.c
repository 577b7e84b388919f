/* .npy datasets: valid files as numpy writes them (built here byte by byte,
 * versions 1.0 and 2.0, every accepted dtype) and crafted bad ones, each of
 * which must give FG_EFORMAT with a message naming the file and the problem. */
#include "data/data_impl.h" /* fg__npy_dataset_open: the exact status */
#include "data_test_util.h"
#include "fulgur/data.h"
#include "harness.h"

/* Writes a .npy file: magic, version, header length, `dict` padded with
 * spaces and a newline to a multiple of 64 bytes (as numpy does), then
 * `data`. */
static void write_npy(const char *name, int major, const char *dict, const void *data, size_t n) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64;
    size_t hlen = total - pre;
    uint8_t *buf = calloc(1, total + n + 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    if (major == 1) {
        buf[8] = (uint8_t)hlen;
        buf[9] = (uint8_t)(hlen >> 8);
    } else {
        for (int i = 0; i < 4; i++) buf[8 + i] = (uint8_t)(hlen >> (8 * i));
    }
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hlen - dl - 1);
    buf[total - 1] = '\n';
    if (n) memcpy(buf + total, data, n);
    tmp_write(name, buf, total + n);
    free(buf);
}

static const float X3x2[6] = {1.0f, -2.5f, 3.25f, 4.0f, 1e-3f, -0.0f};
static const int64_t Y3[3] = {2, 0, 7};

static void write_labels(void) {
    write_npy("y.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", Y3,
              sizeof Y3);
}

static void check_rows(fg_dataset *ds, const float *want, int64_t d) {
    float x[16];
    int32_t y;
    for (int64_t i = 0; i < fg_dataset_len(ds); i++) {
        CHECK_OK(fg_dataset_get(ds, i, x, &y));
        CHECK(y == Y3[i]);
        for (int64_t k = 0; k < d; k++) CHECK_CLOSE(x[k], want[i * d + k], 1e-7, 0);
    }
}

TEST(npy_valid_f32) {
    tmp_new();
    write_npy("x.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", X3x2,
              sizeof X3x2);
    write_labels();
    fg_dataset *ds = fg_npy_dataset_new(tmp_path("x.npy"), tmp_path("y.npy"));
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (ds) {
        CHECK(fg_dataset_len(ds) == 3 && strcmp(fg_dataset_name(ds), "npy") == 0);
        const fg_sample_spec *xs = fg_dataset_x_spec(ds), *ys = fg_dataset_y_spec(ds);
        CHECK(xs->dtype == FG_F32 && xs->ndim == 1 && xs->shape[0] == 2);
        CHECK(ys->dtype == FG_I32 && ys->ndim == 0);
        check_rows(ds, X3x2, 2);
        /* through the loader: x (B, D) f32, y (B) i32 */
        fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 2});
        fg_batch *b = fg_dataloader_next(dl);
        CHECK(b && fg_tensor_ndim(b->x) == 2 && fg_tensor_dim(b->x, 1) == 2);
        CHECK(b && fg_tensor_ndim(b->y) == 1 && fg_tensor_get(b->y, 1) == 0);
        CHECK(b && fg_tensor_get(b->x, 2) == 3.25);
        fg_dataloader_free(dl);
    }
    fg_dataset_free(ds);
    tmp_done();
}

TEST(npy_valid_variants) {
    tmp_new();
    write_labels();
    /* version 2.0, double quotes, keys reordered, no trailing comma, 3-d rows */
    write_npy("x2.npy", 2, "{\"shape\": (3, 1, 2), \"fortran_order\": False, \"descr\": \"<f4\"}",
              X3x2, sizeof X3x2);
    fg_dataset *ds = fg_npy_dataset_new(tmp_path("x2.npy"), tmp_path("y.npy"));
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (ds) {
        const fg_sample_spec *xs = fg_dataset_x_spec(ds);
        CHECK(xs->ndim == 2 && xs->shape[0] == 1 && xs->shape[1] == 2);
        check_rows(ds, X3x2, 2);
    }
    fg_dataset_free(ds);

    /* f8 and u1 inputs become f32 */
    double xd[6];
    uint8_t xu[6];
    float xu_f[6];
    for (int i = 0; i < 6; i++) {
        xd[i] = X3x2[i];
        xu[i] = (uint8_t)(i * 50);
        xu_f[i] = (float)(i * 50);
    }
    write_npy("xd.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }", xd,
              sizeof xd);
    write_npy("xu.npy", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2), }", xu,
              sizeof xu);
    ds = fg_npy_dataset_new(tmp_path("xd.npy"), tmp_path("y.npy"));
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (ds) check_rows(ds, X3x2, 2);
    fg_dataset_free(ds);
    ds = fg_npy_dataset_new(tmp_path("xu.npy"), tmp_path("y.npy"));
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (ds) check_rows(ds, xu_f, 2);
    fg_dataset_free(ds);

    /* labels of every integer dtype become i32 (with sign) */
    struct {
        const char *descr;
        int size;
    } lt[] = {{"|i1", 1}, {"|u1", 1}, {"<i2", 2}, {"<u2", 2}, {"<i4", 4}, {"<u4", 4}, {"<u8", 8}};
    for (size_t t = 0; t < sizeof lt / sizeof lt[0]; t++) {
        uint8_t raw[24] = {0};
        for (int i = 0; i < 3; i++) raw[i * lt[t].size] = (uint8_t)Y3[i];
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3,), }",
                 lt[t].descr);
        write_npy("yt.npy", 1, dict, raw, (size_t)(3 * lt[t].size));
        ds = fg_npy_dataset_new(tmp_path("x2.npy"), tmp_path("yt.npy"));
        CHECK_MSG(ds != NULL, "%s: %s", lt[t].descr, fg_last_error());
        if (ds) check_rows(ds, X3x2, 2);
        fg_dataset_free(ds);
    }
    int16_t neg[3] = {-1, 5, -300};
    write_npy("yn.npy", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }", neg,
              sizeof neg);
    ds = fg_npy_dataset_new(tmp_path("x2.npy"), tmp_path("yn.npy"));
    float x[2];
    int32_t y;
    if (ds) CHECK_OK(fg_dataset_get(ds, 2, x, &y));
    CHECK(ds && y == -300);
    fg_dataset_free(ds);

    /* zero rows: a valid, empty dataset; 1-d inputs: scalar samples */
    write_npy("x0.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    write_npy("y0.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (0,), }", NULL, 0);
    ds = fg_npy_dataset_new(tmp_path("x0.npy"), tmp_path("y0.npy"));
    CHECK(ds && fg_dataset_len(ds) == 0 && fg_dataset_x_spec(ds)->shape[0] == 5);
    fg_dataset_free(ds);
    float x1[3] = {1, 2, 3};
    write_npy("x1.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", x1,
              sizeof x1);
    ds = fg_npy_dataset_new(tmp_path("x1.npy"), tmp_path("y.npy"));
    CHECK(ds && fg_dataset_x_spec(ds)->ndim == 0);
    if (ds) CHECK_OK(fg_dataset_get(ds, 1, x, &y));
    CHECK(x[0] == 2.0f);
    fg_dataset_free(ds);
    tmp_done();
}

/* Every crafted file must be refused with FG_EFORMAT, naming the file and
 * the problem. `as_labels` puts it in the labels' place. */
typedef struct bad_case {
    const char *name;
    int major;
    const char *dict;
    size_t data_bytes; /* bytes of zeros after the header */
    bool as_labels;
    const char *want; /* a piece of the message */
} bad_case;

TEST(npy_bad_headers) {
    tmp_new();
    write_labels();
    float good[6] = {0};
    write_npy("good.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", good,
              sizeof good);
    static const bad_case cases[] = {
        {"fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }", 24, false,
         "Fortran order"},
        {"bigendian.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2), }", 24,
         false, "big-endian"},
        {"complex.npy", 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (3, 2), }", 48, false,
         "'<c8' is not supported"},
        {"object.npy", 1, "{'descr': '|O', 'fortran_order': False, 'shape': (3, 2), }", 48, false,
         "'|O' is not understood"},
        {"f2.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2), }", 12, false,
         "not supported"},
        {"int_x.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }", 24, false,
         "inputs must be f4, f8 or u1"},
        {"structured.npy", 1,
         "{'descr': [('a', '<f4'), ('b', '<f4')], 'fortran_order': False, 'shape': (3,), }", 24,
         false, "structured"},
        {"nodescr.npy", 1, "{'fortran_order': False, 'shape': (3, 2), }", 24, false,
         "lacks 'descr'"},
        {"noshape.npy", 1, "{'descr': '<f4', 'fortran_order': False, }", 24, false,
         "lacks 'shape'"},
        {"extra.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), 'x': 1, }", 24,
         false, "unexpected key 'x'"},
        {"dup.npy", 1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 2)}",
         24, false, "repeats 'descr'"},
        {"notdict.npy", 1, "['descr', '<f4']", 24, false, "not a dict"},
        {"notuple.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12, false,
         "not a tuple"},
        {"negshape.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -2), }", 24,
         false, "non-negative integers"},
        {"overflow.npy", 1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", 24,
         false, "overflows"},
        {"bigdim.npy", 1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 1), }", 24,
         false, "overflows"},
        {"ninedims.npy", 1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, false,
         "more than 8 dimensions"},
        {"truncated.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 23,
         false, "truncated"},
        {"scalar.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, false,
         "scalar"},
        {"garbage.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), } x", 24,
         false, "after the header"},
        {"fortran_str.npy", 1, "{'descr': '<f4', 'fortran_order': 'no', 'shape': (3, 2), }", 24,
         false, "not True or False"},
        {"escape.npy", 1, "{'descr': '<f\\4', 'fortran_order': False, 'shape': (3, 2), }", 24,
         false, "structured"},
        {"float_labels.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 12,
         true, "integer dtype"},
        {"label_shape.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 1), }", 24,
         true, "shape (3,)"},
        {"label_count.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", 32,
         true, "not (4)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const bad_case *k = &cases[c];
        void *zeros = calloc(1, k->data_bytes + 1);
        write_npy(k->name, k->major, k->dict, zeros, k->data_bytes);
        free(zeros);
        fg_clear_error();
        fg_dataset *ds = NULL;
        fg_status st = k->as_labels
                           ? fg__npy_dataset_open(tmp_path("good.npy"), tmp_path(k->name), &ds)
                           : fg__npy_dataset_open(tmp_path(k->name), tmp_path("y.npy"), &ds);
        CHECK_MSG(ds == NULL && st == FG_EFORMAT, "%s: %s, want FG_EFORMAT", k->name,
                  fg_status_str(st));
        fg_dataset_free(ds);
        CHECK_CONTAINS(fg_last_error(), k->name);
        CHECK_CONTAINS(fg_last_error(), k->want);
    }
    tmp_done();
}

TEST(npy_bad_framing) {
    tmp_new();
    write_labels();
    float good[6] = {0};
    write_npy("good.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", good,
              sizeof good);
    struct {
        const char *name;
        const char *bytes;
        size_t n;
        const char *want;
    } raw[] = {
        {"empty.npy", "", 0, "bad magic"},
        {"magic.npy", "\x93NUMPZ\x01\x00\x10\x00{}              ", 26, "bad magic"},
        {"pickle.npy", "\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00", 10, "bad magic"},
        {"version.npy", "\x93NUMPY\x04\x00\x10\x00{}              ", 26, "version 4.0"},
        {"minor.npy", "\x93NUMPY\x01\x01\x10\x00{}              ", 26, "version 1.1"},
        {"hlen.npy", "\x93NUMPY\x01\x00\xff\x7f{}", 12, "past the end"},
        {"hlen2.npy", "\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14, "past the end"},
        {"v2short.npy", "\x93NUMPY\x02\x00\x01\x00", 10, "truncated before the header length"},
    };
    for (size_t c = 0; c < sizeof raw / sizeof raw[0]; c++) {
        tmp_write(raw[c].name, raw[c].bytes, raw[c].n);
        fg_dataset *ds = NULL;
        fg_status st = fg__npy_dataset_open(tmp_path(raw[c].name), tmp_path("y.npy"), &ds);
        CHECK_MSG(ds == NULL && st == FG_EFORMAT, "%s: %s, want FG_EFORMAT", raw[c].name,
                  fg_status_str(st));
        CHECK_CONTAINS(fg_last_error(), raw[c].name);
        CHECK_CONTAINS(fg_last_error(), raw[c].want);
        fg_dataset_free(ds);
    }
    /* a missing file is FG_EIO; the public constructor leaves the same message */
    fg_dataset *ds = NULL;
    CHECK_STATUS(fg__npy_dataset_open(tmp_path("missing.npy"), tmp_path("y.npy"), &ds), FG_EIO);
    CHECK(ds == NULL);
    CHECK_CONTAINS(fg_last_error(), "missing.npy: cannot open");
    CHECK(fg_npy_dataset_new(tmp_path("v2short.npy"), tmp_path("y.npy")) == NULL);
    CHECK_CONTAINS(fg_last_error(), "v2short.npy: not a usable .npy file");
    CHECK(fg_npy_dataset_new(tmp_path("good.npy"), NULL) == NULL);

    /* a label outside int32 */
    int64_t big[3] = {1, (int64_t)1 << 40, 2};
    write_npy("ybig.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", big,
              sizeof big);
    CHECK_STATUS(fg__npy_dataset_open(tmp_path("good.npy"), tmp_path("ybig.npy"), &ds), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "ybig.npy");
    CHECK_CONTAINS(fg_last_error(), "label 1099511627776 at row 1 does not fit in int32");
    uint64_t ubig[3] = {1, 2, ~0ull};
    write_npy("yubig.npy", 1, "{'descr': '<u8', 'fortran_order': False, 'shape': (3,), }", ubig,
              sizeof ubig);
    CHECK_STATUS(fg__npy_dataset_open(tmp_path("good.npy"), tmp_path("yubig.npy"), &ds),
                 FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "label 18446744073709551615 at row 2 does not fit in int32");
    tmp_done();
}

TEST(npy_alloc_failures_never_leak) {
    tmp_new();
    double xd[6] = {1, 2, 3, 4, 5, 6};
    write_npy("x.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }", xd,
              sizeof xd);
    write_labels();
    int fails = 0;
    for (long n = 0; n < 1000; n++) {
        fx_alloc_begin(n);
        fg_dataset *ds = NULL;
        fg_status st = fg__npy_dataset_open(tmp_path("x.npy"), tmp_path("y.npy"), &ds);
        fg_dataset_free(ds);
        long live = fx_alloc_end();
        CHECK_MSG(live == 0, "failing allocation %ld: %ld blocks leaked", n, live);
        CHECK(st == FG_OK || (st == FG_ENOMEM && ds == NULL));
        if (st == FG_OK) break;
        fails++;
    }
    CHECK(fails >= 3);
    tmp_done();
}
