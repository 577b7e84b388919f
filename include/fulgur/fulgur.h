/* fulgur: the umbrella header. Includes every layer's header, nothing else. */
#ifndef FULGUR_H
#define FULGUR_H

#include "fulgur/autograd.h"
#include "fulgur/ckpt.h"
#include "fulgur/comm.h"
#include "fulgur/core.h"
#include "fulgur/data.h"
#include "fulgur/device.h"
#include "fulgur/fabric.h"
#include "fulgur/hivemind.h"
#include "fulgur/kinds.h"
#include "fulgur/launch.h"
#include "fulgur/metrics.h"
#include "fulgur/nn.h"
#include "fulgur/ops.h"
#include "fulgur/optim.h"
#include "fulgur/precision.h"
#include "fulgur/strategy.h"
#include "fulgur/tensor.h"
#include "fulgur/trainer.h"

#endif
