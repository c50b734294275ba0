#include "trainyard/checkpoint/torch_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>
#include <sstream>

#include "trainyard/error.h"

namespace trainyard::checkpoint {
namespace {

template <typename Fill>
std::string archive_bytes(Fill&& fill) {
  torch::serialize::OutputArchive archive;
  fill(archive);
  std::ostringstream out;
  archive.save_to(out);
  return std::move(out).str();
}

// Tensors come back on `device`: an archive remembers where each tensor was saved (rank 0's GPU,
// say), which need not exist, or be this rank's, where it is loaded.
template <typename Read>
void read_archive(const std::string& bytes,
                  const std::string& what,
                  Read&& read,
                  torch::Device device = torch::kCPU) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size(), device);
    read(archive);
  } catch (const c10::Error& e) {
    throw CheckpointCorruptError(
        detail::concat("Cannot load ", what, ": ", e.what_without_backtrace(),
                       " HINT: was it written by another model or optimizer configuration?"));
  }
}

// Note [Loading in place]
// torch::nn::Module::load replaces each tensor's storage (Tensor::set_), which cuts the tie of a
// parameter that is a view of a larger buffer: ShardedAdam's flat buffers, a reducer's buckets.
// This reads the archive Module::save writes (a nested archive per submodule) and copies each
// value into the existing tensor instead, so a model can be loaded after it has been wrapped.
void copy_from_archive(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, torch::Tensor& into, bool is_buffer) {
    torch::Tensor value;
    archive.read(name, value, is_buffer);
    TORCH_CHECK(value.sizes() == into.sizes(), "\"", name, "\" has shape ", value.sizes(),
                " in the archive but ", into.sizes(), " in the model");
    into.copy_(value);
  };
  for (auto& p : module.named_parameters(/*recurse=*/false)) copy(p.key(), p.value(), false);
  for (auto& b : module.named_buffers(/*recurse=*/false)) copy(b.key(), b.value(), true);
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    copy_from_archive(*child.value(), child_archive);
  }
}

}  // namespace

std::string module_to_bytes(const torch::nn::Module& module) {
  return archive_bytes([&](auto& archive) { module.save(archive); });
}

std::string optimizer_to_bytes(const torch::optim::Optimizer& optimizer) {
  return archive_bytes([&](auto& archive) { optimizer.save(archive); });
}

void load_module(torch::nn::Module& module, const std::string& bytes, const std::string& what) {
  read_archive(bytes, what, [&](auto& archive) { copy_from_archive(module, archive); });
}

void load_optimizer(torch::optim::Optimizer& optimizer,
                    const std::string& bytes,
                    const std::string& what) {
  // The state goes where the parameters are (Adam's moments next to their parameter).
  torch::Device device = torch::kCPU;
  for (const auto& group : optimizer.param_groups())
    if (!group.params().empty()) {
      device = group.params().front().device();
      break;
    }
  read_archive(
      bytes, what, [&](auto& archive) { optimizer.load(archive); }, device);
}

std::string cpu_rng_state_to_bytes() {
  auto generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  return archive_bytes([&](auto& archive) { archive.write("cpu_rng_state", state); });
}

void load_cpu_rng_state(const std::string& bytes, const std::string& what) {
  read_archive(bytes, what, [&](auto& archive) {
    torch::Tensor state;
    archive.read("cpu_rng_state", state);
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  });
}

}  // namespace trainyard::checkpoint
