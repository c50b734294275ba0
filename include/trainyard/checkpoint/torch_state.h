// LibTorch state to and from the bytes a Checkpoint holds, in LibTorch's own archive format:
// model.pt as written here is what torch::save(module, path) writes and torch::load reads.
#pragma once

#include <string>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace trainyard::checkpoint {

std::string module_to_bytes(const torch::nn::Module& module);
std::string optimizer_to_bytes(const torch::optim::Optimizer& optimizer);

// Load into an existing module or optimizer of the same structure; a module's tensors are
// overwritten in place (Note [Loading in place]), so views of them stay views. `what` names the
// source in errors; a mismatch or a damaged archive throws CheckpointCorruptError.
void load_module(torch::nn::Module& module, const std::string& bytes, const std::string& what);
void load_optimizer(torch::optim::Optimizer& optimizer,
                    const std::string& bytes,
                    const std::string& what);

// The default CPU generator's state (torch::manual_seed's), to restore RNG streams on resume.
std::string cpu_rng_state_to_bytes();
void load_cpu_rng_state(const std::string& bytes, const std::string& what);

}  // namespace trainyard::checkpoint
