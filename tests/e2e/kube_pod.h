// Kubernetes manifests read with yaml-cpp, and the container a pod of them would run, worked out as
// the kubelet does: envFrom then env in order, values from the downward API and Secrets, the
// variables a controller adds (the training operator's PET_*, Kubeflow Trainer v2's, the Job
// controller's JOB_COMPLETION_INDEX), $(VAR) references expanded, and volume mounts stood in for
// by directories. The deploy tests then run that container's command in a network namespace.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::kubetest {

using Env = std::vector<std::pair<std::string, std::string>>;

// Every YAML document of a manifest file, in order.
inline std::vector<YAML::Node> load_manifest(const std::filesystem::path& file) {
  return YAML::LoadAllFromFile(file.string());
}

// The node at `path` under `node`, or an undefined node when a key on the way is missing
// (yaml-cpp throws when a missing key of a const node is indexed again).
inline YAML::Node at(const YAML::Node& node, std::initializer_list<const char*> path) {
  YAML::Node n = node;
  for (const char* key : path) {
    if (!n.IsMap() || !n[key]) return YAML::Node(YAML::NodeType::Undefined);
    n.reset(n[key]);  // rebinds; `n = ...` would overwrite the node n refers to
  }
  return n;
}

inline std::string kind_of(const YAML::Node& doc) {
  return doc["kind"].as<std::string>("");
}
inline std::string name_of(const YAML::Node& doc) {
  return at(doc, {"metadata", "name"}).as<std::string>("");
}

// The document of `kind` named `name`; throws naming both when there is none.
inline YAML::Node find_doc(const std::vector<YAML::Node>& docs,
                           const std::string& kind,
                           const std::string& name) {
  for (const auto& d : docs) {
    if (kind_of(d) == kind && name_of(d) == name) return d;
  }
  throw std::runtime_error("The manifest has no " + kind + " named '" + name + "'.");
}

// The pod template (metadata and spec) of a workload: spec.template of a Deployment, StatefulSet
// or Job; the Worker replicas' template of a PyTorchJob; the pod template of the Job named "node"
// of a Kubeflow Trainer v2 ClusterTrainingRuntime's JobSet.
inline YAML::Node pod_template(const YAML::Node& doc) {
  if (kind_of(doc) == "PyTorchJob")
    return at(doc, {"spec", "pytorchReplicaSpecs", "Worker", "template"});
  if (kind_of(doc) == "ClusterTrainingRuntime") {
    for (const auto& job : at(doc, {"spec", "template", "spec", "replicatedJobs"})) {
      if (job["name"].as<std::string>("") == "node")
        return at(job, {"template", "spec", "template"});
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }
  return at(doc, {"spec", "template"});
}

// The container named `name` of a pod spec; throws when there is none.
inline YAML::Node container_of(const YAML::Node& pod_spec, const std::string& name) {
  for (const auto& c : pod_spec["containers"]) {
    if (c["name"].as<std::string>("") == name) return c;
  }
  throw std::runtime_error("The pod has no container named '" + name + "'.");
}

// Kubernetes' $(VAR) expansion (k8s.io/kubernetes/third_party/forked/golang/expansion): $(NAME)
// becomes NAME's value when it has one and stays as written otherwise, $$ becomes $.
inline std::string expand(const std::string& in, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '$' || i + 1 == in.size()) {
      out += in[i];
    } else if (in[i + 1] == '$') {
      out += '$';
      ++i;
    } else if (in[i + 1] == '(') {
      const auto close = in.find(')', i + 2);
      if (close == std::string::npos) {
        out += in.substr(i);
        break;
      }
      const std::string name = in.substr(i + 2, close - i - 2);
      const auto found = vars.find(name);
      out += found != vars.end() ? found->second : in.substr(i, close - i + 1);
      i = close;
    } else {
      out += in[i];
    }
  }
  return out;
}

// A CPU quantity ("2", "500m") in millicores.
inline long millicores(const std::string& q) {
  if (!q.empty() && q.back() == 'm') return std::stol(q.substr(0, q.size() - 1));
  return static_cast<long>(std::stod(q) * 1000);
}

