// The Kubernetes manifests (deploy/kubernetes) and the Dockerfile, used rather than only shipped:
// every document parses and hangs together (selectors, ports, names, volumes); kubectl decodes
// every workload into Kubernetes' own types offline and keeps every field; and each workload's
// containers run for real, one network namespace per pod, with the exact command, arguments and
// environment the manifest gives them and what the cluster would add (the training operator's
// PET_* variables, the Job's completion index, Secrets, the downward API, Service names in each
// pod's /etc/hosts, volumes as directories). Only the run's size is cut, through the variables
// the manifests declare for it (EPOCHS, TRAIN_LIMIT, THREADS). Skipped where network namespaces or
// etcd are missing, failed there under CI.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../multiproc/multiproc_util.h"
#include "../text.h"
#include "kube_pod.h"
#include "netns_hosts.h"

namespace trainyard::kubetest {
namespace {

using mptest::Hosts;
using mptest::read_file;
using mptest::run_program;
using mptest::TempDir;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const fs::path kSource = TRAINYARD_SOURCE_DIR;
const fs::path kManifests = kSource / "deploy" / "kubernetes";
// The size of every training run here: one epoch of 512 images (2 steps of 128 on 2 ranks), one
// thread per rank (the pods share this machine's cores).
const std::map<std::string, std::string> kSmallRun = {
    {"EPOCHS", "1"}, {"TRAIN_LIMIT", "512"}, {"THREADS", "1"}};

using trainyard::test::contains;

std::string str(const YAML::Node& n) {
  return n.as<std::string>("");
}

std::map<std::string, std::string> string_map(const YAML::Node& n) {
  std::map<std::string, std::string> out;
  for (const auto& kv : n) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  return out;
}

// Every label of `selector` is among `labels`.
bool selects(const std::map<std::string, std::string>& selector,
             const std::map<std::string, std::string>& labels) {
  if (selector.empty()) return false;
  return std::all_of(selector.begin(), selector.end(), [&](const auto& kv) {
    const auto l = labels.find(kv.first);
    return l != labels.end() && l->second == kv.second;
  });
}

struct Doc {
  std::string file;
  YAML::Node node;
  std::string id() const { return file + ": " + kind_of(node) + "/" + name_of(node); }
};

std::vector<fs::path> manifest_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kManifests)) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Doc> all_docs() {
  std::vector<Doc> docs;
  for (const auto& f : manifest_files()) {
    for (const auto& d : load_manifest(f)) docs.push_back({f.filename().string(), d});
  }
  return docs;
}

// The ClusterTrainingRuntime that TrainJob `job` names in runtimeRef, from the manifests.
YAML::Node trainjob_runtime(const YAML::Node& job) {
  for (const auto& d : all_docs()) {
    if (kind_of(d.node) == "ClusterTrainingRuntime" &&
        name_of(d.node) == at(job, {"spec", "runtimeRef", "name"}).as<std::string>(""))
      return d.node;
  }
  throw std::runtime_error("No manifest defines the runtime that TrainJob " + name_of(job) +
                           " names.");
}

bool has_pod_template(const std::string& kind) {
  return kind == "Deployment" || kind == "StatefulSet" || kind == "Job" || kind == "PyTorchJob" ||
         kind == "ClusterTrainingRuntime";
}

// ---------------------------------------------------------------------------------------------
// A pod: one container's command in a network namespace, its output in a file.

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class Pod {
 public:
  // `name` is also the pod's hostname, as Kubernetes makes it (the Job controller names an Indexed
  // Job's pods' hosts <job>-<index>); each test maps it to the namespace's address in /etc/hosts,
  // as the kubelet does, so that programs resolving their own hostname (Gloo) find the pod's IP.
  Pod(std::string name, const Hosts& hosts, int ns, const ContainerRun& run, const fs::path& dir)
      : name_(std::move(name)), log_(dir / (name_ + ".log")) {
    // A UTS namespace of its own for the hostname; env -i: the container's environment alone.
    std::vector<std::string> argv = {
        "unshare", "--uts", "/bin/sh", "-c", "hostname \"$0\" && exec \"$@\"", name_, "env", "-i"};
    for (const auto& [k, v] : run.env) argv.push_back(k + "=" + v);
    argv.insert(argv.end(), run.argv.begin(), run.argv.end());
    std::string cmd = "exec";
    for (const auto& a : hosts.in(ns, argv)) {
      cmd += ' ';  // appended apart: g++ 12 warns falsely (-Wrestrict) on " " + quote(a)
      cmd += quote(a);
    }
    cmd += " >" + quote(log_.string()) + " 2>&1";
    process_ = std::make_unique<elastic::Subprocess>(
        elastic::SubprocessOptions{.argv = {"/bin/sh", "-c", cmd},
                                   .stdout_mode = elastic::OutputMode::kInherit,
                                   .stderr_mode = elastic::OutputMode::kInherit,
                                   .destructor_term_timeout = 10s});
  }
  const std::string& name() const { return name_; }
  std::string log() const { return "--- pod " + name_ + ":\n" + read_file(log_); }
  elastic::Subprocess& process() { return *process_; }

 private:
  std::string name_;
  fs::path log_;
  std::unique_ptr<elastic::Subprocess> process_;
};

std::string logs_of(const std::vector<std::unique_ptr<Pod>>& pods) {
  std::string out;
  for (const auto& p : pods) out += p->log() + "\n";
  return out;
}

// Waits at most `timeout` for `part` in the pod's log.
bool wait_for_log(const Pod& pod, const std::string& part, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (contains(pod.log(), part)) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// Every pod exits 0 within `timeout` (in all); a failure names the pod and prints every log.
void expect_all_succeed(const std::vector<std::unique_ptr<Pod>>& pods,
                        std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& p : pods) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto status = p->process().wait_for(std::max(left, std::chrono::milliseconds(1)));
    ASSERT_TRUE(status.has_value())
        << "pod " << p->name() << " still runs after " << timeout.count() << " s\n"
        << logs_of(pods);
    EXPECT_TRUE(status->success()) << "pod " << p->name() << " exited with code "
                                   << status->exit_code << " (signal " << status->signal << ")\n"
                                   << logs_of(pods);
  }
}

