#include "trainyard/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::models {
namespace {

// The next token from the last position's logits (vocab,) in fp32.
std::int64_t pick(torch::Tensor logits, const GenerateOptions& o, at::Generator& gen) {
  if (o.vocab_limit > 0 && o.vocab_limit < logits.size(0))
    logits = logits.narrow(0, 0, o.vocab_limit);
  if (o.greedy) return logits.argmax().item<std::int64_t>();
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    const auto kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  if (o.top_p < 1.0) {
    // HF's TopPLogitsWarper: drop the tokens outside the smallest set whose probabilities reach
    // top_p, always keeping the most likely one.
    auto [sorted, order] = logits.sort(/*dim=*/0, /*descending=*/true);
    const auto cumulative = sorted.softmax(0).cumsum(0);
    auto drop = (cumulative - sorted.softmax(0)) >= o.top_p;  // the mass before each token
    drop[0] = false;
    logits = logits.index_put({order.masked_select(drop)},
                              torch::tensor(-std::numeric_limits<float>::infinity()));
  }
  return logits.softmax(0).multinomial(1, /*replacement=*/false, gen).item<std::int64_t>();
}

}  // namespace

void GenerateOptions::validate() const {
  TY_CHECK(max_new_tokens >= 1, "--max-new-tokens must be >= 1, got ", max_new_tokens, ".");
  TY_CHECK(temperature > 0,
           "--temperature must be > 0 (use --greedy for the most likely token), "
           "got ",
           temperature, ".");
  TY_CHECK(top_k >= 0, "--top-k must be >= 0 (0: all tokens), got ", top_k, ".");
  TY_CHECK(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1], got ", top_p, ".");
  TY_CHECK(vocab_limit >= 0, "GenerateOptions.vocab_limit must be >= 0, got ", vocab_limit, ".");
}

std::vector<std::int64_t> generate(CausalLmImpl& model,
                                   const std::vector<std::int64_t>& prompt,
                                   const GenerateOptions& options) {
  options.validate();
  TY_CHECK(!prompt.empty(), "The prompt has no token. HINT: give --prompt some text.");
  const auto vocab = model.lm_config().vocab_size();
  for (auto id : prompt)
    TY_CHECK(id >= 0 && id < vocab, "Prompt token id ", id,
             " is outside the model's vocabulary [0, ", vocab, ").");
  const auto room =
      model.lm_config().max_position_embeddings() - static_cast<std::int64_t>(prompt.size());
  TY_CHECK(room >= 1, "The prompt has ", prompt.size(),
           " tokens; the model takes at most max_position_embeddings = ",
           model.lm_config().max_position_embeddings(), " positions.");
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  KvCache cache;
  auto ids = torch::tensor(prompt, torch::kInt64).unsqueeze(0);  // (1, T)
  std::vector<std::int64_t> out;
  const auto limit = std::min(options.max_new_tokens, room);
  if (options.max_new_tokens > room)
    logger("generate")
        ->warn(
            "--max-new-tokens {} is more than the model has positions for: the prompt's {} "
            "tokens and {} new ones fill its max_position_embeddings ({}), so generation stops "
            "after {} tokens.",
            options.max_new_tokens, prompt.size(), room,
            model.lm_config().max_position_embeddings(), room);
  while (static_cast<std::int64_t>(out.size()) < limit) {
    const auto logits = model.forward_cached(ids, cache);  // (1, T, vocab)
    const auto next = pick(logits[0][-1], options, gen);
    out.push_back(next);
    if (options.eos_id && next == *options.eos_id) break;
    ids = torch::tensor({next}, torch::kInt64).unsqueeze(0);
  }
  model.train(was_training);
  return out;
}

}  // namespace trainyard::models
