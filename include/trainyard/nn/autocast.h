// Autocast (automatic mixed precision) switched on or off for one device type, the same call on
// both LibTorch lines (1.13's set_enabled/set_cpu_enabled, 2.x's set_autocast_enabled; Note [Two
// LibTorch lines] in src/comm/torch_compat.cpp). DDP's bf16-mixed precision is autocast.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace trainyard::nn {

// For ops on `device`'s type (CPU or CUDA) in this thread: `enabled`, computing in `dtype`.
void set_autocast(c10::Device device, bool enabled, c10::ScalarType dtype = c10::kBFloat16);

}  // namespace trainyard::nn
