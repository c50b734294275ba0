#include "trainyard/comm/build_info.h"

#include "torch_compat.h"

namespace trainyard::comm {

BuildInfo build_info() {
  BuildInfo info{.built_torch = compat::built_torch_version(),
                 .loaded_torch = compat::loaded_torch_version(),
                 .accelerator = compat::accelerator_description(),
                 .backends = {"gloo", "shm"}};
  if (compat::nccl_available()) info.backends.emplace_back("nccl");
  return info;
}

std::string describe(const BuildInfo& info) {
  std::string text = "LibTorch " + info.loaded_torch + " (" + info.accelerator +
                     "), built against " + info.built_torch + "\nprocess-group backends:";
  for (std::size_t i = 0; i < info.backends.size(); ++i)
    text += (i == 0 ? " " : ", ") + info.backends[i];
  return text;
}

}  // namespace trainyard::comm
