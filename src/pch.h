// Precompiled header for every target that includes LibTorch: parsing torch/torch.h costs about
// 20 s per translation unit on this machine, so it is parsed once per build.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>
