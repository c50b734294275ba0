#include "trainyard/nn/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "trainyard/error.h"

namespace trainyard::nn {

void set_autocast(c10::Device device, bool enabled, c10::ScalarType dtype) {
  TY_CHECK(device.is_cpu() || device.is_cuda(), "set_autocast: autocast on ", device.str(),
           " is not supported; cpu or cuda.");
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(device.type(), enabled);
  at::autocast::set_autocast_dtype(device.type(), dtype);
#else
  if (device.is_cpu()) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace trainyard::nn
