/* The image-folder dataset against PIL's values (tests/ref/gen_image_ref.py
 * wrote tests/data/images/ with PIL and, for four transform cases, what
 * torchvision's Resize/CenterCrop/ToTensor/Normalize give on them through
 * PIL: tests/data/images_ref/): ImageFolder's classes and order, PNG
 * (RGB, grayscale, palette, RGBA) and JPEG (RGB, grayscale) decoded as PIL
 * decodes them, every element of every case bitwise; RandomHorizontalFlip
 * and RandomCrop as the centred image's mirror and windows, other draws
 * per epoch; the same batches through 2 loader workers; the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fulgur/data.h"
#include "harness.h"

#define ROOT "data/images"
#define REF "data/images_ref"

static const double k_mean[3] = {0.485, 0.456, 0.406}, k_std[3] = {0.229, 0.224, 0.225};

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) len = 0;
    if (b) b[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return b;
}

TEST(classes_and_order_are_imagefolders) {
    fg_dataset *ds = fg_image_folder_new(ROOT, &(fg_image_folder_opts){.crop = 4});
    CHECK(ds != NULL);
    if (!ds) return;
    CHECK(fg_image_folder_num_classes(ds) == 2);
    CHECK(!strcmp(fg_image_folder_class(ds, 0), "cat") &&
          !strcmp(fg_image_folder_class(ds, 1), "dog"));
    size_t n;
    char *index = slurp(REF "/index.txt", &n);
    CHECK(index != NULL);
    int64_t i = 0;
    for (char *save = NULL, *line = index ? strtok_r(index, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save), i++) {
        char rel[256];
        int label;
        CHECK(sscanf(line, "%255s %d", rel, &label) == 2);
        char want[512];
        snprintf(want, sizeof want, "%s/%s", ROOT, rel);
        const char *p = fg_image_folder_path(ds, i);
        CHECK_MSG(p && !strcmp(p, want), "sample %lld: %s, want %s", (long long)i, p, want);
        float x[3 * 16];
        int32_t y = -1;
        CHECK_OK(fg_dataset_get(ds, i, x, &y));
        CHECK(y == label);
    }
    CHECK(i == fg_dataset_len(ds) && i == 7);
    free(index);
    fg_dataset_free(ds);
}

static void check_case(const char *name, fg_image_folder_opts o, int64_t h, int64_t w) {
    char path[256];
    snprintf(path, sizeof path, REF "/%s.f32", name);
    size_t n;
    char *ref = slurp(path, &n);
    CHECK_MSG(ref != NULL, "%s missing (tests/ref/gen_image_ref.py writes it)", path);
    fg_dataset *ds = fg_image_folder_new(ROOT, &o);
    CHECK(ds != NULL);
    if (!ref || !ds) {
        free(ref);
        fg_dataset_free(ds);
        return;
    }
    const fg_sample_spec *sp = fg_dataset_x_spec(ds);
    CHECK(sp->ndim == 3 && sp->shape[0] == 3 && sp->shape[1] == h && sp->shape[2] == w);
    int64_t per = 3 * h * w, len = fg_dataset_len(ds);
    CHECK_MSG(n == (size_t)(len * per) * sizeof(float), "%s: %zu bytes", name, n);
    float *x = malloc((size_t)per * sizeof *x);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < len && n == (size_t)(len * per) * sizeof(float); i++) {
        int32_t y;
        CHECK_OK(fg_dataset_get(ds, i, x, &y));
        const float *want = (const float *)ref + i * per;
        for (int64_t k = 0; k < per; k++)
            if (memcmp(&x[k], &want[k], sizeof(float))) {
                if (first < 0) first = i * per + k;
                differ++;
            }
    }
    CHECK_MSG(differ == 0, "%s: %lld of %lld elements differ from PIL's (first at %lld)", name,
              (long long)differ, (long long)(len * per), (long long)first);
    free(x);
    free(ref);
    fg_dataset_free(ds);
}

TEST(transforms_are_pils_bitwise) {
    fg_image_folder_opts norm = {.resize = 7, .crop = 6};
    memcpy(norm.mean, k_mean, sizeof k_mean);
    memcpy(norm.std, k_std, sizeof k_std);
    check_case("resize7_crop6_norm", norm, 6, 6); /* downsampling, normalised */
    check_case("resize_5x9", (fg_image_folder_opts){.resize_h = 5, .resize_w = 9}, 5, 9);
    check_case("resize20_crop16", (fg_image_folder_opts){.resize = 20, .crop = 16}, 16, 16);
    check_case("crop4", (fg_image_folder_opts){.crop = 4}, 4, 4); /* decoding alone */
}

