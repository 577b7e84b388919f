/* fulgur fit --model sequential --net "Conv2d(in_channels=1, ...); ReLU(); ...":
 * a network written as a list of torch.nn layers by their class names and
 * keyword arguments (the YAML model: section's layers list, LightningCLI's
 * class_path + init_args per layer, reads into this text). */
#ifndef FULGUR_FIT_NET_H
#define FULGUR_FIT_NET_H

#include <stdbool.h>
#include <stddef.h>

#include "cli.h"

/* Checks one layer's text ("Conv2d(in_channels=1, out_channels=8,
 * kernel_size=3)"): a known layer, known arguments of the right kinds, the
 * required ones given. false with the reason in err, naming the layer and
 * the argument and the nearest valid name. */
bool fit_net_check_layer(const char *text, char *err, size_t cap);
/* Checks a whole --net text (layers separated by ';'); the reason names
 * the layer's position (1-based). */
bool fit_net_check(const char *net, char *err, size_t cap);
/* Builds the network (a torch.nn.Sequential of the layers, children "0",
 * "1", ... as PyTorch names them) in dtype dt, finalized with seed; NULL
 * with fg_last_error. */
fg_module *fit_net_build(const char *net, fg_dtype dt, uint64_t seed);
/* The layer names, for help texts: "Linear, Conv2d, ..." */
const char *fit_net_layer_names(void);

#endif
