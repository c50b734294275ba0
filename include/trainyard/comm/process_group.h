// init(): the process group for this rank, built from the environment contract: a c10d TCPStore
// (rank 0 hosts it unless the agent does) and a Gloo process group (NCCL for ranks on GPUs) whose
// collectives time out, so a dead peer surfaces as an error instead of a hang.
#pragma once

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "trainyard/comm/dist_env.h"

namespace trainyard {

class DeviceWorkBeacon;

inline constexpr std::chrono::minutes kDefaultCollectiveTimeout{5};
inline constexpr std::chrono::seconds kDefaultJoinTimeout{60};

struct InitOptions {
  // Bound on every collective and store wait; a peer silent for longer fails the operation.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // Bound on reaching the store's host (MASTER_ADDR:MASTER_PORT) at all: a rank that gets no
  // answer within it fails naming the address, instead of waiting out `timeout`. A host that
  // answers by refusing (rank 0 not started yet) is waited for up to `timeout`.
  std::chrono::milliseconds join_timeout = kDefaultJoinTimeout;
  // Address Gloo binds to. Empty: $GLOO_SOCKET_IFNAME's interface if set, else
  // $TRAINYARD_BIND_ADDR, else 127.0.0.1 when MASTER_ADDR is a loopback address, else this host's
  // name.
  std::string bind_address;
  // Gloo threads per process group (each runs collectives off the caller's thread).
  int gloo_threads = 2;
  // When every rank is on this host, all-reduce and broadcast dense CPU tensors through shared
  // memory (ShmProcessGroup) instead of loopback sockets. TRAINYARD_SHM=0 turns it off too. Ranks
  // on GPUs never use it (their tensors are not in host memory).
  bool shared_memory = true;
  // Keep freed memory in the process for reuse instead of returning it to the kernel, by default
  // through trainyard's caching CPU allocator (TRAINYARD_CPU_ALLOCATOR chooses another way): see
  // Note [Reusing freed memory] in src/comm/process_group.cpp (2-3x the tokens/s of GPT-NeoX
  // training on these VMs). Left to glibc when the environment sets glibc's own malloc
  // variables (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES).
  bool reuse_freed_memory = true;
  // Where this rank's model and tensors live: "cpu", or "cuda" for the GPU numbered LOCAL_RANK
  // (modulo the GPUs visible, when ranks share them over Gloo), which init() makes the current
  // CUDA device. $TRAINYARD_DEVICE when set.
  std::string device = "cpu";
  // The process group: "auto" (NCCL when device is cuda, this build has NCCL and every local rank
  // has a GPU of its own; else Gloo), "gloo" or "nccl". $TRAINYARD_BACKEND when set. Under NCCL,
  // CPU tensors still go through Gloo (compat::nccl_group).
  std::string backend = "auto";
};

// One rank's membership of a job: who it is, the store, and the process group.
class Distributed {
 public:
  Distributed(DistEnv env,
              c10::intrusive_ptr<c10d::Store> store,
              c10::intrusive_ptr<c10d::ProcessGroup> pg,
              c10::Device device = c10::Device(c10::kCPU));
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  const DistEnv& env() const { return env_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // The device this rank trains on (InitOptions::device resolved to an index).
  c10::Device device() const { return device_; }

  // Blocks until every rank has called it (bounded by the group's timeout).
  void barrier();

 private:
  DistEnv env_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  c10::Device device_;
  // Ranks on a GPU: beats while their NCCL work runs (Note [Beating while device work runs]).
  // Declared after pg_, so it is gone (its thread joined, its works released) before the group.
  std::unique_ptr<DeviceWorkBeacon> beacon_;
};

// The defaults, with timeout and join_timeout from $TRAINYARD_COLLECTIVE_TIMEOUT and
// $TRAINYARD_JOIN_TIMEOUT (seconds, > 0), device from $TRAINYARD_DEVICE and backend from
// $TRAINYARD_BACKEND when set. Throws InvalidArgumentError naming a bad one.
InitOptions init_options_from_env(const EnvLookup& env = process_env());

// Reads the contract from the environment, connects to the store and builds the process group
// (Gloo, or NCCL for ranks on GPUs: Note [Choosing the backend]).
// A rank that does not host the store first waits until MASTER_ADDR:MASTER_PORT accepts a
// connection, at most options.join_timeout without an answer or options.timeout while the host
// refuses (then NetworkError naming the address); then blocks
// until all ranks have joined or options.timeout passes (then TimeoutError/NetworkError naming
// MASTER_ADDR:MASTER_PORT). Also sets the log prefix to this rank. init() without options takes
// init_options_from_env().
std::shared_ptr<Distributed> init();
std::shared_ptr<Distributed> init(const InitOptions& options);
std::shared_ptr<Distributed> init(const DistEnv& env, const InitOptions& options = {});

// Waits for a collective like work->wait() (rethrowing its error), calling trainyard::heartbeat()
// about every second while it waits, so that the launcher's hang watchdog sees a rank waiting for
// a slow peer as alive (Note [Hang watchdog] in src/elastic/rank_monitor.cpp). Blocks; the work's
// own timeout still bounds it. Thread-safe as Work::wait is. NCCL work is not waited for on the
// host: the current CUDA stream waits for it (Note [Waiting on NCCL work]).
void wait_work(const c10::intrusive_ptr<c10d::Work>& work);

// wait_work, with a failure rethrown as NetworkError naming `who` ("DistributedDataParallel"),
// this rank, and `what` failed ("a gradient all-reduce"), hinting that a peer probably died.
void wait_collective(const c10::intrusive_ptr<c10d::Work>& work,
                     const char* who,
                     const char* what,
                     int rank,
                     int world_size);

// The device `options.device` names for a rank with this LOCAL_RANK and local world size: cpu, or
// cuda:i. Throws Error naming the fix when there is no GPU or this build has no CUDA.
c10::Device resolve_device(const InitOptions& options, int local_rank);

// Whether init() would form an NCCL group for these options on `device` (options.backend
// resolved: Note [Choosing the backend]). Throws InvalidArgumentError for a backend name it does
// not know or nccl without a GPU.
bool use_nccl(const InitOptions& options, c10::Device device, int local_world_size);

// An NCCL process group (CPU tensors over Gloo) over an existing store, this rank on `device`.
c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int world_size,
    c10::Device device,
    const InitOptions& options = {},
    const std::string& master_addr = "127.0.0.1");

// A Gloo process group over an existing store: for tests that run ranks as threads over a
// c10d::HashStore, and for agents that own the store.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int world_size,
    const InitOptions& options = {},
    const std::string& master_addr = "127.0.0.1");

}  // namespace trainyard
