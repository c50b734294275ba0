// The ECS deployment (deploy/ecs, deploy/terraform) checked as far as can be done without AWS:
// every JSON file has what ECS and Cloud Map require and no key their APIs would reject; the
// Terraform module, parsed by HashiCorp's own HCL parser (tests/e2e/hcl_inspect), refers only to
// what it declares and to JSON fields and files that exist; and the head and worker task
// definitions' own commands and environments run for real, in three network namespaces where
// head.trainyard.local resolves as Cloud Map makes it, and train a job submitted from the head.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../multiproc/cluster_fixture.h"
#include "../multiproc/multiproc_util.h"
#include "../text.h"
#include "netns_hosts.h"

namespace trainyard::mptest {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kEcsDir = fs::path(TRAINYARD_SOURCE_DIR) / "deploy" / "ecs";
const fs::path kTerraformDir = fs::path(TRAINYARD_SOURCE_DIR) / "deploy" / "terraform";
// The image's trainyard (the Dockerfile installs it there); this build's binary stands in for it.
constexpr const char* kImageCli = "/usr/local/bin/trainyard";

using trainyard::test::contains;
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json load_json(const fs::path& path) {
  const json j = json::parse(read_file(path), nullptr, false);
  if (j.is_discarded()) ADD_FAILURE() << path << " is not valid JSON.";
  return j;
}

// deploy/ecs's files by kind, each as `aws` takes it with --cli-input-json.
struct EcsFiles {
  std::vector<fs::path> task_definitions, services, discovery_services, namespaces, unknown;
};
EcsFiles ecs_files() {
  EcsFiles f;
  for (const auto& e : fs::directory_iterator(kEcsDir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json") continue;
    if (ends_with(name, "-task-definition.json")) {
      f.task_definitions.push_back(e.path());
    } else if (ends_with(name, "-discovery-service.json")) {
      f.discovery_services.push_back(e.path());
    } else if (ends_with(name, "-service.json")) {
      f.services.push_back(e.path());
    } else if (ends_with(name, "-namespace.json")) {
      f.namespaces.push_back(e.path());
    } else {
      f.unknown.push_back(e.path());
    }
  }
  return f;
}

// The words of `text`.
std::set<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::set<std::string> out;
  for (std::string w; in >> w;) out.insert(w);
  return out;
}
// Keys the APIs' request shapes have; the aws CLI rejects any other ("Unknown parameter").
const std::set<std::string> kTaskDefinitionKeys = words(
    "family taskRoleArn executionRoleArn networkMode containerDefinitions volumes "
    "placementConstraints requiresCompatibilities cpu memory tags pidMode ipcMode "
    "proxyConfiguration inferenceAccelerators ephemeralStorage runtimePlatform");
const std::set<std::string> kContainerKeys = words(
    "name image repositoryCredentials cpu memory memoryReservation links portMappings "
    "essential entryPoint command environment environmentFiles mountPoints volumesFrom "
    "linuxParameters secrets dependsOn startTimeout stopTimeout hostname user "
    "workingDirectory disableNetworking privileged readonlyRootFilesystem dnsServers "
    "dnsSearchDomains extraHosts dockerSecurityOptions interactive pseudoTerminal "
    "dockerLabels ulimits logConfiguration healthCheck systemControls "
    "resourceRequirements firelensConfiguration credentialSpecs restartPolicy");
const std::set<std::string> kServiceKeys = words(
    "cluster serviceName taskDefinition loadBalancers serviceRegistries desiredCount "
    "clientToken launchType capacityProviderStrategy platformVersion role "
    "deploymentConfiguration placementConstraints placementStrategy networkConfiguration "
    "healthCheckGracePeriodSeconds schedulingStrategy deploymentController tags "
    "enableECSManagedTags propagateTags enableExecuteCommand serviceConnectConfiguration "
    "volumeConfigurations");
const std::set<std::string> kDiscoveryServiceKeys = words(
    "Name NamespaceId CreatorRequestId Description DnsConfig HealthCheckConfig "
    "HealthCheckCustomConfig Tags Type");
const std::set<std::string> kNamespaceKeys =
    words("Name CreatorRequestId Description Vpc Tags Properties");

void expect_known_keys(const json& object,
                       const std::set<std::string>& known,
                       const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    EXPECT_TRUE(known.count(key))
        << where << ": '" << key
        << "' is not a field of the API's request; the aws CLI would "
           "reject it. Hint: check its spelling against the API reference.";
  }
}