// What every pod here shares: the image's programs (this build's trainyard, Debian's etcd),
// a home, Service names in /etc/hosts, and directories standing in for volumes.
struct PodEnvironment {
  explicit PodEnvironment(int namespaces) : hosts(namespaces), count(namespaces) {
    fs::create_directories(bin());
    fs::create_directories(home());
    fs::create_symlink(TRAINYARD_CLI_PATH, bin() / "trainyard");
    if (fs::exists(TRAINYARD_ETCD_PATH)) fs::create_symlink(TRAINYARD_ETCD_PATH, bin() / "etcd");
  }
  fs::path bin() const { return dir.path() / "image-bin"; }
  fs::path home() const { return dir.path() / "home"; }
  fs::path volume(const std::string& name) const {
    fs::create_directories(dir.path() / "volumes" / name);
    return dir.path() / "volumes" / name;
  }
  PodContext context() const { return {.bin_dir = bin(), .home = home()}; }
  // The same names in every namespace, as the cluster's DNS answers every pod alike.
  bool set_hosts(const std::vector<std::pair<std::string, int>>& names) {
    std::string lines;
    for (const auto& [name, ns] : names) lines += hosts.addr(ns) + " " + name + "\n";
    bool ok = true;
    for (int i = 0; i < count; ++i) ok = hosts.set_hosts(i, lines) && ok;
    return ok;
  }

  TempDir dir;
  Hosts hosts;
  int count;  // namespaces
};

// ---------------------------------------------------------------------------------------------
// The manifests hang together.

TEST(DeployKubernetes, EveryDocumentParsesWithKnownKindAndApiVersion) {
  const std::map<std::string, std::string> api = {
      {"Service", "v1"},
      {"PersistentVolumeClaim", "v1"},
      {"ServiceAccount", "v1"},
      {"Deployment", "apps/v1"},
      {"StatefulSet", "apps/v1"},
      {"Job", "batch/v1"},
      {"PyTorchJob", "kubeflow.org/v1"},
      {"TrainJob", "trainer.kubeflow.org/v1alpha1"},
      {"ClusterTrainingRuntime", "trainer.kubeflow.org/v1alpha1"}};
  const auto files = manifest_files();
  std::set<std::string> names;
  for (const auto& f : files) names.insert(f.filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{"etcd.yaml", "head.yaml", "indexed-job.yaml",
                                   "pytorchjob-c10d.yaml", "pytorchjob-etcd.yaml", "storage.yaml",
                                   "trainingruntime.yaml", "trainjob.yaml", "worker.yaml"}));
  std::set<std::string> ids;
  for (const auto& f : files) {
    std::vector<YAML::Node> docs;
    ASSERT_NO_THROW(docs = load_manifest(f)) << f;
    ASSERT_FALSE(docs.empty()) << f;
    for (const auto& d : docs) {
      ASSERT_TRUE(d.IsMap()) << f << ": a document that is not a mapping";
      const Doc doc{f.filename().string(), d};
      ASSERT_TRUE(api.count(kind_of(d)) > 0) << doc.id() << ": a kind these tests do not know";
      EXPECT_EQ(str(d["apiVersion"]), api.at(kind_of(d))) << doc.id();
      EXPECT_FALSE(name_of(d).empty()) << doc.id() << ": no metadata.name";
      EXPECT_TRUE(ids.insert(kind_of(d) + "/" + name_of(d)).second) << doc.id() << " twice";
    }
  }
  // The README says how to use each file.
  const auto readme = read_file(kManifests / "README.md");
  for (const auto& n : names)
    EXPECT_TRUE(contains(readme, n)) << "deploy/kubernetes/README.md omits " << n;
}

TEST(DeployKubernetes, WorkloadsServicesVolumesAndAccountsReferToOneAnother) {
  const auto docs = all_docs();
  std::set<std::string> defined;
  for (const auto& d : docs) defined.insert(kind_of(d.node) + "/" + name_of(d.node));
  std::string all_text;
  for (const auto& f : manifest_files()) all_text += read_file(f);

  for (const auto& d : docs) {
    const auto kind = kind_of(d.node);
    if (!has_pod_template(kind)) continue;
    const auto tmpl = pod_template(d.node);
    const auto labels = string_map(tmpl["metadata"]["labels"]);
    if (kind == "Deployment" || kind == "StatefulSet") {
      EXPECT_TRUE(selects(string_map(d.node["spec"]["selector"]["matchLabels"]), labels))
          << d.id() << ": spec.selector.matchLabels must match the pod template's labels";
    }
    const auto spec = tmpl["spec"];
    if (spec["serviceAccountName"]) {
      EXPECT_TRUE(defined.count("ServiceAccount/" + str(spec["serviceAccountName"])) > 0)
          << d.id() << " runs as a ServiceAccount no manifest defines";
    }
    std::set<std::string> volumes;
    for (const auto& v : spec["volumes"]) {
      volumes.insert(str(v["name"]));
      if (v["persistentVolumeClaim"]) {
        EXPECT_TRUE(defined.count("PersistentVolumeClaim/" +
                                  str(v["persistentVolumeClaim"]["claimName"])) > 0)
            << d.id() << ": volume " << str(v["name"]) << " claims a PVC no manifest defines";
      }
    }
    for (const auto& v : d.node["spec"]["volumeClaimTemplates"]) {
      volumes.insert(str(v["metadata"]["name"]));
    }
    ASSERT_TRUE(spec["containers"].IsSequence()) << d.id() << ": no containers";
    for (const auto& c : spec["containers"]) {
      EXPECT_FALSE(str(c["image"]).empty()) << d.id() << ": container without an image";
      EXPECT_TRUE(c["command"].IsSequence()) << d.id() << ": container without a command";
      for (const auto& m : c["volumeMounts"]) {
        EXPECT_TRUE(volumes.count(str(m["name"])) > 0)
            << d.id() << ": mount of an undefined volume " << str(m["name"]);
      }
      for (const auto& e : c["env"]) {
        const auto ref = at(e, {"valueFrom", "secretKeyRef"});
        if (!ref || ref["optional"].as<bool>(false)) continue;
        // A required Secret is the user's to create; the manifests say how.
        EXPECT_TRUE(contains(all_text, "kubectl create secret generic " + str(ref["name"])))
            << d.id() << " needs the Secret " << str(ref["name"])
            << ", and no manifest says how to create it";
      }
    }
  }

  // Each Service selects the pods of exactly one workload, on ports those pods' containers have.
  for (const auto& s : docs) {
    if (kind_of(s.node) != "Service") continue;
    const auto selector = string_map(s.node["spec"]["selector"]);
    std::vector<const Doc*> selected;
    for (const auto& d : docs) {
      if (has_pod_template(kind_of(d.node)) &&
          selects(selector, string_map(pod_template(d.node)["metadata"]["labels"]))) {
        selected.push_back(&d);
      }
    }
    ASSERT_EQ(selected.size(), 1U) << s.id() << " selects the pods of " << selected.size()
                                   << " workloads; it should select one";
    const auto spec = pod_template(selected.front()->node)["spec"];
    for (const auto& p : s.node["spec"]["ports"]) {
      const auto target = p["targetPort"] ? str(p["targetPort"]) : str(p["port"]);
      bool found = false;
      for (const auto& c : spec["containers"]) {
        for (const auto& cp : c["ports"]) {
          found = found || str(cp["name"]) == target || str(cp["containerPort"]) == target;
        }
      }
      EXPECT_TRUE(found) << s.id() << ": port " << str(p["port"]) << " targets '" << target
                         << "', which no container of " << selected.front()->id() << " exposes";
    }
    if (kind_of(selected.front()->node) == "StatefulSet") {
      EXPECT_EQ(str(selected.front()->node["spec"]["serviceName"]), name_of(s.node));
      EXPECT_EQ(str(s.node["spec"]["clusterIP"]), "None") << s.id() << " must be headless";
    }
  }
}

