#include "trainyard/train/trainer.h"

#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/cpu_count.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/rank_files.h"
#include "trainyard/metrics/registry.h"

namespace trainyard::train {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr const char* kStateFile = "state.json";
constexpr const char* kSetupFile = "setup.json";  // describe_setup()'s facts, a JSON object

// Note [Root checkpoints]
// Rank 0 picks the checkpoint to resume from (the newest that verifies) and tells the others, so
// that every rank loads the same one even while rank 0 of an earlier attempt is saving. Saving is
// collective because collect() may gather (ZeRO-1's moments come from their owners on every rank
// at the same steps); then rank 0 writes in the background while the others go on to the next
// step and meet it in the next collective. Serialising is the stall; the files are written while
// training goes on.
class RootCheckpointIO final : public CheckpointIO {
 public:
  RootCheckpointIO(RootFiles files, Distributed& dist) : files_(std::move(files)), dist_(dist) {}

  std::optional<Loaded> load_latest(checkpoint::Checkpointer& checkpointer) override {
    std::optional<checkpoint::LoadedCheckpoint> loaded;
    if (dist_.rank() == 0) loaded = checkpointer.load_latest();
    auto chosen =
        torch::tensor({loaded ? checkpoint::checkpoint_number(loaded->name) : -1}, torch::kInt64);
    if (dist_.world_size() > 1) {
      std::vector<torch::Tensor> v{chosen};
      wait_work(comm::broadcast(dist_.process_group(), v));
    }
    const auto number = chosen.item<std::int64_t>();
    if (number < 0) return std::nullopt;
    if (dist_.rank() != 0) loaded = checkpointer.load(checkpoint::checkpoint_name(number));
    files_.restore(*loaded);
    auto it = loaded->checkpoint.files.find(kStateFile);
    TY_CHECK_T(CheckpointCorruptError, it != loaded->checkpoint.files.end(),
               storage::join_uri(checkpointer.storage().uri(), loaded->name), " has no ",
               kStateFile, ".");
    return Loaded{loaded->name, it->second};
  }

  void save(checkpoint::Checkpointer& checkpointer,
            std::int64_t step,
            std::map<std::string, std::string> extra) override {
    auto files = files_.collect();
    if (dist_.rank() != 0) return;
    checkpoint::Checkpoint c{.step = step, .files = std::move(files)};
    for (auto& [name, bytes] : extra) c.files[name] = std::move(bytes);
    checkpointer.save_in_background(std::move(c));  // waits for the previous save first
  }

  bool every_rank_writes() const override { return false; }

  std::optional<std::string> wait(checkpoint::Checkpointer& checkpointer) override {
    if (dist_.rank() != 0) return std::nullopt;
    return checkpointer.wait();
  }

 private:
  RootFiles files_;
  Distributed& dist_;
};

class FsdpCheckpointIO final : public CheckpointIO {
 public:
  FsdpCheckpointIO(fsdp::FullyShardedDataParallelBase& model,
                   torch::optim::Optimizer* optimizer,
                   Distributed& dist)
      : model_(model), optimizer_(optimizer), dist_(dist) {}

  std::optional<Loaded> load_latest(checkpoint::Checkpointer& checkpointer) override {
    auto loaded = fsdp::load_latest_checkpoint(model_, optimizer_, checkpointer, {kStateFile});
    if (!loaded) return std::nullopt;
    last_ = loaded->name;
    return Loaded{loaded->name, loaded->extra.at(kStateFile)};
  }

  void save(checkpoint::Checkpointer& checkpointer,
            std::int64_t step,
            std::map<std::string, std::string> extra) override {
    last_ = fsdp::save_checkpoint(model_, optimizer_, checkpointer, *dist_.store(), step, extra);
  }

  bool every_rank_writes() const override { return true; }

  std::optional<std::string> wait(checkpoint::Checkpointer&) override {
    if (last_.empty()) return std::nullopt;
    return last_;
  }