TEST(random_flip_and_crop) {
    fg_image_folder_opts base = {.resize = 20, .crop = 16};
    fg_image_folder_opts fl = base;
    fl.random_flip = true;
    fl.seed = 5;
    fg_dataset *a = fg_image_folder_new(ROOT, &base), *b = fg_image_folder_new(ROOT, &fl);
    CHECK(a && b);
    if (!a || !b) return;
    float x[3 * 16 * 16], f[3 * 16 * 16];
    int32_t y;
    int flips = 0, plain = 0, changed = 0;
    for (int64_t e = 0; e < 4; e++) {
        fg_image_folder_set_epoch(b, e);
        for (int64_t i = 0; i < fg_dataset_len(a); i++) {
            CHECK_OK(fg_dataset_get(a, i, x, &y));
            CHECK_OK(fg_dataset_get(b, i, f, &y));
            bool same = !memcmp(x, f, sizeof x), mirror = true;
            for (int c = 0; c < 3; c++)
                for (int r = 0; r < 16; r++)
                    for (int q = 0; q < 16; q++)
                        mirror =
                            mirror && x[(c * 16 + r) * 16 + q] == f[(c * 16 + r) * 16 + 15 - q];
            CHECK_MSG(same || mirror, "epoch %lld sample %lld: neither the image nor its mirror",
                      (long long)e, (long long)i);
            flips += !same;
            plain += same;
        }
    }
    CHECK_MSG(flips > 4 && plain > 4, "%d flipped, %d not, of 28", flips, plain);
    /* RandomCrop: a 4x4 window of the 16x16 centred image... of the resized one:
     * every random crop of resize_h x resize_w is a window of it */
    fg_dataset *whole =
        fg_image_folder_new(ROOT, &(fg_image_folder_opts){.resize_h = 10, .resize_w = 12});
    fg_dataset *rc = fg_image_folder_new(
        ROOT, &(fg_image_folder_opts){
                  .resize_h = 10, .resize_w = 12, .crop = 4, .random_crop = true, .seed = 9});
    CHECK(whole && rc);
    float big[3 * 10 * 12], win[3 * 4 * 4], prev[3 * 4 * 4];
    for (int64_t i = 0; whole && rc && i < fg_dataset_len(whole); i++) {
        CHECK_OK(fg_dataset_get(whole, i, big, &y));
        for (int64_t e = 0; e < 3; e++) {
            fg_image_folder_set_epoch(rc, e);
            CHECK_OK(fg_dataset_get(rc, i, win, &y));
            bool found = false;
            for (int t = 0; t <= 6 && !found; t++)
                for (int l = 0; l <= 8 && !found; l++) {
                    bool ok = true;
                    for (int c = 0; c < 3 && ok; c++)
                        for (int r = 0; r < 4 && ok; r++)
                            for (int q = 0; q < 4 && ok; q++)
                                ok = win[(c * 4 + r) * 4 + q] == big[(c * 10 + t + r) * 12 + l + q];
                    found = ok;
                }
            CHECK_MSG(found, "sample %lld epoch %lld: the crop is no window of the image",
                      (long long)i, (long long)e);
            if (e > 0 && memcmp(win, prev, sizeof win)) changed++;
            memcpy(prev, win, sizeof win);
        }
    }
    CHECK_MSG(changed > 3, "the random crop moved %d times over the epochs", changed);
    fg_dataset_free(a);
    fg_dataset_free(b);
    fg_dataset_free(whole);
    fg_dataset_free(rc);
}

/* decoding and transforms in the loader's workers: the same batches */
TEST(workers_give_the_same_batches) {
    fg_image_folder_opts o = {.resize = 7, .crop = 6, .random_flip = true, .seed = 3};
    fg_dataset *ds = fg_image_folder_new(ROOT, &o);
    CHECK(ds != NULL);
    if (!ds) return;
    fg_dataloader *l0 =
        fg_dataloader_new(ds, &(fg_loader_opts){.batch = 3, .shuffle = true, .seed = 1});
    fg_dataloader *l2 = fg_dataloader_new(
        ds, &(fg_loader_opts){.batch = 3, .shuffle = true, .seed = 1, .num_workers = 2});
    CHECK(l0 && l2);
    int64_t batches = 0;
    for (fg_batch *a, *b; l0 && l2 && (a = fg_dataloader_next(l0));) {
        b = fg_dataloader_next(l2);
        CHECK(b != NULL);
        if (!b) break;
        CHECK(a->size == b->size);
        CHECK(!memcmp(fg_tensor_data(a->x), fg_tensor_data(b->x), fg_tensor_nbytes(a->x)));
        CHECK(!memcmp(fg_tensor_data(a->y), fg_tensor_data(b->y), fg_tensor_nbytes(a->y)));
        batches++;
    }
    CHECK(batches == 3);
    fg_dataloader_free(l0);
    fg_dataloader_free(l2);
    fg_dataset_free(ds);
}

TEST(errors_name_what_is_wrong) {
    CHECK(fg_image_folder_new("data/no-such-folder", NULL) == NULL);
    CHECK(fg_last_status() == FG_EIO);
    CHECK_CONTAINS(fg_last_error(), "no-such-folder");
    CHECK(fg_image_folder_new(ROOT "/cat/sub", NULL) == NULL); /* files, no class folders */
    CHECK(fg_last_status() == FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "no class folder");
    CHECK(fg_image_folder_new(ROOT, &(fg_image_folder_opts){.random_crop = true}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    CHECK(fg_image_folder_new(ROOT, &(fg_image_folder_opts){.resize_h = 4}) == NULL);
    CHECK(fg_last_status() == FG_EINVAL);
    /* images of several sizes without a fixed size: the first other one is named */
    fg_dataset *ds = fg_image_folder_new(ROOT, NULL);
    CHECK(ds != NULL);
    float x[3 * 16 * 16];
    int32_t y;
    CHECK_STATUS(fg_dataset_get(ds, 1, x, &y), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "b.jpg");
    CHECK_CONTAINS(fg_last_error(), "give crop");
    fg_dataset_free(ds);
    /* a crop larger than an image */
    ds = fg_image_folder_new(ROOT, &(fg_image_folder_opts){.crop = 12});
    CHECK_STATUS(fg_dataset_get(ds, 0, x, &y), FG_EFORMAT);
    CHECK_CONTAINS(fg_last_error(), "a.png");
    fg_dataset_free(ds);
}