// The port `name` of Service `service`, as a string.
std::string service_port(const YAML::Node& service, const std::string& name) {
  for (const auto& p : service["spec"]["ports"]) {
    if (str(p["name"]) == name) return str(p["port"]);
  }
  return "";
}

TEST(DeployKubernetes, PyTorchJobsAreElasticAndRunTrainyardFromPetVariables) {
  const auto etcd_service = find_doc(load_manifest(kManifests / "etcd.yaml"), "Service", "etcd");
  for (const auto& [file, backend] : std::vector<std::pair<std::string, std::string>>{
           {"pytorchjob-c10d.yaml", "c10d"}, {"pytorchjob-etcd.yaml", "etcd"}}) {
    SCOPED_TRACE(file);
    const auto docs = load_manifest(kManifests / file);
    ASSERT_EQ(docs.size(), 1U);
    const auto job = docs.front();
    ASSERT_EQ(kind_of(job), "PyTorchJob");
    const auto p = job["spec"]["elasticPolicy"];
    ASSERT_TRUE(p.IsMap()) << "no elasticPolicy";
    EXPECT_EQ(str(p["rdzvBackend"]), backend);
    for (const char* field :
         {"rdzvPort", "rdzvId", "minReplicas", "maxReplicas", "maxRestarts", "nProcPerNode"}) {
      EXPECT_TRUE(p[field].IsScalar()) << "elasticPolicy." << field << " missing";
    }
    const auto worker = job["spec"]["pytorchReplicaSpecs"]["Worker"];
    const int replicas = worker["replicas"].as<int>();
    EXPECT_LE(p["minReplicas"].as<int>(), replicas);
    EXPECT_LE(replicas, p["maxReplicas"].as<int>());
    EXPECT_GE(p["maxRestarts"].as<int>(), 1);
    EXPECT_EQ(job["spec"]["pytorchReplicaSpecs"].size(), 1U) << "Worker replicas only";
    // The operator finds the container by this name.
    YAML::Node c;
    ASSERT_NO_THROW(c = container_of(worker["template"]["spec"], "pytorch"));
    if (backend == "etcd") {
      EXPECT_EQ(str(p["rdzvHost"]), name_of(etcd_service)) << "rdzvHost is etcd.yaml's Service";
      EXPECT_EQ(str(p["rdzvPort"]), service_port(etcd_service, "client"));
    } else {
      EXPECT_FALSE(p["rdzvHost"]) << "c10d: the first worker serves the store";
      std::string port;
      for (const auto& cp : c["ports"]) {
        if (str(cp["name"]) == "pytorchjob-port") port = str(cp["containerPort"]);
      }
      EXPECT_EQ(port, str(p["rdzvPort"])) << "the store's port is the pytorchjob-port";
    }
    // `trainyard run` with no flags of its own (the PET_* variables give them), then the recipe.
    std::vector<std::string> argv;
    for (const auto& a : c["command"]) argv.push_back(str(a));
    for (const auto& a : c["args"]) argv.push_back(str(a));
    ASSERT_GE(argv.size(), 6U);
    EXPECT_EQ(std::vector<std::string>(argv.begin(), argv.begin() + 6),
              (std::vector<std::string>{"trainyard", "run", "--", "trainyard", "train",
                                        "fashion-mnist"}));
    for (const auto& e : c["env"]) {
      EXPECT_FALSE(str(e["name"]).starts_with("PET_"))
          << str(e["name"]) << ": the training operator sets the PET_* variables";
    }
  }
}

