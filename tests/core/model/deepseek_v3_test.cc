// The DeepSeek-V3 family's pieces: its config fields and their refusals by name, YaRN's
// frequencies and softmax scale against transformers' formulas (values computed with them),
// the tiny checkpoint's tensors whole and as each rank's part, and the presets' shapes.
#include "core/model/deepseek_v3.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/model/model_config.h"
#include "core/model/rope.h"
#include "core/model/weights.h"
#include "core/util/file.h"

namespace kvrt::model {
namespace {

using ::testing::HasSubstr;

std::string tiny_dir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/../shared/models/tiny-deepseek-v3";
}

std::string tiny_config() {
  Result<std::string> text = util::read_file(tiny_dir() + "/config.json", model::kModelConfigFile);
  return text.ok() ? *text : "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

Result<ModelConfig> parse(const std::string& text) {
  Result<ModelConfig> c = read_hf_config(text, "config.json");
  if (!c.ok()) return c;
  if (Status s = check_runnable(*c, "config.json"); !s.ok()) return s;
  return c;
}

#define REQUIRE_TINY()                                                  \
  if (!std::filesystem::exists(tiny_dir() + "/model.safetensors")) {    \
    GTEST_SKIP() << "tiny-deepseek-v3 not found at " << tiny_dir();     \
  }

TEST(DeepseekV3Config, ReadsTheTinyCheckpointsFields) {
  REQUIRE_TINY();
  Result<ModelConfig> c = parse(tiny_config());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_TRUE(c->is_mla());
  EXPECT_EQ(c->mla.kv_lora_rank, 32);
  EXPECT_EQ(c->mla.q_lora_rank, 32);
  EXPECT_TRUE(c->mla.rope_interleave);
  EXPECT_EQ(c->moe.n_routed_experts, 8);
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  EXPECT_DOUBLE_EQ(c->moe.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_FALSE(c->moe_layer(0));
  EXPECT_TRUE(c->moe_layer(1));
  EXPECT_TRUE(c->moe_layer(2));
  // Every tensor the checkpoint holds, counted from the config (f32: 4 bytes each; the file
  // adds its header).
  const auto bytes = std::filesystem::file_size(tiny_dir() + "/model.safetensors");
  EXPECT_LT(static_cast<uint64_t>(c->weight_bytes(4)), bytes);
  EXPECT_GT(static_cast<uint64_t>(c->weight_bytes(4)), bytes - 16384);
  EXPECT_TRUE(find_architecture(*c).ok());
}

TEST(DeepseekV3Config, RefusesWhatItCannotRunByName) {
  REQUIRE_TINY();
  const std::string base = tiny_config();
  struct Case {
    std::string from, to, expect;
  };
  const Case cases[] = {
      {"\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"",
       "config.json: scoring_func: unsupported 'softmax'"},
      {"\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"greedy\"",
       "config.json: topk_method: unsupported 'greedy'"},
      {"\"n_group\": 1", "\"n_group\": 3", "config.json: n_group: 3 does not divide"},
      {"\"topk_group\": 1", "\"topk_group\": 2", "config.json: topk_group: must lie in 1..n_group"},
      {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9",
       "config.json: num_experts_per_tok: must lie in 1..n_routed_experts (8)"},
      {"\"kv_lora_rank\": 32,", "", "config.json: kv_lora_rank: a positive value is required"},
      {"\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 7",
       "config.json: qk_rope_head_dim: must be even"},
      {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}",
       "config.json: rope_scaling: unsupported type 'linear'"},
      {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\"}",
       "config.json: rope_scaling: factor: a positive number is required for yarn"},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act: unsupported 'gelu'"},
      {"\"rope_scaling\": null",
       "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"beta_fast\": 0}",
       "config.json: rope_scaling: yarn needs positive beta_fast"},
  };
  for (const Case& c : cases) {
    Result<ModelConfig> r = parse(replace(base, c.from, c.to));
    ASSERT_FALSE(r.ok()) << c.to;
    EXPECT_THAT(r.status().message(), HasSubstr(c.expect));
  }
  // yarn runs in both families (a Llama with yarn is Qwen's long-context setting); llama3 is the
  // Llama family's only, refused on DeepSeek-V3 by name.
  Result<ModelConfig> llama = parse(replace(
      replace(base, "DeepseekV3ForCausalLM", "LlamaForCausalLM"), "\"rope_scaling\": null",
      "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  Result<ModelConfig> deepseek = parse(replace(
      base, "\"rope_scaling\": null",
      "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
      "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}"));
  ASSERT_FALSE(deepseek.ok());
  EXPECT_THAT(deepseek.status().message(), HasSubstr("rope_scaling: unsupported type 'llama3'"));
}

// The expected values are transformers' _compute_yarn_parameters (float32 pow and divisions,
// float64 correction range) for DeepSeek-V3's rope_scaling; every fourth frequency of 32.
TEST(DeepseekV3Config, YarnAsTransformersComputesIt) {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.rope_theta = 10000.0;
  c.mla.qk_nope_head_dim = 128;
  c.mla.qk_rope_head_dim = 64;
  c.yarn.factor = 40;
  c.yarn.original_max_position_embeddings = 4096;
  c.yarn.beta_fast = 32;
  c.yarn.beta_slow = 1;
  c.yarn.mscale = c.yarn.mscale_all_dim = 1;
  std::vector<float> inv_freq;
  float factor = 0;
  rope_frequencies(c, 64, &inv_freq, &factor);
  ASSERT_EQ(inv_freq.size(), 32u);
  const double want[] = {1,      0.316227764,   0.100000001,   0.0268793618,
                         0.00549999989, 0.000790569466, 2.49999994e-05, 7.90569447e-06};
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(inv_freq[4 * i], want[i], want[i] * 1e-6) << i;
  EXPECT_FLOAT_EQ(factor, 1.0f);  // mscale / mscale_all_dim
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(mla_softmax_scale(c), m * m / std::sqrt(192.0), 1e-7);
  // Without rope_scaling: plain RoPE, the qk head's scale.
  c.yarn = {};
  rope_frequencies(c, 64, &inv_freq, &factor);
  EXPECT_FLOAT_EQ(inv_freq[1], 1.0f / std::pow(10000.0f, 2.0f / 64));
  EXPECT_FLOAT_EQ(factor, 1.0f);
  EXPECT_FLOAT_EQ(mla_softmax_scale(c), 1.0f / std::sqrt(192.0f));
}

TEST(DeepseekV3Weights, EachRanksPartIsThatSliceOfTheWhole) {
  REQUIRE_TINY();
  Result<DeepseekV3Weights> whole = load_deepseek_v3(tiny_dir(), nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  ASSERT_EQ(whole->layers.size(), 3u);
  EXPECT_EQ(whole->layers[0].experts.size(), 0u);
  EXPECT_EQ(whole->layers[1].experts.size(), 8u);
  auto rows = [](const std::vector<float>& m, int64_t cols, parallel::Range r) {
    return std::vector<float>(m.begin() + r.begin * cols, m.begin() + r.end * cols);
  };
  auto columns = [](const std::vector<float>& m, int64_t cols, parallel::Range c) {
    std::vector<float> out;
    for (size_t i = 0; i < m.size() / cols; ++i) {
      out.insert(out.end(), m.begin() + i * cols + c.begin, m.begin() + i * cols + c.end);
    }
    return out;
  };
  for (int tp : {2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(tp));
      Result<DeepseekV3Shard> shard = deepseek_v3_shard(whole->config, rank, tp);
      ASSERT_TRUE(shard.ok());
      Result<DeepseekV3Weights> part = load_deepseek_v3(tiny_dir(), &*shard);
      ASSERT_TRUE(part.ok()) << part.status().message();
      const parallel::Range heads = shard->heads;
      EXPECT_EQ(part->embed, rows(whole->embed, 64, shard->vocab));
      EXPECT_EQ(part->lm_head, rows(whole->lm_head, 64, shard->vocab));
      for (size_t i = 0; i < 3; ++i) {
        const DeepseekV3Layer& a = part->layers[i];
        const DeepseekV3Layer& b = whole->layers[i];
        EXPECT_EQ(a.q_a, b.q_a);    // replicated
        EXPECT_EQ(a.kv_a, b.kv_a);  // replicated: every rank computes the latent
        EXPECT_EQ(a.q_b, rows(b.q_b, 32, {heads.begin * 24, heads.end * 24}));
        EXPECT_EQ(a.kv_b, rows(b.kv_b, 32, {heads.begin * 32, heads.end * 32}));
        EXPECT_EQ(a.o, columns(b.o, 64, {heads.begin * 16, heads.end * 16}));
        if (i == 0) {
          EXPECT_EQ(a.mlp.gate, rows(b.mlp.gate, 64, shard->intermediate));
          EXPECT_EQ(a.mlp.down, columns(b.mlp.down, 128, shard->intermediate));
          continue;
        }
        EXPECT_EQ(a.router, b.router);
        EXPECT_EQ(a.router_bias, b.router_bias);
        for (size_t e = 0; e < 8; ++e) {
          EXPECT_EQ(a.experts[e].up, rows(b.experts[e].up, 64, shard->expert));
          EXPECT_EQ(a.experts[e].down, columns(b.experts[e].down, 32, shard->expert));
        }
        EXPECT_EQ(a.shared.gate, rows(b.shared.gate, 64, shard->shared));
      }
    }
  }
}

TEST(DeepseekV3Weights, AMissingTensorIsNamed) {
  REQUIRE_TINY();
  // A copy of the checkpoint whose config asks for one more layer than the file holds.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvrt_ds_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tiny_dir() + "/model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  {
    const std::string edited =
        replace(tiny_config(), "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4");
    FILE* f = std::fopen((dir / "config.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(edited.data(), 1, edited.size(), f);
    std::fclose(f);
  }
  Result<DeepseekV3Weights> w = load_deepseek_v3(dir.string(), nullptr);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("tensor 'model.layers.3."));
  EXPECT_THAT(w.status().message(), HasSubstr("is missing"));
}

TEST(DeepseekV3Preset, SynthMlaHasKimiK2sAttentionAndItsParameterCount) {
  Result<ModelConfig> c = preset_config("synth-mla");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c->mla.kv_lora_rank, 512);
  EXPECT_EQ(c->mla.qk_rope_head_dim, 64);
  EXPECT_EQ(c->num_attention_heads, 16);
  EXPECT_EQ(c->moe.n_routed_experts, 64);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  EXPECT_TRUE(check_runnable(*c, "synth-mla").ok());
  // Generated weights hold exactly the counted parameters.
  Result<ModelConfig> tiny = preset_config("synth-mla-tiny");
  ASSERT_TRUE(tiny.ok());
  const DeepseekV3Weights w = generate_deepseek_v3(*tiny, 0);
  size_t n = w.embed.size() + w.final_norm.size() + w.lm_head.size();
  for (const DeepseekV3Layer& l : w.layers) {
    for (const auto* t : {&l.input_norm, &l.post_norm, &l.q_a, &l.q_a_norm, &l.q_b, &l.kv_a,
                          &l.kv_a_norm, &l.kv_b, &l.o, &l.router, &l.router_bias}) {
      n += t->size();
    }
    for (const MlpWeights* m : {&l.mlp, &l.shared}) n += m->gate.size() + m->up.size() + m->down.size();
    for (const MlpWeights& m : l.experts) n += m.gate.size() + m.up.size() + m.down.size();
  }
  EXPECT_EQ(static_cast<int64_t>(n), tiny->parameter_count());
  std::printf("synth-mla: %lld parameters\n", static_cast<long long>(c->parameter_count()));
}

}  // namespace
}  // namespace kvrt::model