// Fargate's task sizes: memory (MiB) allowed for each cpu (units).
bool fargate_size_ok(int cpu, int memory) {
  struct Range {
    int cpu, low, high, step;
  };
  for (const Range r :
       {Range{256, 512, 2048, 512}, Range{512, 1024, 4096, 1024}, Range{1024, 2048, 8192, 1024},
        Range{2048, 4096, 16384, 1024}, Range{4096, 8192, 30720, 1024},
        Range{8192, 16384, 61440, 4096}, Range{16384, 32768, 122880, 8192}}) {
    if (cpu == r.cpu) return memory >= r.low && memory <= r.high && (memory - r.low) % r.step == 0;
  }
  return false;
}

// The value after `flag` in argv, or "".
std::string flag_value(const json& argv, const std::string& flag) {
  for (std::size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) return argv[i + 1].get<std::string>();
  }
  return "";
}

const json& container_of(const json& task) {
  return task.at("containerDefinitions").at(0);
}
json command_of(const json& container) {
  json argv = container.value("entryPoint", json::array());
  for (const auto& w : container.value("command", json::array())) argv.push_back(w);
  return argv;
}

// "head.trainyard.local": the head's Cloud Map service name in its namespace.
std::string head_dns_name() {
  return load_json(kEcsDir / "head-discovery-service.json").value("Name", "") + "." +
         load_json(kEcsDir / "cloud-map-namespace.json").value("Name", "");
}