TEST(DeployKubernetes, TrainJobRunsTrainyardFromTrainerV2sVariablesOnItsRuntime) {
  const auto job =
      find_doc(load_manifest(kManifests / "trainjob.yaml"), "TrainJob", "fashion-mnist-v2");
  YAML::Node runtime;
  ASSERT_NO_THROW(runtime = trainjob_runtime(job));
  // The kind defaults to ClusterTrainingRuntime; the controller finds the Job to put the trainer
  // settings on by its ancestor label, and the container by the name "node".
  EXPECT_FALSE(at(job, {"spec", "runtimeRef", "kind"}).IsDefined());
  const auto replicated = at(runtime, {"spec", "template", "spec", "replicatedJobs"});
  ASSERT_EQ(replicated.size(), 1U);
  EXPECT_EQ(str(at(replicated[0], {"template", "metadata",
                                   "labels"})["trainer.kubeflow.org/trainjob-ancestor-step"]),
            "trainer");
  EXPECT_EQ(str(at(runtime, {"metadata", "labels"})["trainer.kubeflow.org/framework"]), "torch");
  YAML::Node c;
  ASSERT_NO_THROW(c = container_of(pod_template(runtime)["spec"], "node"));
  // v2 has no elastic policy: a fixed size, and the JobSet restarts the whole group.
  EXPECT_FALSE(at(runtime, {"spec", "mlPolicy", "torch", "elasticPolicy"}).IsDefined());
  EXPECT_GE(at(runtime, {"spec", "template", "spec", "failurePolicy", "maxRestarts"}).as<int>(0),
            1);
  const auto trainer = at(job, {"spec", "trainer"});
  EXPECT_EQ(trainer["numNodes"].as<int>(), 2);
  // An int: v2.2 took the strings (auto, cpu, gpu) away.
  EXPECT_EQ(trainer["numProcPerNode"].as<int>(), 1);
  std::vector<std::string> argv;
  for (const auto& a : trainer["command"]) argv.push_back(str(a));
  for (const auto& a : trainer["args"]) argv.push_back(str(a));
  ASSERT_GE(argv.size(), 6U);
  EXPECT_EQ(
      std::vector<std::string>(argv.begin(), argv.begin() + 6),
      (std::vector<std::string>{"trainyard", "run", "--", "trainyard", "train", "fashion-mnist"}));
  for (const auto& e : trainer["env"]) {
    EXPECT_FALSE(str(e["name"]).starts_with("PET_"))
        << str(e["name"]) << ": Trainer v2 sets the PET_* variables and rejects a TrainJob's own";
  }
  // The README of deploy/ says what v2 lacks and what to use instead.
  const auto readme = read_file(kManifests / "README.md");
  EXPECT_TRUE(contains(readme, "no elastic policy")) << "deploy/kubernetes/README.md";
}

TEST(DeployKubernetes, IndexedJobFindsIndexZeroThroughItsHeadlessService) {
  const auto docs = load_manifest(kManifests / "indexed-job.yaml");
  const auto job = find_doc(docs, "Job", "fashion-mnist-indexed");
  const auto spec = job["spec"];
  EXPECT_EQ(str(spec["completionMode"]), "Indexed");
  EXPECT_EQ(str(spec["completions"]), str(spec["parallelism"]));
  const auto pod = spec["template"]["spec"];
  const auto service = find_doc(docs, "Service", str(pod["subdomain"]));
  EXPECT_EQ(str(service["spec"]["clusterIP"]), "None");
  std::map<std::string, YAML::Node> env;
  for (const auto& e : pod["containers"][0]["env"]) {
    env[str(e["name"])] = static_cast<const YAML::Node&>(e);
  }
  EXPECT_EQ(str(env["PET_NNODES"]["value"]), str(spec["completions"]));
  EXPECT_EQ(str(at(env["PET_NODE_RANK"], {"valueFrom", "fieldRef", "fieldPath"})),
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(str(env["PET_MASTER_ADDR"]["value"]), name_of(job) + "-0." + str(pod["subdomain"]));
  EXPECT_EQ(str(env["PET_MASTER_PORT"]["value"]), service_port(service, "master"));
}

TEST(DeployKubernetes, WorkersFindTheHeadByItsServiceName) {
  const auto head = load_manifest(kManifests / "head.yaml");
  const auto service = find_doc(head, "Service", "trainyard-head");
  const auto worker =
      find_doc(load_manifest(kManifests / "worker.yaml"), "Deployment", "trainyard-worker");
  const auto c = container_of(pod_template(worker)["spec"], "worker");
  std::vector<std::string> args;
  for (const auto& a : c["args"]) args.push_back(str(a));
  const auto at = std::find(args.begin(), args.end(), "--head");
  ASSERT_TRUE(at != args.end() && at + 1 != args.end()) << "the worker has no --head";
  EXPECT_EQ(*(at + 1), name_of(service) + ":" + service_port(service, "http"));
  // The head listens on every interface, on the port its Service forwards to.
  const auto h =
      container_of(pod_template(find_doc(head, "Deployment", "trainyard-head"))["spec"], "head");
  std::vector<std::string> head_args;
  for (const auto& a : h["args"]) head_args.push_back(str(a));
  const auto bind = std::find(head_args.begin(), head_args.end(), "--bind");
  const auto port = std::find(head_args.begin(), head_args.end(), "--port");
  ASSERT_TRUE(bind != head_args.end() && port != head_args.end());
  EXPECT_EQ(*(bind + 1), "0.0.0.0");
  EXPECT_EQ(*(port + 1), service_port(service, "http"));
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile.

// The Dockerfile's instructions, continuation lines joined, comments dropped.
std::vector<std::pair<std::string, std::string>> dockerfile_instructions(const fs::path& file) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(read_file(file));
  std::string line, joined;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    joined += line.substr(first);
    if (!joined.empty() && joined.back() == '\\') {
      joined.pop_back();
      joined += ' ';
      continue;
    }
    const auto space = joined.find(' ');
    out.emplace_back(joined.substr(0, space),
                     space == std::string::npos ? "" : joined.substr(space + 1));
    joined.clear();
  }
  return out;
}

