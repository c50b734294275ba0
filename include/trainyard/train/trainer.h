// The run protocol every recipe shares, one Trainer per rank:
//
//   Trainer trainer("fashion-mnist", run, scaling);        // joins the job, opens the run folder
//   trainer.write_config(config_json);
//   ... build the model and optimizer ...
//   auto io = root_checkpoint_io({.collect = ..., .restore = ...});   // or fsdp_checkpoint_io
//   trainer.resume(*io);                                  // the newest checkpoint, if any
//   for (int epoch = trainer.progress().epoch; epoch < epochs; ++epoch) {
//     auto first = trainer.begin_epoch(epoch, batches_in_epoch);   // resume mid-epoch
//     for (...) { ... step ...; trainer.step_done(batch_size, {{"loss", l}}); }
//     trainer.end_epoch();
//   }
//   result.checkpoint_dir_name = trainer.finish_training();   // the final checkpoint
//   trainer.write_result(result);                           // result.json
//
// Metrics (docs/METRICS.md, "Training metrics"): every rank records what report() receives,
// steps, samples and tokens, and where each step's time went into metrics::process_registry();
// the recipe names the phases (trainer.phase(Phase::kForward), ...: metrics/step_timer.h), each
// step begins when the last one is done (in Phase::kData) and ends in step_done(). With
// $TRAINYARD_METRICS_DIR set the Trainer publishes the registry to the agent (rank_files.h).
//
// Fault tolerance: a checkpoint is saved every RunConfig::checkpoint_every steps and at the end,
// under <storage>/<name>/, with the recipe's state and the Progress (state.json). Every start
// resumes from the newest checkpoint that loads: after an agent restart, or when the same command
// runs again with more epochs. The sample position is counted over all ranks (Note [Positions
// across world sizes] in trainer.cpp), so a run resumes at another world size where it stopped.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/heartbeat.h"
#include "trainyard/metrics/step_timer.h"
#include "trainyard/train/result.h"
#include "trainyard/train/run_config.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace trainyard {
class Distributed;
}
namespace trainyard::checkpoint {
class Checkpointer;
struct LoadedCheckpoint;
}  // namespace trainyard::checkpoint
namespace trainyard::storage {
class Storage;
}
namespace trainyard::fsdp {
class FullyShardedDataParallelBase;
}
namespace trainyard::metrics {
class FilePublisher;
}

namespace trainyard::train {

// Where a run stands; state.json in each checkpoint.
struct Progress {
  int epoch = 0;                    // the epoch to run next (or being run)
  std::int64_t epoch_position = 0;  // sample positions of that epoch done, all ranks together
  std::int64_t global_step = 0;     // optimizer steps since the run began
  int world_size = 1;               // when the checkpoint was taken
};

std::string progress_json(const Progress& progress);
// Throws CheckpointCorruptError naming `what` when `text` is not a training state.
Progress progress_from_json(const std::string& text, const std::string& what);

// How a recipe's state goes into a checkpoint and comes back. The Trainer adds the Progress as
// the file state.json.
class CheckpointIO {
 public:
  struct Loaded {
    std::string name;        // "checkpoint_000003"
    std::string state_json;  // the Progress it was saved with
  };
  virtual ~CheckpointIO() = default;
  // Collective: the newest checkpoint every rank can load, loaded into the recipe's state.
  virtual std::optional<Loaded> load_latest(checkpoint::Checkpointer& checkpointer) = 0;
  // Collective: saves the recipe's state and `extra` files (written by rank 0) as a new
  // checkpoint; may return before the files are written (see wait()).
  virtual void save(checkpoint::Checkpointer& checkpointer,
                    std::int64_t step,
                    std::map<std::string, std::string> extra) = 0;
  // Whether every rank writes files of each checkpoint (each then holds a writer's lease), or
  // rank 0 alone.
  virtual bool every_rank_writes() const = 0;
  // Waits for a save still being written; the name of the newest saved checkpoint, on the ranks
  // that know it (rank 0 always).
  virtual std::optional<std::string> wait(checkpoint::Checkpointer& checkpointer) = 0;
};

// Rank 0 writes every file of each checkpoint, in the background while training goes on; every
// rank loads the one rank 0 chose. For state every rank holds in full (DDP) or that can be
// gathered to rank 0 (ZeRO-1's optimizer).
struct RootFiles {
  // Every rank, at the same steps (it may gather): the files to save. Rank 0's are written.
  std::function<std::map<std::string, std::string>()> collect;
  // Every rank: restores the recipe's state from a verified checkpoint's files.
  std::function<void(const checkpoint::LoadedCheckpoint&)> restore;
};
std::unique_ptr<CheckpointIO> root_checkpoint_io(RootFiles files, Distributed& dist);

// Each rank writes its own shards of `model` and of `optimizer` (may be null) as FSDP's sharded
// checkpoint (fsdp/state_dict.h); a run resumes at any world size and strategy.
std::unique_ptr<CheckpointIO> fsdp_checkpoint_io(fsdp::FullyShardedDataParallelBase& model,
                                                 torch::optim::Optimizer* optimizer,
                                                 Distributed& dist);

// What a rank reports after a step: named values (loss, lr, tokens/s, ...).
using Metrics = std::vector<std::pair<std::string, double>>;

// One report(), as sinks receive it.
struct Report {
  int rank = 0;
  int epoch = 0;
  std::int64_t step = 0;  // global step just done
  double time_s = 0;      // since this rank's Trainer started
  Metrics metrics;
};

class Trainer {
 public:
  // Joins the job from the environment contract (init(), with run.collective_timeout_s as the
  // collective timeout), sets this rank's intra-op threads (scaling.threads, else the CPUs this
  // process may use / local ranks: usable_cpu_count(), which sees a container's affinity mask and
  // CPU quota) and opens the run's folder; rank 0 holds its lease (Note [Run lease]).
  Trainer(std::string recipe, RunConfig run, ScalingConfig scaling);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  Distributed& dist() { return *dist_; }
  // The device this rank trains on (ScalingConfig::device resolved: cpu or cuda:LOCAL_RANK).
  c10::Device device() const;
  const std::shared_ptr<Distributed>& dist_ptr() { return dist_; }
  int rank() const;
  int world_size() const;
  int local_rank() const;
  int restart_count() const;
  int threads() const { return threads_; }
  const RunConfig& run() const { return run_; }
  const std::string& recipe() const { return recipe_; }
  // The run's folder: config.json, result.json, and the checkpoints' files.
  storage::Storage& storage() { return *storage_; }

