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

template <typename Read>
void read_archive(const std::string& bytes, const std::string& what, Read&& read) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    read(archive);
  } catch (const c10::Error& e) {
    throw CheckpointCorruptError(
        detail::concat("Cannot load ", what, ": ", e.what_without_backtrace(),
                       " HINT: was it written by another model or optimizer configuration?"));
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
  read_archive(bytes, what, [&](auto& archive) { module.load(archive); });
}

void load_optimizer(torch::optim::Optimizer& optimizer,
                    const std::string& bytes,
                    const std::string& what) {
  read_archive(bytes, what, [&](auto& archive) { optimizer.load(archive); });
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
