// The Llama 3.1-style checkpoint (../shared/models/tiny-llama3: rope_scaling llama3 with factor
// 32, low 1, high 4, original 8192, rope_theta 5e5, head_dim 8, GQA 4 / 2, tied embeddings,
// BF16) end to end: kvrt's inverse frequencies are the reference's, and its greedy ids equal the
// float64 reference's (scripts/reference_forward.py) with the KV in bf16 and in f32, at TP 1 and
// 2 and page sizes 1 and 16, and through the runtime, up to each prompt's first near-tie. Three
// prompts: "I like to", "The quick brown fox" and 320 seeded ids, over which unscaled RoPE's
// greedy ids differ from the reference's (tiny_hf_reference.h). All 16 steps of each are
// compared; the smallest margin crossed is 0.0185 logits (the long prompt's step 14).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/model/llama.h"
#include "core/model/rope.h"
#include "tests/e2e/greedy_reference.h"
#include "tests/e2e/model_run.h"
#include "tests/e2e/tiny_hf_reference.h"

namespace kvrt {
namespace {

struct Checkpoint {
  static constexpr const char* kName = "tiny-llama3";
};

std::string model_dir() { return e2e::CheckpointSuite<Checkpoint>::dir(); }
bool have_model() { return e2e::CheckpointSuite<Checkpoint>::present(); }

// rope_scaling llama3 divides the low frequencies by 32, interpolates the middle band and keeps
// the high ones, as transformers' _compute_llama3_parameters (the reference's numbers).
TEST(TinyLlama3, InverseFrequenciesAreLlama3s) {
  if (!have_model()) GTEST_SKIP() << "tiny-llama3 not found at " << model_dir();
  Result<model::ModelConfig> c = model::parse_hf_config(model_dir() + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  std::vector<float> scaled, plain;
  float factor = 0;
  model::rope_frequencies(*c, c->head_dim, &scaled, &factor);
  EXPECT_EQ(factor, 1.0f);
  c->llama3 = {};
  model::rope_frequencies(*c, c->head_dim, &plain, &factor);
  ASSERT_EQ(scaled.size(), e2e::kTinyLlama3InverseFrequencies.size());
  for (size_t i = 0; i < scaled.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(scaled[i], e2e::kTinyLlama3InverseFrequencies[i],
                1e-6 * e2e::kTinyLlama3InverseFrequencies[i]);  // f32 against f64
    EXPECT_NEAR(plain[i], e2e::kTinyLlama3PlainInverseFrequencies[i],
                1e-6 * e2e::kTinyLlama3PlainInverseFrequencies[i]);
  }
  EXPECT_NE(scaled, plain);
}

TEST(TinyLlama3Reference, ComparesEveryStep) {
  for (const e2e::GreedyReference& r : e2e::kTinyLlama3Reference) {
    EXPECT_EQ(e2e::compared_steps(r), r.ids.size());
  }
  std::printf("tiny-llama3: smallest top-1 margin of the compared steps %.4f logits\n",
              e2e::smallest_compared_margin(e2e::kTinyLlama3Reference));
}

using TinyLlama3Run = e2e::CheckpointSuite<Checkpoint>;

TEST_P(TinyLlama3Run, GreedyIdsMatchTheReference) {
  std::unique_ptr<exec::Engine> engine =
      engines_->engine(GetParam(), e2e::longest_sequence(e2e::kTinyLlama3Reference));
  ASSERT_NE(engine, nullptr);
  e2e::expect_reference_ids(*engine, e2e::kTinyLlama3Reference);
}

INSTANTIATE_TEST_SUITE_P(StoresTpPages, TinyLlama3Run, e2e::stores_tp_pages(),
                         e2e::store_tp_page_name);

// What `kvrt generate` and the server run: config.json with its rope_scaling, the BF16 weights
// held as they are, tokenizer.json, KV heads split over TP 2; the reference prompts' text through
// the tokenizer gives their ids.
TEST(TinyLlama3Runtime, GivesTheReferenceIds) {
  if (!have_model()) GTEST_SKIP() << "tiny-llama3 not found at " << model_dir();
  // The f32 embedding (16 MB) and the bf16 LM head.
  e2e::ModelRun run(model_dir(), "kv_bf16_paged", 2, 16, {"device.memory=\"96MiB\""});
  ASSERT_TRUE(run.runtime.ok()) << run.runtime.status().message();
  EXPECT_TRUE(run.runtime->bf16_weights);
  EXPECT_EQ(run.runtime->geometry.num_kv_heads, 1u);
  EXPECT_EQ(run.runtime->geometry.k_head_dim, 8u);
  EXPECT_EQ(run.runtime->tokenizer->encode("I like to", /*add_special_tokens=*/true),
            e2e::kTinyLlama3Reference[0].prompt);
  EXPECT_EQ(run.runtime->tokenizer->encode("The quick brown fox", /*add_special_tokens=*/true),
            e2e::kTinyLlama3Reference[1].prompt);
  e2e::expect_reference_ids(*run.runtime->engine, e2e::kTinyLlama3Reference);
}

}  // namespace
}  // namespace kvrt