TEST(DeployKubernetes, DockerfileBuildsWithTheProjectScriptsAndRunsAsAUser) {
  const auto steps = dockerfile_instructions(kSource / "Dockerfile");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), (std::pair<std::string, std::string>{"FROM", "debian:12"}));
  std::string runs, user, entrypoint;
  for (const auto& [op, arg] : steps) {
    if (op == "RUN") runs += arg + "\n";
    if (op == "USER") user = arg;
    if (op == "ENTRYPOINT") entrypoint = arg;
    if (op == "COPY") {
      // Every source copied exists in the repository.
      std::istringstream words(arg);
      std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
      ASSERT_GE(w.size(), 2U) << "COPY " << arg;
      for (std::size_t i = 0; i + 1 < w.size(); ++i) {
        EXPECT_TRUE(fs::exists(kSource / w[i])) << "COPY of a missing path " << w[i];
      }
    }
  }
  EXPECT_TRUE(contains(runs, "scripts/setup.sh")) << runs;
  EXPECT_TRUE(contains(runs, "scripts/build.sh")) << runs;
  // The manifests call `trainyard` by name: the image has it on PATH.
  EXPECT_TRUE(contains(runs, "/usr/local/bin")) << runs;
  EXPECT_FALSE(user.empty()) << "no USER: the image would run as root";
  EXPECT_NE(user.substr(0, user.find(':')), "root");
  EXPECT_NE(user.substr(0, user.find(':')), "0");
  // The pods' securityContext runs as uid 1000: the image's user.
  EXPECT_EQ(user.substr(0, user.find(':')), "1000");
  EXPECT_EQ(entrypoint, "[\"trainyard\"]");
  // The scripts the image runs exist and are executable.
  for (const char* s : {"scripts/setup.sh", "scripts/build.sh"}) {
    const auto perms = fs::status(kSource / s).permissions();
    EXPECT_NE(perms & fs::perms::owner_exec, fs::perms::none) << s;
  }
  std::set<std::string> ignored;
  std::istringstream in(read_file(kSource / ".dockerignore"));
  for (std::string line; std::getline(in, line);) ignored.insert(line);
  EXPECT_TRUE(ignored.count("build") > 0) << ".dockerignore must leave out build/";
  EXPECT_TRUE(ignored.count(".git") > 0) << ".dockerignore must leave out .git";
}

// ---------------------------------------------------------------------------------------------
// kubectl, offline.

#ifndef TRAINYARD_KUBECTL_PATH
#define TRAINYARD_KUBECTL_PATH "/usr/bin/kubectl"
#endif

// Fields kubectl keeps only from a version on: an older kubectl drops them.
int kubectl_minor_knowing(const std::string& path) {
  if (path == "spec.completionMode") return 21;  // Indexed Jobs: alpha in 1.21, GA in 1.24
  return 0;
}

// Every scalar under `in` is in `out` at the same place with the same value; `where` names the
// place. Appends a line per difference to `missing` unless the kubectl is older than the field.
void compare_kept(const YAML::Node& in,
                  const YAML::Node& out,
                  const std::string& where,
                  int kubectl_minor,
                  std::vector<std::string>& missing) {
  const auto path_only = [&] {  // where, without sequence indices: "spec.template.spec..."
    std::string p;
    for (std::size_t i = 0; i < where.size(); ++i) {
      if (where[i] == '[') {
        i = where.find(']', i);
      } else {
        p += where[i];
      }
    }
    return p;
  };
  if (!out || out.IsNull()) {
    if (kubectl_minor >= kubectl_minor_knowing(path_only())) {
      missing.push_back(where + " (dropped: Kubernetes has no such field there)");
    }
    return;
  }
  if (in.IsMap()) {
    for (const auto& kv : in) {
      const auto key = kv.first.as<std::string>();
      compare_kept(kv.second, out[key], where.empty() ? key : where + "." + key, kubectl_minor,
                   missing);
    }
  } else if (in.IsSequence()) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      compare_kept(in[i], out.IsSequence() && i < out.size() ? out[i] : YAML::Node(),
                   where + "[" + std::to_string(i) + "]", kubectl_minor, missing);
    }
  } else if (in.IsScalar() && (!out.IsScalar() || out.Scalar() != in.Scalar())) {
    missing.push_back(where + " ('" + in.Scalar() + "' became '" + YAML::Dump(out) + "')");
  }
}

// A YAML node as JSON, with YAML 1.2's core schema for plain scalars (quoted ones are strings):
// what kubectl itself makes of the manifest.
nlohmann::json to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    auto out = nlohmann::json::object();
    for (const auto& kv : n) out[kv.first.as<std::string>()] = to_json(kv.second);
    return out;
  }
  if (n.IsSequence()) {
    auto out = nlohmann::json::array();
    for (const auto& item : n) out.push_back(to_json(item));
    return out;
  }
  if (!n.IsScalar() || (n.Tag() == "?" && (n.Scalar() == "null" || n.Scalar() == "~"))) {
    return nullptr;
  }
  const std::string& s = n.Scalar();
  if (n.Tag() != "?") return s;  // quoted
  if (s == "true" || s == "false") return s == "true";
  const auto number = nlohmann::json::parse(s, nullptr, false);
  if (number.is_number() && !s.starts_with("+") && !s.starts_with(".")) return number;
  return s;
}