TEST(DeployEcs, EveryFileIsARequestTheApisAccept) {
  const EcsFiles f = ecs_files();
  EXPECT_TRUE(f.unknown.empty()) << "deploy/ecs holds a JSON file of no known kind: "
                                 << f.unknown.front();
  ASSERT_GE(f.task_definitions.size(), 2u);
  ASSERT_GE(f.services.size(), 2u);
  std::set<std::string> families;
  std::map<std::string, json> task_by_family;
  for (const auto& path : f.task_definitions) {
    SCOPED_TRACE(path.string());
    const json t = load_json(path);
    ASSERT_TRUE(t.is_object());
    expect_known_keys(t, kTaskDefinitionKeys, path.filename().string());
    ASSERT_TRUE(t.contains("family") && t["family"].is_string());
    families.insert(t["family"].get<std::string>());
    task_by_family[t["family"]] = t;
    EXPECT_EQ(t.value("networkMode", ""), "awsvpc") << "Cloud Map A records need awsvpc";
    ASSERT_TRUE(t.contains("requiresCompatibilities") && t["requiresCompatibilities"].is_array());
    bool fargate = false;
    for (const auto& c : t["requiresCompatibilities"]) {
      EXPECT_TRUE(c == "EC2" || c == "FARGATE" || c == "EXTERNAL") << c;
      fargate = fargate || c == "FARGATE";
    }
    // Secrets and awslogs are fetched by the execution role; S3 is reached with the task role.
    EXPECT_TRUE(t.contains("executionRoleArn") && t.contains("taskRoleArn"));
    ASSERT_TRUE(t["cpu"].is_string() && t["memory"].is_string())
        << "the task's cpu and memory are strings in the API";
    if (fargate) {
      EXPECT_TRUE(fargate_size_ok(std::stoi(t["cpu"].get<std::string>()),
                                  std::stoi(t["memory"].get<std::string>())))
          << "cpu " << t["cpu"] << " with memory " << t["memory"] << " is no Fargate task size";
    }
    ASSERT_TRUE(t["containerDefinitions"].is_array() && !t["containerDefinitions"].empty());
    for (const json& c : t["containerDefinitions"]) {
      expect_known_keys(c, kContainerKeys, path.filename().string() + " container");
      EXPECT_TRUE(c["name"].is_string() && c["image"].is_string() && c["essential"].is_boolean());
      EXPECT_EQ(command_of(c).at(0), kImageCli);
      for (const json& p : c.value("portMappings", json::array())) {
        ASSERT_TRUE(p["containerPort"].is_number_integer()) << p;
        // awsvpc: no port translation.
        EXPECT_EQ(p.value("hostPort", p["containerPort"]), p["containerPort"]) << p;
      }
      for (const json& s : c.value("secrets", json::array())) {
        EXPECT_TRUE(s["name"].is_string() && s["valueFrom"].is_string()) << s;
      }
      EXPECT_TRUE(c["secrets"].is_array() && c["secrets"].at(0)["name"] == "TRAINYARD_TOKEN")
          << "the cluster token comes from Secrets Manager as TRAINYARD_TOKEN";
      const json& log = c.at("logConfiguration");
      EXPECT_EQ(log.value("logDriver", ""), "awslogs");
      for (const char* o : {"awslogs-group", "awslogs-region", "awslogs-stream-prefix"}) {
        EXPECT_TRUE(log["options"].contains(o)) << o << " (Fargate needs the stream prefix)";
      }
      for (const json& r : c.value("resourceRequirements", json::array())) {
        EXPECT_FALSE(r["type"] == "GPU" && fargate) << "Fargate has no GPUs";
        EXPECT_TRUE(r["value"].is_string()) << r;
      }
      if (c.contains("healthCheck")) {
        const json& h = c["healthCheck"];
        EXPECT_TRUE(h["command"][0] == "CMD" || h["command"][0] == "CMD-SHELL") << h;
        EXPECT_TRUE(h.value("interval", 30) >= 5 && h.value("interval", 30) <= 300) << h;
        EXPECT_TRUE(h.value("timeout", 5) >= 2 && h.value("timeout", 5) <= 60) << h;
        EXPECT_TRUE(h.value("retries", 3) >= 1 && h.value("retries", 3) <= 10) << h;
        EXPECT_TRUE(h.value("startPeriod", 0) >= 0 && h.value("startPeriod", 0) <= 300) << h;
      }
    }
  }
  for (const auto& path : f.services) {
    SCOPED_TRACE(path.string());
    const json s = load_json(path);
    ASSERT_TRUE(s.is_object());
    expect_known_keys(s, kServiceKeys, path.filename().string());
    EXPECT_TRUE(s["serviceName"].is_string());
    ASSERT_TRUE(s["taskDefinition"].is_string());
    ASSERT_TRUE(families.count(s["taskDefinition"])) << "no task definition in deploy/ecs has "
                                                        "the family "
                                                     << s["taskDefinition"];
    EXPECT_TRUE(s["desiredCount"].is_number_integer() && s["desiredCount"] >= 0);
    ASSERT_TRUE(s["serviceRegistries"].is_array() && !s["serviceRegistries"].empty());
    EXPECT_TRUE(s["serviceRegistries"][0]["registryArn"].is_string());
    const json& vpc = s.at("networkConfiguration").at("awsvpcConfiguration");
    EXPECT_FALSE(vpc.at("subnets").empty());
    EXPECT_FALSE(vpc.at("securityGroups").empty());
    // A launch type or a capacity provider strategy, never both; the task must allow it.
    EXPECT_NE(s.contains("launchType"), s.contains("capacityProviderStrategy"));
    const json& compat = task_by_family[s["taskDefinition"]]["requiresCompatibilities"];
    const std::string launch = s.value("launchType", "EC2");
    EXPECT_NE(std::find(compat.begin(), compat.end(), launch), compat.end())
        << "the service launches on " << launch << " but its task allows " << compat;
  }
  for (const auto& path : f.discovery_services) {
    const json d = load_json(path);
    expect_known_keys(d, kDiscoveryServiceKeys, path.filename().string());
    EXPECT_TRUE(d["Name"].is_string() && d["NamespaceId"].is_string()) << path;
    // ECS registers awsvpc tasks by address: A records.
    EXPECT_EQ(d["DnsConfig"]["DnsRecords"][0]["Type"], "A") << path;
  }
  ASSERT_EQ(f.namespaces.size(), 1u);
  const json ns = load_json(f.namespaces[0]);
  expect_known_keys(ns, kNamespaceKeys, f.namespaces[0].filename().string());
  EXPECT_TRUE(ns["Name"].is_string() && ns["Vpc"].is_string());
}

TEST(DeployEcs, WorkersNameTheHeadAsCloudMapRegistersIt) {
  const json head = container_of(load_json(kEcsDir / "head-task-definition.json"));
  const json head_argv = command_of(head);
  const std::string port = flag_value(head_argv, "--port");
  ASSERT_FALSE(port.empty()) << head_argv;
  EXPECT_EQ(flag_value(head_argv, "--bind"), "0.0.0.0") << "other tasks must reach the head";
  EXPECT_EQ(std::to_string(head.at("portMappings").at(0).at("containerPort").get<int>()), port);
  const std::string health = head.at("healthCheck").at("command").dump();
  EXPECT_TRUE(contains(health, ":" + port)) << health;
  const std::string want = head_dns_name() + ":" + port;
  EXPECT_EQ(want, "head.trainyard.local:8265") << "the name README.md documents";
  for (const auto& path : ecs_files().task_definitions) {
    const json argv = command_of(container_of(load_json(path)));
    if (argv.at(1) != "worker") continue;
    EXPECT_EQ(flag_value(argv, "--head"), want) << path;
  }
  // Each service registers with the Cloud Map service of its role.
  EXPECT_TRUE(contains(load_json(kEcsDir / "head-service.json")["serviceRegistries"].dump(),
                       "HEAD_REGISTRY_ARN"));
  EXPECT_TRUE(contains(load_json(kEcsDir / "worker-service.json")["serviceRegistries"].dump(),
                       "WORKER_REGISTRY_ARN"));
}