 private:
  fsdp::FullyShardedDataParallelBase& model_;
  torch::optim::Optimizer* optimizer_;
  Distributed& dist_;
  std::string last_;
};

// Note [Non-finite training]
// A loss that turns NaN or Inf (a learning rate far too high, an overflow in low precision, bad
// data) poisons the weights its step updates, and a run that goes on keeps saving them:
// retention then deletes the last good checkpoint, and export and generation "succeed" on NaN
// weights. So the Trainer stops the run at the first sign and never saves one:
//  - step_done() throws NonFiniteError naming the step when the loss the recipe reports is not
//    finite (causal-lm reports the mean over the ranks, so every rank stops together; a
//    classifier rank its own, and the launcher stops the others when it exits);
//  - save_checkpoint() first checks the weights the recipe guards (guard_weights(): what its
//    optimizer updates), all ranks agreeing through a MAX all-reduce, because one step can take
//    finite weights to Inf while its own loss, computed before the update, was still finite.
// The rank then exits non-zero and so does the job; the newest checkpoint is the last finite one,
// from which the run resumes when started again (with a lower --lr, say).
bool all_finite(const std::vector<at::Tensor>& tensors) {
  at::Tensor finite;  // on the tensors' device, read once: one sync on a GPU
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto one = torch::isfinite(t).all();
    finite = finite.defined() ? finite.logical_and(one) : one;
  }
  return !finite.defined() || finite.item<bool>();
}

// Where a run stopped by a non-finite value can resume from, for its error.
std::string last_good_checkpoint(const std::string& run_uri) {
  return detail::concat("The checkpoints saved before it in ", run_uri,
                        " hold finite weights; the same command resumes from the newest.");
}

// How many recent steps the samples/s and tokens/s gauges average over, and the longest span they
// look back (a slow step or a pause counts for at most that long).
constexpr std::size_t kRateWindowSteps = 10;
constexpr double kRateWindowSeconds = 5.0;

}  // namespace

// The series report() and step_done() set, looked up in the registry once; report keys as they
// first appear (a recipe reports a handful).
struct Trainer::TrainSeries {
  explicit TrainSeries(metrics::Registry& r)
      : registry(r),
        loss(r.gauge(metrics::name::kTrainLoss, "The last loss the rank reported.")),
        learning_rate(r.gauge(metrics::name::kTrainLearningRate,
                              "The last learning rate the rank reported (\"lr\").")),
        epoch(r.gauge(metrics::name::kTrainEpoch, "The epoch being trained.")),
        step(r.gauge(metrics::name::kTrainStep, "Optimizer steps since the run began.")),
        steps(r.counter(metrics::name::kTrainStepsTotal, "Optimizer steps this process took.")),
        samples(r.counter(metrics::name::kTrainSamplesTotal,
                          "Samples this rank trained on (its batch size per step).")),
        tokens(r.counter(metrics::name::kTrainTokensTotal,
                         "Tokens this rank trained on (recipes that count tokens).")),
        samples_per_second(r.gauge(metrics::name::kTrainSamplesPerSecond,
                                   "This rank's samples per second over its last steps.")),
        tokens_per_second(r.gauge(metrics::name::kTrainTokensPerSecond,
                                  "This rank's tokens per second over its last steps.")) {
    // Not measured yet (NaN), rather than 0: the dashboard shows no point instead of a false
    // loss of 0, and a recipe that counts no tokens shows samples/s, not 0 tokens/s.
    for (metrics::Gauge* g : {&loss, &learning_rate, &samples_per_second, &tokens_per_second})
      g->set(std::numeric_limits<double>::quiet_NaN());
  }

