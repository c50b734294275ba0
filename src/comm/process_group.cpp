#include "trainyard/comm/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <malloc.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>

#include "torch_compat.h"
#include "trainyard/comm/address.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/device_work_beacon.h"
#include "trainyard/env.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/memory/caching_allocator.h"
#include "trainyard/seconds.h"

namespace trainyard {
namespace {

std::shared_ptr<::gloo::transport::Device> make_device(const InitOptions& options,
                                                       const std::string& master_addr) {
  if (!options.bind_address.empty())
    return c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_address);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (const char* addr = std::getenv(kBindAddrEnv); addr && *addr)
    return c10d::ProcessGroupGloo::createDeviceForHostname(addr);
  if (is_loopback_address(master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// A positive number of seconds from the variable `name`, or nullopt when it is unset or empty.
std::optional<std::chrono::milliseconds> seconds_from_env(const EnvLookup& env, const char* name) {
  const auto text = env(name);
  if (!text || text->empty()) return std::nullopt;
  const auto seconds = parse_seconds(*text, 0, 1e6);
  TY_CHECK(seconds && seconds->count() > 0, "Environment variable ", name, "='", *text,
           "' is not a number of seconds in (0, 1000000]. HINT: e.g. ", name, "=120.");
  return *seconds;
}

// How often wait_work() beats while it waits.
constexpr std::chrono::seconds kWaitSlice{1};

}  // namespace

InitOptions init_options_from_env(const EnvLookup& env) {
  InitOptions options;
  if (auto t = seconds_from_env(env, kCollectiveTimeoutEnv)) options.timeout = *t;
  if (auto t = seconds_from_env(env, kJoinTimeoutEnv)) options.join_timeout = *t;
  if (auto d = env(kDeviceEnv); d && !d->empty()) options.device = *d;
  if (auto b = env(kBackendEnv); b && !b->empty()) options.backend = *b;
  return options;
}

c10::Device resolve_device(const InitOptions& options, int local_rank) {
  if (options.device == "cpu") return c10::Device(c10::kCPU);
  TY_CHECK(options.device == "cuda", "InitOptions.device (", kDeviceEnv, ", --device) is '",
           options.device, "'. HINT: cpu or cuda.");
  const int gpus = comm::compat::cuda_device_count();
  TY_CHECK_T(Error, gpus > 0, "--device cuda (", kDeviceEnv,
             "): this process sees no GPU: this is trainyard's ",
             comm::compat::accelerator_description(),
             " build, or no device is visible (CUDA_VISIBLE_DEVICES, driver). HINT: build with "
             "CUDA (scripts/build.sh --cuda, README \"GPUs\"), or train with --device cpu.");
  // Ranks beyond the GPU count share them round-robin; NCCL refuses that (use_nccl).
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
}

// Note [Choosing the backend]
// NCCL when the rank trains on a GPU, this build has NCCL, and every rank on this node has a GPU
// of its own (NCCL cannot run two ranks of one communicator on one device); otherwise Gloo, which
// takes CUDA tensors too (staged through the host) and so lets ranks share a GPU, as the tests on
// a one-GPU machine do. "nccl" insists, with an error where it cannot work; "gloo" never uses it.
bool use_nccl(const InitOptions& options, c10::Device device, int local_world_size) {
  TY_CHECK(options.backend == "auto" || options.backend == "gloo" || options.backend == "nccl",
           "InitOptions.backend (", kBackendEnv, ") is '", options.backend,
           "'. HINT: auto, gloo or nccl.");
  if (options.backend == "gloo") return false;
  const bool own_gpu = device.is_cuda() && comm::compat::cuda_device_count() >= local_world_size;
  if (options.backend == "auto") return own_gpu && comm::compat::nccl_available();
  TY_CHECK(device.is_cuda(), kBackendEnv, "=nccl needs --device cuda (", kDeviceEnv,
           "=cuda): NCCL runs collectives on GPU tensors only.");
  TY_CHECK(own_gpu, kBackendEnv, "=nccl: ", local_world_size, " ranks on this node but ",
           comm::compat::cuda_device_count(),
           " GPU(s) visible; NCCL needs a GPU per rank. HINT: --nproc-per-node at most the "
           "GPU count, or ",
           kBackendEnv, "=gloo to share GPUs.");
  return true;
}

void wait_work(const c10::intrusive_ptr<c10d::Work>& work) {
  if (comm::compat::completes_on_device(work)) {  // Note [Waiting on NCCL work]
    work->wait();
    watch_stream_wait();  // Note [Beating while device work runs]
    return;
  }
  // Work::wait(timeout) throws when the timeout passes first, and the work goes on; a work that
  // completed with an error rethrows it from a plain wait(). See Note [Hang watchdog].
  while (!work->isCompleted()) {
    try {
      work->wait(kWaitSlice);
      return;
    } catch (const std::exception&) {
      if (work->isCompleted()) break;  // its own error, or it finished just after the slice
    }
    heartbeat();
  }
  work->wait();
}

void wait_collective(const c10::intrusive_ptr<c10d::Work>& work,
                     const char* who,
                     const char* what,
                     int rank,
                     int world_size) {
  try {
    wait_work(work);
  } catch (const std::exception& e) {
    throw NetworkError(detail::concat(who, " on rank ", rank, "/", world_size, ": ", what,
                                      " failed: ", e.what(),
                                      " HINT: another rank probably died or timed out; its own "
                                      "log names the root cause."));
  }
}

Distributed::Distributed(DistEnv env,
                         c10::intrusive_ptr<c10d::Store> store,
                         c10::intrusive_ptr<c10d::ProcessGroup> pg,
                         c10::Device device)
    : env_(std::move(env)), store_(std::move(store)), pg_(std::move(pg)), device_(device) {
  // Note [Beating while device work runs]: a work keeps the rank beating at most the timeout.
  if (device_.is_cuda())
    beacon_ = std::make_unique<DeviceWorkBeacon>(
        comm::compat::gloo_timeout(*pg_).value_or(kDefaultCollectiveTimeout));
}

Distributed::~Distributed() = default;

void Distributed::barrier() {
  if (env_.world_size == 1) return;
  wait_work(comm::barrier(pg_));
}

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank,
                                                       int world_size,
                                                       const InitOptions& options,
                                                       const std::string& master_addr) {
  TY_CHECK(options.gloo_threads >= 1, "InitOptions.gloo_threads must be >= 1, got ",
           options.gloo_threads, ".");
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(make_device(options, master_addr));
  gloo_options->threads = options.gloo_threads;
  return comm::compat::gloo_group(
      store, rank, world_size,
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options));
}

c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank,
                                                       int world_size,
                                                       c10::Device device,
                                                       const InitOptions& options,
                                                       const std::string& master_addr) {
  TY_CHECK(device.is_cuda() && device.has_index(),
           "make_nccl_group: the rank's device must be a CUDA device with an index, got ",
           device.str(), ".");
  // The Gloo half (CPU tensors) and NCCL keep apart in the store.
  auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(make_device(options, master_addr));
  gloo_options->threads = options.gloo_threads;
  auto gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, world_size, gloo_options);
  return comm::compat::nccl_group(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank,
                                  world_size, device.index(), options.timeout, std::move(gloo));
}

