/* fulgur: the umbrella header. Includes every layer's header, nothing else. */
#ifndef FULGUR_H
#define FULGUR_H

#include "fulgur/core.h"
#include "fulgur/tensor.h"
#include "fulgur/ops.h"
#include "fulgur/autograd.h"
#if __has_include("fulgur/nn.h")
#include "fulgur/nn.h"
#endif
#if __has_include("fulgur/optim.h")
#include "fulgur/optim.h"
#endif
#if __has_include("fulgur/data.h")
#include "fulgur/data.h"
#endif
#if __has_include("fulgur/comm.h")
#include "fulgur/comm.h"
#endif
#if __has_include("fulgur/ckpt.h")
#include "fulgur/ckpt.h"
#endif
#if __has_include("fulgur/strategy.h")
#include "fulgur/strategy.h"
#endif
#if __has_include("fulgur/precision.h")
#include "fulgur/precision.h"
#endif
#if __has_include("fulgur/launch.h")
#include "fulgur/launch.h"
#endif
#if __has_include("fulgur/fabric.h")
#include "fulgur/fabric.h"
#endif

#endif