TEST(DeployEcs, ReadmeExplainsEveryPlaceholder) {
  const std::string readme = read_file(kEcsDir / "README.md");
  const std::regex placeholder(R"(\$\{([A-Z_]+)\})");
  for (const auto& e : fs::directory_iterator(kEcsDir)) {
    if (e.path().extension() != ".json") continue;
    const std::string text = read_file(e.path());
    for (std::sregex_iterator m(text.begin(), text.end(), placeholder), end; m != end; ++m) {
      EXPECT_TRUE(contains(readme, (*m)[1].str()))
          << e.path().filename() << " has ${" << (*m)[1] << "}, which deploy/ecs/README.md "
          << "does not explain.";
    }
  }
}

// --- Terraform
// ------------------------------------------------------------------------------------

// Every block of the module's files as hcl_inspect prints them, with the file's name.
struct Module {
  std::vector<std::pair<std::string, json>> blocks;  // (file, block)
  json templates;
  std::string error;
};

Module inspect_module(const std::vector<fs::path>& templates) {
  std::vector<std::string> argv = {TRAINYARD_HCL_INSPECT_PATH};
  for (const auto& t : templates) argv.insert(argv.end(), {"-template", t.string()});
  for (const auto& e : fs::directory_iterator(kTerraformDir)) {
    if (e.path().extension() == ".tf") argv.push_back(e.path().string());
  }
  const RunOutput r = run_program(argv, {}, 30s);
  Module m;
  if (!r.status.success()) {
    m.error = "hcl_inspect failed (" + r.status.to_string() + "):\n" + r.err;
    return m;
  }
  const json out = json::parse(r.out);
  for (const auto& [file, blocks] : out["files"].items()) {
    for (const auto& b : blocks) m.blocks.emplace_back(fs::path(file).filename().string(), b);
  }
  m.templates = out["templates"];
  return m;
}

// Calls f(block, attribute name, attribute) for every attribute, nested blocks included.
template <typename F>
void each_attribute(const json& block, const F& f) {
  for (const auto& [name, attr] : block["attributes"].items()) f(block, name, attr);
  for (const auto& nested : block["blocks"]) each_attribute(nested, f);
}

// Splits "local.head_task.containerDefinitions[0].cpu" after its first two names into JSON
// steps: {"containerDefinitions", "0", "cpu"}.
std::vector<std::string> json_steps(const std::string& reference) {
  std::vector<std::string> steps;
  std::string current;
  int dots = 0;
  std::size_t i = 0;
  for (; i < reference.size() && dots < 2; ++i) dots += reference[i] == '.';
  if (dots < 2) return steps;
  for (; i < reference.size(); ++i) {
    const char c = reference[i];
    if (c == '.' || c == '[' || c == ']') {
      if (!current.empty()) steps.push_back(current);
      current.clear();
    } else if (c != '"') {
      current += c;
    }
  }
  if (!current.empty()) steps.push_back(current);
  return steps;
}

bool json_has(const json& j, const std::vector<std::string>& steps) {
  const json* at = &j;
  for (const auto& s : steps) {
    if (at->is_array()) {
      const std::size_t i = std::stoul(s);
      if (i >= at->size()) return false;
      at = &(*at)[i];
    } else if (at->is_object() && at->contains(s)) {
      at = &(*at)[s];
    } else {
      return false;
    }
  }
  return true;
}

class DeployTerraform : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(TRAINYARD_HCL_INSPECT_PATH).empty() ||
        !fs::exists(TRAINYARD_HCL_INSPECT_PATH)) {
      TY_MISSING_PREREQUISITE(
          "no HCL parser: tests/e2e/hcl_inspect is built with Debian's golang-go and "
          "golang-github-hashicorp-hcl-v2-dev (scripts/setup.sh installs them; re-run cmake)");
    }
    module_ = inspect_module(ecs_files().task_definitions);
    ASSERT_TRUE(module_.error.empty()) << module_.error;
  }
  std::vector<json> blocks_of(const std::string& type) const {
    std::vector<json> out;
    for (const auto& [file, b] : module_.blocks) {
      if (b["type"] == type) out.push_back(b);
    }
    return out;
  }
  const json* resource(const std::string& type, const std::string& name) const {
    for (const auto& [file, b] : module_.blocks) {
      if (b["type"] == "resource" && b["labels"][0] == type && b["labels"][1] == name) return &b;
    }
    return nullptr;
  }
  Module module_;
};