TEST(DeployKubernetes, KubectlDecodesEveryWorkloadAndServiceOffline) {
  // TRAINYARD_KUBECTL picks another kubectl (e.g. Debian's 1.20 beside a newer one).
  const char* chosen = std::getenv("TRAINYARD_KUBECTL");
  const std::string kubectl =
      chosen != nullptr && *chosen != '\0' ? chosen : TRAINYARD_KUBECTL_PATH;
  if (!fs::exists(kubectl)) {
    TY_MISSING_PREREQUISITE("kubectl is not installed at "
                            << kubectl << "; run scripts/setup.sh (Debian's kubernetes-client).");
  }
  TempDir dir;
  // No cluster: an empty kubeconfig, and only --local commands, which decode each object into
  // Kubernetes' own Go types (wrong types fail, unknown fields are dropped) without a server.
  // `kubectl apply/create --dry-run=client` need the server's discovery even so.
  const std::vector<std::pair<std::string, std::string>> env = {
      {"KUBECONFIG", (dir.path() / "kubeconfig").string()}, {"HOME", dir.str()}};
  std::ofstream(dir.path() / "kubeconfig") << "";
  const auto version = run_program({kubectl, "version", "--client", "-o", "json"}, env, 30s);
  ASSERT_EQ(version.status.exit_code, 0) << version.out << version.err;
  const auto v = nlohmann::json::parse(version.out, nullptr, false);
  ASSERT_TRUE(v.is_object()) << version.out;
  const int minor = std::atoi(v["clientVersion"].value("minor", "0").c_str());
  std::cout << "kubectl " << v["clientVersion"].value("gitVersion", "?") << "\n";

  int checked = 0;
  for (const auto& d : all_docs()) {
    const auto kind = kind_of(d.node);
    // kubectl has no PyTorchJob type: its Worker pod template, as the operator makes the pods.
    const auto as_pod = [&] {
      YAML::Node pod;
      pod["apiVersion"] = "v1";
      pod["kind"] = "Pod";
      pod["metadata"] = YAML::Clone(pod_template(d.node)["metadata"]);
      pod["metadata"]["name"] = name_of(d.node) + "-worker-0";
      pod["spec"] = YAML::Clone(pod_template(d.node)["spec"]);
      return pod;
    };
    // Nor Trainer v2's types: the Job that the JobSet of the TrainJob runs on each node, its
    // runtime's with the trainer settings (the runtime alone is checked through it).
    const auto as_node_job = [&] {
      YAML::Node job;
      job["apiVersion"] = "batch/v1";
      job["kind"] = "Job";
      job["metadata"]["name"] = name_of(d.node) + "-node-0";
      job["spec"]["template"] = trainjob_pod_template(trainjob_runtime(d.node), d.node);
      return job;
    };
    if (kind == "ClusterTrainingRuntime") continue;
    const YAML::Node object = kind == "PyTorchJob" ? as_pod()
                              : kind == "TrainJob" ? as_node_job()
                                                   : d.node;
    std::vector<std::string> args;
    if (kind == "Service") {
      std::string selector;
      for (const auto& [k, val] : string_map(d.node["spec"]["selector"])) {
        selector += (selector.empty() ? "" : ",") + k + "=" + val;
      }
      args = {"set", "selector", "--local", selector};
    } else if (has_pod_template(kind) || kind == "TrainJob") {
      args = {"set", "env", "--local", "TRAINYARD_KUBECTL_CHECK=1"};
    } else {
      continue;  // PVCs and ServiceAccounts: no --local command decodes them
    }
    const auto file = dir.path() / (kind + "-" + name_of(d.node) + ".json");
    std::ofstream(file) << to_json(object).dump(2) << "\n";
    std::vector<std::string> argv = {kubectl};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"-f", file.string(), "-o", "yaml"});
    const auto r = run_program(argv, env, 30s);
    ASSERT_EQ(r.status.exit_code, 0) << d.id() << ": kubectl rejects it:\n" << r.out << r.err;
    YAML::Node out;
    ASSERT_NO_THROW(out = YAML::Load(r.out)) << r.out;
    std::vector<std::string> missing;
    compare_kept(object, out, "", minor, missing);
    std::string lines;
    for (const auto& m : missing) lines += "  " + m + "\n";
    EXPECT_TRUE(missing.empty()) << d.id() << ": kubectl 1." << minor
                                 << " did not keep these fields:\n"
                                 << lines;
    ++checked;
  }
  EXPECT_EQ(checked, 10) << "every workload (6, and the TrainJob's node Job) and Service (3)";
}

// ---------------------------------------------------------------------------------------------
// The pods, run.

// How a training workload's pods are made: the pod spec, the training container's name, and per
// pod its name (also its hostname) and the variables its controller adds.
struct TrainingPods {
  YAML::Node pod_spec;
  std::string container;
  std::function<std::string(int)> pod_name;
  std::function<Env(int)> injected;
};

// Runs `replicas` such pods in namespaces first .. first + replicas - 1, each with the small run's
// sizes and the shared runs volume, into `pods`; `services` are pods already running (etcd),
// whose logs are printed on failure. Every pod must exit 0 and the run report all of them.
void train_on_pods(const TrainingPods& spec,
                   int replicas,
                   PodEnvironment& pods_env,
                   int first,
                   const std::vector<std::unique_ptr<Pod>>& services,
                   std::vector<std::unique_ptr<Pod>>& pods) {
  const auto runs = pods_env.volume("trainyard-runs");
  fs::path result;
  for (int i = 0; i < replicas; ++i) {
    auto ctx = pods_env.context();
    const std::string pod = spec.pod_name(i);
    ctx.fields = {{"metadata.name", pod}};
    ctx.injected = spec.injected(i);
    ctx.overrides = kSmallRun;
    ctx.mounts = {{"/mnt/runs", runs}};
    const auto run = container_run(spec.pod_spec, spec.container, ctx);
    std::map<std::string, std::string> env(run.env.begin(), run.env.end());
    result = fs::path(env["STORAGE"]) / env["RUN_NAME"] / "result.json";
    pods.push_back(std::make_unique<Pod>(pod, pods_env.hosts, first + i, run, pods_env.dir.path()));
  }
  expect_all_succeed(pods, 55s);
  if (::testing::Test::HasFailure()) {
    std::cout << logs_of(services);
    return;
  }
  const auto r = nlohmann::json::parse(read_file(result), nullptr, false);
  ASSERT_TRUE(r.is_object()) << "no result at " << result << "\n" << logs_of(pods);
  EXPECT_EQ(r["world_size"].get<int>(), replicas) << r.dump();
  std::string logs;
  for (const auto& pod : pods) logs += pod->log();
  EXPECT_TRUE(contains(logs, "Process rank " + std::to_string(replicas - 1))) << logs;
}

// Runs the PyTorchJob's Worker pods in namespaces first .. first + replicas - 1, each with the
// training operator's variables and the pod's own name; `names` are the other Service names
// (etcd). Every pod must exit 0 and the run must report all of them.
void train_pytorchjob(const YAML::Node& job,
                      PodEnvironment& pods_env,
                      int first,
                      std::vector<std::pair<std::string, int>> names,
                      const std::vector<std::unique_ptr<Pod>>& services) {
  const int replicas = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"].as<int>();
  ASSERT_EQ(replicas, 2) << "the test trains the seeds' 2 workers";
  // The operator's Service per replica: <job>-worker-<i>.
  const auto pod_name = [&](int i) { return name_of(job) + "-worker-" + std::to_string(i); };
  for (int i = 0; i < replicas; ++i) names.emplace_back(pod_name(i), first + i);
  ASSERT_TRUE(pods_env.set_hosts(names));
  std::vector<std::unique_ptr<Pod>> pods;
  train_on_pods({.pod_spec = pod_template(job)["spec"],
                 .container = "pytorch",
                 .pod_name = pod_name,
                 .injected = [&](int) { return training_operator_env(job); }},
                replicas, pods_env, first, services, pods);
}

