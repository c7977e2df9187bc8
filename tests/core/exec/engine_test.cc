// The engine on the synth-tiny preset: TP-N gives TP-1's ids, a batch mixing a prefill chunk and
// a decode step gives what each sequence gets alone, bad batches are refused before any rank
// runs, and sampling is reproducible.
#include "core/exec/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/exec/generate.h"
#include "core/sampling/sampler.h"
#include "core/model/architecture.h"
#include "core/model/llama.h"
#include "core/model/weights.h"
#include "core/plugin/host.h"
#include "core/plugin/registry.h"

namespace kvrt::exec {
namespace {

using sampling::Sampler;

// An engine over `weights` with attn_cpu and a pool of 64 pages.
std::unique_ptr<Engine> make_engine(plugin::Registry& registry, const model::LoadedWeights& weights,
                                    int tp, const char* store = "kv_bf16_paged",
                                    uint32_t page_size = 4) {
  EngineOptions o;
  o.tp = tp;
  o.page_size = page_size;
  o.num_pages = 64;
  o.plugins.store = *registry.load_kv_store(store);
  o.plugins.attention = *registry.load("attn_cpu");
  Result<std::unique_ptr<Engine>> e = Engine::create(weights, o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(*e) : nullptr;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    weights_ = std::move(*model::make_preset("synth-tiny"));
  }
  std::unique_ptr<Engine> engine(int tp, const char* store = "kv_bf16_paged",
                                 uint32_t page_size = 4) {
    return make_engine(registry_, weights_, tp, store, page_size);
  }

  plugin::Registry registry_;
  model::Weights weights_;
};

// A KV store that refuses to be created on a rank (here its option's value) fails create()
// with the store's error at TP 1 and TP 2 alike; nothing is left half-started to crash on.
TEST_F(EngineTest, AStoreThatCannotBeCreatedFailsCreateAtAnyTp) {
  const toml::table bad{{"scale_mode", "per_nothing"}};
  for (int tp : {1, 2}) {
    EngineOptions o;
    o.tp = tp;
    o.page_size = 16;
    o.num_pages = 64;
    o.plugins.store = *registry_.load_kv_store("kv_fp8_e4m3");
    o.plugins.store_config = plugin::as_config(&bad);
    o.plugins.attention = *registry_.load("attn_cpu");
    Result<std::unique_ptr<Engine>> e = Engine::create(weights_, o);
    ASSERT_FALSE(e.ok()) << "tp " << tp;
    EXPECT_NE(e.status().message().find("TP rank 0"), std::string::npos) << e.status().message();
    EXPECT_NE(e.status().message().find("scale_mode"), std::string::npos) << e.status().message();
  }
}

const std::vector<int32_t> kPrompt = {1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108};

// TP 1, 2, 4 and 8 give the same greedy ids of kPrompt, and first logits within 1e-4 of TP 1's;
// `reference` gets TP 1's ids.
void expect_tp_ranks_agree(const std::function<std::unique_ptr<Engine>(int)>& engine,
                           const GenerateOptions& options, std::vector<int32_t>* reference) {
  std::vector<float> reference_logits;
  for (int tp : {1, 2, 4, 8}) {
    std::unique_ptr<Engine> e = engine(tp);
    ASSERT_NE(e, nullptr);
    Result<Generation> out = generate(*e, kPrompt, options);
    ASSERT_TRUE(out.ok()) << out.status().message();
    if (tp == 1) {
      *reference = out->ids;
      reference_logits = out->first_logits;
      continue;
    }
    EXPECT_EQ(out->ids, *reference) << "TP " << tp;
    for (size_t i = 0; i < reference_logits.size(); ++i) {
      ASSERT_NEAR(out->first_logits[i], reference_logits[i], 1e-4) << "TP " << tp;
    }
  }
}

// Sequence A: 10 tokens already cached, one decode token. Sequence B: a fresh prefill of 7.
// Together in one batch they must give what each gives alone, in fresh pages of the same engine.
void expect_mixed_batch_matches_sequences_alone(Engine& e) {
  SequenceStep a_prefill{{kPrompt.begin(), kPrompt.begin() + 10}, 0, {0, 1, 2}};
  ASSERT_TRUE(e.step(Batch{{a_prefill}}).ok());
  SequenceStep a_decode{{kPrompt[10]}, 10, {0, 1, 2}};
  SequenceStep b_prefill{{kPrompt.begin(), kPrompt.begin() + 7}, 0, {9, 5}};
  Result<std::vector<float>> both = e.step(Batch{{a_decode, b_prefill}});
  ASSERT_TRUE(both.ok()) << both.status().message();
  SequenceStep a2_prefill{{kPrompt.begin(), kPrompt.begin() + 10}, 0, {20, 21, 22}};
  ASSERT_TRUE(e.step(Batch{{a2_prefill}}).ok());
  Result<std::vector<float>> a_alone = e.step(Batch{{{{kPrompt[10]}, 10, {20, 21, 22}}}});
  Result<std::vector<float>> b_alone =
      e.step(Batch{{{{kPrompt.begin(), kPrompt.begin() + 7}, 0, {30, 31}}}});
  ASSERT_TRUE(a_alone.ok() && b_alone.ok());
  const size_t vocab = a_alone->size();
  for (size_t i = 0; i < vocab; ++i) {
    ASSERT_NEAR((*both)[i], (*a_alone)[i], 1e-4);
    ASSERT_NEAR((*both)[vocab + i], (*b_alone)[i], 1e-4);
  }
}

TEST_F(EngineTest, TensorParallelRanksGiveTheSameIds) {
  GenerateOptions options;
  options.max_new_tokens = 24;
  std::vector<int32_t> reference;
  // synth-tiny: 4 heads, 2 KV heads; at TP 8 some ranks hold a replicated KV head and no query
  // head at all.
  expect_tp_ranks_agree([&](int tp) { return engine(tp); }, options, &reference);
}

TEST_F(EngineTest, QkvBiasIsShardedWithItsRows) {
  // Qwen2-style q/k/v biases: TP 2 and 4 must agree with TP 1, and the bias must matter.
  GenerateOptions options;
  options.max_new_tokens = 8;
  std::unique_ptr<Engine> plain = engine(1);
  std::vector<float> without = generate(*plain, kPrompt, options)->first_logits;
  weights_.config.attention_bias = true;
  uint32_t seed = 1;
  auto fill = [&seed](std::vector<float>* v, size_t n) {
    v->resize(n);
    for (float& x : *v)
      x = static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) / (1 << 24) - 0.5f;
  };
  for (model::LayerWeights& l : weights_.layers) {
    fill(&l.q_bias, weights_.config.q_dim());
    fill(&l.k_bias, weights_.config.kv_dim());
    fill(&l.v_bias, weights_.config.kv_dim());
  }
  std::vector<float> reference;
  for (int tp : {1, 2, 4}) {
    std::unique_ptr<Engine> e = engine(tp);
    ASSERT_NE(e, nullptr);
    std::vector<float> logits = generate(*e, kPrompt, options)->first_logits;
    if (tp == 1) {
      reference = logits;
      double moved = 0;
      for (size_t i = 0; i < logits.size(); ++i) moved += std::fabs(logits[i] - without[i]);
      EXPECT_GT(moved, 1e-3) << "the biases changed nothing";
      continue;
    }
    for (size_t i = 0; i < logits.size(); ++i) ASSERT_NEAR(logits[i], reference[i], 1e-4);
  }
}

TEST_F(EngineTest, MixedBatchMatchesSequencesAlone) {
  std::unique_ptr<Engine> e = engine(2);
  ASSERT_NE(e, nullptr);
  expect_mixed_batch_matches_sequences_alone(*e);
}

TEST(MlaEngine, TensorParallelRanksGiveTheSameIdsAndMixedBatchesAgree) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  plugin::Registry registry;
  Result<std::unique_ptr<model::LoadedWeights>> weights =
      model::make_preset_weights("synth-mla-tiny");
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  auto engine = [&](int tp) { return make_engine(registry, **weights, tp); };
  GenerateOptions options;
  options.max_new_tokens = 16;
  options.prefill_chunk = 5;
  std::vector<int32_t> reference;
  expect_tp_ranks_agree(engine, options, &reference);
  if (HasFatalFailure()) return;
  std::set<int32_t> distinct(reference.begin(), reference.end());
  EXPECT_GT(distinct.size(), 1u) << "a degenerate model tests nothing";
  std::unique_ptr<Engine> e = engine(2);
  ASSERT_NE(e, nullptr);
  expect_mixed_batch_matches_sequences_alone(*e);
}

