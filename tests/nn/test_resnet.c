/* The residual blocks and the ResNet family: torchvision's parameter and
 * buffer names and counts (resnet18 11,689,512 and resnet50 25,557,032
 * parameters at 1000 classes, as torchvision.models gives them), output
 * shapes of both layouts, the blocks' shortcuts; ModuleList and
 * ModuleDict names; train()/eval() reaching every module; and
 * convert_sync_batchnorm's renaming. */
#include <string.h>

#include "fulgur/nn.h"
#include "harness.h"

static int64_t count_params(fg_module *m) { return fg_module_numel(m); }

TEST(resnet_imagenet_layouts_have_torchvisions_sizes_and_names) {
    fg_module *r18 = fg_resnet_new(&(fg_resnet_config){.layout = FG_RESNET_IMAGENET, .depth = 18});
    CHECK(r18 != NULL);
    if (!r18) return;
    CHECK(count_params(r18) == 11689512);
    CHECK(fg_module_num_params(r18) == 62); /* 20 convs + 20 BN pairs + fc's two */
    CHECK(fg_module_num_buffers(r18) == 60);
    CHECK(strcmp(fg_module_param_name(r18, 0), "conv1.weight") == 0);
    CHECK(fg_module_find_param(r18, "layer2.0.downsample.0.weight") >= 0);
    CHECK(fg_module_find_param(r18, "layer4.1.bn2.bias") >= 0);
    CHECK(strcmp(fg_module_param_name(r18, 61), "fc.bias") == 0);
    CHECK(strcmp(fg_module_buffer_name(r18, 2), "bn1.num_batches_tracked") == 0);
    fg_tensor *x = fg_zeros(FG_F32, 4, (int64_t[]){2, 3, 40, 36});
    fg_tensor *y = fg_module_forward(r18, x);
    CHECK_MSG(y && fg_tensor_dim(y, 0) == 2 && fg_tensor_dim(y, 1) == 1000, "%s", fg_last_error());
    fg_step_reset();
    fg_module_free(r18);
    fg_module *r50 = fg_resnet_new(&(fg_resnet_config){.layout = FG_RESNET_IMAGENET});
    CHECK(r50 && count_params(r50) == 25557032);
    CHECK(r50 && fg_module_find_param(r50, "layer3.5.conv3.weight") >= 0);
    CHECK(r50 && strcmp(fg_module_type(fg_module_child(r50, "layer1.0")), "Bottleneck") == 0);
    fg_module_free(r50);
}

TEST(resnet_cifar_layouts) {
    fg_module *r20 = fg_resnet_new(&(fg_resnet_config){.depth = 20, .in_channels = 1});
    CHECK(r20 != NULL);
    if (!r20) return;
    /* 19 3x3 convs, 2 shortcut convs, 21 BNs, fc: 16-32-64 planes */
    int64_t convs = 16 * 1 * 9 + 6 * 16 * 16 * 9 + (16 * 32 * 9 + 5 * 32 * 32 * 9 + 16 * 32) +
                    (32 * 64 * 9 + 5 * 64 * 64 * 9 + 32 * 64);
    int64_t bns = 2 * (16 * 7 + 32 * 7 + 64 * 7);
    CHECK(count_params(r20) == convs + bns + 64 * 10 + 10);
    CHECK(fg_module_child(r20, "layer4") == NULL);
    CHECK(fg_module_child(r20, "maxpool") == NULL);
    fg_tensor *x = fg_zeros(FG_F32, 4, (int64_t[]){3, 1, 8, 8});
    fg_tensor *y = fg_module_forward(r20, x);
    CHECK(y && fg_tensor_dim(y, 1) == 10);
    /* the wrong channel count is named */
    CHECK(fg_module_forward(r20, fg_zeros(FG_F32, 4, (int64_t[]){3, 3, 8, 8})) == NULL);
    CHECK_CONTAINS(fg_last_error(), "expected (N, 1, H, W)");
    /* train / eval reach every BatchNorm */
    fg_module_train(r20, false);
    CHECK(!fg_module_is_training(fg_module_child(r20, "layer3.2.bn2")));
    fg_module_train(r20, true);
    CHECK(fg_module_is_training(fg_module_child(r20, "layer3.0.downsample.1")));
    /* convert_sync_batchnorm: every BatchNorm, its names unchanged */
    fg_stats_reduce r = {NULL, NULL};
    CHECK(fg_module_convert_sync_batchnorm(r20, &r) == 21);
    CHECK(strcmp(fg_module_type(fg_module_child(r20, "layer2.0.bn1")), "SyncBatchNorm") == 0);
    CHECK(fg_module_find_param(r20, "layer2.0.bn1.weight") >= 0);
    CHECK(fg_module_convert_sync_batchnorm(r20, NULL) == 21);
    CHECK(strcmp(fg_module_type(fg_module_child(r20, "layer2.0.bn1")), "BatchNorm2d") == 0);
    fg_step_reset();
    fg_module_free(r20);
    fg_module *r18 = fg_resnet_new(&(fg_resnet_config){.depth = 18});
    CHECK(r18 && fg_module_child(r18, "layer4.1") && count_params(r18) == 11173962);
    fg_module_free(r18);
    CHECK(fg_resnet_new(&(fg_resnet_config){.depth = 21}) == NULL);
    CHECK_CONTAINS(fg_last_error(), "depth 21");
}

