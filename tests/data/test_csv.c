/* The CSV / TSV reader: the awkward files of tests/ref/gen_csv_ref.py read as Python's csv
 * module reads them (quotes, doubled quotes, separators and line breaks inside quotes, CRLF,
 * blank lines, missing values, gzip in two members), the errors naming file, line, column and
 * value, the options, a loader over a CSV dataset, and scikit-learn's 8x8 digits file. */
#include <stdint.h>

#include "data/data_impl.h"
#include "data_test_util.h"
#include "fulgur/data.h"
#include "harness.h"

#define DIGITS "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

static void unhex(const char *h, char *out) {
    size_t n = 0;
    if (strcmp(h, "-") != 0)
        for (; h[0] && h[1]; h += 2) {
            unsigned v;
            sscanf(h, "%2x", &v);
            out[n++] = (char)v;
        }
    out[n] = '\0';
}

/* Checks ds against a ref file of gen_csv_ref.py; returns the missing-value line it names. */
static int check_against_ref(fg_dataset *ds, const char *ref) {
    FILE *f = fopen(ref, "r");
    CHECK_MSG(f != NULL, "%s: cannot open (run tests/ref/gen_csv_ref.py)", ref);
    if (!f) return -1;
    const fg_sample_spec *xs = fg_dataset_x_spec(ds), *ys = fg_dataset_y_spec(ds);
    CHECK(xs->dtype == FG_F32 && xs->ndim == 1 && xs->shape[0] == 4);
    CHECK(ys->dtype == FG_I32 && ys->ndim == 0);
    char line[4096], a[1024], b[1024];
    int64_t row = 0;
    int missing = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "row ", 4) == 0) {
            int y;
            double x[4];
            CHECK(sscanf(line + 4, "%d %lf %lf %lf %lf", &y, &x[0], &x[1], &x[2], &x[3]) == 5);
            float gx[4] = {0};
            int32_t gy = -99;
            CHECK_OK(fg_dataset_get(ds, row, gx, &gy));
            CHECK_MSG(gy == y, "row %lld: label %d, Python %d", (long long)row, gy, y);
            for (int k = 0; k < 4; k++)
                CHECK_MSG(gx[k] == (float)x[k], "row %lld column %d: %.9g, Python %.17g",
                          (long long)row, k, gx[k], x[k]);
            row++;
        } else if (strncmp(line, "cat ", 4) == 0) {
            char hcol[1024], htext[1024];
            int k;
            CHECK(sscanf(line + 4, "%1023s %d %1023s", hcol, &k, htext) == 3);
            unhex(hcol, a);
            unhex(htext, b);
            const char *got = fg_csv_dataset_category(ds, a, k);
            CHECK_MSG(got && strcmp(got, b) == 0, "category %d of '%s': \"%s\", Python \"%s\"", k,
                      a, got ? got : "(null)", b);
            CHECK(fg_csv_dataset_category(ds, a, k + 100) == NULL);
        } else if (strncmp(line, "missing ", 8) == 0) {
            missing = atoi(line + 8);
        }
    }
    fclose(f);
    CHECK(row == fg_dataset_len(ds));
    return missing;
}

static void check_file(const char *path, const char *ref) {
    fg_dataset *ds =
        fg_csv_dataset_new(path, &(fg_csv_opts){.fill_missing = true, .fill_value = -1});
    CHECK_MSG(ds != NULL, "%s: %s", path, fg_last_error());
    if (!ds) return;
    CHECK(fg_dataset_len(ds) == 7);
    CHECK(strcmp(fg_dataset_name(ds), "csv") == 0);
    CHECK(strcmp(fg_csv_dataset_label(ds), "label") == 0);
    CHECK(strcmp(fg_csv_dataset_feature(ds, 0), "id") == 0);
    CHECK(strcmp(fg_csv_dataset_feature(ds, 1), "name, full") == 0);
    CHECK(strcmp(fg_csv_dataset_feature(ds, 3), "note\nmulti") == 0);
    CHECK(fg_csv_dataset_feature(ds, 4) == NULL);
    CHECK(fg_csv_dataset_num_categories(ds, "name, full") == 5);
    CHECK(fg_csv_dataset_num_categories(ds, "score") == 0);
    int missing = check_against_ref(ds, ref);
    fg_dataset_free(ds);

    /* without fill_missing the same value is an error naming file, line and column */
    const char *feats[] = {"id", "score"};
    fg_dataset *bad = NULL;
    CHECK_STATUS(
        fg__csv_dataset_open(path, &(fg_csv_opts){.features = feats, .nfeatures = 2}, &bad),
        FG_EFORMAT);
    CHECK(bad == NULL);
    char want[600];
    snprintf(want, sizeof want, "%s:%d: column 'score' (3): a missing value", path, missing);
    CHECK_CONTAINS(fg_last_error(), want);
}

