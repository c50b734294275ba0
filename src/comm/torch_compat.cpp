#include "torch_compat.h"

#include <link.h>

#include <torch/cuda.h>
#include <torch/version.h>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string_view>

// Note [LibTorch's process groups]
// c10d's ProcessGroup holds one backend per device type and dispatches each collective to the
// backend of its tensors' device: Gloo for CPU tensors (and CUDA tensors, which Gloo stages through
// the host), NCCL for CUDA tensors where the build has it. Everything above comm/ sees only
// c10d::ProcessGroup. What depends on NCCL lives in nccl.cpp (the CUDA build) or no_nccl.cpp (the
// CPU build), chosen by CMake.

namespace trainyard::comm::compat {

c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank,
                                                  int world_size,
                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  c10::intrusive_ptr<c10d::Backend> backend = gloo;
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  if (torch::cuda::is_available())
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

std::optional<std::chrono::milliseconds> gloo_timeout(c10d::ProcessGroup& group) {
  c10d::ProcessGroupGloo* gloo = nullptr;
  try {
    gloo = dynamic_cast<c10d::ProcessGroupGloo*>(group.getBackend(c10::DeviceType::CPU).get());
  } catch (const std::exception&) {
    return std::nullopt;  // no CPU backend (the shared-memory group registers none)
  }
  if (gloo == nullptr) return std::nullopt;
  return gloo->getOptions()->timeout;
}

int cuda_device_count() {
  return static_cast<int>(torch::cuda::device_count());
}

void set_cuda_device(int index) {
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA)
      .setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

const char* built_torch_version() {
  return TORCH_VERSION;
}

// The version of the libtorch_cpu.so this process loaded, from the files beside it: a pip wheel's
// torch/version.py (__version__ = '2.15.0+cu132') or a pytorch.org archive's build-version.
std::string loaded_torch_version() {
  std::string library;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* found) {
        const std::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (!name.ends_with("/libtorch_cpu.so")) return 0;
        *static_cast<std::string*>(found) = name;
        return 1;
      },
      &library);
  if (library.empty()) return "unknown";
  const std::filesystem::path lib_dir = std::filesystem::path(library).parent_path();
  std::ifstream version_py(lib_dir / ".." / "version.py");
  const std::regex assignment(R"(^__version__\s*=\s*['"]([^'"]+)['"])");
  for (std::string line; std::getline(version_py, line);) {
    std::smatch m;
    if (std::regex_search(line, m, assignment)) return m[1].str();
  }
  std::ifstream build_version(lib_dir / ".." / "build-version");
  std::string version;
  if (std::getline(build_version, version) && !version.empty()) return version;
  return "unknown";
}

}  // namespace trainyard::comm::compat
