// The image models (models/resnet.h, models/efficientnet.h, models/image_model.h) are
// torchvision 0.14's: the same parameter counts, the same state-dict names and shapes in the same
// order, the same BatchNorm, dropout and stochastic-depth settings (against Debian's
// the venv's torchvision, run as the oracle); one row of logits per image; StochasticDepth drops
// rows in training and is the identity in evaluation; the factory refuses an unknown name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../prerequisite.h"
#include "../temp_dir.h"
#include "trainyard/error.h"
#include "trainyard/models/efficientnet.h"
#include "trainyard/models/image_model.h"
#include "trainyard/models/resnet.h"

namespace {
namespace nn = torch::nn;
using namespace trainyard::models;

std::int64_t parameter_count(const nn::Module& model) {
  std::int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// Parameters at 3 input channels and 1000 classes, from Debian's torchvision 0.14:
//   /usr/bin/python3 -c "import torchvision; m=torchvision.models.efficientnet_b0();
//                        print(sum(p.numel() for p in m.parameters()))"
// with each name in place of efficientnet_b0.
struct ExpectedCount {
  const char* name;
  std::int64_t parameters;
};
constexpr ExpectedCount kTorchvisionCounts[] = {
    {"resnet18", 11'689'512},        {"resnet34", 21'797'672},
    {"resnet50", 25'557'032},        {"resnet101", 44'549'160},
    {"efficientnet_b0", 5'288'548},  {"efficientnet_b1", 7'794'184},
    {"efficientnet_b2", 9'109'994},  {"efficientnet_b3", 12'233'232},
    {"efficientnet_b4", 19'341'616}, {"efficientnet_b5", 30'389'784},
    {"efficientnet_b6", 43'040'704}, {"efficientnet_b7", 66'347'960},
};

TEST(ImageModels, ParameterCountsEqualTorchvisions) {
  for (const auto& expected : kTorchvisionCounts) {
    const auto model = image_model(expected.name, /*in_channels=*/3, /*num_classes=*/1000);
    EXPECT_EQ(parameter_count(*model), expected.parameters) << expected.name;
  }
  // The fashion-mnist recipe's ResNet-18: conv1 of 1 channel (7x7x64 weights instead of 3x7x7x64)
  // and a 10-class fc.
  EXPECT_EQ(parameter_count(*resnet18(1, 10)), 11'689'512 - 2 * 7 * 7 * 64 - 990 * 513);
  // EfficientNet-B0 for 10 classes: torchvision.models.efficientnet_b0(num_classes=10).
  EXPECT_EQ(parameter_count(*efficientnet(0, /*num_classes=*/10)), 4'020'358);
}

// printf's %.17g of each double, as Python's "%.17g" % x prints it (both round correctly).
std::string format(const char* fmt, const std::string& name, double a, double b = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, name.c_str(), a, b);
  return buf;
}

// What the oracle below prints for a torchvision model, for one of ours: each state-dict entry
// (name and shape) in state-dict order (a module's parameters, its buffers, then its children's),
// then the settings of every BatchNorm, Dropout, StochasticDepth and MBConv.
std::vector<std::string> describe(const nn::Module& model) {
  std::vector<std::string> lines;
  const auto modules = model.named_modules();
  for (const auto& item : modules) {
    const auto prefix = item.key().empty() ? std::string() : item.key() + ".";
    auto entry = [&](const std::string& name, const torch::Tensor& t) {
      auto line = prefix + name;
      for (auto d : t.sizes()) line.append(" ").append(std::to_string(d));
      lines.push_back(line);
    };
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      entry(p.key(), p.value());
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false)) entry(b.key(), b.value());
  }
  for (const auto& item : modules) {
    const auto& m = *item.value();
    if (const auto* bn = m.as<nn::BatchNorm2d>()) {
      lines.push_back(format("%s BatchNorm2d eps=%.17g momentum=%.17g", item.key(),
                             bn->options.eps(), bn->options.momentum().value()));
    } else if (const auto* dropout = m.as<nn::Dropout>()) {
      lines.push_back(format("%s Dropout p=%.17g", item.key(), dropout->options.p()));
    } else if (const auto* depth = m.as<StochasticDepth>()) {
      lines.push_back(format("%s StochasticDepth p=%.17g", item.key(), depth->p));
    } else if (const auto* block = m.as<MBConv>()) {
      lines.push_back(item.key() + " MBConv residual=" + (block->residual ? "1" : "0"));
    }
  }
  return lines;
}

constexpr const char* kOracle = R"PY(
import sys
import torch
import torchvision
from torchvision.models.efficientnet import MBConv
from torchvision.ops import StochasticDepth

