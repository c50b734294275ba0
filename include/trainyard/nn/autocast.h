// Autocast (automatic mixed precision) switched on or off for one device type.
// DDP's bf16-mixed precision is autocast.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace trainyard::nn {

// For ops on `device`'s type (CPU or CUDA) in this thread: `enabled`, computing in `dtype`.
void set_autocast(c10::Device device, bool enabled, c10::ScalarType dtype = c10::kBFloat16);

}  // namespace trainyard::nn