// The downward API's resourceFieldRef: a container's CPU request or limit in units of the
// divisor (1 CPU by default), rounded up, as the kubelet gives it.
inline std::string resource_field(const YAML::Node& pod_spec, const YAML::Node& ref) {
  const auto resource = ref["resource"].as<std::string>();
  const auto dot = resource.find('.');
  if (dot == std::string::npos || resource.substr(dot + 1) != "cpu") {
    throw std::runtime_error("resourceFieldRef " + resource + " is not emulated (only cpu).");
  }
  const auto c = container_of(pod_spec, ref["containerName"].as<std::string>());
  const auto quantity = at(c, {"resources", resource.substr(0, dot).c_str(), "cpu"});
  if (!quantity) {
    throw std::runtime_error("resourceFieldRef " + resource + ": the container sets no " +
                             resource + ".");
  }
  const long divisor = millicores(ref["divisor"].as<std::string>("1"));
  return std::to_string((millicores(quantity.as<std::string>()) + divisor - 1) / divisor);
}

// What Kubernetes provides a pod, and what stands in for it here.
struct PodContext {
  // Downward API fields by fieldPath (metadata.name, metadata.annotations['...'], ...).
  std::map<std::string, std::string> fields;
  // Secrets by name, then key. A Secret not here does not exist.
  std::map<std::string, std::map<std::string, std::string>> secrets;
  // Variables a controller appends after the container's own, in order.
  Env injected;
  // New values for variables the container declares, whatever their source (as `kubectl set
  // env` would change them).
  std::map<std::string, std::string> overrides;
  // Volume mounts by mountPath: the directory that stands in for each here.
  std::map<std::string, std::filesystem::path> mounts;
  // Put before the image's PATH: holds the image's programs (trainyard, etcd) as this machine's.
  std::filesystem::path bin_dir;
  // The image's HOME.
  std::filesystem::path home;
};

// The command the container runs and its whole environment.
struct ContainerRun {
  std::vector<std::string> argv;
  Env env;
};

// `text` with each mounted path (a whole value, a prefix before '/', or after '=' as in
// --data-dir=/path) replaced by its stand-in. A mount of the container that is used but not
// stood in for is an error: the command would touch this machine's real path.
inline std::string remap_mounts(const std::string& text,
                                const YAML::Node& container,
                                const PodContext& ctx) {
  std::string out = text;
  for (const auto& m : container["volumeMounts"]) {
    const auto path = m["mountPath"].as<std::string>();
    for (std::size_t at = out.find(path); at != std::string::npos; at = out.find(path, at + 1)) {
      const bool starts = at == 0 || out[at - 1] == '=';
      const auto end = at + path.size();
      const bool ends = end == out.size() || out[end] == '/';
      if (!starts || !ends) continue;
      const auto stand_in = ctx.mounts.find(path);
      if (stand_in == ctx.mounts.end()) {
        throw std::runtime_error("The container uses its volume mount " + path + " in '" + text +
                                 "', which the test stands in for with no directory.");
      }
      out.replace(at, path.size(), stand_in->second.string());
      at += stand_in->second.string().size() - 1;
    }
  }
  return out;
}