  // Rank 0 logs the configuration (a JSON object's text) and writes it as config.json once
  // resume() has loaded the run's newest checkpoint; result.json repeats it.
  void write_config(const std::string& config_json);

  // Loads the newest checkpoint through `io` (which it keeps for saves) and returns where the run
  // stands: the start when there is none. Rank 0 prints what it resumed from, or names the
  // damaged checkpoints it could not.
  // `check_resumed`, when given, runs after a checkpoint loaded and before config.json is written
  // (Note [config.json after the resume]): a recipe's own check of what it resumed, which throws
  // to leave the run's folder as it was.
  const Progress& resume(CheckpointIO& io, const std::function<void()>& check_resumed = {});
  // The tensors the optimizer updates (this rank's: whole parameters, or its FSDP shards), which
  // every save checks first: a checkpoint of NaN or Inf weights is never written (Note
  // [Non-finite training] in trainer.cpp). Recipes name them before the first step.
  void guard_weights(std::vector<at::Tensor> weights);
  const Progress& progress() const { return progress_; }
  // The resumed checkpoint's name; empty when the run started from scratch.
  const std::string& resumed_from() const { return resumed_from_; }
  // File `name` of the resumed checkpoint, verified against its manifest; nullopt when the run
  // started from scratch or that checkpoint has no such file.
  std::optional<std::string> resumed_file(const std::string& name);
  // A file every checkpoint saved from now on holds beside the recipe's state (written by rank 0).
  void add_checkpoint_file(const std::string& name, std::string bytes);
  // How this run is set up, as facts a person reads ({"training", "full fine-tune"},
  // {"precision", "bf16-mixed"}), given before resume(): every checkpoint saves them, and
  // resume() compares the checkpoint's with these (Note [A run resumed as it was not set up]).
  void describe_setup(std::vector<std::pair<std::string, std::string>> facts);

  // Starts epoch `epoch` of `batches` steps per rank (counted from the epoch's first sample) and
  // returns the sample position to start it from: where the resumed checkpoint left it, else 0.
  std::int64_t begin_epoch(int epoch, std::int64_t batches);
  // One optimizer step over `batch_size` samples (and `tokens` tokens, for recipes that count
  // them) per rank is done: advances the position, beats the hang watchdog, report()s `metrics`,
  // saves a checkpoint when checkpoint_every says so, and ends the step's timing (what it does
  // itself is Phase::kOther) and begins the next one's. A "loss" or "train_loss" in `metrics`
  // that is NaN or Inf stops the run: NonFiniteError naming the step, nothing of it saved.
  void step_done(std::int64_t batch_size, Metrics metrics, std::int64_t tokens = 0);
  // Enters `phase` of the current step (metrics/step_timer.h) and beats (a phase done is progress
  // inside the step: Note [Hang watchdog]); cheap: two clock reads.
  void phase(metrics::Phase phase) {
    heartbeat();
    step_timer_->phase(phase);
  }
  metrics::StepTimer& step_timer() { return *step_timer_; }
  // Steps done in the current epoch by this attempt (resumed ones excluded).
  std::int64_t epoch_steps() const { return epoch_steps_; }
  void end_epoch();