TEST(csv_matches_python_csv_module) {
    check_file("data/csv/awkward.csv", "data/csv/awkward_ref.txt");
}

TEST(csv_gzip_in_two_members_reads_as_the_plain_file) {
    check_file("data/csv/awkward.csv.gz", "data/csv/awkward_ref.txt");
}

TEST(tsv_by_its_name_matches_python) {
    check_file("data/csv/awkward.tsv", "data/csv/awkward_tsv_ref.txt");
}

static fg_status open_text(const char *name, const char *text, const fg_csv_opts *o,
                           fg_dataset **ds) {
    tmp_write(name, text, strlen(text));
    return fg__csv_dataset_open(tmp_path(name), o, ds);
}

#define CHECK_ERR(name, text, opts, status, needle)                                                \
    do {                                                                                           \
        fg_dataset *d_ = NULL;                                                                     \
        CHECK_STATUS(open_text(name, text, opts, &d_), status);                                    \
        CHECK(d_ == NULL);                                                                         \
        CHECK_CONTAINS(fg_last_error(), needle);                                                   \
        CHECK_CONTAINS(fg_last_error(), name);                                                     \
        fg_dataset_free(d_);                                                                       \
    } while (0)

TEST(csv_errors_name_file_line_column_value) {
    tmp_new();
    CHECK_ERR("q.csv", "a,b\n1,2\n3,\"unterminated\n4,5\n", NULL, FG_EFORMAT,
              "q.csv:3: field 2: a quote is never closed");
    CHECK_ERR("n.csv", "a,b\n1,2\n\n3,4,5\n", NULL, FG_EFORMAT,
              "n.csv:4: 3 fields, but the header has 2");
    CHECK_ERR("f.csv", "a,b\n1,2\nabc,3\n",
              (&(fg_csv_opts){.columns = (fg_csv_column[]){{"a", FG_CSV_FLOAT}}, .ncolumns = 1}),
              FG_EFORMAT, "f.csv:3: column 'a' (1): value \"abc\" is not a number");
    CHECK_ERR("i.csv", "a,b\n1,2\n1,99999999999\n",
              (&(fg_csv_opts){.columns = (fg_csv_column[]){{"b", FG_CSV_INT}}, .ncolumns = 1}),
              FG_EFORMAT, "i.csv:3: column 'b' (2): value \"99999999999\" is not an integer");
    CHECK_ERR("i2.csv", "a,b\n1,2.5\n",
              (&(fg_csv_opts){.columns = (fg_csv_column[]){{"b", FG_CSV_INT}}, .ncolumns = 1}),
              FG_EFORMAT, "value \"2.5\" is not an integer");
    CHECK_ERR("m.csv", "a,b\n1,2\n,3\n", NULL, FG_EFORMAT,
              "m.csv:3: column 'a' (1): a missing value");
    CHECK_ERR("c.csv", "a,b\n1,\"2\"x\n", NULL, FG_EFORMAT, "c.csv:2: field 2: 'x' after a");
    CHECK_ERR("e.csv", "", NULL, FG_EFORMAT, "e.csv: an empty file");
    CHECK_ERR("h.csv", "a,b\r\n\r\n", NULL, FG_EFORMAT, "h.csv: a header but no data rows");
    CHECK_ERR("l.csv", "a,b\n1,2\n", (&(fg_csv_opts){.label = "c"}), FG_EINVAL,
              "label 'c' is no column of the header (it has 'a', 'b')");
    CHECK_ERR(
        "t.csv", "a,b\n1,2\n",
        (&(fg_csv_opts){.label = "a", .features = (const char *[]){"b", "a"}, .nfeatures = 2}),
        FG_EINVAL, "feature 'a' is the label");
    CHECK_ERR("s.csv", "a,b\n1,2\n",
              (&(fg_csv_opts){.columns = (fg_csv_column[]){{"b", FG_CSV_SKIP}}, .ncolumns = 1}),
              FG_EINVAL, "the label column 'b' is marked FG_CSV_SKIP");
    CHECK_ERR("d.csv", "a,a,b\n1,2,3\n",
              (&(fg_csv_opts){.features = (const char *[]){"a"}, .nfeatures = 1}), FG_EINVAL,
              "feature 'a' is ambiguous: columns 1 and 2");
    fg_dataset *ds = NULL;
    CHECK_STATUS(fg__csv_dataset_open(tmp_path("absent.csv"), NULL, &ds), FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "absent.csv: cannot open");

    /* a gzip stream cut short */
    FILE *f = fopen("data/csv/awkward.csv.gz", "rb");
    CHECK(f != NULL);
    if (f) {
        char gz[4096];
        size_t n = fread(gz, 1, sizeof gz, f);
        fclose(f);
        tmp_write("cut.csv.gz", gz, n / 3);
        CHECK_STATUS(fg__csv_dataset_open(tmp_path("cut.csv.gz"), NULL, &ds), FG_EIO);
        CHECK_CONTAINS(fg_last_error(), "cut.csv.gz");
        CHECK_CONTAINS(fg_last_error(), "gzip");
    }
    tmp_done();
}

