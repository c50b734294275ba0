#include "trainyard/plan/memory_plan.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "trainyard/error.h"

namespace trainyard::plan {

// Note [ZeRO paper accounting]
// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
// (2020), section 3.1 and figure 1: mixed-precision Adam keeps, per parameter, fp16 parameters
// (2 bytes) and gradients (2 bytes) plus K = 12 bytes of optimizer state (fp32 master weights,
// momentum, variance). With Psi parameters on N_d devices:
//   baseline (DDP)     (2 + 2 + K) Psi                 7.5B, 64 devices: 120 GB
//   P_os   (ZeRO-1)    (2 + 2) Psi + K Psi / N_d                         31.4 GB
//   P_os+g (ZeRO-2)    2 Psi + (2 + K) Psi / N_d                         16.6 GB
//   P_os+g+p (ZeRO-3)  (2 + 2 + K) Psi / N_d                             1.9 GB
// (GB = 1e9 bytes.) FSDP's SHARD_GRAD_OP is P_os+g at its peak (every unit stays gathered from
// its forward to its backward), FULL_SHARD is P_os+g+p, and HYBRID_SHARD is P_os+g+p over the
// devices of one node. In fp32 the same split holds with 4 + 4 bytes and K = 8 (two moments).
// These are model states only: no activations, no buffers, no runtime.

// Note [What the engine holds]
// trainyard's engine at W ranks, shard group S (W for FULL_SHARD and SHARD_GRAD_OP, the ranks of a
// node for HYBRID_SHARD, 1 for DDP), compute dtype c bytes (4, or 2 under bf16-mixed), gradients
// reduced in fp32 (what train_gpt_fsdp asks for):
//   DDP (src/ddp/reducer.cpp): fp32 parameters (4 Psi), gradients as views of the fp32 all-reduce
//     buckets (4 Psi, Note [Gradients as bucket views]), Adam's moments (8 Psi). Under bf16-mixed
//     (CPU autocast) the matmuls' bf16 copies of the weights live from forward to backward.
//   ZeRO-1 (src/optim/sharded_adam.cpp): DDP with the moments of the parameters the rank owns;
//     the owners are chosen greedily by whole tensors, so the largest share is what counts.
//   FSDP (src/fsdp/fully_sharded_data_parallel.cpp): per unit one flat buffer padded to a
//     multiple of S, of which the rank keeps the fp32 shard, its fp32 gradient and Adam's moments
//     (16 bytes per shard element). Around that, at the step's peak:
//     - gathered parameters in the compute dtype: FULL_SHARD and HYBRID_SHARD free a unit after
//       its forward and gather it again for its backward, at most two units besides the root
//       (limit_all_gathers); SHARD_GRAD_OP keeps every unit gathered from its forward to its
//       backward, so all of them at the loss. One fp32 shard (S = 1) is its own gathered copy.
//     - in a unit's backward: its flat gradient buffer (c bytes per element, Note [Gradients in
//       place]), and up to kReductionsInFlight + 1 = 3 flat fp32 gradients whose reduction is in
//       flight (Note [Settling reductions]).
//   So the engine's "params" column counts the fp32 shards plus the gathered copies at the peak,
//   "grads" the fp32 gradients plus the flat gradients in flight, "optimizer" Adam's moments.
//   Under mixed precision the fp32 shard is the master copy: the paper's K = 12 (master + two
//   moments) becomes 4 (params) + 8 (optimizer) here, and the paper's 2-byte copies are the
//   engine's transient gathered ones. The step's peak is the largest of three moments:
//     loss backward:   saved activations, the logits and the loss's fp32 temporaries
//     head backward:   the output projection gathered, the logits' fp32 gradient, its flat
//                      gradient buffer
//     layer backward:  two layers gathered, reductions in flight, one layer recomputed
//                      (checkpointing) and the layer's gradient temporaries
//   For small models the first wins (pythia-70m: 3 x B x T x V x 4 bytes of loss temporaries);
//   for large ones the layers' buffers do.

// Note [Activations around the layers]
// What any causal LM's layers keep per micro-batch is its architecture's (Note [GPT-NeoX
// activations], Note [Llama activations]). With activation checkpointing (nn::checkpoint per unit)
// a layer keeps only its input (BTh c), and in backward one layer at a time is recomputed. After
// the layers: the final norm's output (B,T,h) c and the logits (B,T,V) c, which the caller holds
// until the step ends; the loss (causal_lm_loss) copies logits[:, :-1] to fp32, keeps
// log_softmax's output, and at its backward holds that output, its gradient and the gradient of
// its input: 3 x B(T-1)V x 4 bytes at once. At the head's backward the logits' gradient is fp32
// (B,T,V) (plus its bf16 cast under bf16-mixed).

// Note [CPU ranks]
// trainyard's ranks on CPUs (train_gpt_fsdp) differ from devices in two ways the plan models with
// PlanOptions::cpu_ranks. (1) The caching CPU allocator (Note [Caching CPU allocator] in
// src/memory/caching_allocator.cpp) keeps a size class's blocks for that class: memory the loss's
// logits-sized temporaries free is not lent to a layer's activations or to FSDP's flat buffers.
// So peak RSS is not the largest moment of the step but about the sum of three pools, each at its
// own peak: the logits pool (the larger of the loss's and the head's backward), the layers' pool
// (saved activations, a recomputed layer, a layer's gradient temporaries) and FSDP's unit buffers
// (gathered parameters and flat gradients). (2) DDP's gradient buckets live in the node's shared
// memory (Note [Collectives in place] in src/comm/shm_process_group.cpp); every rank reads every
// peer's copy, so each rank's RSS counts the node's W buckets, 4 Psi each, though the machine holds
// them once. Measured for pythia-70m at W = 2 (bench/plan_vs_measured.sh, 14 variants), the
// pools' sum plus kCpuRuntimeBytes comes within 6% of every variant's peak RSS. The largest moment
// alone, given its own best-fitting constant, spread from 0.95 to 1.05 of the measured peaks on
// the first 9 variants and fell furthest short under activation checkpointing, whose recomputed
// layer lives in blocks the loss's moment does not use.

// Note [Runtime overhead]
// What a rank holds besides the model: the program and LibTorch's libraries (200-250 MiB resident
// at the first step), glibc's heap for tensors under kCachedMinBytes (45-75 MiB), the token buffer
// (8 MiB), Gloo's and the shared-memory group's buffers, and the caching allocator's slack.
// kCpuRuntimeBytes is one calibration: the median, over the 14 variants of
// bench/plan_vs_measured.sh --calibrate (pythia- 70m, seq 256, batch 4 per rank, 2 ranks; DDP,
// NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD on one node and on two, in fp32 and bf16-mixed,
// FULL_SHARD with checkpointing), of measured peak RSS minus the plan without runtime: 380.75 MiB
// (from 293 to 485), taken as 380 MiB. A second, fresh run of the script checks it. It is added
// only under `trainyard plan --cpu`; a GPU's CUDA context and NCCL's buffers are not measured here:
// --runtime-mem adds them, and the headroom covers them otherwise.

namespace {

constexpr int kReductionsInFlight = 2;  // src/fsdp/backward.cpp

std::int64_t pad_to(std::int64_t n, std::int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// A model's parameters grouped by the FSDP unit train_gpt_fsdp wraps them in: the root (the final
// norm, and the embedding when tied), the input embedding, each layer, the output projection.
struct Units {
  std::vector<std::int64_t> sizes;    // elements per unit, [0] the root
  std::int64_t layer = 0;             // one layer's elements
  std::int64_t embedding = 0;         // the input embedding's (= the output projection's)
  std::vector<std::int64_t> tensors;  // every parameter tensor's elements (ZeRO-1's owners)
  std::int64_t autocast_weights = 0;  // elements the bf16 autocast copies (Dense weights, biases)
};

Units model_units(const models::CausalLmConfig& config) {
  const auto p = config.parameter_layout();
  Units u;
  u.embedding = p.embedding;
  u.layer = p.layer_elements();
  std::int64_t final_norm = 0;
  for (auto n : p.final_norm) final_norm += n;
  u.sizes.push_back(final_norm + (p.tied ? p.embedding : 0));
  if (!p.tied) u.sizes.push_back(p.embedding);
  for (std::int64_t l = 0; l < p.num_layers; ++l) u.sizes.push_back(u.layer);
  if (!p.tied) u.sizes.push_back(p.embedding);
  u.tensors.push_back(p.embedding);
  for (std::int64_t l = 0; l < p.num_layers; ++l)
    u.tensors.insert(u.tensors.end(), p.layer.begin(), p.layer.end());
  u.tensors.insert(u.tensors.end(), p.final_norm.begin(), p.final_norm.end());
  if (!p.tied) u.tensors.push_back(p.embedding);
  u.autocast_weights = p.num_layers * (u.layer - p.layer_norm_elements) + p.embedding;
  return u;
}

// The largest element count greedy whole-tensor partitioning gives one of `ranks` owners (as
// ShardedAdam::partition does: largest first, each to the least loaded).
std::int64_t largest_owned(std::vector<std::int64_t> tensors, int ranks) {
  std::stable_sort(tensors.begin(), tensors.end(), std::greater<>());
  std::vector<std::int64_t> load(static_cast<std::size_t>(ranks), 0);
  for (auto n : tensors) *std::min_element(load.begin(), load.end()) += n;
  return *std::max_element(load.begin(), load.end());
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// The whole of `text` as a finite, non-negative number, and what follows it.
bool split_number(std::string_view text, double& value, std::string& suffix) {
  const auto* begin = text.data();
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin || !std::isfinite(value) || value < 0) return false;
  suffix = lower(std::string_view(ptr, static_cast<std::size_t>(end - ptr)));
  return true;
}

}  // namespace

StateBytes zero_paper_state_bytes(Precision precision) {
  if (precision == Precision::kFp32) return {.params = 4, .grads = 4, .optimizer = 8};
  return {.params = 2, .grads = 2, .optimizer = 12};
}

void PlanOptions::validate() const {
  TY_CHECK(model.has_value() || parameter_count > 0,
           "PlanOptions: give a model (--model) or a parameter count (--params).");
  TY_CHECK(parameter_count >= 0, "PlanOptions.parameter_count (--params) must be > 0, got ",
           parameter_count, ".");
  TY_CHECK(precision != Precision::kPureBf16,
           "PlanOptions.precision (--precision) pure-bf16 is not planned: the planner models fp32 "
           "and bf16-mixed. HINT: plan bf16-mixed; pure-bf16 holds FSDP's shards, gradients and "
           "Adam moments in bf16, half of bf16-mixed's 16 bytes per sharded parameter.");
  if (model) model->validate();
  TY_CHECK(!lora || model,
           "PlanOptions: LoRA (--peft lora) needs the model (--model), to find "
           "the layers it adapts.");
  if (lora) {
    lora->validate();
    models::lora_targets(*model, *lora);  // names a target the architecture lacks
  }
  TY_CHECK(world_size >= 1, "PlanOptions.world_size (--gpus) must be >= 1, got ", world_size, ".");
  TY_CHECK(gpus_per_node >= 0, "PlanOptions.gpus_per_node (--gpus-per-node) must be >= 0, got ",
           gpus_per_node, ".");
  TY_CHECK(gpus_per_node == 0 || world_size % gpus_per_node == 0, "PlanOptions.gpus_per_node (",
           gpus_per_node, ", --gpus-per-node) must divide the world size (", world_size,
           ", --gpus). HINT: every node runs the same number of ranks.");
  TY_CHECK(seq_len >= 2, "PlanOptions.seq_len (--seq-len) must be >= 2, got ", seq_len, ".");
  TY_CHECK(!model || seq_len <= model->max_position_embeddings(), "PlanOptions.seq_len (--seq-len ",
           seq_len, ") exceeds the model's max_position_embeddings (",
           model ? model->max_position_embeddings() : 0, ").");
  TY_CHECK(micro_batch >= 1, "PlanOptions.micro_batch (--batch-size) must be >= 1, got ",
           micro_batch, ".");
  TY_CHECK(device_memory_bytes >= 0,
           "PlanOptions.device_memory_bytes (--gpu-mem) must be >= 0, got ", device_memory_bytes,
           ".");
  TY_CHECK(headroom >= 0 && headroom < 1,
           "PlanOptions.headroom (--headroom) must be in [0, 1), got ", headroom, ".");
  TY_CHECK(runtime_bytes >= 0, "PlanOptions.runtime_bytes (--runtime-mem) must be >= 0, got ",
           runtime_bytes, ".");
}

ActivationBytes activation_bytes(const models::CausalLmConfig& config,
                                 std::int64_t seq_len,
                                 std::int64_t micro_batch,
                                 Precision precision,
                                 bool activation_checkpointing) {
  // See Note [Activations around the layers].
  const bool bf16 = precision == Precision::kBf16Mixed;
  const double b = static_cast<double>(micro_batch), t = static_cast<double>(seq_len);
  const double c = bf16 ? 2 : 4;
  const double bth = b * t * static_cast<double>(config.hidden_size());
  const double layers = static_cast<double>(config.num_hidden_layers());
  ActivationBytes a;
  a.per_layer =
      config.layer_activation_bytes({.micro_batch = micro_batch, .seq_len = seq_len, .bf16 = bf16});
  a.layers = activation_checkpointing ? layers * c * bth : layers * a.per_layer;
  a.recompute = activation_checkpointing ? a.per_layer : 0;
  const double v = static_cast<double>(config.vocab_size());
  a.head = c * bth + c * b * t * v + 8 * b * t;  // final norm out, logits, the token ids
  a.loss_peak = 3 * b * (t - 1) * v * 4;
  return a;
}

namespace {

struct Engine {
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double persistent = 0;
  std::string phase;
};

// The largest sum of `width` consecutive units (backward visits them in reverse forward order;
// the root, [0], is not one of them).
double window(const std::vector<std::int64_t>& sizes, std::size_t width) {
  double best = 0;
  for (std::size_t k = 1; k < sizes.size(); ++k) {
    double sum = 0;
    for (std::size_t j = k; j < sizes.size() && j < k + width; ++j)
      sum += static_cast<double>(sizes[j]);
    best = std::max(best, sum);
  }
  return best;
}

// One moment of the step (Note [What the engine holds]): the transient bytes beyond the resident
// model states, split as the table's columns.
struct Moment {
  const char* name;
  double params = 0, grads = 0, activations = 0;
  double sum() const { return params + grads + activations; }
};

Engine engine_bytes(const PlanOptions& o, Strategy s, std::int64_t psi) {
  const bool bf16 = o.precision == Precision::kBf16Mixed;
  const double c = bf16 ? 2 : 4, r = 4;
  const int node = o.gpus_per_node > 0 ? o.gpus_per_node : o.world_size;
  const int shard = s == Strategy::kHybridShard              ? node
                    : s == Strategy::kNoShard || !is_fsdp(s) ? 1
                                                             : o.world_size;
  Units units;
  if (o.model) {
    units = model_units(*o.model);
  } else {  // a parameter count alone: one unit, and no per-unit buffers or activations
    units.sizes = {0, psi};
    units.tensors = {psi};
    units.autocast_weights = psi;
  }
  const double full = static_cast<double>(psi);

  // Activations, in three pools by when they live (Note [GPT-NeoX activations]).
  ActivationBytes act;
  double logits_loss = 0, logits_head = 0, layer_pool = 0, head_held = 0;
  if (o.model) {
    act = activation_bytes(*o.model, o.seq_len, o.micro_batch, o.precision,
                           o.activation_checkpointing);
    const double bt = static_cast<double>(o.micro_batch * o.seq_len);
    const double bth = bt * static_cast<double>(o.model->hidden_size());
    const double btv = bt * static_cast<double>(o.model->vocab_size());
    if ((s == Strategy::kDdp || s == Strategy::kZero1) && bf16) {
      // autocast keeps the layer norms and the residual stream in fp32
      act.per_layer += 2 * bth;
      act.layers += 2 * bth * static_cast<double>(o.model->num_hidden_layers());
      if (o.activation_checkpointing) act.recompute = act.per_layer;
    }
    head_held = act.head;
    logits_loss = act.head + act.loss_peak;
    // At the head's backward: the logits' fp32 gradient (and its bf16 cast), and under
    // checkpointing the logits recomputed beside the ones the caller holds.
    logits_head = act.head + btv * (bf16 ? 6 : 4) + (o.activation_checkpointing ? c * btv : 0);
    // A layer's backward temporaries: the gradients of its widest activations (the MLP's, the
    // attention probabilities') and of its input and output.
    const double layer_grads =
        2 * c * bt * static_cast<double>(o.model->intermediate_size()) +
        8 * static_cast<double>(o.micro_batch * o.model->num_attention_heads()) *
            static_cast<double>(o.seq_len) * static_cast<double>(o.seq_len) +
        4 * c * bth;
    layer_pool = act.layers + act.recompute + layer_grads;
  }

  Engine e;
  std::array<Moment, 3> moments = {{{"loss backward"}, {"head backward"}, {"layer backward"}}};
  moments[0].activations = act.layers + logits_loss;
  moments[1].activations = act.layers + logits_head;
  moments[2].activations = layer_pool + head_held;
  double peers_buckets = 0;  // CPU ranks: the shared-memory gradient buckets of the node's peers
  if (s == Strategy::kDdp || s == Strategy::kZero1) {
    e.params = 4 * full;
    e.grads = 4 * full;
    // ZeRO-1's owners take whole tensors: the most loaded rank counts (without the model's
    // tensors, an even split).
    const auto owned = !o.model ? (psi + o.world_size - 1) / o.world_size
                                : largest_owned(units.tensors, o.world_size);
    e.optimizer = 8 * static_cast<double>(s == Strategy::kZero1 ? owned : psi);
    // autocast's bf16 weight copies live from forward to backward
    const double casts = bf16 ? 2 * static_cast<double>(units.autocast_weights) : 0;
    for (auto& m : moments) m.params = casts;
    peers_buckets = 4 * full * (node - 1);
  } else {
    double sharded = 0;  // elements of this rank's fp32 shards
    for (auto n : units.sizes) sharded += static_cast<double>(pad_to(n, shard) / shard);
    e.params = 4 * sharded;
    e.grads = 4 * sharded;
    e.optimizer = 8 * sharded;
    const bool aliases = shard == 1 && !bf16;  // one fp32 shard is its own gathered copy
    const bool keeps_gathered = s == Strategy::kShardGradOp || shard == 1;
    const double gathered_all = aliases ? 0 : c * full;
    const double head_unit = o.model ? static_cast<double>(units.embedding) : 0;
    const double pair = o.model ? window(units.sizes, 2) : 0;    // limit_all_gathers
    const double flight = o.model ? window(units.sizes, 3) : 0;  // kReductionsInFlight + 1
    const double widest = o.model ? window(units.sizes, 1) : 0;
    moments[0].params = keeps_gathered ? gathered_all : 0;
    moments[1].params = keeps_gathered ? gathered_all : aliases ? 0 : c * pair;
    moments[2].params = moments[1].params;
    // The head's flat gradient (c bytes, plus its fp32 copy to reduce under bf16); in a layer's
    // backward, kReductionsInFlight + 1 fp32 flat gradients and the unit's own buffer.
    moments[1].grads = head_unit * (c + (bf16 ? r : 0));
    moments[2].grads = flight * r + (bf16 ? c * widest : 0);
    static_assert(kReductionsInFlight == 2, "window(units.sizes, 3) above assumes 3 in flight");
  }
  e.persistent = e.params + e.grads + e.optimizer;

  if (o.cpu_ranks) {
    // See Note [CPU ranks]: the caching allocator keeps each pool's blocks for that pool.
    const Moment* units_peak = &moments[0];
    for (const auto& m : moments)
      if (m.params + m.grads > units_peak->params + units_peak->grads) units_peak = &m;
    e.params += units_peak->params;
    e.grads += units_peak->grads + peers_buckets;
    e.activations = o.model ? std::max(logits_loss, logits_head) + layer_pool : 0;
    e.phase = "pools (CPU ranks)";
    return e;
  }
  const Moment* peak = &moments[0];
  for (const auto& m : moments)
    if (m.sum() > peak->sum()) peak = &m;
  e.params += peak->params;
  e.grads += peak->grads;
  e.activations = peak->activations;
  e.phase = o.model ? peak->name : "-";  // without the model's shape there are no moments
  return e;
}

}  // namespace

namespace {

StrategyPlan plan_row(const PlanOptions& options, Strategy s, std::int64_t parameter_count) {
  const double psi = static_cast<double>(parameter_count);
  const double world = options.world_size;
  const double node = options.gpus_per_node > 0 ? options.gpus_per_node : options.world_size;
  const auto k = zero_paper_state_bytes(options.precision);
  StrategyPlan row{.strategy = s};
  // See Note [ZeRO paper accounting]; NO_SHARD is the baseline.
  const bool replicated = s == Strategy::kDdp || s == Strategy::kNoShard;
  const double os = replicated ? 1 : s == Strategy::kHybridShard ? node : world;
  const double g = replicated || s == Strategy::kZero1 ? 1 : os;
  const double p = s == Strategy::kFullShard || s == Strategy::kHybridShard ? os : 1;
  row.paper_params = k.params * psi / p;
  row.paper_grads = k.grads * psi / g;
  row.paper_optimizer = k.optimizer * psi / os;

  const auto e = engine_bytes(options, s, parameter_count);
  row.params = e.params;
  row.grads = e.grads;
  row.optimizer = e.optimizer;
  row.activations = e.activations;
  row.persistent = e.persistent;
  row.runtime = static_cast<double>(options.runtime_bytes);
  row.peak_phase = e.phase;
  row.fits =
      options.device_memory_bytes > 0 &&
      row.total() <= (1 - options.headroom) * static_cast<double>(options.device_memory_bytes);
  return row;
}

std::int64_t parameter_count_of(const PlanOptions& options) {
  return options.parameter_count > 0 ? options.parameter_count : options.model->parameter_count();
}

}  // namespace

MemoryPlan plan_memory(const PlanOptions& options) {
  options.validate();
  MemoryPlan plan{.options = options, .parameter_count = parameter_count_of(options)};
  // On one node HYBRID_SHARD is FULL_SHARD: recommend it by that name.
  const bool one_node = options.gpus_per_node == 0 || options.gpus_per_node == options.world_size;
  for (auto s : {Strategy::kDdp, Strategy::kZero1, Strategy::kShardGradOp, Strategy::kHybridShard,
                 Strategy::kFullShard}) {
    plan.rows.push_back(plan_row(options, s, plan.parameter_count));
    if (plan.rows.back().fits && !plan.recommended && !(one_node && s == Strategy::kHybridShard))
      plan.recommended = s;
  }
  return plan;
}

StrategyPlan plan_strategy(const PlanOptions& options, Strategy strategy) {
  options.validate();
  TY_CHECK(std::find(std::begin(kPlannedStrategies), std::end(kPlannedStrategies), strategy) !=
               std::end(kPlannedStrategies),
           "The planner models ", strategy_names(kPlannedStrategies), ", not ", to_string(strategy),
           ".");
  return plan_row(options, strategy, parameter_count_of(options));
}

// --- text ------------------------------------------------------------------------------------

namespace {

std::string size_text(double bytes, bool decimal) {
  const double unit = decimal ? 1e9 : 1073741824.0;
  char buf[32];
  const double v = bytes / unit;
  // As the ZeRO paper prints its figures: 120, 31.4, 16.6, 1.9.
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : v >= 1 ? "%.1f" : "%.2f", v);
  return buf;
}

// 6738415616 -> "6,738,415,616".
std::string grouped(std::int64_t n) {
  auto digits = std::to_string(n);
  for (auto i = static_cast<std::ptrdiff_t>(digits.size()) - 3; i > 0; i -= 3)
    digits.insert(static_cast<std::size_t>(i), ",");
  return digits;
}

std::string count_text(std::int64_t n) {
  char buf[32];
  const double d = static_cast<double>(n);
  if (d >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", d / 1e9);
  else if (d >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1fM", d / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

// Note [LoRA model states]
// With LoRA the base gets no gradient and no optimizer state: trainyard's FSDP keeps its frozen
// shards in the compute dtype (2 bytes a parameter under bf16-mixed, 4 in fp32: Note [Frozen
// shards]), divided by the shard group, while the adapters hold fp32 parameters, gradients and
// AdamW's two moments (16 bytes each). Activations are the full model's (the table above): the
// input gradients still flow through every frozen layer.
std::string lora_text(const PlanOptions& o, std::int64_t base, bool decimal) {
  const auto adapters = models::lora_parameter_count(*o.model, *o.lora);
  const double c = o.precision == Precision::kBf16Mixed ? 2 : 4;
  const double shards = o.gpus_per_node > 0 ? o.gpus_per_node : o.world_size;
  const double unit = decimal ? 1e9 : 1073741824.0;
  std::string targets;
  for (const auto& t : o.lora->targets) targets += (targets.empty() ? "" : ",") + t;
  char line[320];
  std::snprintf(line, sizeof line,
                "\nLoRA (r %lld on %s): %s trainable parameters (%.3f%% of the base's %s).\n"
                "  Model states per device under FULL_SHARD: base %.2f %s (%s, frozen, sharded %g "
                "ways), adapters %.1f MiB (fp32 weights, gradients, AdamW).\n",
                static_cast<long long>(o.lora->r), targets.c_str(), grouped(adapters).c_str(),
                100.0 * static_cast<double>(adapters) / static_cast<double>(base),
                grouped(base).c_str(), c * static_cast<double>(base) / shards / unit,
                decimal ? "GB" : "GiB", c == 2 ? "bf16" : "fp32", shards,
                16.0 * static_cast<double>(adapters) / shards / 1048576.0);
  return line;
}

}  // namespace

std::string format_plan(const MemoryPlan& plan, bool decimal) {
  const auto& o = plan.options;
  const char* unit = decimal ? "GB (1e9 bytes)" : "GiB (2^30 bytes)";
  const int node = o.gpus_per_node > 0 ? o.gpus_per_node : o.world_size;
  std::ostringstream out;
  out << "Model: " << grouped(plan.parameter_count) << " parameters";
  if (plan.parameter_count >= 1'000'000) out << " (" << count_text(plan.parameter_count) << ")";
  if (o.model)
    out << ", " << o.model->architecture() << ": " << o.model->num_hidden_layers()
        << " layers, hidden " << o.model->hidden_size() << ", vocab " << o.model->vocab_size();
  out << "; " << to_string(o.precision) << ", " << o.world_size << " devices ("
      << o.world_size / node << " node(s) x " << node << ")";
  if (o.model)
    out << ", micro-batch " << o.micro_batch << " x " << o.seq_len << " tokens"
        << (o.activation_checkpointing ? ", activation checkpointing" : "");
  out << ".\n\n";

  char line[256];
  out << "trainyard's engine, per device at the step's peak, in " << unit << ":\n";
  std::snprintf(line, sizeof line, "  %-14s %8s %8s %8s %8s %8s %8s  %-5s %s\n", "strategy",
                "params", "grads", "optim", "activ", "runtime", "total", "fits", "peak at");
  out << line;
  for (const auto& r : plan.rows) {
    const char* fits = o.device_memory_bytes == 0 ? "-" : r.fits ? "yes" : "no";
    std::snprintf(line, sizeof line, "  %-14s %8s %8s %8s %8s %8s %8s  %-5s %s\n",
                  std::string(display_name(r.strategy)).c_str(),
                  size_text(r.params, decimal).c_str(), size_text(r.grads, decimal).c_str(),
                  size_text(r.optimizer, decimal).c_str(),
                  o.model ? size_text(r.activations, decimal).c_str() : "n/a",
                  size_text(r.runtime, decimal).c_str(), size_text(r.total(), decimal).c_str(),
                  fits, r.peak_phase.c_str());
    out << line;
  }
  if (node == o.world_size)
    out << "  HYBRID_SHARD on one node is FULL_SHARD: give --nodes or --gpus-per-node to shard "
           "within a node.\n";
  out << "  params: fp32 shards plus the copies gathered at the peak; grads: fp32 gradients plus "
         "flat gradients in flight;\n  optim: Adam's two fp32 moments (mixed precision's master "
         "weights are the fp32 params).\n";
  if (!o.model)
    out << "  Activations and per-unit buffers (gathered units, flat gradients) need the model's "
           "shape: give --model\n  (a preset or a config.json) for them.\n";

  if (o.lora) out << lora_text(o, plan.parameter_count, decimal);

  const auto k = zero_paper_state_bytes(o.precision);
  out << "\nModel states as the ZeRO paper counts them (" << k.params << " + " << k.grads
      << " + K=" << k.optimizer << " bytes per parameter), in " << unit << ":\n";
  std::snprintf(line, sizeof line, "  %-14s %-9s %8s %8s %8s %8s\n", "strategy", "ZeRO", "params",
                "grads", "optim", "total");
  out << line;
  for (const auto& r : plan.rows) {
    const char* stage = r.strategy == Strategy::kDdp || r.strategy == Strategy::kNoShard
                            ? "baseline"
                        : r.strategy == Strategy::kZero1       ? "P_os"
                        : r.strategy == Strategy::kShardGradOp ? "P_os+g"
                                                               : "P_os+g+p";
    std::snprintf(
        line, sizeof line, "  %-14s %-9s %8s %8s %8s %8s\n",
        std::string(display_name(r.strategy)).c_str(), stage,
        size_text(r.paper_params, decimal).c_str(), size_text(r.paper_grads, decimal).c_str(),
        size_text(r.paper_optimizer, decimal).c_str(), size_text(r.paper_total(), decimal).c_str());
    out << line;
  }

  out << "\n";
  if (o.device_memory_bytes == 0) {
    out << "No --gpu-mem given: no verdict on fitting.\n";
  } else {
    out << "Device memory " << size_text(static_cast<double>(o.device_memory_bytes), decimal) << " "
        << (decimal ? "GB" : "GiB") << ", of which " << std::lround(o.headroom * 100)
        << "% is kept as headroom (allocator fragmentation, communication buffers, kernel "
           "workspaces): a plan fits within "
        << size_text((1 - o.headroom) * static_cast<double>(o.device_memory_bytes), decimal)
        << ".\n";
    if (plan.recommended) {
      out << "Recommended: " << display_name(*plan.recommended)
          << ", the strategy with the least communication that fits.\n";
    } else {
      out << "Nothing fits. HINT: more devices, bf16-mixed, activation checkpointing, or a "
             "smaller --batch-size or --seq-len.\n";
      // The first of the usual remedies that makes something fit, planned for real.
      auto with = [&](const char* change, auto edit) {
        PlanOptions changed = o;
        edit(changed);
        const auto other = plan_memory(changed);
        if (!other.recommended) return false;
        const auto& r = *std::find_if(other.rows.begin(), other.rows.end(), [&](const auto& row) {
          return row.strategy == *other.recommended;
        });
        out << "With " << change << ": " << display_name(r.strategy) << " fits ("
            << size_text(r.total(), decimal) << " " << (decimal ? "GB" : "GiB") << ").\n";
        return true;
      };
      (o.model && !o.activation_checkpointing &&
       with("--activation-checkpointing",
            [](PlanOptions& c) { c.activation_checkpointing = true; })) ||
          (o.precision == Precision::kFp32 &&
           with("--precision bf16-mixed",
                [](PlanOptions& c) { c.precision = Precision::kBf16Mixed; })) ||
          (o.model && o.micro_batch > 1 &&
           with("--batch-size 1", [](PlanOptions& c) { c.micro_batch = 1; }));
    }
  }
  return out.str();
}

models::CausalLmConfig resolve_model(const std::string& spec, std::string_view flag) {
  namespace fs = std::filesystem;
  const auto names = models::CausalLmConfig::preset_names();
  if (models::CausalLmConfig::is_preset(spec)) return models::CausalLmConfig::preset(spec);
  std::error_code ec;
  fs::path path(spec);
  if (fs::is_directory(path, ec)) path /= "config.json";
  if (!fs::is_regular_file(path, ec)) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgumentError(detail::concat(
        flag, " is '", spec, "', which is neither a preset (", known,
        ") nor a config.json or a directory holding one", fs::is_directory(spec, ec) ? " (" : "",
        fs::is_directory(spec, ec) ? path.string() + " does not exist)" : "", "."));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  TY_CHECK(in.good() || in.eof(), flag, ": cannot read ", path.string(), ".");
  try {
    return models::CausalLmConfig::from_json(text.str());
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(detail::concat(flag, " ", path.string(), ": ", e.what()));
  }
}

std::int64_t parse_byte_size(std::string_view text, std::string_view flag) {
  double value = 0;
  std::string suffix;
  const bool ok = split_number(text, value, suffix);
  // Decimal units (KB ... TB, also K ... T) and binary ones (KiB ... TiB, also Ki ... Ti).
  static const std::array<std::pair<const char*, double>, 18> kUnits = {{
      {"", 1},
      {"b", 1},
      {"k", 1e3},
      {"kb", 1e3},
      {"m", 1e6},
      {"mb", 1e6},
      {"g", 1e9},
      {"gb", 1e9},
      {"t", 1e12},
      {"tb", 1e12},
      {"ki", 0x1p10},
      {"kib", 0x1p10},
      {"mi", 0x1p20},
      {"mib", 0x1p20},
      {"gi", 0x1p30},
      {"gib", 0x1p30},
      {"ti", 0x1p40},
      {"tib", 0x1p40},
  }};
  double scale = 0;
  for (const auto& [name, s] : kUnits)
    if (suffix == name) scale = s;
  const double bytes = value * scale;
  TY_CHECK(ok && scale > 0 && bytes < 9.2e18, flag, " is '", text,
           "'; expected a size such as 24GiB, 80GB, 512MiB or a number of bytes (units: B, KB, MB, "
           "GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).");
  return static_cast<std::int64_t>(std::llround(bytes));
}

std::int64_t parse_count(std::string_view text, std::string_view flag) {
  double value = 0;
  std::string suffix;
  const bool ok = split_number(text, value, suffix);
  double scale = 0;
  if (suffix.empty()) scale = 1;
  if (suffix == "k") scale = 1e3;
  if (suffix == "m") scale = 1e6;
  if (suffix == "b" || suffix == "g") scale = 1e9;
  if (suffix == "t") scale = 1e12;
  const double n = value * scale;
  TY_CHECK(ok && scale > 0, flag, " is '", text,
           "'; expected a parameter count such as 7.5e9, 6.9B, 410M or 70000000.");
  TY_CHECK(n >= 1, flag, " is '", text, "', fewer than one parameter; a model has at least one.");
  TY_CHECK(n < 9.2e18, flag, " is '", text, "', ", n,
           " parameters: more than trainyard can count (under 9.2e18; the largest models have "
           "about 2e12).");
  return static_cast<std::int64_t>(std::llround(n));
}

}  // namespace trainyard::plan