TEST_F(DeployTerraform, EveryReferenceNamesSomethingTheModuleDeclares) {
  std::set<std::string> declared;  // "var.x", "local.x", "data.T.N", "T.N"
  for (const auto& [file, b] : module_.blocks) {
    const std::string type = b["type"];
    if (type == "variable") declared.insert("var." + b["labels"][0].get<std::string>());
    if (type == "locals") {
      for (const auto& [name, attr] : b["attributes"].items()) declared.insert("local." + name);
    }
    if (type == "data") {
      declared.insert("data." + b["labels"][0].get<std::string>() + "." +
                      b["labels"][1].get<std::string>());
    }
    if (type == "resource") {
      declared.insert(b["labels"][0].get<std::string>() + "." + b["labels"][1].get<std::string>());
    }
  }
  // A dynamic block's iterator is named after its label.
  std::set<std::string> iterators = {"path", "each", "count", "self", "terraform"};
  std::function<void(const json&)> find_dynamic = [&](const json& b) {
    if (b["type"] == "dynamic") iterators.insert(b["labels"][0]);
    for (const auto& nested : b["blocks"]) find_dynamic(nested);
  };
  for (const auto& [file, b] : module_.blocks) find_dynamic(b);

  for (const auto& [file, b] : module_.blocks) {
    each_attribute(
        b, [&, &file = file](const json& block, const std::string& name, const json& attr) {
          if (block["type"] == "variable" && name == "type") return;  // a type, not references
          for (const std::string ref : attr["references"]) {
            const std::string root = ref.substr(0, ref.find_first_of(".["));
            if (iterators.count(root)) continue;
            bool found = false;
            for (const auto& d : declared) {
              found = found || ref == d || ref.starts_with(d + ".") || ref.starts_with(d + "[");
            }
            EXPECT_TRUE(found) << file << ": " << name << " refers to " << ref
                               << ", which no block of deploy/terraform declares.";
          }
        });
  }
  for (const char* v : {"var.cluster_arn", "var.subnet_ids", "var.image", "var.worker_count",
                        "var.token_secret_arn", "var.checkpoint_bucket", "var.vpc_id"}) {
    EXPECT_TRUE(declared.count(v)) << "the module has no variable " << v;
  }
  for (const char* r :
       {"aws_ecs_cluster.this", "aws_service_discovery_private_dns_namespace.this",
        "aws_service_discovery_service.head", "aws_ecs_task_definition.head",
        "aws_ecs_task_definition.worker", "aws_ecs_service.head", "aws_ecs_service.worker",
        "aws_iam_role.task", "aws_iam_role.execution", "aws_security_group.tasks"}) {
    EXPECT_TRUE(declared.count(r)) << "the module declares no " << r;
  }
}

