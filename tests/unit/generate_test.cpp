// Decoding with the key/value cache (GptNeoXImpl::forward_cached) and generate(): the cache gives
// the full forward's logits, greedy decoding is the argmax of a recomputed forward, sampling is
// reproducible by seed and honours top-k / top-p.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../log_capture.h"
#include "tiny_gpt_neox.h"
#include "trainyard/error.h"
#include "trainyard/models/generate.h"

namespace {
using namespace trainyard::models;
using trainyard::testing::tiny_gpt_neox_batch;
using trainyard::testing::tiny_gpt_neox_config;

TEST(KvCache, ChunkedDecodingGivesTheFullForwardsLogits) {
  for (bool parallel : {true, false}) {
    auto config = tiny_gpt_neox_config();
    config.use_parallel_residual = parallel;
    GptNeoX model(config, GptNeoXInit{.seed = 3});
    model->eval();
    torch::NoGradGuard no_grad;
    const auto ids = tiny_gpt_neox_batch(0, 2, 12);
    const auto full = model->forward(ids);
    KvCache cache;
    std::vector<torch::Tensor> pieces;
    // 5 positions, then one at a time, then 4: every shape of past and new positions.
    pieces.push_back(model->forward_cached(ids.narrow(1, 0, 5), cache));
    for (int t = 5; t < 8; ++t) pieces.push_back(model->forward_cached(ids.narrow(1, t, 1), cache));
    pieces.push_back(model->forward_cached(ids.narrow(1, 8, 4), cache));
    EXPECT_EQ(cache.length(), 12);
    const auto cached = torch::cat(pieces, 1);
    EXPECT_TRUE(torch::allclose(cached, full, /*rtol=*/1e-5, /*atol=*/1e-5))
        << "max difference " << (cached - full).abs().max().item<double>();
  }
}

TEST(KvCache, RefusesMorePositionsThanTheModelTakes) {
  GptNeoX model(tiny_gpt_neox_config());
  KvCache cache;
  torch::NoGradGuard no_grad;
  model->forward_cached(tiny_gpt_neox_batch(0, 1, 10), cache);
  EXPECT_THROW(model->forward_cached(tiny_gpt_neox_batch(1, 1, 7), cache),
               trainyard::InvalidArgumentError);
}

TEST(Generate, GreedyIsTheArgmaxOfTheRecomputedForward) {
  GptNeoX model(tiny_gpt_neox_config(), GptNeoXInit{.seed = 5});
  const std::vector<std::int64_t> prompt = {3, 14, 15, 9};
  const auto out = generate(*model, prompt, {.max_new_tokens = 8, .greedy = true});
  ASSERT_EQ(out.size(), 8u);
  torch::NoGradGuard no_grad;
  model->eval();
  auto seq = prompt;
  for (auto token : out) {
    const auto logits = model->forward(torch::tensor(seq, torch::kInt64).unsqueeze(0));
    EXPECT_EQ(logits[0][-1].argmax().item<std::int64_t>(), token);
    seq.push_back(token);
  }
}

TEST(Generate, StopsAtTheModelsLastPositionAndAtEos) {
  GptNeoX model(tiny_gpt_neox_config(), GptNeoXInit{.seed = 5});
  // max_position_embeddings is 16: a 10-token prompt leaves 6.
  const std::vector<std::int64_t> prompt(10, 7);
  {
    trainyard::test::LogCapture log("generate");
    EXPECT_EQ(generate(*model, prompt, {.max_new_tokens = 50, .greedy = true}).size(), 6u);
    EXPECT_NE(log.text().find("--max-new-tokens 50 is more than the model has positions for: the "
                              "prompt's 10 tokens and 6 new ones fill its max_position_embeddings "
                              "(16), so generation stops after 6 tokens."),
              std::string::npos)
        << "a cut is said, not silent: " << log.text();
  }
  const auto greedy = generate(*model, prompt, {.max_new_tokens = 6, .greedy = true});
  const auto stopped =
      generate(*model, prompt, {.max_new_tokens = 6, .greedy = true, .eos_id = greedy[1]});
  EXPECT_EQ(stopped.size(), 2u);
}

TEST(Generate, SamplingIsReproducibleBySeedAndHonoursTopKAndTopP) {
  GptNeoX model(tiny_gpt_neox_config(), GptNeoXInit{.seed = 5});
  const std::vector<std::int64_t> prompt = {1, 2, 3};
  GenerateOptions o{.max_new_tokens = 12, .temperature = 2.0, .seed = 11};
  EXPECT_EQ(generate(*model, prompt, o), generate(*model, prompt, o));
  o.seed = 12;
  const auto other = generate(*model, prompt, o);
  o.seed = 11;
  EXPECT_NE(generate(*model, prompt, o), other) << "another seed, another sample (12 tokens)";

  // top_k = 1 and a tiny top_p both leave only the most likely token: greedy.
  const auto greedy = generate(*model, prompt, {.max_new_tokens = 12, .greedy = true});
  EXPECT_EQ(generate(*model, prompt, {.max_new_tokens = 12, .top_k = 1, .seed = 4}), greedy);
  EXPECT_EQ(generate(*model, prompt, {.max_new_tokens = 12, .top_p = 1e-6, .seed = 4}), greedy);
  // A vocabulary limit keeps every id below it.
  for (auto id : generate(*model, prompt, {.max_new_tokens = 12, .seed = 4, .vocab_limit = 5}))
    EXPECT_LT(id, 5);
}

TEST(Generate, BadOptionsNameTheFlag) {
  GptNeoX model(tiny_gpt_neox_config());
  auto message = [&](GenerateOptions o, std::vector<std::int64_t> prompt = {1}) {
    try {
      generate(*model, prompt, o);
    } catch (const trainyard::InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.temperature = 0}).find("--temperature must be > 0"), std::string::npos);
  EXPECT_NE(message({.top_p = 0}).find("--top-p must be in (0, 1]"), std::string::npos);
  EXPECT_NE(message({.max_new_tokens = 0}).find("--max-new-tokens must be >= 1"),
            std::string::npos);
  EXPECT_NE(message({}, {}).find("The prompt has no token"), std::string::npos);
  EXPECT_NE(message({}, {99}).find("Prompt token id 99 is outside"), std::string::npos);
}

}  // namespace