  // The gauge of a report() key; null past kMaxReportKeys distinct keys (warned about once), so
  // that a recipe reporting a key per epoch cannot grow the series without bound.
  static constexpr std::size_t kMaxReportKeys = 64;
  metrics::Gauge* report_key(const std::string& key) {
    auto it = report_keys.find(key);
    if (it != report_keys.end()) return it->second;
    if (report_keys.size() >= kMaxReportKeys) {
      if (!warned_keys) {
        logger("train")->warn(
            "report() has seen {} distinct keys; \"{}\" and later new keys are not exported as "
            "metrics. HINT: report a fixed set of keys (put the epoch in its own key).",
            kMaxReportKeys, key);
        warned_keys = true;
      }
      return nullptr;
    }
    auto& g =
        registry.gauge(metrics::name::kTrainReport, "The last value report() received per key.",
                       {{std::string(metrics::name::kKeyLabel), key}});
    report_keys.emplace(key, &g);
    return &g;
  }

  // A step ended at `t` (steady seconds): moves the window and sets the rate gauges.
  void mark(double t, std::int64_t batch, std::int64_t step_tokens) {
    samples.add(static_cast<double>(batch));
    tokens.add(static_cast<double>(step_tokens));
    samples_so_far += static_cast<double>(batch);
    tokens_so_far += static_cast<double>(step_tokens);
    window.push_back(Mark{t, samples_so_far, tokens_so_far});
    while (window.size() > kRateWindowSteps + 1 ||
           (window.size() > 2 && t - window[1].t >= kRateWindowSeconds))
      window.pop_front();
    if (window.size() < 2) return;
    const double span = t - window.front().t;
    if (span <= 0) return;
    samples_per_second.set((samples_so_far - window.front().samples) / span);
    if (tokens_so_far > 0) tokens_per_second.set((tokens_so_far - window.front().tokens) / span);
  }
  // Starts the window afresh at `t` (a new epoch: what came between does not count).
  void restart_window(double t) {
    window.clear();
    window.push_back(Mark{t, samples_so_far, tokens_so_far});
  }

  struct Mark {
    double t;
    double samples;
    double tokens;
  };
  metrics::Registry& registry;
  metrics::Gauge& loss;
  metrics::Gauge& learning_rate;
  metrics::Gauge& epoch;
  metrics::Gauge& step;
  metrics::Counter& steps;
  metrics::Counter& samples;
  metrics::Counter& tokens;
  metrics::Gauge& samples_per_second;
  metrics::Gauge& tokens_per_second;
  std::map<std::string, metrics::Gauge*> report_keys;
  bool warned_keys = false;
  std::deque<Mark> window;
  double samples_so_far = 0;
  double tokens_so_far = 0;
};

std::string progress_json(const Progress& p) {
  const nlohmann::json j = {{"epoch", p.epoch},
                            {"epoch_position", p.epoch_position},
                            {"global_step", p.global_step},
                            {"world_size", p.world_size}};
  return j.dump(2) + "\n";
}

Progress progress_from_json(const std::string& text, const std::string& what) {
  try {
    const auto j = nlohmann::json::parse(text);
    return Progress{.epoch = j.at("epoch").get<int>(),
                    .epoch_position = j.at("epoch_position").get<std::int64_t>(),
                    .global_step = j.at("global_step").get<std::int64_t>(),
                    .world_size = j.at("world_size").get<int>()};
  } catch (const std::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(what, " is not a valid training state: ", e.what()));
  }
}

std::unique_ptr<CheckpointIO> root_checkpoint_io(RootFiles files, Distributed& dist) {
  TY_CHECK(files.collect && files.restore, "RootFiles needs both collect and restore.");
  return std::make_unique<RootCheckpointIO>(std::move(files), dist);
}

std::unique_ptr<CheckpointIO> fsdp_checkpoint_io(fsdp::FullyShardedDataParallelBase& model,
                                                 torch::optim::Optimizer* optimizer,
                                                 Distributed& dist) {
  return std::make_unique<FsdpCheckpointIO>(model, optimizer, dist);
}

c10::Device Trainer::device() const {
  return dist_->device();
}