out_dir = sys.argv[1]
for name in sys.argv[2:]:
    model = getattr(torchvision.models, name)()
    with open(f"{out_dir}/{name}.txt", "w") as f:
        for key, value in model.state_dict().items():
            f.write(key + "".join(f" {d}" for d in value.shape) + "\n")
        for module_name, m in model.named_modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                f.write("%s BatchNorm2d eps=%.17g momentum=%.17g\n"
                        % (module_name, m.eps, m.momentum))
            elif isinstance(m, torch.nn.Dropout):
                f.write("%s Dropout p=%.17g\n" % (module_name, m.p))
            elif isinstance(m, StochasticDepth):
                f.write("%s StochasticDepth p=%.17g\n" % (module_name, m.p))
            elif isinstance(m, MBConv):
                f.write("%s MBConv residual=%d\n" % (module_name, m.use_res_connect))
)PY";

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(ImageModels, StateDictsAndSettingsEqualTorchvisions) {
  if (std::system(TRAINYARD_PYTHON " -c 'import torchvision' >/dev/null 2>&1") != 0)
    TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON " has no torchvision: scripts/setup.sh installs it");
  const std::vector<std::string> names = {"resnet18",        "resnet50",        "efficientnet_b0",
                                          "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
                                          "efficientnet_b4", "efficientnet_b5", "efficientnet_b6",
                                          "efficientnet_b7"};
  trainyard::test::TempDir dir("ty-image-models");
  std::ofstream(dir.path() / "oracle.py") << kOracle;
  auto cmd = TRAINYARD_PYTHON " " + (dir.path() / "oracle.py").string() + " " + dir.str();
  for (const auto& name : names) cmd += " " + name;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  for (const auto& name : names) {
    const auto expected = read_lines(dir.path() / (name + ".txt"));
    ASSERT_GT(expected.size(), 100u) << name;
    const auto actual = describe(*image_model(name, 3, 1000));
    for (std::size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
      ASSERT_EQ(actual[i], expected[i]) << name << ", line " << i << " of torchvision's";
    }
    EXPECT_EQ(actual.size(), expected.size()) << name;
  }
}

TEST(ImageModels, ForwardGivesOneRowOfLogitsPerImage) {
  torch::manual_seed(0);
  const auto x = torch::randn({2, 3, 64, 64});
  for (const char* name : {"resnet50", "efficientnet_b0"}) {
    const auto model = image_model(name, 3, 7);
    model->train();
    EXPECT_EQ(model->forward(x).sizes(), (torch::IntArrayRef{2, 7})) << name << " in training";
    torch::NoGradGuard no_grad;
    model->eval();
    const auto logits = model->forward(x);
    EXPECT_EQ(logits.sizes(), (torch::IntArrayRef{2, 7})) << name;
    EXPECT_TRUE(logits.isfinite().all().item<bool>()) << name;
    // Evaluation is deterministic: dropout and stochastic depth are off.
    EXPECT_TRUE(torch::equal(model->forward(x), logits)) << name;
  }
  // One channel, 28x28, as the fashion-mnist recipe's images.
  auto one_channel = efficientnet(0, /*num_classes=*/10, /*in_channels=*/1);
  EXPECT_EQ(one_channel->forward(torch::randn({3, 1, 28, 28})).sizes(),
            (torch::IntArrayRef{3, 10}));
}

TEST(ImageModels, EfficientNetTrainsEveryParameter) {
  torch::manual_seed(0);
  auto model = efficientnet(0, /*num_classes=*/5);
  model->train();
  const auto loss = torch::cross_entropy_loss(model->forward(torch::randn({2, 3, 32, 32})),
                                              torch::tensor({1, 3}));
  loss.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
  }
}

TEST(ImageModels, EfficientNetIsInitialisedAsTorchvision) {
  torch::manual_seed(0);
  auto model = efficientnet(0);
  const auto params = model->named_parameters();
  // BatchNorm to identity; conv biases (squeeze-and-excitation) and the Linear's bias zero.
  EXPECT_TRUE(torch::equal(params["features.0.1.weight"], torch::ones({32})));
  EXPECT_TRUE(torch::equal(params["features.0.1.bias"], torch::zeros({32})));
  EXPECT_TRUE(torch::equal(params["features.1.0.block.1.fc1.bias"], torch::zeros({8})));
  EXPECT_TRUE(torch::equal(params["classifier.1.bias"], torch::zeros({1000})));
  // Linear weights uniform in +-1/sqrt(1000).
  const auto linear = params["classifier.1.weight"];
  EXPECT_LE(linear.abs().max().item<double>(), 1 / std::sqrt(1000.0));
  EXPECT_GT(linear.abs().max().item<double>(), 0.9 / std::sqrt(1000.0));
  // He normal, fan_out: the head's 1x1 conv (1280 outputs) has std sqrt(2 / 1280).
  const auto head = params["features.8.0.weight"];
  EXPECT_NEAR(head.std().item<double>(), std::sqrt(2.0 / 1280), 0.02 * std::sqrt(2.0 / 1280));
  // The depthwise 3x3 conv of stage 1 (32 outputs, one input each): std sqrt(2 / (32 * 9)).
  const auto depthwise = params["features.1.0.block.0.0.weight"];
  EXPECT_EQ(depthwise.sizes(), (torch::IntArrayRef{32, 1, 3, 3}));
  EXPECT_NEAR(depthwise.std().item<double>(), std::sqrt(2.0 / 288), 0.2 * std::sqrt(2.0 / 288));
}