TEST(csv_options_sep_header_features_types) {
    tmp_new();
    fg_dataset *ds = NULL;
    /* ';' separator, no header, features chosen in another order, a skipped column, a
     * category label, CRLF endings and no final line break */
    const char *t = "1;x;dog;2.5\r\n2;y;cat;-4\r\n3;z;dog;1e1";
    CHECK_OK(open_text("p.txt", t,
                       &(fg_csv_opts){.sep = ';',
                                      .no_header = true,
                                      .label = "2",
                                      .features = (const char *[]){"3", "0"},
                                      .nfeatures = 2,
                                      .columns = (fg_csv_column[]){{"1", FG_CSV_SKIP}},
                                      .ncolumns = 1},
                       &ds));
    if (ds) {
        CHECK(fg_dataset_len(ds) == 3);
        CHECK(fg_dataset_x_spec(ds)->shape[0] == 2);
        CHECK(fg_dataset_y_spec(ds)->dtype == FG_I32);
        CHECK(strcmp(fg_csv_dataset_label(ds), "2") == 0);
        CHECK(strcmp(fg_csv_dataset_category(ds, "2", 0), "cat") == 0);
        CHECK(strcmp(fg_csv_dataset_category(ds, "2", 1), "dog") == 0);
        float x[2];
        int32_t y;
        float want[3][2] = {{2.5f, 1}, {-4, 2}, {10, 3}};
        int32_t wy[3] = {1, 0, 1};
        for (int i = 0; i < 3; i++) {
            CHECK_OK(fg_dataset_get(ds, i, x, &y));
            CHECK(x[0] == want[i][0] && x[1] == want[i][1] && y == wy[i]);
        }
        fg_dataset_free(ds);
    }
    /* a float label is f32; a forced category feature of numbers is its sorted index as text;
     * a missing value with fill_missing becomes fill_value */
    CHECK_OK(open_text("r.csv", "k,v,target\n10,,0.5\n9,1,1.25\n10,2,-2\n",
                       &(fg_csv_opts){.columns = (fg_csv_column[]){{"k", FG_CSV_CATEGORY}},
                                      .ncolumns = 1,
                                      .fill_missing = true,
                                      .fill_value = 7},
                       &ds));
    if (ds) {
        CHECK(fg_dataset_y_spec(ds)->dtype == FG_F32);
        float x[2], y;
        CHECK_OK(fg_dataset_get(ds, 0, x, &y));
        CHECK(x[0] == 0 && x[1] == 7 && y == 0.5f); /* "10" < "9" in byte order */
        CHECK_OK(fg_dataset_get(ds, 1, x, &y));
        CHECK(x[0] == 1 && x[1] == 1 && y == 1.25f);
        CHECK_OK(fg_dataset_get(ds, 2, x, &y));
        CHECK(x[0] == 0 && x[1] == 2 && y == -2.0f);
        fg_dataset_free(ds);
    }
    /* a UTF-8 byte order mark is not part of the first name */
    CHECK_OK(open_text("bom.csv",
                       "\xEF\xBB\xBF"
                       "a,b\n1,2\n",
                       &(fg_csv_opts){.label = "b"}, &ds));
    if (ds) CHECK(strcmp(fg_csv_dataset_feature(ds, 0), "a") == 0);
    fg_dataset_free(ds);
    tmp_done();
}