Trainer::Trainer(std::string recipe, RunConfig run, ScalingConfig scaling)
    : recipe_(std::move(recipe)), run_(std::move(run)), scaling_(std::move(scaling)) {
  run_.validate();
  scaling_.validate();
  start_s_ = now_s();
  auto init_options = init_options_from_env();  // the join timeout, TRAINYARD_BACKEND
  init_options.timeout = run_.collective_timeout;
  init_options.device = scaling_.device;
  dist_ = init(init_options);
  if (scaling_.threads > 0) {
    threads_ = scaling_.threads;
    logger("train")->debug("{} intra-op threads per rank (--threads)", threads_);
  } else {
    // The CPUs this container may use, not the host's: see Note [Counting CPUs in a container].
    const int cpus = usable_cpu_count();
    const int local_ranks = std::max(1, dist_->env().local_world_size);
    threads_ = std::max(1, cpus / local_ranks);
    logger("train")->debug(
        "{} intra-op threads per rank: {} usable CPUs (affinity mask and cgroup quota) / {} local "
        "ranks",
        threads_, cpus, local_ranks);
  }
  torch::set_num_threads(threads_);
  storage_ = storage::open_storage(run_.uri());
  progress_.world_size = dist_->world_size();
  auto& registry = metrics::process_registry();
  step_timer_ = std::make_unique<metrics::StepTimer>(registry);
  if (metrics::recording_enabled()) {
    series_ = std::make_unique<TrainSeries>(registry);
    registry
        .gauge(metrics::name::kRestarts, "Restarts of the job so far (TORCHELASTIC_RESTART_COUNT).")
        .set(dist_->env().restart_count);
  }
  if (const char* dir = std::getenv(kMetricsDirEnv); dir != nullptr && *dir != '\0') {
    publisher_ = std::make_unique<metrics::FilePublisher>(
        registry, metrics::FilePublisherOptions{.dir = dir, .rank = rank()});
  }
}

Trainer::~Trainer() {
  if (publisher_) publisher_->stop();  // writes the last values once more
}

int Trainer::rank() const {
  return dist_->rank();
}
int Trainer::world_size() const {
  return dist_->world_size();
}
int Trainer::local_rank() const {
  return dist_->local_rank();
}
int Trainer::restart_count() const {
  return dist_->env().restart_count;
}

void Trainer::all_reduce(at::Tensor& values, bool max) {
  if (world_size() == 1) return;
  std::vector<torch::Tensor> v{values};
  c10d::AllreduceOptions options;
  if (max) options.reduceOp = c10d::ReduceOp::MAX;
  wait_work(comm::all_reduce(dist_->process_group(), v, options));
}

double Trainer::elapsed_s() const {
  return now_s() - start_s_;
}

// Note [config.json after the resume]
// config.json says how the run's checkpoints are to be read (generate and export rebuild the model
// from it). A run started on another's folder, or resumed with flags its checkpoints cannot load
// into (Note [A run resumed as it was not set up]), must not replace it before it fails: so the
// file is written once resume() has taken the folder's lease and loaded its newest checkpoint (or
// found none) and the recipe's own check of it passed (check_resumed: a LoRA run's base), and at
// once when the recipe names its configuration after that.
void Trainer::write_config(const std::string& config_json) {
  config_json_ = config_json;
  if (rank() != 0) return;
  logger("train")->info("configuration: {}", nlohmann::ordered_json::parse(config_json).dump());
  if (checkpointer_) store_config();
}

void Trainer::store_config() {
  if (rank() != 0 || config_json_ == "{}") return;
  storage_->write("config.json", nlohmann::ordered_json::parse(config_json_).dump(2) + "\n");
}