TEST_F(DeployTerraform, TaskDefinitionsAndNamesComeFromTheEcsJsonFiles) {
  // Every deploy/ecs JSON file is read by the module (no second copy to drift), and every file
  // the module reads exists.
  std::map<std::string, std::vector<fs::path>> local_files;  // local name -> files it decodes
  std::set<fs::path> read;
  for (const auto& [file, b] : module_.blocks) {
    each_attribute(b, [&](const json& block, const std::string& name, const json& attr) {
      for (const std::string s : attr["strings"]) {
        if (!ends_with(s, ".json")) continue;
        const fs::path p = fs::weakly_canonical(s);
        EXPECT_TRUE(fs::exists(p))
            << file << ": " << name << " reads " << s << ", which does not exist.";
        read.insert(p);
        if (block["type"] == "locals") local_files[name].push_back(p);
      }
    });
  }
  for (const auto& e : fs::directory_iterator(kEcsDir)) {
    if (e.path().extension() != ".json") continue;
    EXPECT_TRUE(read.count(fs::weakly_canonical(e.path())))
        << "deploy/terraform does not read " << e.path().filename()
        << ": the module and the file would drift apart.";
  }

  // templatefile() gets every variable each task definition uses, and renders valid JSON.
  std::set<std::string> passed;
  for (const auto& b : blocks_of("locals")) {
    if (b["attributes"].contains("template_vars")) {
      for (const std::string k : b["attributes"]["template_vars"]["keys"]) passed.insert(k);
    }
  }
  ASSERT_FALSE(passed.empty()) << "no local.template_vars in deploy/terraform";
  std::map<fs::path, json> rendered;
  for (const json& t : module_.templates) {
    for (const std::string v : t["variables"]) {
      EXPECT_TRUE(passed.count(v))
          << t["path"] << " uses ${" << v << "}, which local.template_vars does not set.";
    }
    const json doc = json::parse(t["rendered"].get<std::string>(), nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << t["path"] << " rendered is not JSON";
    rendered[fs::weakly_canonical(t["path"].get<std::string>())] = doc;
  }

  // Every JSON field the module reads (local.head_task.containerDefinitions[0]...) exists in
  // each file its local decodes; try() marks the ones a file may lack.
  int checked = 0;
  for (const auto& [file, b] : module_.blocks) {
    each_attribute(b, [&](const json&, const std::string& name, const json& attr) {
      const json& optional = attr["optional_references"];
      for (const std::string ref : attr["references"]) {
        if (!ref.starts_with("local.")) continue;
        const std::string local = ref.substr(6, ref.find_first_of(".[", 6) - 6);
        if (!local_files.count(local)) continue;
        if (std::find(optional.begin(), optional.end(), ref) != optional.end()) continue;
        for (const auto& p : local_files[local]) {
          const json doc = rendered.count(p) ? rendered[p] : load_json(p);
          EXPECT_TRUE(json_has(doc, json_steps(ref)))
              << file << ": " << name << " reads " << ref << ", which " << p.filename()
              << " does not have.";
          ++checked;
        }
      }
    });
  }
  EXPECT_GT(checked, 20);

  // The resources take their definitions and names from those locals.
  const json* head_td = resource("aws_ecs_task_definition", "head");
  ASSERT_NE(head_td, nullptr);
  EXPECT_EQ(head_td->at("attributes")["container_definitions"]["references"],
            json::array({"local.head_task.containerDefinitions"}));
  EXPECT_TRUE(contains(local_files["head_task"].at(0).string(), "head-task-definition.json"));
  const json* worker_td = resource("aws_ecs_task_definition", "worker");
  ASSERT_NE(worker_td, nullptr);
  EXPECT_EQ(worker_td->at("attributes")["container_definitions"]["references"],
            json::array({"local.worker_task.containerDefinitions"}));
  const json* ns = resource("aws_service_discovery_private_dns_namespace", "this");
  ASSERT_NE(ns, nullptr);
  EXPECT_EQ(ns->at("attributes")["name"]["references"], json::array({"local.namespace.Name"}));
  EXPECT_TRUE(contains(local_files["namespace"].at(0).string(), "cloud-map-namespace.json"));
  const json* head_sd = resource("aws_service_discovery_service", "head");
  ASSERT_NE(head_sd, nullptr);
  EXPECT_EQ(head_sd->at("attributes")["name"]["references"],
            json::array({"local.head_discovery.Name"}));
  EXPECT_TRUE(
      contains(local_files["head_discovery"].at(0).string(), "head-discovery-service.json"));
}

TEST_F(DeployTerraform, ServicesRegisterInCloudMapAndTasksUseTheTaskRole) {
  for (const std::string role : {"head", "worker"}) {
    const json* service = resource("aws_ecs_service", role);
    ASSERT_NE(service, nullptr) << role;
    std::map<std::string, json> nested;
    for (const auto& b : service->at("blocks")) nested[b["type"]] = b;
    ASSERT_TRUE(nested.count("service_registries")) << role;
    EXPECT_EQ(nested["service_registries"]["attributes"]["registry_arn"]["references"],
              json::array({"aws_service_discovery_service." + role + ".arn"}));
    ASSERT_TRUE(nested.count("network_configuration")) << role;
    EXPECT_EQ(nested["network_configuration"]["attributes"]["security_groups"]["references"],
              json::array({"aws_security_group.tasks.id"}));
    EXPECT_EQ(service->at("attributes")["task_definition"]["references"],
              json::array({"aws_ecs_task_definition." + role + ".arn"}));
    const json* td = resource("aws_ecs_task_definition", role);
    ASSERT_NE(td, nullptr);
    EXPECT_EQ(td->at("attributes")["task_role_arn"]["references"],
              json::array({"aws_iam_role.task.arn"}));
  }
  // The task role's policy covers the checkpoint bucket.
  bool bucket = false;
  for (const auto& b : blocks_of("locals")) {
    if (b["attributes"].contains("bucket_arn")) {
      bucket = b["attributes"]["bucket_arn"]["references"].dump().find("var.checkpoint_bucket") !=
               std::string::npos;
    }
  }
  EXPECT_TRUE(bucket) << "local.bucket_arn should be built from var.checkpoint_bucket";
  // Clients reach the head's port, taken from the head's task definition.
  const json* clients = resource("aws_vpc_security_group_ingress_rule", "clients");
  ASSERT_NE(clients, nullptr);
  EXPECT_EQ(clients->at("attributes")["from_port"]["references"], json::array({"local.head_port"}));
}

// --- The tasks, run -----------------------------------------------------------------------------

// A container as its task definition describes it, run on this machine: the image's trainyard
// is this build's, absolute paths in its arguments live under `root` (the container's own file
// system), and its environment is only what ECS gives it (no variable of this test's process).
struct Container {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value"
};

Container container_for(const json& task,
                        const fs::path& root,
                        const std::map<std::string, std::string>& secrets_manager) {
  const json& c = container_of(task);
  Container out;
  for (const std::string word : command_of(c)) {
    if (word == kImageCli) {
      out.argv.push_back(TRAINYARD_CLI_PATH);
    } else if (word.starts_with("/")) {
      fs::create_directories(root / word.substr(1));  // the image has these directories
      out.argv.push_back((root / word.substr(1)).string());
    } else {
      out.argv.push_back(word);
    }
  }
  fs::create_directories(root / "home");
  out.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME=" + (root / "home").string(),
             // ECS serves the task role's credentials here (storage/aws_credentials reads it).
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=/v2/credentials/test"};
  const std::regex placeholder(R"(\$\{([A-Z_]+)\})");
  for (const json& e : c.value("environment", json::array())) {
    out.env.push_back(e["name"].get<std::string>() + "=" +
                      std::regex_replace(e["value"].get<std::string>(), placeholder, "us-east-1"));
  }
  for (const json& s : c.value("secrets", json::array())) {
    const auto it = secrets_manager.find(s["valueFrom"]);
    EXPECT_NE(it, secrets_manager.end()) << "no secret " << s["valueFrom"] << " for " << s;
    if (it != secrets_manager.end())
      out.env.push_back(s["name"].get<std::string>() + "=" + it->second);
  }
  return out;
}

// argv inside namespace `ns`, with exactly the container's environment.
std::vector<std::string> in_container(const Hosts& hosts,
                                      int ns,
                                      const Container& c,
                                      std::vector<std::string> argv) {
  std::vector<std::string> full = hosts.in(ns, {"env", "-i"});
  full.insert(full.end(), c.env.begin(), c.env.end());
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

std::unique_ptr<elastic::Subprocess> start_task(const std::vector<std::string>& argv,
                                                const fs::path& log) {
  return std::make_unique<elastic::Subprocess>(elastic::SubprocessOptions{
      .argv = {"/bin/sh", "-c",
               "exec " + elastic::shell_quote(argv) + " >>'" + log.string() + "' 2>&1"},
      .stdout_mode = elastic::OutputMode::kInherit,
      .stderr_mode = elastic::OutputMode::kInherit,
      .destructor_term_timeout = 15s});
}

// The head's healthCheck as Docker runs it for ECS: in the container, with its environment.
RunOutput run_health_check(const Hosts& hosts, const json& head_task, const Container& head) {
  const json& check = container_of(head_task).at("healthCheck");
  std::vector<std::string> argv;
  for (const std::string w : check.at("command"))
    argv.push_back(w == kImageCli ? TRAINYARD_CLI_PATH : w);
  if (argv.front() == "CMD-SHELL") {
    argv = {"/bin/sh", "-c", argv.at(1)};
  } else {
    argv.erase(argv.begin());
  }
  return run_program(in_container(hosts, 0, head, argv), {},
                     std::chrono::seconds(check.value("timeout", 5)));
}

TEST(DeployEcsTasks, HeadAndTwoWorkersRunAsTheTaskDefinitionsSayAndTrainAJob) {
  Hosts hosts(3);
  if (!hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << hosts.error());
  // Cloud Map's record: every task resolves the head's name to the head task's address.
  const std::string head_name = head_dns_name();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(hosts.set_hosts(i, hosts.addr(0) + " " + head_name + "\n"));
  TempDir dir;
  const std::map<std::string, std::string> secrets_manager = {
      {"${TOKEN_SECRET_ARN}", "ecs-test-token-5f1d0c2a9b8e7d6c"}};
  const json head_task = load_json(kEcsDir / "head-task-definition.json");
  const json worker_task = load_json(kEcsDir / "worker-task-definition.json");
  const Container head = container_for(head_task, dir.path() / "head", secrets_manager);
  const Container w1 = container_for(worker_task, dir.path() / "w1", secrets_manager);
  const Container w2 = container_for(worker_task, dir.path() / "w2", secrets_manager);
  const auto logs = [&] {
    return "\n--- head ---\n" + read_file(dir.path() / "head.log") + "\n--- w1 ---\n" +
           read_file(dir.path() / "w1.log") + "\n--- w2 ---\n" + read_file(dir.path() / "w2.log");
  };

  // ECS starts the services' tasks in no particular order: the workers first here.
  auto worker1 = start_task(in_container(hosts, 1, w1, w1.argv), dir.path() / "w1.log");
  auto worker2 = start_task(in_container(hosts, 2, w2, w2.argv), dir.path() / "w2.log");
  const RunOutput before = run_health_check(hosts, head_task, head);
  EXPECT_FALSE(before.status.success()) << "the health check passed with no head running:\n"
                                        << before.out << before.err;
  auto head_process = start_task(in_container(hosts, 0, head, head.argv), dir.path() / "head.log");

  // Healthy within the check's start period.
  const int start_period = container_of(head_task)["healthCheck"].value("startPeriod", 0);
  RunOutput check;
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        check = run_health_check(hosts, head_task, head);
        return check.status.success();
      },
      std::chrono::seconds(std::max(start_period, 10))))
      << check.out << check.err << logs();
  // A client in the head's task (aws ecs execute-command) sees both workers with its own env.
  const auto in_head = [&](std::vector<std::string> args, std::chrono::seconds timeout) {
    args.insert(args.begin(), TRAINYARD_CLI_PATH);
    return run_program(in_container(hosts, 0, head, args), {}, timeout);
  };
  ASSERT_TRUE(ClusterFixture::eventually(
      [&] {
        const auto s = json::parse(in_head({"status", "--json"}, 10s).out, nullptr, false);
        int alive = 0;
        if (s.is_object()) {
          for (const auto& n : s["nodes"]) alive += n.value("state", "") == "alive";
        }
        return alive == 2;
      },
      30s))
      << logs();
  const auto status = in_head({"status", "-v"}, 10s);
  EXPECT_TRUE(contains(status.out, hosts.addr(1)) && contains(status.out, hosts.addr(2)))
      << status.out;

  const auto r = in_head({"submit",
                          "--nodes",
                          "2",
                          "--nproc-per-node",
                          "1",
                          "--submission-id",
                          "ecs",
                          "--",
                          TRAINYARD_CLI_PATH,
                          "train",
                          "fashion-mnist",
                          "--epochs",
                          "1",
                          "--limit",
                          "1024",
                          "--batch-size",
                          "64",
                          "--threads",
                          "1",
                          "--storage",
                          dir.str(),
                          "--name",
                          "ecs-run",
                          "--no-progress"},
                         40s);
  ASSERT_EQ(r.status.exit_code, 0) << r.out << r.err << logs();
  EXPECT_TRUE(contains(r.out, "Job 'ecs' succeeded")) << r.out;
  EXPECT_TRUE(contains(r.out, "Process rank 0") && contains(r.out, "Process rank 1")) << r.out;
  const json result =
      json::parse(read_file(dir.path() / "ecs-run" / "result.json"), nullptr, false);
  ASSERT_TRUE(result.is_object()) << r.out;
  EXPECT_EQ(result["world_size"].get<int>(), 2) << result.dump();
  EXPECT_EQ(result["training_iteration"].get<int>(), 1) << result.dump();
  // 8 steps of 2 x 64 images: well above chance (0.1), and a loss below chance's ln 10 = 2.30.
  EXPECT_GT(result["accuracy"].get<double>(), 0.3) << result.dump();
  EXPECT_LT(result["loss"].get<double>(), 2.3) << result.dump();

  // A wrong token fails the check: it tests the head's auth, not only that a port is open.
  Container wrong = head;
  for (auto& e : wrong.env) {
    if (e.starts_with("TRAINYARD_TOKEN=")) e = "TRAINYARD_TOKEN=not-the-token";
  }
  EXPECT_FALSE(run_health_check(hosts, head_task, wrong).status.success());
  // ECS stops a task with SIGTERM: the workers leave and the head stops, each exiting 0.
  for (auto* p : {worker1.get(), worker2.get(), head_process.get()}) p->send_signal(SIGTERM);
  for (auto* p : {worker1.get(), worker2.get(), head_process.get()}) {
    const auto s = p->wait_for(20s);
    ASSERT_TRUE(s.has_value()) << logs();
    EXPECT_TRUE(s->success()) << s->to_string() << logs();
  }
}

}  // namespace
}  // namespace trainyard::mptest
