#include "trainyard/models/image_model.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/models/efficientnet.h"
#include "trainyard/models/resnet.h"

namespace trainyard::models {

namespace {
using Builder = std::function<std::shared_ptr<ImageModel>(int in_channels, int num_classes)>;
using BuilderTable = std::vector<std::pair<std::string, Builder>>;

BuilderTable make_builders() {
  BuilderTable table = {
      {"resnet18", [](int in, int classes) { return resnet18(in, classes).ptr(); }},
      {"resnet34", [](int in, int classes) { return resnet34(in, classes).ptr(); }},
      {"resnet50", [](int in, int classes) { return resnet50(in, classes).ptr(); }},
      {"resnet101", [](int in, int classes) { return resnet101(in, classes).ptr(); }},
  };
  for (int variant = 0; variant <= 7; ++variant) {
    table.emplace_back("efficientnet_b" + std::to_string(variant), [variant](int in, int classes) {
      return efficientnet(variant, classes, in).ptr();
    });
  }
  return table;
}

const BuilderTable& builders() {
  static const BuilderTable table = make_builders();
  return table;
}

std::string joined_names() {
  std::string joined;
  for (const auto& name : image_model_names()) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}
}  // namespace

const std::vector<std::string>& image_model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& entry : builders()) n.push_back(entry.first);
    return n;
  }();
  return names;
}

std::shared_ptr<ImageModel> image_model(const std::string& name, int in_channels, int num_classes) {
  const auto& table = builders();
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const auto& entry) { return entry.first == name; });
  TY_CHECK(it != table.end(), "Unknown image model '", name, "'. HINT: the known models are ",
           joined_names(), ".");
  return it->second(in_channels, num_classes);
}

}  // namespace trainyard::models