const Progress& Trainer::resume(CheckpointIO& io, const std::function<void()>& check_resumed) {
  io_ = &io;
  // Rank 0 writes the checkpoints of a root io and holds the run's lease (Note [Run lease]); the
  // others only read the one rank 0 chose. Under an FSDP io every rank writes its shards, each
  // through its own writer of the same job.
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
      run_.uri(),
      checkpoint::CheckpointerOptions{.num_to_keep = run_.num_to_keep,
                                      .read_only = rank() != 0 && !io.every_rank_writes()});
  std::optional<CheckpointIO::Loaded> loaded;
  try {
    loaded = io.load_latest(*checkpointer_);
  } catch (const NetworkError&) {
    throw;  // storage away: nothing to do with how the run is set up
  } catch (const Error& e) {
    // See Note [A run resumed as it was not set up].
    const auto complete = checkpointer_->list_complete();
    const auto changed = complete.empty() ? std::string() : setup_changes(complete.back());
    if (changed.empty()) throw;
    throw InvalidArgumentError(detail::concat(
        "The run's newest checkpoint ", storage::join_uri(run_.uri(), complete.back()),
        " was saved by a run set up otherwise (", changed,
        "), and cannot be loaded into this one: ", e.what(),
        " HINT: resume the run as it was set up, or give --name a new run."));
  }
  if (!loaded) {
    if (rank() == 0) {
      if (const auto damaged = checkpointer_->list_damaged(); !damaged.empty()) {
        std::string names;
        for (const auto& n : damaged) names += (names.empty() ? "" : ", ") + n;
        std::printf(
            "No checkpoint of %s verifies: starting from scratch; the damaged ones (%s) are kept "
            "for inspection\n",
            run_.uri().c_str(), names.c_str());
        std::fflush(stdout);
      }
    }
    store_config();  // Note [config.json after the resume]
    return progress_;
  }
  const auto where = storage::join_uri(run_.uri(), loaded->name);
  progress_ = progress_from_json(loaded->state_json, where + "/" + kStateFile);
  resumed_from_ = last_checkpoint_ = loaded->name;
  last_checkpoint_step_ = progress_.global_step;
  if (progress_.world_size != world_size()) {
    logger("train")->warn(
        "{} was taken at world size {}; continuing at world size {} from the same sample "
        "position.",
        loaded->name, progress_.world_size, world_size());
  }
  if (const auto changed = rank() == 0 ? setup_changes(loaded->name) : ""; !changed.empty())
    logger("train")->warn(
        "{} was saved by a run set up otherwise: {}. The run goes on as this one "
        "is set up.",
        loaded->name, changed);
  if (rank() == 0) {
    std::printf("Resuming from %s at step %lld (epoch %d, %lld samples into it)\n",
                loaded->name.c_str(), static_cast<long long>(progress_.global_step),
                progress_.epoch, static_cast<long long>(progress_.epoch_position));
    std::fflush(stdout);
  }
  if (check_resumed) check_resumed();
  store_config();  // Note [config.json after the resume]
  return progress_;
}

std::optional<std::string> Trainer::resumed_file(const std::string& name) {
  if (resumed_from_.empty()) return std::nullopt;
  const auto manifest = checkpointer_->read_manifest(resumed_from_);
  if (manifest.files.count(name) == 0) return std::nullopt;
  return checkpointer_->read_file(manifest, name);
}

void Trainer::add_checkpoint_file(const std::string& name, std::string bytes) {
  TY_CHECK(name != kStateFile, name, " is the Trainer's own checkpoint file.");
  checkpoint_files_[name] = std::move(bytes);
}

void Trainer::describe_setup(std::vector<std::pair<std::string, std::string>> facts) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const auto& [fact, value] : facts) json[fact] = value;
  checkpoint_files_[kSetupFile] = json.dump();
  setup_ = std::move(facts);
}

// Note [A run resumed as it was not set up]
// A run resumed with other flags than it was saved with may load fine and quietly train on
// otherwise (another precision: the checkpoint's fp32 weights now train in bf16), or fail to load
// with a message about a parameter that only the flags explain (a LoRA run resumed as a full
// fine-tune "has no parameter model.norm.weight"). So each checkpoint keeps the recipe's setup
// facts (setup.json), and resume() compares: a difference is said as a warning when the
// checkpoint loads, and leads the error when it does not. A checkpoint from before setup.json, or
// a fact one side lacks, is not a difference.
std::string Trainer::setup_changes(const std::string& checkpoint) {
  if (setup_.empty()) return "";
  std::optional<std::string> text;
  try {
    const auto manifest = checkpointer_->read_manifest(checkpoint);
    if (manifest.files.count(kSetupFile) > 0) text = checkpointer_->read_file(manifest, kSetupFile);
  } catch (const Error&) {
    return "";  // the load reports what is wrong with the checkpoint itself
  }
  if (!text) return "";
  const auto saved = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object()) return "";
  std::string out;
  for (const auto& [fact, value] : setup_) {
    const auto it = saved.find(fact);
    if (it == saved.end() || !it->is_string() || it->get<std::string>() == value) continue;
    out += detail::concat(out.empty() ? "" : "; ", fact, ": ", it->get<std::string>(), " there, ",
                          value, " here");
  }
  return out;
}