  // Hands `metrics` of the current step to every sink (the seam the cluster's metrics hang on)
  // and keeps them as the last report. Records each as the gauge trainyard_train_report{key};
  // "loss" (or "train_loss") also as trainyard_train_loss and "lr" as
  // trainyard_train_learning_rate.
  void report(Metrics metrics);
  void on_report(std::function<void(const Report&)> sink);
  const Report& last_report() const { return last_report_; }

  // Collective: saves a checkpoint now (it is written in the background where the io can).
  // Throws NonFiniteError, saving nothing, when a guarded weight holds NaN or Inf.
  void save_checkpoint();
  // Collective: saves a checkpoint now, waits for it, and (rank 0) marks it the run's best, so
  // that retention keeps it beyond num_to_keep (checkpoint::Checkpointer::mark_best). Returns
  // its name on rank 0.
  std::string save_best_checkpoint(double metric, const std::string& why);
  // The metric of the run's best checkpoint (lower is better), as mark_best recorded it: what a
  // resumed run must beat to replace it; nullopt when none is marked. Reads the run's folder.
  std::optional<double> best_checkpoint_metric();
  // Collective: saves the final checkpoint unless the last step is saved, waits for every save,
  // and returns the newest checkpoint's name (on rank 0; "" elsewhere unless the io knows it).
  std::string finish_training();

  // Collective: sums `values` (or takes their maximum) over the ranks, in place.
  void all_reduce(at::Tensor& values, bool max = false);

  // Seconds since this rank's Trainer started.
  double elapsed_s() const;
  // Rank 0 writes result.json (adding the configuration and time_total_s when unset); then every
  // rank waits for it (a barrier), so the table can be printed after any rank returns.
  void write_result(Result result);

 private:
  std::string recipe_;
  RunConfig run_;
  ScalingConfig scaling_;
  std::shared_ptr<Distributed> dist_;
  std::unique_ptr<storage::Storage> storage_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;  // from resume() on
  int threads_ = 1;
  double start_s_ = 0;  // steady clock, seconds
  std::string config_json_ = "{}";
  CheckpointIO* io_ = nullptr;
  std::vector<at::Tensor> guarded_weights_;
  std::map<std::string, std::string> checkpoint_files_;     // add_checkpoint_file()
  std::vector<std::pair<std::string, std::string>> setup_;  // describe_setup()
  // What differs between `checkpoint`'s setup.json and setup_, as "fact: X there, Y here; ...";
  // "" when nothing does or either is unknown.
  std::string setup_changes(const std::string& checkpoint);
  // Rank 0 writes config_json_ as config.json (Note [config.json after the resume]).
  void store_config();
  Progress progress_;
  std::string resumed_from_;
  std::string last_checkpoint_;
  std::int64_t last_checkpoint_step_ = -1;
  bool first_step_logged_ = false;
  // The epoch being run.
  int current_epoch_ = 0;
  std::int64_t first_position_ = 0;
  std::int64_t epoch_batches_ = 0;
  std::int64_t epoch_steps_ = 0;
  std::vector<std::function<void(const Report&)>> sinks_;
  Report last_report_;
  struct TrainSeries;  // the registry's series the Trainer sets, looked up once
  std::unique_ptr<TrainSeries> series_;
  std::unique_ptr<metrics::StepTimer> step_timer_;
  std::unique_ptr<metrics::FilePublisher> publisher_;  // when $TRAINYARD_METRICS_DIR is set
};

// True when stdout is a terminal (or TRAINYARD_TTY=1): recipes draw progress bars only then.
bool interactive_output();

// A one-line bar ("Epoch 0 [#####.....] 40/100 loss 0.4213") redrawn with '\r' on rank 0 when
// `enabled` (an interactive terminal); erased when destroyed.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int epoch, std::int64_t total) noexcept
      : enabled_(enabled), epoch_(epoch), total_(total) {}
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  void update(std::int64_t done, double loss);

 private:
  bool enabled_;
  int epoch_;
  std::int64_t total_;
};

}  // namespace trainyard::train