TEST(DeployKubernetes, C10dPyTorchJobTrainsOnTwoPods) {
  PodEnvironment env(2);
  if (!env.hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << env.hosts.error());
  const auto job =
      find_doc(load_manifest(kManifests / "pytorchjob-c10d.yaml"), "PyTorchJob", "fashion-mnist");
  train_pytorchjob(job, env, 0, {}, {});
}

TEST(DeployKubernetes, EtcdPyTorchJobTrainsOnTwoPodsWithTheEtcdStatefulSet) {
  if (!fs::exists(TRAINYARD_ETCD_PATH)) {
    TY_MISSING_PREREQUISITE("etcd is not installed at " TRAINYARD_ETCD_PATH
                            "; run scripts/setup.sh (Debian's etcd-server).");
  }
  PodEnvironment env(3);
  if (!env.hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << env.hosts.error());
  // etcd.yaml's StatefulSet pod etcd-0 in namespace 2, found as etcd and etcd-0.etcd.
  const auto etcd_docs = load_manifest(kManifests / "etcd.yaml");
  const auto sts = find_doc(etcd_docs, "StatefulSet", "etcd");
  const auto service = find_doc(etcd_docs, "Service", "etcd");
  const std::string pod = name_of(sts) + "-0";
  const std::vector<std::pair<std::string, int>> names = {
      {name_of(service), 2}, {pod + "." + name_of(service), 2}, {pod, 2}};
  ASSERT_TRUE(env.set_hosts(names));
  auto ctx = env.context();
  ctx.fields = {{"metadata.name", pod}};
  ctx.mounts = {{"/var/run/etcd", env.volume("data-etcd-0")}};
  std::vector<std::unique_ptr<Pod>> services;
  services.push_back(std::make_unique<Pod>(
      pod, env.hosts, 2, container_run(pod_template(sts)["spec"], "etcd", ctx), env.dir.path()));
  ASSERT_TRUE(wait_for_log(*services.front(), "ready to serve client requests", 20s))
      << services.front()->log();

  const auto job = find_doc(load_manifest(kManifests / "pytorchjob-etcd.yaml"), "PyTorchJob",
                            "fashion-mnist-etcd");
  train_pytorchjob(job, env, 0, names, services);
}

TEST(DeployKubernetes, TrainJobTrainsOnTwoNodesFromTrainerV2sVariables) {
  PodEnvironment env(2);
  if (!env.hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << env.hosts.error());
  const auto job =
      find_doc(load_manifest(kManifests / "trainjob.yaml"), "TrainJob", "fashion-mnist-v2");
  const auto runtime = trainjob_runtime(job);
  const auto tmpl = trainjob_pod_template(runtime, job);
  const int nodes = at(job, {"spec", "trainer", "numNodes"}).as<int>();
  ASSERT_EQ(nodes, 2) << "the test trains the seeds' 2 workers";
  // The JobSet's pods: hostname <job>-node-0-<index> under the headless Service <job>.
  const std::string name = name_of(job);
  std::vector<std::pair<std::string, int>> names;
  for (int i = 0; i < nodes; ++i) {
    const std::string host = name + "-node-0-" + std::to_string(i);
    names.emplace_back(host, i);
    names.emplace_back(host + "." + name, i);
  }
  ASSERT_TRUE(env.set_hosts(names));
  std::vector<std::unique_ptr<Pod>> pods;
  train_on_pods({.pod_spec = tmpl["spec"],
                 .container = "node",
                 .pod_name = [&](int i) { return name + "-node-0-" + std::to_string(i); },
                 .injected = [&](int i) { return trainjob_env(runtime, job, i); }},
                nodes, env, 0, {}, pods);
  if (::testing::Test::HasFailure()) return;
  // Node 1 met node 0 at the name Trainer v2 gives it.
  EXPECT_TRUE(contains(pods.back()->log(), "this is node 1; world size 2, master " + name +
                                               "-node-0-0." + name + ":29500"))
      << logs_of(pods);
}

TEST(DeployKubernetes, IndexedJobTrainsWithTwoIndices) {
  const auto docs = load_manifest(kManifests / "indexed-job.yaml");
  const auto job = find_doc(docs, "Job", "fashion-mnist-indexed");
  const int n = job["spec"]["completions"].as<int>();
  ASSERT_EQ(n, 2);
  PodEnvironment env(n);
  if (!env.hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << env.hosts.error());
  const auto spec = pod_template(job)["spec"];
  const std::string subdomain = str(spec["subdomain"]);
  // Each pod's hostname is <job>-<index>; with the subdomain's headless Service, DNS answers
  // <job>-<index>.<subdomain>.
  std::vector<std::pair<std::string, int>> names;
  for (int i = 0; i < n; ++i) {
    names.emplace_back(name_of(job) + "-" + std::to_string(i) + "." + subdomain, i);
    names.emplace_back(name_of(job) + "-" + std::to_string(i), i);
  }
  ASSERT_TRUE(env.set_hosts(names));
  const auto runs = env.volume("trainyard-runs");
  std::vector<std::unique_ptr<Pod>> pods;
  fs::path result;
  for (int i = 0; i < n; ++i) {
    auto ctx = env.context();
    const auto index = std::to_string(i);
    // The Job controller's pod name, annotation and variable for the index.
    ctx.fields = {{"metadata.name", name_of(job) + "-" + index + "-x7k2p"},
                  {"metadata.annotations['batch.kubernetes.io/job-completion-index']", index}};
    ctx.injected = {{"JOB_COMPLETION_INDEX", index}};
    ctx.overrides = kSmallRun;
    ctx.mounts = {{"/mnt/runs", runs}};
    const auto run = container_run(spec, "trainyard", ctx);
    std::map<std::string, std::string> e(run.env.begin(), run.env.end());
    result = fs::path(e["STORAGE"]) / e["RUN_NAME"] / "result.json";
    pods.push_back(
        std::make_unique<Pod>(name_of(job) + "-" + index, env.hosts, i, run, env.dir.path()));
  }
  expect_all_succeed(pods, 55s);
  if (::testing::Test::HasFailure()) return;
  const auto r = nlohmann::json::parse(read_file(result), nullptr, false);
  ASSERT_TRUE(r.is_object()) << "no result at " << result << "\n" << logs_of(pods);
  EXPECT_EQ(r["world_size"].get<int>(), n) << r.dump();
  // Node ranks follow the indices: index 1's pod ran global rank 1.
  EXPECT_TRUE(contains(pods[1]->log(), "Process rank 1")) << logs_of(pods);
}