void Trainer::guard_weights(std::vector<at::Tensor> weights) {
  guarded_weights_ = std::move(weights);
}

// Note [Positions across world sizes]
// The position within an epoch counts sample positions of the sampler's permutation consumed by
// all ranks together: after s steps of B samples on W ranks, s * B * W. A resumed epoch starts
// from that position at whatever world size the job now has; the sampler deals the rest of the
// permutation out to the new ranks (DistributedSampler::indices). The position of a resumed
// epoch is rounded down to a whole round of the old world, as the sampler starts rounds there.
std::int64_t Trainer::begin_epoch(int epoch, std::int64_t batches) {
  first_position_ = epoch == progress_.epoch ? progress_.epoch_position : 0;
  current_epoch_ = epoch;
  epoch_batches_ = batches;
  epoch_steps_ = 0;
  progress_.epoch = epoch;
  progress_.epoch_position = first_position_;
  if (series_) {
    series_->epoch.set(epoch);
    series_->restart_window(now_s());
  }
  step_timer_->begin_step();
  return first_position_;
}

void Trainer::step_done(std::int64_t batch_size, Metrics metrics, std::int64_t tokens) {
  for (const auto& [key, value] : metrics) {  // Note [Non-finite training]
    if ((key == "loss" || key == "train_loss") && !std::isfinite(value)) {
      throw NonFiniteError(detail::concat(
          "the loss of step ", progress_.global_step + 1, " (epoch ", current_epoch_, ") is ",
          value, ": the run stops here and saves nothing of this step. ",
          last_good_checkpoint(run_.uri()), " HINT: lower --lr, or look at this step's data."));
    }
  }
  step_timer_->phase(metrics::Phase::kOther);
  heartbeat();  // one step of progress; see Note [Hang watchdog]
  ++epoch_steps_;
  ++progress_.global_step;
  if (epoch_steps_ == epoch_batches_) {
    progress_.epoch = current_epoch_ + 1;
    progress_.epoch_position = 0;
  } else {
    progress_.epoch_position =
        first_position_ - first_position_ % world_size() + epoch_steps_ * batch_size * world_size();
  }
  report(std::move(metrics));
  if (!resumed_from_.empty() && !first_step_logged_) {
    logger("train")->info(
        "First step after resuming from {} done: step {}, {:.2f} s after this rank started",
        resumed_from_, progress_.global_step, elapsed_s());
  } else {
    logger("train")->debug("step {} done", progress_.global_step);
  }
  first_step_logged_ = true;
  if (run_.checkpoint_every > 0 && progress_.global_step % run_.checkpoint_every == 0)
    save_checkpoint();
  // The step is counted before its phases' seconds are added (end_step), so a snapshot taken in
  // between shows a step without all of its time, never time without its step.
  if (series_) series_->steps.add(1);
  step_timer_->end_step();
  if (series_) {
    series_->step.set(static_cast<double>(progress_.global_step));
    series_->mark(now_s(), batch_size, tokens);
  }
  step_timer_->begin_step();
}

void Trainer::end_epoch() {
  progress_.epoch = current_epoch_ + 1;
  progress_.epoch_position = 0;
}

