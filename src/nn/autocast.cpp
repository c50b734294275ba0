#include "trainyard/nn/autocast.h"

#include <ATen/autocast_mode.h>

#include "trainyard/error.h"

namespace trainyard::nn {

void set_autocast(c10::Device device, bool enabled, c10::ScalarType dtype) {
  TY_CHECK(device.is_cpu() || device.is_cuda(), "set_autocast: autocast on ", device.str(),
           " is not supported; cpu or cuda.");
  at::autocast::set_autocast_enabled(device.type(), enabled);
  at::autocast::set_autocast_dtype(device.type(), dtype);
}

}  // namespace trainyard::nn