// The container `name` of `pod_spec` as the kubelet would start it, with `ctx` for what the
// cluster provides. Throws naming what the manifest asks for and `ctx` lacks.
inline ContainerRun container_run(const YAML::Node& pod_spec,
                                  const std::string& name,
                                  const PodContext& ctx) {
  const YAML::Node c = container_of(pod_spec, name);
  Env env = {{"PATH", ctx.bin_dir.string() +
                          ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:" + "/sbin:/bin"},
             {"HOME", ctx.home.string()}};
  if (auto pod = ctx.fields.find("metadata.name"); pod != ctx.fields.end()) {
    env.emplace_back("HOSTNAME", pod->second);
  }
  std::map<std::string, std::string> vars(env.begin(), env.end());
  auto set = [&](const std::string& key, const std::string& value) {
    vars[key] = value;
    for (auto& [k, v] : env) {
      if (k == key) {
        v = value;
        return;
      }
    }
    env.emplace_back(key, value);
  };
  for (const auto& from : c["envFrom"]) {
    const auto ref = from["secretRef"];
    if (!ref) throw std::runtime_error("envFrom other than secretRef is not emulated.");
    const auto secret = ctx.secrets.find(ref["name"].as<std::string>());
    if (secret == ctx.secrets.end()) {
      if (ref["optional"].as<bool>(false)) continue;
      throw std::runtime_error("envFrom names the Secret '" + ref["name"].as<std::string>() +
                               "', which does not exist here.");
    }
    for (const auto& [k, v] : secret->second) set(k, v);
  }
  for (const auto& e : c["env"]) {
    const auto key = e["name"].as<std::string>();
    if (const auto o = ctx.overrides.find(key); o != ctx.overrides.end()) {
      set(key, o->second);
    } else if (e["value"]) {
      set(key, expand(e["value"].as<std::string>(), vars));
    } else if (const auto res = at(e, {"valueFrom", "resourceFieldRef"})) {
      set(key, resource_field(pod_spec, res));
    } else if (const auto field = at(e, {"valueFrom", "fieldRef", "fieldPath"})) {
      const auto f = ctx.fields.find(field.as<std::string>());
      if (f == ctx.fields.end()) {
        throw std::runtime_error("The variable " + key + " comes from the field " +
                                 field.as<std::string>() + ", which the test does not provide.");
      }
      set(key, f->second);
    } else if (const auto ref = at(e, {"valueFrom", "secretKeyRef"})) {
      std::optional<std::string> value;
      if (const auto s = ctx.secrets.find(ref["name"].as<std::string>()); s != ctx.secrets.end()) {
        if (const auto k = s->second.find(ref["key"].as<std::string>()); k != s->second.end()) {
          value = k->second;
        }
      }
      if (value) {
        set(key, *value);
      } else if (!ref["optional"].as<bool>(false)) {
        throw std::runtime_error("The variable " + key + " comes from the Secret '" +
                                 ref["name"].as<std::string>() + "' key '" +
                                 ref["key"].as<std::string>() + "', which does not exist here.");
      }
    } else {
      throw std::runtime_error("The variable " + key + " has a source the test does not emulate.");
    }
  }
  for (const auto& [key, value] : ctx.overrides) {
    bool declared = false;
    for (const auto& e : c["env"]) declared = declared || e["name"].as<std::string>() == key;
    if (!declared) {
      throw std::runtime_error("The container declares no variable " + key +
                               " for the test to set.");
    }
  }
  for (const auto& [k, v] : ctx.injected) set(k, v);

  ContainerRun run;
  for (const char* part : {"command", "args"}) {
    for (const auto& a : c[part]) {
      run.argv.push_back(remap_mounts(expand(a.as<std::string>(), vars), c, ctx));
    }
  }
  if (run.argv.empty()) throw std::runtime_error("The container '" + name + "' has no command.");
  for (auto& [k, v] : env) v = remap_mounts(v, c, ctx);
  run.env = std::move(env);
  return run;
}

// The variables the Kubeflow training operator (kubeflow.org/v1) sets in the containers of an
// elastic PyTorchJob's pods, from its elasticPolicy (pkg/controller.v1/pytorch/elastic.go).
inline Env training_operator_env(const YAML::Node& job) {
  const YAML::Node p = job["spec"]["elasticPolicy"];
  Env env = {{"PYTHONUNBUFFERED", "0"}};
  const std::string host =
      p["rdzvHost"] ? p["rdzvHost"].as<std::string>() : name_of(job) + "-worker-0";
  std::string port;
  if (p["rdzvPort"]) {
    port = p["rdzvPort"].as<std::string>();
  } else {
    const auto spec = pod_template(job)["spec"];
    for (const auto& prt : container_of(spec, "pytorch")["ports"]) {
      if (prt["name"].as<std::string>("") == "pytorchjob-port") {
        port = prt["containerPort"].as<std::string>();
      }
    }
    if (port.empty()) throw std::runtime_error("No rdzvPort and no port named pytorchjob-port.");
  }
  env.emplace_back("PET_RDZV_ENDPOINT", host + ":" + port);
  env.emplace_back("PET_RDZV_BACKEND", p["rdzvBackend"].as<std::string>("c10d"));
  if (p["minReplicas"] || p["maxReplicas"]) {
    env.emplace_back("PET_NNODES",
                     p["minReplicas"].as<std::string>() + ":" + p["maxReplicas"].as<std::string>());
  } else {
    env.emplace_back("PET_NNODES",
                     job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"].as<std::string>());
  }
  if (p["maxRestarts"]) env.emplace_back("PET_MAX_RESTARTS", p["maxRestarts"].as<std::string>());
  if (p["nProcPerNode"])
    env.emplace_back("PET_NPROC_PER_NODE", p["nProcPerNode"].as<std::string>());
  if (p["rdzvId"]) env.emplace_back("PET_RDZV_ID", p["rdzvId"].as<std::string>());
  if (p["rdzvConf"]) {
    std::string conf;
    for (const auto& kv : p["rdzvConf"]) {
      conf += (conf.empty() ? "" : ",") + kv["key"].as<std::string>() + "=" +
              kv["value"].as<std::string>();
    }
    env.emplace_back("PET_RDZV_CONF", conf);
  }
  if (p["standalone"].as<bool>(false)) env.emplace_back("PET_STANDALONE", "");
  return env;
}

// The pod template of the Job that Kubeflow Trainer v2 runs on each node of TrainJob `job`: its
// runtime's "node" Job with the trainer settings put on the container named "node" as the
// controller puts them: image, command and args replaced, env merged by name, resourcesPerNode
// as the container's resources.
inline YAML::Node trainjob_pod_template(const YAML::Node& runtime, const YAML::Node& job) {
  YAML::Node tmpl = YAML::Clone(pod_template(runtime));
  const YAML::Node trainer = at(job, {"spec", "trainer"});
  for (auto c : tmpl["spec"]["containers"]) {
    if (c["name"].as<std::string>("") != "node") continue;
    for (const char* key : {"image", "command", "args"}) {
      if (trainer[key]) c[key] = YAML::Clone(trainer[key]);
    }
    if (trainer["resourcesPerNode"]) c["resources"] = YAML::Clone(trainer["resourcesPerNode"]);
    for (const auto& e : trainer["env"]) {
      YAML::Node env = c["env"];
      std::size_t k = 0;
      while (k < env.size() && env[k]["name"].as<std::string>() != e["name"].as<std::string>()) ++k;
      if (k < env.size()) {
        env[k] = YAML::Clone(e);
      } else {
        env.push_back(YAML::Clone(e));
      }
    }
  }
  return tmpl;
}

// The variables Kubeflow Trainer v2's torch plugin (pkg/runtime/framework/plugins/torch) sets on
// the container "node" of TrainJob `job`'s node `index`: the node count, ranks per node (the
// TrainJob's, else the runtime's, else auto), the node rank (from the Job's completion index),
// the first pod's name through the JobSet's headless Service, and port 29500. No WORLD_SIZE or
// RANK, no elastic range.
inline Env trainjob_env(const YAML::Node& runtime, const YAML::Node& job, int index) {
  const auto name = name_of(job);
  const YAML::Node trainer = at(job, {"spec", "trainer"});
  const YAML::Node policy = at(runtime, {"spec", "mlPolicy"});
  const std::string nnodes = trainer["numNodes"] ? trainer["numNodes"].as<std::string>()
                                                 : policy["numNodes"].as<std::string>("1");
  std::string nproc = "auto";
  if (trainer["numProcPerNode"]) {
    nproc = trainer["numProcPerNode"].as<std::string>();
  } else if (const auto from_runtime = at(policy, {"torch", "numProcPerNode"})) {
    nproc = from_runtime.as<std::string>();
  }
  return {{"PET_NNODES", nnodes},
          {"PET_NPROC_PER_NODE", nproc},
          {"PET_NODE_RANK", std::to_string(index)},
          {"PET_MASTER_ADDR", name + "-node-0-0." + name},
          {"PET_MASTER_PORT", "29500"}};
}

}  // namespace trainyard::kubetest