std::shared_ptr<Distributed> init() {
  return init(parse_dist_env(), init_options_from_env());
}

std::shared_ptr<Distributed> init(const InitOptions& options) {
  return init(parse_dist_env(), options);
}

// Note [Reusing freed memory]
// glibc serves allocations above its mmap threshold (128 KiB, rising to at most 32 MiB) with
// fresh mmap()s and unmaps them on free. Training allocates and frees many such blocks every
// step (activations, gradients, FSDP's gathered parameters and reduction buffers), so each step's
// memory arrives as fresh pages, each faulted in and zeroed by the kernel on first touch. On the
// VMs this project runs on a page fault costs ~15 us (first touch of 32 MiB: ~120 ms; of the same
// memory reused: ~1 ms): pythia-70m under FULL_SHARD bf16 trained at 98 tokens/s with glibc's
// defaults against 264 with freed memory kept (docs/BENCHMARKS.md). So a rank keeps freed
// memory for reuse, one of these ways (TRAINYARD_CPU_ALLOCATOR):
//   caching      (the default) trainyard's caching allocator becomes LibTorch's CPU allocator:
//                tensors of 1 MiB and more get blocks kept per size class and reused (Note
//                [Caching CPU allocator]); everything else (smaller tensors, and what oneDNN,
//                Gloo and the rest malloc, e.g. oneDNN's bf16 reorder buffers) comes from a glibc
//                heap set as for glibc-reuse, which holds little enough to stay unfragmented.
//   glibc-reuse  mallopt M_MMAP_MAX 0 (every block from the heap) and M_TRIM_THRESHOLD high (the
//                heap never given back), what ranks did before the caching allocator: as fast,
//                but with large tensors of mixed sizes the heap fragments and keeps growing.
//   glibc        glibc's defaults, page faults and all.
// A process that set glibc's own variables (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
// GLIBC_TUNABLES) keeps glibc's behaviour as it chose, and without an explicit
// TRAINYARD_CPU_ALLOCATOR gets no caching allocator either, so the variables mean what they say.
static void reuse_freed_memory() {
  const char* choice = std::getenv(kCpuAllocatorEnv);
  const std::string mode = choice != nullptr ? choice : "";
  TY_CHECK(mode.empty() || mode == "caching" || mode == "glibc-reuse" || mode == "glibc",
           kCpuAllocatorEnv, "='", mode,
           "' is not an allocator. HINT: caching (the default), glibc-reuse or glibc.");
  bool glibc_set = false;
  for (const char* var : {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"})
    glibc_set = glibc_set || std::getenv(var) != nullptr;
  const bool caching = mode == "caching" || (mode.empty() && !glibc_set);
  if (caching) memory::install_caching_allocator();
  if ((caching || mode == "glibc-reuse") && !glibc_set) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  }
}

std::shared_ptr<Distributed> init(const DistEnv& env, const InitOptions& options) {
  set_log_rank(env.rank, env.world_size);
  auto log = logger("comm");
  if (options.reuse_freed_memory) reuse_freed_memory();
  c10d::TCPStoreOptions store_options;
  store_options.port = env.master_port;
  store_options.isServer = env.rank == 0 && !env.use_agent_store;
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  TY_CHECK(options.join_timeout.count() > 0, "InitOptions.join_timeout must be > 0 ms, got ",
           options.join_timeout.count(), " ms.");

  if (!store_options.isServer) {
    // Without this, an address that drops packets is silent for the whole collective timeout and
    // then LibTorch only warns about "?UNKNOWN?".
    wait_until_reachable(
        env.master_addr, env.master_port, options.join_timeout,
        /*refused_timeout=*/options.timeout,
        detail::concat("the rendezvous store at ", env.master_addr, ":", env.master_port,
                       " (MASTER_ADDR:MASTER_PORT) from rank ", env.rank, "/", env.world_size),
        detail::concat("check that MASTER_ADDR is the host of rank 0 (or of the agent serving the "
                       "store) and reachable from here (routes, firewall), and that it is "
                       "running; ",
                       kJoinTimeoutEnv, " (seconds) sets this limit."));
  }

  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    throw NetworkError(detail::concat(
        "Rank ", env.rank, "/", env.world_size, " could not ",
        store_options.isServer ? "host" : "reach", " the rendezvous store at ", env.master_addr,
        ":", env.master_port, " within ", options.timeout.count(), " ms: ", e.what(),
        " HINT: check MASTER_ADDR/MASTER_PORT, that rank 0 is running, and that the port is "
        "free on the master host."));
  }

  if (env.use_agent_store) {
    // The agent's store lives across restarts: keep each attempt's keys apart, as torchrun does.
    store = c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.restart_count), store);
  }

  const c10::Device device = resolve_device(options, env.local_rank);
  const bool nccl = use_nccl(options, device, env.local_world_size);
  if (device.is_cuda()) comm::compat::set_cuda_device(device.index());
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = nccl ? make_nccl_group(store, env.rank, env.world_size, device, options, env.master_addr)
              : make_gloo_group(store, env.rank, env.world_size, options, env.master_addr);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(detail::concat(
        "Rank ", env.rank, "/", env.world_size, " could not form the ", nccl ? "NCCL" : "Gloo",
        " process group through ", env.master_addr, ":", env.master_port, ": ", e.what()));
  }
  const char* shm_env = std::getenv(kShmEnv);
  const bool shm_allowed = shm_env == nullptr || std::string(shm_env) != "0";
  // Shared memory carries CPU tensors only: ranks on GPUs keep the plain group.
  if (!nccl && device.is_cpu() && options.shared_memory && shm_allowed && env.world_size > 1 &&
      env.local_world_size == env.world_size) {
    pg = make_local_group(store, env.rank, env.world_size, pg,
                          ShmOptions{.timeout = options.timeout,
                                     .name = "init-" + std::to_string(env.restart_count)});
  }
  log->debug("{} process group ready on {}: master {}:{}, timeout {} ms", pg->getBackendName(),
             device.str(), env.master_addr, env.master_port, options.timeout.count());
  return std::make_shared<Distributed>(env, std::move(store), std::move(pg), device);
}

}  // namespace trainyard