TEST_F(EngineTest, RefusesBadBatchesBeforeRunning) {
  std::unique_ptr<Engine> e = engine(2);
  ASSERT_NE(e, nullptr);
  Result<std::vector<float>> bad = e->step(Batch{{{{600}, 0, {0}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token id 600 outside the vocabulary of 512"),
            std::string::npos);
  bad = e->step(Batch{{{{1, 2, 3, 4, 5}, 0, {0}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("5 tokens need 2 pages, the page table has 1"),
            std::string::npos);
  bad = e->step(Batch{{{{1}, 0, {64}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("page 64 outside the pool of 64"), std::string::npos);
  // The engine still works afterwards.
  EXPECT_TRUE(e->step(Batch{{{{1}, 0, {0}}}}).ok());
}

TEST_F(EngineTest, RequestLongerThanThePoolIsRefused) {
  std::unique_ptr<Engine> e = engine(1);
  ASSERT_NE(e, nullptr);
  GenerateOptions options;
  options.max_new_tokens = 64 * 4;
  Result<Generation> out = generate(*e, kPrompt, options);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("the request needs 268 tokens (67 pages) but the KV pool "
                                        "holds 256 tokens (64 pages)"),
            std::string::npos)
      << out.status().message();
}

TEST(Batch, SerialisesAndRefusesTruncatedWords) {
  Batch batch{{{{5, 6, 7}, 0, {3}, /*all_logits=*/true}, {{9}, 12, {0, 1, 2, 4}}}};
  std::vector<int32_t> words;
  serialize(batch, &words);
  Batch back;
  ASSERT_TRUE(deserialize(words, &back).ok());
  ASSERT_EQ(back.sequences.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.sequences[i].tokens, batch.sequences[i].tokens);
    EXPECT_EQ(back.sequences[i].start, batch.sequences[i].start);
    EXPECT_EQ(back.sequences[i].pages, batch.sequences[i].pages);
    EXPECT_EQ(back.sequences[i].all_logits, batch.sequences[i].all_logits);
  }
  for (size_t cut = 0; cut < words.size(); ++cut) {
    EXPECT_FALSE(deserialize(std::span<const int32_t>(words).first(cut), &back).ok()) << cut;
  }
  words[2] = -1;  // a negative token count
  EXPECT_FALSE(deserialize(words, &back).ok());
}

// Nobody passes a phase before everyone has arrived, and every phase reuses the barrier: each
// thread stamps its slot with the phase, then checks every slot after the barrier. Spinning
// and sleeping waits, with as many threads as cores and more.
TEST(Shard, UnevenAndReplicated) {
  // stories260k at TP 8: 8 heads, 4 KV heads, MLP 172, vocab 512.
  int64_t mlp = 0, vocab = 0;
  for (int r = 0; r < 8; ++r) {
    model::LlamaShard s = *model::llama_shard(8, 4, 172, 512, r, 8);
    EXPECT_EQ(s.kv_heads.begin, r / 2);
    EXPECT_EQ(s.kv_heads.size(), 1);
    EXPECT_EQ(s.q_heads.begin, r);
    EXPECT_EQ(s.intermediate.size(), r < 4 ? 22 : 21);
    mlp += s.intermediate.size();
    vocab += s.vocab.size();
  }
  EXPECT_EQ(mlp, 172);
  EXPECT_EQ(vocab, 512);
  EXPECT_FALSE(model::llama_shard(12, 3, 100, 512, 0, 8).ok());
}

TEST(Sampler, GreedyTopKAndSeeds) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  EXPECT_EQ(Sampler({}).sample(logits), 1);
  EXPECT_EQ(Sampler({1.0f, 1, 1.0f, 7, 0.0f}).sample(logits), 1);   // top-k 1 is greedy
  EXPECT_EQ(Sampler({1.0f, 0, 1e-6f, 7, 0.0f}).sample(logits), 1);  // a tiny nucleus too
  std::vector<int32_t> a, b;
  Sampler s1({1.0f, 0, 1.0f, 42, 0.0f}), s2({1.0f, 0, 1.0f, 42, 0.0f});
  for (int i = 0; i < 200; ++i) a.push_back(s1.sample(logits)), b.push_back(s2.sample(logits));
  EXPECT_EQ(a, b);
  // Top-k 2 never picks outside {1, 3}.
  Sampler s3({5.0f, 2, 1.0f, 1, 0.0f});
  for (int i = 0; i < 200; ++i) {
    int32_t t = s3.sample(logits);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

// Min-p keeps the tokens at least min_p times as likely as the likeliest: at temperature 1,
// token 3 is exp(-0.1) = 0.90 times as likely as token 1, token 4 exp(-1.5) = 0.22 times.
TEST(Sampler, MinPKeepsTokensNearTheLikeliest) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  Sampler near({1.0f, 0, 1.0f, 3, 0.5f});
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(near.sample(logits));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
  Sampler only({1.0f, 0, 1.0f, 3, 0.95f});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(only.sample(logits), 1);
  Sampler wide({1.0f, 0, 1.0f, 3, 0.2f});
  seen.clear();
  for (int i = 0; i < 2000; ++i) seen.insert(wide.sample(logits));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 4}));
}

}  // namespace
}  // namespace kvrt::exec