void Trainer::report(Metrics metrics) {
  last_report_ = Report{.rank = rank(),
                        .epoch = current_epoch_,
                        .step = progress_.global_step,
                        .time_s = elapsed_s(),
                        .metrics = std::move(metrics)};
  if (series_) {
    series_->epoch.set(current_epoch_);
    series_->step.set(static_cast<double>(progress_.global_step));
    for (const auto& [key, value] : last_report_.metrics) {
      if (metrics::Gauge* g = series_->report_key(key)) g->set(value);
      if (key == "loss" || key == "train_loss") series_->loss.set(value);
      if (key == "lr") series_->learning_rate.set(value);
    }
  }
  for (const auto& sink : sinks_) sink(last_report_);
}

void Trainer::on_report(std::function<void(const Report&)> sink) {
  sinks_.push_back(std::move(sink));
}

void Trainer::save_checkpoint() {
  TY_CHECK(io_ != nullptr, "Trainer::save_checkpoint needs resume() first (it sets the io).");
  heartbeat();                      // around each phase that may take a while: Note [Hang watchdog]
  if (!guarded_weights_.empty()) {  // Note [Non-finite training]
    auto bad = torch::tensor({all_finite(guarded_weights_) ? 0.0 : 1.0}, torch::kFloat64);
    all_reduce(bad, /*max=*/true);
    TY_CHECK_T(NonFiniteError, bad.item<double>() == 0, "step ", progress_.global_step, " (epoch ",
               current_epoch_,
               ") left NaN or Inf in the weights: the run stops without saving them. ",
               last_good_checkpoint(run_.uri()), " HINT: lower --lr.");
  }
  const double t0 = now_s();
  last_checkpoint_step_ = progress_.global_step;  // on every rank: it decides the final save
  Progress saved = progress_;
  saved.world_size = world_size();
  auto files = checkpoint_files_;
  files[kStateFile] = progress_json(saved);
  io_->save(*checkpointer_, progress_.global_step, std::move(files));
  heartbeat();
  if (rank() == 0)
    logger("train")->info("Checkpoint of step {}: training stalled {:.2f} s", progress_.global_step,
                          now_s() - t0);
}

std::optional<double> Trainer::best_checkpoint_metric() {
  TY_CHECK(checkpointer_ != nullptr, "Trainer::best_checkpoint_metric needs resume() first.");
  const auto best = checkpointer_->best();
  if (!best) return std::nullopt;
  return best->metric;
}

std::string Trainer::save_best_checkpoint(double metric, const std::string& why) {
  save_checkpoint();
  const auto name = io_->wait(*checkpointer_).value_or("");
  if (rank() == 0 && !name.empty()) {
    checkpointer_->mark_best(name, metric, why);
    last_checkpoint_ = name;
  }
  heartbeat();
  return name;
}

std::string Trainer::finish_training() {
  TY_CHECK(io_ != nullptr, "Trainer::finish_training needs resume() first (it sets the io).");
  if (last_checkpoint_step_ != progress_.global_step) save_checkpoint();
  if (auto name = io_->wait(*checkpointer_)) last_checkpoint_ = *name;
  heartbeat();
  return last_checkpoint_;
}

void Trainer::write_result(Result result) {
  if (rank() == 0) {
    if (result.time_total_s == 0) result.time_total_s = elapsed_s();
    if (result.time_this_iter_s == 0) result.time_this_iter_s = result.time_total_s;
    if (result.config_json == "{}") result.config_json = config_json_;
    storage_->write("result.json", result_json(result));
  }
  dist_->barrier();
}

bool interactive_output() {
  const char* tty = std::getenv(kTtyEnv);
  return (tty != nullptr && std::string(tty) == "1") || ::isatty(STDOUT_FILENO) == 1;
}

void ProgressBar::update(std::int64_t done, double loss) {
  if (!enabled_ || total_ == 0) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total_);
  // Drawn as "text\r" so it also works through the launcher's line prefixes.
  std::printf("Epoch %d [%s%s] %lld/%lld loss %.4f\r", epoch_, std::string(filled, '#').c_str(),
              std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done),
              static_cast<long long>(total_), loss);
  std::fflush(stdout);
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  std::printf("%s\r", std::string(72, ' ').c_str());
  std::fflush(stdout);
}

}  // namespace trainyard::train