// A Deployment's pod name: the ReplicaSet's hash and a suffix of its own.
std::string worker_pod(int i) {
  return "trainyard-worker-6d9f8-z" + std::to_string(i);
}

TEST(DeployKubernetes, HeadAndWorkerDeploymentsRunASubmittedJob) {
  const auto head_docs = load_manifest(kManifests / "head.yaml");
  const auto head = find_doc(head_docs, "Deployment", "trainyard-head");
  const auto service = find_doc(head_docs, "Service", "trainyard-head");
  const auto worker =
      find_doc(load_manifest(kManifests / "worker.yaml"), "Deployment", "trainyard-worker");
  const int workers = worker["spec"]["replicas"].as<int>();
  ASSERT_EQ(workers, 2);
  PodEnvironment env(1 + workers);
  if (!env.hosts.ok())
    TY_MISSING_PREREQUISITE("cannot create network namespaces here: " << env.hosts.error());
  // The Service's name, and each pod's hostname in its own namespace.
  std::vector<std::pair<std::string, int>> names = {{name_of(service), 0},
                                                    {"trainyard-head-5c7b9-q4x2z", 0}};
  for (int i = 0; i < workers; ++i) names.emplace_back(worker_pod(i), 1 + i);
  ASSERT_TRUE(env.set_hosts(names));
  // kubectl create secret generic trainyard-token --from-literal=token=...
  const std::map<std::string, std::map<std::string, std::string>> secrets = {
      {"trainyard-token", {{"token", "deploy-test-token-0123456789abcdef"}}}};
  const auto runs = env.volume("trainyard-runs");

  std::vector<std::unique_ptr<Pod>> pods;
  // The workers first: they wait for the head's name to answer.
  const auto worker_spec = pod_template(worker)["spec"];
  for (int i = 0; i < workers; ++i) {
    auto ctx = env.context();
    const std::string pod = worker_pod(i);
    ctx.fields = {{"metadata.name", pod}};
    ctx.secrets = secrets;
    ctx.mounts = {{"/mnt/runs", runs},
                  {"/var/lib/trainyard-worker", env.volume("state-" + std::to_string(i))}};
    pods.push_back(std::make_unique<Pod>(
        pod, env.hosts, 1 + i, container_run(worker_spec, "worker", ctx), env.dir.path()));
  }
  auto head_ctx = env.context();
  head_ctx.fields = {{"metadata.name", "trainyard-head-5c7b9-q4x2z"}};
  head_ctx.secrets = secrets;
  head_ctx.mounts = {{"/var/lib/trainyard", env.volume("trainyard-head-state")}};
  const auto head_run = container_run(pod_template(head)["spec"], "head", head_ctx);
  pods.push_back(
      std::make_unique<Pod>("trainyard-head-5c7b9-q4x2z", env.hosts, 0, head_run, env.dir.path()));

  // `kubectl exec deploy/trainyard-head -- trainyard ARGS`: in the head's pod, with its
  // environment (the token), against the head on the pod's loopback.
  const auto exec_in_head = [&](std::vector<std::string> args, std::chrono::seconds timeout) {
    std::vector<std::string> argv = {"env", "-i"};
    for (const auto& [k, v] : head_run.env) argv.push_back(k + "=" + v);
    argv.push_back("trainyard");
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(env.hosts.in(0, argv), {}, timeout);
  };
  const auto deadline = std::chrono::steady_clock::now() + 40s;
  int alive = 0;
  std::string last;
  while (alive < workers && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(300ms);
    const auto r = exec_in_head({"status", "--json"}, 10s);
    last = r.out + r.err;
    const auto s = nlohmann::json::parse(r.out, nullptr, false);
    if (!s.is_object()) continue;
    alive = 0;
    for (const auto& node : s["nodes"]) alive += node.value("state", "") == "alive";
  }
  ASSERT_EQ(alive, workers) << "trainyard status: " << last << "\n" << logs_of(pods);

  // The job as a user submits it; its checkpoints go to the workers' shared volume.
  const auto storage = remap_mounts("/mnt/runs", container_of(worker_spec, "worker"),
                                    PodContext{.mounts = {{"/mnt/runs", runs}}});
  const auto r = exec_in_head({"submit",
                               "--nodes",
                               "2",
                               "--nproc-per-node",
                               "1",
                               "--submission-id",
                               "k8s",
                               "--",
                               "trainyard",
                               "train",
                               "fashion-mnist",
                               "--epochs",
                               "1",
                               "--limit",
                               "512",
                               "--batch-size",
                               "128",
                               "--threads",
                               "1",
                               "--storage",
                               storage,
                               "--name",
                               "cluster-run",
                               "--no-progress"},
                              45s);
  ASSERT_EQ(r.status.exit_code, 0) << r.out << r.err << logs_of(pods);
  EXPECT_TRUE(contains(r.out, "Job 'k8s' succeeded")) << r.out;
  const auto result =
      nlohmann::json::parse(read_file(runs / "cluster-run" / "result.json"), nullptr, false);
  ASSERT_TRUE(result.is_object()) << r.out;
  EXPECT_EQ(result["world_size"].get<int>(), 2) << result.dump();
}

}  // namespace
}  // namespace trainyard::kubetest