TEST(csv_alloc_failures_never_leak) {
    int fails = 0;
    for (long n = 0; n < 2000; n++) {
        fx_alloc_begin(n);
        fg_dataset *ds = NULL;
        fg_status st = fg__csv_dataset_open("data/csv/awkward.csv.gz",
                                            &(fg_csv_opts){.fill_missing = true}, &ds);
        fg_dataset_free(ds);
        long live = fx_alloc_end();
        CHECK_MSG(live == 0, "failing allocation %ld: %ld blocks leaked", n, live);
        CHECK(st == FG_OK || (st == FG_ENOMEM && ds == NULL));
        if (st == FG_OK) break;
        fails++;
    }
    CHECK(fails >= 10);
}

TEST(csv_digits_from_scikit_learn) {
    if (access(DIGITS, R_OK) != 0) SKIP("%s is absent (Debian's python3-sklearn ships it)", DIGITS);
    fg_dataset *ds = fg_csv_dataset_new(DIGITS, &(fg_csv_opts){.no_header = true});
    CHECK_MSG(ds != NULL, "%s", fg_last_error());
    if (!ds) return;
    CHECK(fg_dataset_len(ds) == 1797);
    CHECK(fg_dataset_x_spec(ds)->shape[0] == 64);
    CHECK(fg_dataset_y_spec(ds)->dtype == FG_I32);
    CHECK(strcmp(fg_csv_dataset_label(ds), "64") == 0);
    float x[64];
    int32_t y;
    CHECK_OK(fg_dataset_get(ds, 0, x, &y));
    CHECK(y == 0 && x[0] == 0 && x[2] == 5 && x[3] == 13 && x[4] == 9 && x[63] == 0);
    CHECK_OK(fg_dataset_get(ds, 1, x, &y));
    CHECK(y == 1 && x[3] == 12 && x[4] == 13 && x[5] == 5);
    CHECK_OK(fg_dataset_get(ds, 1796, x, &y));
    CHECK(y == 8 && x[2] == 10 && x[3] == 14 && x[62] == 1);

    /* the label counts of load_digits(), read through a loader in batches of 64 */
    fg_dataloader *dl = fg_dataloader_new(ds, &(fg_loader_opts){.batch = 64, .num_workers = 2});
    CHECK(dl != NULL);
    if (dl) {
        CHECK(fg_dataloader_len(dl) == 29);
        int64_t count[10] = {0}, seen = 0;
        double first_ten = 0;
        for (fg_batch *b; (b = fg_dataloader_next(dl)) != NULL;) {
            CHECK(fg_tensor_shape(b->x)[1] == 64 && fg_tensor_shape(b->x)[0] == b->size);
            const int32_t *yb = fg_tensor_data(b->y);
            const float *xb = fg_tensor_data(b->x);
            for (int64_t j = 0; j < b->size; j++) {
                CHECK(yb[j] >= 0 && yb[j] <= 9);
                if (yb[j] >= 0 && yb[j] <= 9) count[yb[j]]++;
                for (int k = 0; k < 10; k++) first_ten += xb[j * 64 + k];
            }
            seen += b->size;
        }
        CHECK_OK(fg_dataloader_status(dl));
        CHECK(seen == 1797);
        const int64_t want[10] = {178, 182, 177, 183, 181, 182, 181, 179, 174, 180};
        for (int k = 0; k < 10; k++)
            CHECK_MSG(count[k] == want[k], "label %d: %lld, want %lld", k, (long long)count[k],
                      (long long)want[k]);
        CHECK(first_ten == 69123); /* awk over the file's first ten columns */
        fg_dataloader_free(dl);
    }
    fg_dataset_free(ds);
}