TEST(resnet_blocks_shortcuts) {
    fg_module *b = fg_resnet_block_new(4, 4, 1, false, FG_F64);
    CHECK(b && fg_module_child(b, "downsample") == NULL);
    fg_tensor *x = fg_zeros(FG_F64, 4, (int64_t[]){2, 4, 5, 5});
    CHECK_OK(fg_tensor_fill(x, 1));
    /* identity shortcut: relu(bn2(...) + x), bn2 zeroed (zero_init_residual) */
    CHECK_OK(fg_tensor_fill(fg_module_param(b, fg_module_find_param(b, "bn2.weight")), 0));
    fg_tensor *y = fg_module_forward(b, x);
    CHECK(y && fg_tensor_get(y, 7) == 1);
    fg_module *d = fg_resnet_block_new(4, 3, 2, true, FG_F64);
    CHECK(d && fg_module_child(d, "downsample.0") && fg_module_child(d, "conv3"));
    y = fg_module_forward(d, x);
    CHECK(y && fg_tensor_dim(y, 1) == 12 && fg_tensor_dim(y, 2) == 3 && fg_tensor_dim(y, 3) == 3);
    fg_step_reset();
    fg_module_free(b);
    fg_module_free(d);
}

TEST(module_list_and_dict_names) {
    fg_module *root = fg_module_new("Net", NULL, NULL, NULL);
    fg_module *list = fg_module_list_new(), *dict = fg_module_dict_new();
    CHECK_OK(fg_module_list_append(list, fg_linear_new(3, 4, true, FG_F32)));
    CHECK_OK(fg_module_list_append(list, fg_relu_new()));
    CHECK_OK(fg_module_list_append(list, fg_linear_new(4, 2, false, FG_F32)));
    CHECK_OK(fg_module_dict_set(dict, "encoder", fg_layer_norm_new(2, 0, true, FG_F32)));
    CHECK_OK(fg_module_add_child(root, "layers", list));
    CHECK_OK(fg_module_add_child(root, "heads", dict));
    CHECK(fg_module_num_params(root) == 5);
    CHECK(strcmp(fg_module_param_name(root, 2), "layers.2.weight") == 0);
    CHECK(strcmp(fg_module_param_name(root, 4), "heads.encoder.bias") == 0);
    CHECK(fg_module_forward(list, fg_zeros(FG_F32, 1, (int64_t[]){3})) == NULL);
    CHECK(fg_last_status() == FG_EUNSUPPORTED);
    fg_module *lin = fg_linear_new(1, 1, true, FG_F32);
    CHECK(fg_module_dict_set(list, "x", lin) == FG_EINVAL); /* lin freed */
    CHECK_CONTAINS(fg_last_error(), "is not a ModuleDict");
    fg_step_reset();
    fg_module_free(root);
}

/* ViT: torchvision's names in its order, shapes, a forward and backward */
TEST(vit_names_shapes_forward) {
    fg_module *v = fg_vit_new(&(fg_vit_config){.image_size = 8,
                                               .patch_size = 2,
                                               .in_channels = 1,
                                               .num_layers = 2,
                                               .num_heads = 2,
                                               .hidden_dim = 16,
                                               .mlp_dim = 24,
                                               .num_classes = 10,
                                               .seed = 3});
    CHECK_MSG(v != NULL, "%s", fg_last_error());
    if (!v) return;
    static const char *const first[] = {
        "class_token",
        "conv_proj.weight",
        "conv_proj.bias",
        "encoder.pos_embedding",
        "encoder.layers.encoder_layer_0.ln_1.weight",
        "encoder.layers.encoder_layer_0.ln_1.bias",
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight"};
    for (int i = 0; i < 7; i++) CHECK(strcmp(fg_module_param_name(v, i), first[i]) == 0);
    CHECK(fg_module_find_param(v, "encoder.layers.encoder_layer_1.mlp.3.weight") >= 0);
    CHECK(strcmp(fg_module_param_name(v, fg_module_num_params(v) - 1), "heads.head.bias") == 0);
    int64_t D = 16,
            per = 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D + (D * 24 + 24) + (24 * D + D);
    CHECK(fg_module_numel(v) == D + (D * 4 + D) + 17 * D + 2 * per + 2 * D + (D * 10 + 10));
    fg_tensor *x = fg_zeros(FG_F32, 4, (int64_t[]){3, 1, 8, 8});
    fg_tensor *y = fg_module_forward(v, x);
    CHECK_MSG(y && fg_tensor_dim(y, 0) == 3 && fg_tensor_dim(y, 1) == 10, "%s", fg_last_error());
    if (y) CHECK_OK(fg_backward(fg_sum(y)));
    CHECK(fg_module_forward(v, fg_zeros(FG_F32, 4, (int64_t[]){3, 1, 6, 8})) == NULL);
    CHECK_CONTAINS(fg_last_error(), "expected (N, 1, 8, 8)");
    fg_step_reset();
    fg_module_free(v);
}