TEST(StochasticDepth, DropsRowsAndScalesSurvivorsInTraining) {
  torch::manual_seed(0);
  const auto x = torch::ones({4000, 3, 2, 2});
  StochasticDepth depth(0.25, StochasticDepthMode::kRow);
  depth->train();
  const auto y = depth->forward(x);
  // Each row is all zeros or all 1 / (1 - 0.25).
  const auto row_min = y.flatten(1).amin(1);
  const auto row_max = y.flatten(1).amax(1);
  EXPECT_TRUE(torch::equal(row_min, row_max));
  const auto dropped = (row_max == 0).sum().item<std::int64_t>();
  const auto kept =
      torch::isclose(row_max, torch::full_like(row_max, 1 / 0.75)).sum().item<std::int64_t>();
  EXPECT_EQ(dropped + kept, 4000);
  // Binomial(4000, 0.25): mean 1000, standard deviation ~27; six of them either side.
  EXPECT_GT(dropped, 840);
  EXPECT_LT(dropped, 1160);
  // The expectation is kept: the mean stays near 1.
  EXPECT_NEAR(y.mean().item<double>(), 1.0, 0.05);
}

TEST(StochasticDepth, IsTheIdentityInEvaluationAndAtZero) {
  const auto x = torch::randn({16, 4, 3, 3});
  StochasticDepth depth(0.5, StochasticDepthMode::kRow);
  depth->eval();
  EXPECT_TRUE(torch::equal(depth->forward(x), x));
  StochasticDepth never(0.0, StochasticDepthMode::kRow);
  never->train();
  EXPECT_TRUE(torch::equal(never->forward(x), x));
  StochasticDepth always(1.0, StochasticDepthMode::kRow);
  always->train();
  EXPECT_TRUE(torch::equal(always->forward(x), torch::zeros_like(x)));
}

TEST(StochasticDepth, BatchModeDropsTheWholeBatchOrNone) {
  torch::manual_seed(0);
  const auto x = torch::ones({8, 2});
  StochasticDepth depth(0.5, StochasticDepthMode::kBatch);
  depth->train();
  int dropped = 0;
  for (int i = 0; i < 200; ++i) {
    const auto y = depth->forward(x);
    const bool all_zero = torch::equal(y, torch::zeros_like(x));
    EXPECT_TRUE(all_zero || torch::equal(y, torch::full_like(x, 2.0))) << "call " << i;
    dropped += all_zero;
  }
  EXPECT_GT(dropped, 50);  // Binomial(200, 0.5): 100 +- 7
  EXPECT_LT(dropped, 150);
}

TEST(StochasticDepth, RefusesAProbabilityOutsideZeroToOne) {
  EXPECT_THROW(StochasticDepth(1.5, StochasticDepthMode::kRow), trainyard::InvalidArgumentError);
  EXPECT_THROW(StochasticDepth(-0.1, StochasticDepthMode::kRow), trainyard::InvalidArgumentError);
}

TEST(ImageModels, MakeDivisibleRoundsAsTorchvision) {
  // torchvision.models._utils._make_divisible(v, 8) for these v: 16, 32, 16, 48.
  EXPECT_EQ(make_divisible(11.9), 16);  // 8 would be more than 10% below
  EXPECT_EQ(make_divisible(35.2), 32);
  EXPECT_EQ(make_divisible(17.6), 16);
  EXPECT_EQ(make_divisible(44.8), 48);
  EXPECT_EQ(make_divisible(3), 8);  // never below the divisor
}

TEST(ImageModels, UnknownNamesAndVariantsAreRefusedWithTheKnownOnes) {
  try {
    image_model("efficientnet_b8", 3, 10);
    FAIL() << "image_model accepted efficientnet_b8";
  } catch (const trainyard::InvalidArgumentError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'efficientnet_b8'"), std::string::npos) << message;
    for (const auto& name : image_model_names())
      EXPECT_NE(message.find(name), std::string::npos) << message;
  }
  EXPECT_THROW(efficientnet(8), trainyard::InvalidArgumentError);
  EXPECT_THROW(efficientnet(-1), trainyard::InvalidArgumentError);
  EXPECT_THROW(image_model("resnet50", 0, 10), trainyard::InvalidArgumentError);
  EXPECT_THROW(image_model("efficientnet_b0", 3, 0), trainyard::InvalidArgumentError);
  auto options = EfficientNetOptions::variant(0);
  options.dropout = 1.5;
  EXPECT_THROW(EfficientNet{options}, trainyard::InvalidArgumentError);
}

}  // namespace
