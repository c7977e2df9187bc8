// Tests of the model-loading layer: config.json parsing, safetensors reading (synthetic files
// written here, plus the real stories260k checkpoint), f32 weights and presets (the tokenizers'
// tests are in tests/core/text).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/model/model_config.h"
#include "core/model/safetensors.h"
#include "core/model/weight_format.h"
#include "core/model/weights.h"
#include "tests/safetensors_writer.h"

namespace kvrt::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// ---- Helpers ----

// The real tiny model, or "" when the checkout has no ../shared/models next to it.
std::string Stories260kDir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  if (root == nullptr) return "";
  fs::path dir = fs::path(root) / ".." / "shared" / "models" / "stories260k";
  return fs::exists(dir / "config.json") ? dir.string() : "";
}

#define REQUIRE_STORIES260K(dir)                                                               \
  const std::string dir = Stories260kDir();                                                    \
  if (dir.empty()) {                                                                           \
    GTEST_SKIP() << "stories260k not found: set KVRT_SOURCE_DIR to the repository root, with " \
                    "the model in ../shared/models/stories260k";                               \
  }

// A fresh directory, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kvrt_model_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

using testdata::F32Bytes;
using testdata::Framed;
using testdata::RawTensor;
using testdata::U16Bytes;
using testdata::WriteFile;
using testdata::WriteSafetensors;

// bf16 by truncation: exact for the values the tests use (8 significant bits or fewer).
std::string BF16Bytes(const std::vector<float>& v) {
  std::vector<uint16_t> b;
  for (float x : v) b.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16));
  return U16Bytes(b);
}

// ---- ModelConfig ----

constexpr char kLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
  "vocab_size": 16, "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_scaling": null,
  "tie_word_embeddings": true, "torch_dtype": "float32"})";

// Parses `text` as <temp dir>/config.json.
Result<ModelConfig> ParseEdited(const std::string& text) {
  TempDir dir;
  WriteFile(dir / "config.json", text);
  return parse_hf_config(dir / "config.json");
}
std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ModelConfigTest, ParsesStories260k) {
  REQUIRE_STORIES260K(dir);
  auto c = parse_hf_config(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 5);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c->torch_dtype, "float32");
  // 512*64 embeddings + 5 * (q 64*64 + k,v 2*32*64 + o 64*64 + MLP 3*172*64 + norms 2*64) + 64.
  EXPECT_EQ(c->parameter_count(), 260032);
  EXPECT_EQ(c->weight_bytes(4), 4 * 260032);
}

TEST(ModelConfigTest, DefaultsAndArchitectures) {
  auto c = ParseEdited(kLlamaConfig);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->head_dim, 4);  // hidden / heads
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->bos_token_id, 1);

  // Qwen2 has q/k/v biases unless the config says otherwise, and no default BOS/EOS.
  auto qwen = ParseEdited(Replace(kLlamaConfig, "LlamaForCausalLM", "Qwen2ForCausalLM"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_TRUE(qwen->attention_bias);
  EXPECT_EQ(qwen->bos_token_id, -1);
  EXPECT_TRUE(qwen->eos_token_ids.empty());
  EXPECT_EQ(qwen->parameter_count(), ModelConfig(*c).parameter_count() + 8 + 2 * 4);
  auto qwen_nobias =
      ParseEdited(Replace(Replace(kLlamaConfig, "LlamaForCausalLM", "Qwen2ForCausalLM"),
                          "\"hidden_act\"", "\"attention_bias\": false, \"hidden_act\""));
  ASSERT_TRUE(qwen_nobias.ok()) << qwen_nobias.status().message();
  EXPECT_FALSE(qwen_nobias->attention_bias);

  auto mistral =
      ParseEdited(Replace(Replace(kLlamaConfig, "LlamaForCausalLM", "MistralForCausalLM"),
                          "\"hidden_act\"", "\"sliding_window\": 4096, \"hidden_act\""));
  ASSERT_TRUE(mistral.ok()) << mistral.status().message();
  EXPECT_FALSE(mistral->attention_bias);
  EXPECT_EQ(mistral->sliding_window, 4096);

  auto eos_list = ParseEdited(Replace(kLlamaConfig, "\"vocab_size\": 16",
                                      "\"vocab_size\": 16, \"eos_token_id\": [2, 7], "
                                      "\"head_dim\": 8, \"bos_token_id\": null"));
  ASSERT_TRUE(eos_list.ok()) << eos_list.status().message();
  EXPECT_EQ(eos_list->eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(eos_list->head_dim, 8);
  EXPECT_EQ(eos_list->q_dim(), 16);
  EXPECT_EQ(eos_list->bos_token_id, 1);  // null means "unset": Llama's default
}

TEST(ModelConfigTest, Errors) {
  auto arch = ParseEdited(Replace(kLlamaConfig, "LlamaForCausalLM", "GPT2LMHeadModel"));
  ASSERT_FALSE(arch.ok());
  EXPECT_THAT(arch.status().message(),
              HasSubstr("config.json: architectures: unsupported 'GPT2LMHeadModel' (supported: "
                        "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                        "MistralForCausalLM, DeepseekV3ForCausalLM)"));

  auto missing = ParseEdited(Replace(kLlamaConfig, "\"hidden_size\": 8,", ""));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("config.json: hidden_size: missing required"));

  auto typed = ParseEdited(Replace(kLlamaConfig, "\"hidden_size\": 8", "\"hidden_size\": \"8\""));
  ASSERT_FALSE(typed.ok());
  EXPECT_THAT(typed.status().message(), HasSubstr("hidden_size: expected an integer"));

  auto act = ParseEdited(Replace(kLlamaConfig, "\"silu\"", "\"gelu\""));
  ASSERT_FALSE(act.ok());
  EXPECT_THAT(act.status().message(), HasSubstr("hidden_act: unsupported 'gelu'"));

  auto rope = ParseEdited(Replace(kLlamaConfig, "\"rope_scaling\": null",
                                  "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}"));
  ASSERT_FALSE(rope.ok());
  EXPECT_EQ(rope.status().code(), Status::Code::kUnsupported);
  EXPECT_THAT(rope.status().message(),
              HasSubstr("config.json: rope_scaling: unsupported type 'linear'"));

  auto gqa =
      ParseEdited(Replace(kLlamaConfig, "\"num_attention_heads\": 2, \"num_key_value_heads\": 1",
                          "\"num_attention_heads\": 4, \"num_key_value_heads\": 3"));
  ASSERT_FALSE(gqa.ok());
  EXPECT_THAT(gqa.status().message(), HasSubstr("num_key_value_heads: 3 does not divide"));

  auto eos = ParseEdited(
      Replace(kLlamaConfig, "\"vocab_size\": 16", "\"vocab_size\": 16, \"eos_token_id\": 99"));
  ASSERT_FALSE(eos.ok());
  EXPECT_THAT(eos.status().message(), HasSubstr("eos_token_id: 99 is outside the vocabulary"));

  auto json = ParseEdited("{\"architectures\": [");
  ASSERT_FALSE(json.ok());
  EXPECT_THAT(json.status().message(), HasSubstr("not valid JSON"));

  auto absent = parse_hf_config("/nonexistent/config.json");
  ASSERT_FALSE(absent.ok());
  EXPECT_TRUE(absent.status().IsNotFound());
}

// The shared tiny checkpoints' config.json, or "" (the test skips) when absent.
std::string SharedModelConfig(const std::string& name) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  if (root == nullptr) return "";
  fs::path path = fs::path(root) / ".." / "shared" / "models" / name / "config.json";
  return fs::exists(path) ? path.string() : "";
}

TEST(ModelConfigTest, ParsesTinyQwen3) {
  const std::string path = SharedModelConfig("tiny-qwen3");
  if (path.empty()) GTEST_SKIP() << "../shared/models/tiny-qwen3 not found (KVRT_SOURCE_DIR)";
  auto c = parse_hf_config(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c->head_dim, 16);  // explicit, not hidden_size / heads = 8
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->rope_scaling);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{151645});
  // Tied embeddings 151936 * 32, per layer q 64*32, k and v 2 * 32*32, o 32*64, MLP 3 * 64*32,
  // norms 2 * 32 and q_norm, k_norm 2 * 16; the final norm.
  EXPECT_EQ(c->parameter_count(), 151936 * 32 + 2 * (2048 + 2048 + 2048 + 6144 + 64 + 32) + 32);
}

TEST(ModelConfigTest, ParsesTinyLlama3RopeScaling) {
  const std::string path = SharedModelConfig("tiny-llama3");
  if (path.empty()) GTEST_SKIP() << "../shared/models/tiny-llama3 not found (KVRT_SOURCE_DIR)";
  auto c = parse_hf_config(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->rope_scaling);
  EXPECT_EQ(c->rope_scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(c->llama3.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->llama3.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->llama3.high_freq_factor, 4.0);
  EXPECT_EQ(c->llama3.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e5);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c->yarn.factor, 0);  // llama3 is not yarn
}

TEST(ModelConfigTest, Qwen3Defaults) {
  const std::string qwen3 = Replace(kLlamaConfig, "LlamaForCausalLM", "Qwen3ForCausalLM");
  auto c = ParseEdited(qwen3);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 128);  // Qwen3Config's default, not hidden / heads
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
  // With head_dim as Llama's, Qwen3 adds only q_norm and k_norm per layer.
  auto same =
      ParseEdited(Replace(qwen3, "\"vocab_size\": 16", "\"vocab_size\": 16, \"head_dim\": 4"));
  auto llama = ParseEdited(kLlamaConfig);
  ASSERT_TRUE(same.ok() && llama.ok());
  EXPECT_EQ(same->parameter_count(), llama->parameter_count() + 2 * 4);

  auto window =
      ParseEdited(Replace(qwen3, "\"hidden_act\"", "\"use_sliding_window\": true, \"hidden_act\""));
  ASSERT_FALSE(window.ok());
  EXPECT_THAT(window.status().message(), HasSubstr("use_sliding_window: true is not implemented"));
}

TEST(ModelConfigTest, RopeScalingTypes) {
  auto with = [](const std::string& scaling, const char* arch = "LlamaForCausalLM") {
    return ParseEdited(Replace(Replace(kLlamaConfig, "LlamaForCausalLM", arch),
                               "\"rope_scaling\": null", "\"rope_scaling\": " + scaling));
  };
  const std::string llama3 =
      "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
      "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}";
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    SCOPED_TRACE(arch);
    auto c = with(llama3, arch);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->rope_scaling_type, "llama3");
    EXPECT_DOUBLE_EQ(c->llama3.factor, 8.0);
    EXPECT_DOUBLE_EQ(c->llama3.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(c->llama3.high_freq_factor, 4.0);
    EXPECT_EQ(c->llama3.original_max_position_embeddings, 8192);
  }
  // "default" is plain RoPE, under either key.
  for (const char* plain : {"{\"rope_type\": \"default\"}", "{\"type\": \"default\"}"}) {
    auto c = with(plain);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->llama3.factor, 0);
  }
  // yarn (Qwen's long-context setting) is read, under either key.
  for (const char* key : {"type", "rope_type"}) {
    auto c = with("{\"" + std::string(key) +
                  "\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}");
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_DOUBLE_EQ(c->yarn.factor, 4.0);
    EXPECT_EQ(c->yarn.original_max_position_embeddings, 32768);
    EXPECT_EQ(c->llama3.factor, 0);
  }
  // Types not implemented are refused by name, with the file and the key, under either key.
  for (const char* type : {"linear", "dynamic", "longrope"}) {
    for (const char* key : {"type", "rope_type"}) {
      SCOPED_TRACE(std::string(key) + " " + type);
      auto c = with("{\"" + std::string(key) + "\": \"" + type + "\", \"factor\": 2.0}");
      ASSERT_FALSE(c.ok());
      EXPECT_EQ(c.status().code(), Status::Code::kUnsupported);
      EXPECT_THAT(c.status().message(),
                  HasSubstr("config.json: rope_scaling: unsupported type '" + std::string(type) +
                            "' (the Llama family (Llama, Mistral, Qwen2, Qwen3) runs \"default\", "
                            "\"llama3\" and \"yarn\")"));
    }
  }
  auto untyped = with("{\"factor\": 2.0}");
  ASSERT_FALSE(untyped.ok());
  EXPECT_THAT(untyped.status().message(), HasSubstr("config.json: rope_scaling: no rope_type"));
  // llama3 needs all four keys, and a medium band to interpolate over.
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SCOPED_TRACE(key);
    // Each key is followed by a comma, as "rope_type" ends the object.
    std::string text = Replace(llama3, "\"rope_type\": \"llama3\", ", "");
    text.insert(text.size() - 1, ", \"rope_type\": \"llama3\"");
    const size_t at = text.find(std::string("\"") + key + "\"");
    text.erase(at, text.find(", ", at) + 2 - at);
    auto c = with(text);
    ASSERT_FALSE(c.ok());
    EXPECT_THAT(c.status().message(), HasSubstr(std::string("config.json: rope_scaling: ") + key +
                                                ": missing (required by rope_type llama3)"));
  }
  auto inverted = with(Replace(llama3, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0"));
  ASSERT_FALSE(inverted.ok());
  EXPECT_THAT(inverted.status().message(),
              HasSubstr("rope_scaling: high_freq_factor: must exceed low_freq_factor"));
  auto typed = with(Replace(llama3, "\"factor\": 8.0", "\"factor\": \"8\""));
  ASSERT_FALSE(typed.ok());
  EXPECT_THAT(typed.status().message(), HasSubstr("rope_scaling: factor: expected a number"));
}

// ---- f16 conversion ----

TEST(SafetensorsTest, F16ToF32Exhaustive) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    // The IEEE binary16 definition, evaluated in double: sign, 5-bit exponent (bias 15),
    // 10-bit fraction; exponent 0 is subnormal (no implicit 1, exponent -14), 31 is inf / NaN.
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float got = f16_to_f32(h);
    if (e == 31 && m != 0) {
      ASSERT_TRUE(std::isnan(got)) << bits;
      ASSERT_EQ(std::signbit(got), sign == 1) << bits;
      ASSERT_EQ(std::bit_cast<uint32_t>(got) & 0x7fffff, static_cast<uint32_t>(m) << 13) << bits;
      continue;
    }
    double want;
    if (e == 31) {
      want = INFINITY;
    } else if (e == 0) {
      want = std::ldexp(m / 1024.0, -14);
    } else {
      want = std::ldexp(1.0 + m / 1024.0, e - 15);
    }
    if (sign) want = -want;
    // Bit equality also separates +0 from -0.
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(static_cast<float>(want)))
        << "f16 bits 0x" << std::hex << bits << ": got " << got << ", want " << want;
  }
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
}

// ---- Safetensors reader ----

TEST(SafetensorsTest, ReadsEveryDtypeAlignedAndNot) {
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.125f, 1e-3f};
  const std::vector<float> bf = {1.0f, -2.5f, 0.0078125f, 96.0f};
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000};
  const std::vector<float> f16_want = {1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, -0.0f};
  // Pads 0 and 1: the data section at an 8-aligned and at an odd offset.
  for (size_t pad : {0, 1}) {
    TempDir dir;
    WriteSafetensors(dir / "model.safetensors",
                     {{"d.i64", "I64", {1}, std::string(8, '\0')},
                      {"a.f32", "F32", {2, 3}, F32Bytes(f32)},
                      {"b.bf16", "BF16", {4}, BF16Bytes(bf)},
                      {"c.f16", "F16", {3, 2}, U16Bytes(f16)}},
                     pad);
    // Both a directory and the file itself open.
    for (const std::string& path : {dir.path(), dir / "model.safetensors"}) {
      auto ck = SafetensorsCheckpoint::open(path);
      ASSERT_TRUE(ck.ok()) << ck.status().message();
      EXPECT_EQ(ck->names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.i64"}));
      EXPECT_EQ(ck->files(), std::vector<std::string>{dir / "model.safetensors"});

      auto a = ck->get("a.f32");
      ASSERT_TRUE(a.ok()) << a.status().message();
      EXPECT_EQ(a->dtype, DType::kF32);
      EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
      EXPECT_EQ(a->bytes, 24u);
      EXPECT_EQ(a->file, dir / "model.safetensors");
      std::vector<float> out(6);
      to_f32(*a, out.data());
      EXPECT_EQ(out, f32);

      auto b = ck->get("b.bf16");
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(b->dtype, DType::kBF16);
      out.assign(4, 0);
      to_f32(*b, out.data());
      EXPECT_EQ(out, bf);

      auto c = ck->get("c.f16");
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(c->numel(), 6);
      out.assign(6, 0);
      to_f32(*c, out.data());
      for (size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(f16_want[i])) << i;
      }

      auto d = ck->get("d.i64");
      ASSERT_FALSE(d.ok());
      EXPECT_EQ(d.status().code(), Status::Code::kUnsupported);
      EXPECT_THAT(d.status().message(), HasSubstr("tensor 'd.i64' has dtype I64"));

      auto missing = ck->get("nope");
      ASSERT_FALSE(missing.ok());
      EXPECT_TRUE(missing.status().IsNotFound());
      EXPECT_THAT(missing.status().message(), HasSubstr("tensor 'nope' not found"));
    }
  }
}

TEST(SafetensorsTest, BadFiles) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSafetensors(path, {{"w", "F32", {4, 4}, F32Bytes(std::vector<float>(16, 1.0f))},
                          {"x", "F32", {2}, F32Bytes({1.0f, 2.0f})}});
  // Cut the file in the middle of the last tensor's data.
  fs::resize_file(path, fs::file_size(path) - 6);
  auto truncated = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr(path + ": truncated: tensor 'x'"));

  // The header length itself points past the end.
  fs::resize_file(path, 40);
  auto header = SafetensorsCheckpoint::open(path);
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(header.status().message(), HasSubstr("header length"));

  WriteFile(path, "abc");
  auto tiny = SafetensorsCheckpoint::open(path);
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(tiny.status().message(), HasSubstr("not a safetensors file"));

  // Byte range disagreeing with shape x dtype.
  WriteSafetensors(path, {{"w", "F32", {3}, F32Bytes({1.0f, 2.0f})}});
  auto size = SafetensorsCheckpoint::open(path);
  ASSERT_FALSE(size.ok());
  EXPECT_THAT(size.status().message(), HasSubstr("tensor 'w': 8 bytes for shape [3] of F32"));

  TempDir empty;
  auto none = SafetensorsCheckpoint::open(empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(none.status().IsNotFound());
  EXPECT_THAT(none.status().message(), HasSubstr("neither model.safetensors nor"));
}

TEST(SafetensorsTest, ShardedIndex) {
  TempDir dir;
  WriteSafetensors(
      dir / "model-00001-of-00002.safetensors",
      {{"a", "F32", {2}, F32Bytes({1.0f, 2.0f})}, {"b", "F32", {1}, F32Bytes({3.0f})}});
  WriteSafetensors(dir / "model-00002-of-00002.safetensors",
                   {{"c", "BF16", {2}, BF16Bytes({4.0f, 5.0f})}});
  WriteFile(dir / "model.safetensors.index.json",
            R"({"metadata": {"total_size": 16}, "weight_map": {
                "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                "c": "model-00002-of-00002.safetensors"}})");
  auto ck = SafetensorsCheckpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck->files().size(), 2u);
  auto c = ck->get("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->file, dir / "model-00002-of-00002.safetensors");
  std::vector<float> out(2);
  to_f32(*c, out.data());
  EXPECT_EQ(out, (std::vector<float>{4.0f, 5.0f}));

  // The index names a shard that lacks the tensor.
  WriteFile(dir / "model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "c": "model-00001-of-00002.safetensors"}})");
  auto wrong = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("weight_map puts tensor 'c' in model-00001-of-00002.safetensors"));

  // The index names a shard that does not exist.
  WriteFile(dir / "model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00003-of-00002.safetensors"}})");
  auto absent = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(absent.ok());
  EXPECT_THAT(absent.status().message(), HasSubstr("model-00003-of-00002.safetensors"));
}

// Writes a header by hand (the helper above always lays tensors end to end).
void WriteRawSafetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  WriteFile(path, Framed(header) + std::string(data_bytes, '\0'));
}

// Found by fuzz_safetensors: an empty tensor converted into an empty vector's data() (null) must
// not reach memcpy with a null pointer.
TEST(SafetensorsTest, EmptyTensorConvertsIntoNothing) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    WriteRawSafetensors(
        path,
        std::string(R"({"e":{"dtype":")") + dtype + R"(","shape":[0, 3],"data_offsets":[0,0]}})",
        0);
    auto ck = SafetensorsCheckpoint::open(path);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    auto e = ck->get("e");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->numel(), 0);
    std::vector<float> out;
    to_f32(*e, out.data());  // UBSan reports a null memcpy here if the guard goes
  }
}

// Two tensors sharing bytes would alias each other's weights: refused, naming both.
TEST(SafetensorsTest, OverlappingTensorsAreRefused) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteRawSafetensors(path,
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      16);
  auto ck = SafetensorsCheckpoint::open(path);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(),
              HasSubstr(path + ": tensors 'a' and 'b' overlap: data bytes [0, 16) and [8, 16)"));
  // Empty tensors share no byte with anything.
  WriteRawSafetensors(path,
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                      8);
  EXPECT_TRUE(SafetensorsCheckpoint::open(path).ok());
}

// An offset that is not a multiple of the element size is refused (writers align every tensor).
TEST(SafetensorsTest, MisalignedOffsetsAreRefused) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteRawSafetensors(path,
                      R"({"b":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                      6);
  auto ck = SafetensorsCheckpoint::open(path);
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(),
              HasSubstr(path + ": tensor 'w': data_offsets begin 2 is not a multiple of F32's "
                               "4-byte element"));
}

// A shard index naming a file outside the model directory is refused before anything is opened.
TEST(SafetensorsTest, ShardOutsideTheModelDirectoryIsRefused) {
  TempDir dir;
  WriteSafetensors(dir / "model-00001.safetensors", {{"a", "F32", {1}, F32Bytes({1.0f})}});
  for (const char* shard : {"../../etc/passwd", "/etc/passwd", "sub/../../x.safetensors"}) {
    WriteFile(dir / "model.safetensors.index.json",
              std::string(R"({"weight_map": {"a": ")") + shard + R"("}})");
    auto ck = SafetensorsCheckpoint::open(dir.path());
    ASSERT_FALSE(ck.ok()) << shard;
    EXPECT_THAT(ck.status().message(),
                HasSubstr("weight_map: 'a': shard '" + std::string(shard) + "' is"));
    EXPECT_THAT(ck.status().message(), HasSubstr("model directory"));
  }
}

// A FIFO or a device in place of a shard is refused (open would block, mmap would fail).
TEST(SafetensorsTest, NonRegularFileIsRefused) {
  TempDir dir;
  ASSERT_EQ(mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  auto fifo = SafetensorsCheckpoint::open(dir / "model.safetensors");
  ASSERT_FALSE(fifo.ok());
  EXPECT_THAT(fifo.status().message(),
              HasSubstr("the safetensors file is a FIFO, not a regular file"));
  auto zero = SafetensorsCheckpoint::open("/dev/zero");
  ASSERT_FALSE(zero.ok());
}

// An endless index (a FIFO fed forever, /dev/zero) stops at the index's limit.
TEST(SafetensorsTest, EndlessIndexIsRefusedAtItsLimit) {
  TempDir dir;
  fs::create_symlink("/dev/zero", dir / "model.safetensors.index.json");
  auto ck = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(),
              HasSubstr("the safetensors index is larger than kvrt's limit of 64 MiB"));
}

// Integers are range-checked before anything narrows them: 2^32 KV heads must not become 0,
// nor 2^32 + 5 layers 5.
TEST(ModelConfigTest, IntegersOutside32BitsAreRefusedByName) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"num_key_value_heads", "4294967296"},
                                                        {"num_hidden_layers", "4294967301"},
                                                        {"hidden_size", "-8"},
                                                        {"vocab_size", "18446744073709551615"}}) {
    std::string text = kLlamaConfig;
    const std::string field = "\"" + key + "\": ";
    const size_t at = text.find(field) + field.size();
    text.replace(at, text.find_first_of(",}", at) - at, value);
    auto c = read_hf_config(text, "config.json");
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_THAT(c.status().message(), HasSubstr("config.json: " + key +
                                                ": out of range: expected an integer in "
                                                "0..2147483647, found " +
                                                value));
  }
}

// Each field fits, but together they describe no real model (and would overflow byte counts).
TEST(ModelConfigTest, DimensionsOfNoRealModelAreRefused) {
  std::string text = kLlamaConfig;
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers"}) {
    const std::string field = "\"" + std::string(key) + "\": ";
    const size_t at = text.find(field) + field.size();
    text.replace(at, text.find_first_of(",}", at) - at, "2000000000");
  }
  auto c = read_hf_config(text, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("describe over 2^48 parameters"));
}

// ---- Weights from a Hugging Face directory ----

TEST(WeightsTest, LoadsStories260k) {
  REQUIRE_STORIES260K(dir);
  auto w = load_hf(dir);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const ModelConfig& c = w->config;
  EXPECT_EQ(w->embed.size(), 512u * 64);
  ASSERT_EQ(w->layers.size(), 5u);
  size_t total = w->embed.size() + w->final_norm.size() + w->lm_head.size();
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.input_norm.size(), 64u);
    EXPECT_EQ(l.q.size(), 64u * 64);
    EXPECT_EQ(l.k.size(), 32u * 64);
    EXPECT_EQ(l.v.size(), 32u * 64);
    EXPECT_EQ(l.o.size(), 64u * 64);
    EXPECT_EQ(l.post_norm.size(), 64u);
    EXPECT_EQ(l.gate.size(), 172u * 64);
    EXPECT_EQ(l.up.size(), 172u * 64);
    EXPECT_EQ(l.down.size(), 64u * 172);
    EXPECT_TRUE(l.q_bias.empty());
    for (const auto* t :
         {&l.input_norm, &l.q, &l.k, &l.v, &l.o, &l.post_norm, &l.gate, &l.up, &l.down}) {
      total += t->size();
    }
  }
  EXPECT_EQ(w->final_norm.size(), 64u);
  EXPECT_TRUE(w->lm_head.empty());  // tied
  EXPECT_EQ(&w->output_embedding(), &w->embed);
  EXPECT_EQ(static_cast<int64_t>(total), c.parameter_count());

  // Values are the stored ones, in the stored (HF) layout.
  auto ck = SafetensorsCheckpoint::open(dir);
  ASSERT_TRUE(ck.ok());
  auto k = ck->get("model.layers.3.self_attn.k_proj.weight");
  ASSERT_TRUE(k.ok());
  std::vector<float> raw(static_cast<size_t>(k->numel()));
  to_f32(*k, raw.data());
  EXPECT_EQ(raw, w->layers[3].k);
}

// One TP rank's part (what a rank in its own process loads) is exactly that part of the whole:
// rows of q / k / v, gate / up, embed; columns of o and down; norms whole.
TEST(WeightsTest, LoadsOneRanksPartOfStories260k) {
  REQUIRE_STORIES260K(dir);
  auto whole = load_hf(dir);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  const int64_t d = 8, h = 64;
  auto rows = [](const std::vector<float>& m, int64_t cols, parallel::Range r) {
    return std::vector<float>(m.begin() + r.begin * cols, m.begin() + r.end * cols);
  };
  auto columns = [](const std::vector<float>& m, int64_t nrows, int64_t cols, parallel::Range c) {
    std::vector<float> out;
    for (int64_t i = 0; i < nrows; ++i) {
      out.insert(out.end(), m.begin() + i * cols + c.begin, m.begin() + i * cols + c.end);
    }
    return out;
  };
  for (int tp : {2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(tp));
      HeldPart part;
      part.whole = false;
      part.kv_heads = parallel::split(4, tp, rank);
      part.q_heads = {part.kv_heads.begin * 2, part.kv_heads.end * 2};
      part.intermediate = parallel::split(172, tp, rank);
      part.vocab = parallel::split(512, tp, rank);
      auto w = load_hf(dir, &part);
      ASSERT_TRUE(w.ok()) << w.status().message();
      EXPECT_FALSE(w->held.whole);
      const parallel::Range q{part.q_heads.begin * d, part.q_heads.end * d};
      const parallel::Range kv{part.kv_heads.begin * d, part.kv_heads.end * d};
      EXPECT_EQ(w->embed, rows(whole->embed, h, part.vocab));
      EXPECT_EQ(w->final_norm, whole->final_norm);
      for (size_t i = 0; i < w->layers.size(); ++i) {
        const LayerWeights& a = w->layers[i];
        const LayerWeights& b = whole->layers[i];
        EXPECT_EQ(a.input_norm, b.input_norm);
        EXPECT_EQ(a.q, rows(b.q, h, q));
        EXPECT_EQ(a.k, rows(b.k, h, kv));
        EXPECT_EQ(a.v, rows(b.v, h, kv));
        EXPECT_EQ(a.o, columns(b.o, h, 64, q));
        EXPECT_EQ(a.gate, rows(b.gate, h, part.intermediate));
        EXPECT_EQ(a.up, rows(b.up, h, part.intermediate));
        EXPECT_EQ(a.down, columns(b.down, h, 172, part.intermediate));
      }
    }
  }
}

// A complete one-layer model in a temp dir whose tensors a test can drop, reshape or retype.
class TinyHfModel {
 public:
  static constexpr int64_t kH = 8, kQ = 8, kKv = 4, kI = 16, kV = 16;

  explicit TinyHfModel(bool qwen2 = false, bool tied = true, bool qwen3 = false) {
    std::string config = kLlamaConfig;
    if (qwen2) config = Replace(config, "LlamaForCausalLM", "Qwen2ForCausalLM");
    if (qwen3) {
      config = Replace(Replace(config, "LlamaForCausalLM", "Qwen3ForCausalLM"), "\"vocab_size\"",
                       "\"head_dim\": 4, \"vocab_size\"");
    }
    if (!tied)
      config = Replace(config, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    WriteFile(dir_ / "config.json", config);
    Add("model.embed_tokens.weight", {kV, kH});
    const std::string p = "model.layers.0.";
    Add(p + "input_layernorm.weight", {kH});
    Add(p + "self_attn.q_proj.weight", {kQ, kH});
    Add(p + "self_attn.k_proj.weight", {kKv, kH});
    Add(p + "self_attn.v_proj.weight", {kKv, kH});
    Add(p + "self_attn.o_proj.weight", {kH, kQ});
    Add(p + "post_attention_layernorm.weight", {kH});
    Add(p + "mlp.gate_proj.weight", {kI, kH});
    Add(p + "mlp.up_proj.weight", {kI, kH});
    Add(p + "mlp.down_proj.weight", {kH, kI});
    Add("model.norm.weight", {kH});
    if (qwen2) {
      Add(p + "self_attn.q_proj.bias", {kQ});
      Add(p + "self_attn.k_proj.bias", {kKv});
      Add(p + "self_attn.v_proj.bias", {kKv});
    }
    if (qwen3) {
      Add(p + "self_attn.q_norm.weight", {kQ / 2}, "BF16");
      Add(p + "self_attn.k_norm.weight", {kQ / 2}, "BF16");
    }
    if (!tied) Add("lm_head.weight", {kV, kH});
  }

  // Tensor i holds i + 0.5, i + 1.5, ... (exact in bf16 for these sizes), so values identify it.
  void Add(const std::string& name, std::vector<int64_t> shape, const std::string& dtype = "F32") {
    int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f;
    tensors_.push_back({name, dtype, shape, dtype == "BF16" ? BF16Bytes(v) : F32Bytes(v)});
  }
  void Remove(const std::string& name) {
    std::erase_if(tensors_, [&](const RawTensor& t) { return t.name == name; });
  }
  void Overwrite(const std::string& name, std::vector<int64_t> shape,
                 const std::string& dtype = "F32") {
    Remove(name);
    Add(name, shape, dtype);
  }
  Result<Weights> Load() {
    WriteSafetensors(dir_ / "model.safetensors", tensors_);
    return load_hf(dir_.path());
  }

 private:
  TempDir dir_;
  std::vector<RawTensor> tensors_;
};

TEST(WeightsTest, LoadsSyntheticHfDirectory) {
  TinyHfModel m;
  // A bf16 tensor is widened; an unused extra tensor is ignored.
  m.Overwrite("model.layers.0.mlp.up_proj.weight", {16, 8}, "BF16");
  m.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {2});
  auto w = m.Load();
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->layers[0].up.size(), 128u);
  EXPECT_EQ(w->layers[0].up[127], 127.5f);
  EXPECT_EQ(w->layers[0].k.size(), 32u);
  EXPECT_TRUE(w->lm_head.empty());

  TinyHfModel qwen(/*qwen2=*/true, /*tied=*/false);
  auto wq = qwen.Load();
  ASSERT_TRUE(wq.ok()) << wq.status().message();
  EXPECT_EQ(wq->layers[0].q_bias.size(), 8u);
  EXPECT_EQ(wq->layers[0].k_bias.size(), 4u);
  EXPECT_EQ(wq->layers[0].v_bias.size(), 4u);
  EXPECT_EQ(wq->lm_head.size(), 128u);
  EXPECT_EQ(&wq->output_embedding(), &wq->lm_head);
  EXPECT_TRUE(wq->layers[0].q_norm.empty());

  // Qwen3's per-head norms, one head_dim each, read from bf16 as they are.
  TinyHfModel qwen3(/*qwen2=*/false, /*tied=*/true, /*qwen3=*/true);
  auto w3 = qwen3.Load();
  ASSERT_TRUE(w3.ok()) << w3.status().message();
  EXPECT_EQ(w3->layers[0].q_norm, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(w3->layers[0].k_norm, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  EXPECT_TRUE(w3->layers[0].q_bias.empty());
}

TEST(WeightsTest, LoadErrorsNameTensorAndShapes) {
  {
    TinyHfModel m;
    m.Remove("model.layers.0.self_attn.k_proj.weight");
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_TRUE(w.status().IsNotFound());
    EXPECT_THAT(w.status().message(),
                HasSubstr("tensor 'model.layers.0.self_attn.k_proj.weight' is missing "
                          "(expected shape [4, 8])"));
  }
  {
    TinyHfModel m;
    m.Overwrite("model.layers.0.self_attn.k_proj.weight", {8, 8});
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(),
                HasSubstr("tensor 'model.layers.0.self_attn.k_proj.weight': expected shape "
                          "[4, 8], found [8, 8]"));
  }
  {
    TinyHfModel m;
    m.Overwrite("model.norm.weight", {8}, "I32");
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), Status::Code::kUnsupported);
    EXPECT_THAT(w.status().message(), HasSubstr("tensor 'model.norm.weight' has dtype I32"));
  }
  {
    TinyHfModel m(/*qwen2=*/true);
    m.Remove("model.layers.0.self_attn.v_proj.bias");
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(
        w.status().message(),
        HasSubstr("'model.layers.0.self_attn.v_proj.bias' is missing (expected shape [4])"));
  }
  {
    TinyHfModel m(/*qwen2=*/false, /*tied=*/true, /*qwen3=*/true);
    m.Remove("model.layers.0.self_attn.k_norm.weight");
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(
        w.status().message(),
        HasSubstr("'model.layers.0.self_attn.k_norm.weight' is missing (expected shape [4])"));
  }
  {
    TinyHfModel m(/*qwen2=*/false, /*tied=*/false);
    m.Remove("lm_head.weight");
    auto w = m.Load();
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr("'lm_head.weight' is missing"));
  }
}

// ---- Presets ----

TEST(PresetTest, NamesAndUnknown) {
  EXPECT_EQ(preset_names(),
            (std::vector<std::string>{"synth-76m", "synth-tiny", "synth-bench", "synth-llama3-8b",
                                      "llama-3.2-1b-shape", "synth-mla", "synth-mla-tiny"}));
  auto w = make_preset("synth-7b");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(),
            "unknown model preset 'synth-7b' (known: synth-76m, synth-tiny, synth-bench, "
            "synth-llama3-8b, llama-3.2-1b-shape, synth-mla, synth-mla-tiny)");
  EXPECT_FALSE(preset_config("").ok());
}

TEST(PresetTest, TinyIsDeterministic) {
  auto a = make_preset("synth-tiny");
  auto b = make_preset("synth-tiny");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->embed, b->embed);
  EXPECT_EQ(a->layers[1].down, b->layers[1].down);
  EXPECT_EQ(fingerprint(*a), fingerprint(*b));
  // Pinned: a change here changes every synthetic model's outputs (and any golden data).
  EXPECT_EQ(fingerprint(*a), 0x21bd936af47ab713ull);

  auto other = make_preset("synth-tiny", 1);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->embed, a->embed);

  const ModelConfig& c = a->config;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.validate("synth-tiny").ok());
  EXPECT_EQ(a->layers[0].k.size(), 32u * 64);
  EXPECT_EQ(a->layers[0].input_norm, std::vector<float>(64, 1.0f));
  EXPECT_TRUE(a->lm_head.empty());
}

TEST(PresetTest, Synth76m) {
  auto c = preset_config("synth-76m");
  ASSERT_TRUE(c.ok());
  // 512*768 embeddings + 12 * (q 768*768 + k,v 2*256*768 + o 768*768 + MLP 3*2048*768
  // + norms 2*768) + final norm 768; tied, so no lm_head.
  EXPECT_EQ(c->parameter_count(), 75909888);

  auto w = make_preset("synth-76m");
  ASSERT_TRUE(w.ok());
  size_t total = w->embed.size() + w->final_norm.size() + w->lm_head.size();
  for (const LayerWeights& l : w->layers) {
    for (const auto* t :
         {&l.input_norm, &l.q, &l.k, &l.v, &l.o, &l.post_norm, &l.gate, &l.up, &l.down}) {
      total += t->size();
    }
  }
  EXPECT_EQ(total, 75909888u);
  EXPECT_EQ(fingerprint(*w), 0x22dd83dff84e0482ull);

  // The distribution is the documented one: mean 0, std 0.02, bounded by 4 * sqrt(3) / 2 std.
  const std::vector<float>& g = w->layers[11].gate;
  double sum = 0, sq = 0, max_abs = 0;
  for (float x : g) {
    sum += x;
    sq += double{x} * x;
    max_abs = std::max(max_abs, std::fabs(double{x}));
  }
  const double mean = sum / g.size(), sd = std::sqrt(sq / g.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(sd, 0.02, 2e-4);
  EXPECT_LE(max_abs, 0.02 * 2 * std::sqrt(3.0) + 1e-6);
}

// ---- Quantized weights (weight_format.h) ----

WeightFormat Fp8Blocks(int64_t rows, int64_t cols, std::vector<std::string> kept = {}) {
  nlohmann::json q = {{"quant_method", "fp8"},
                      {"fmt", "e4m3"},
                      {"activation_scheme", "dynamic"},
                      {"weight_block_size", {rows, cols}}};
  if (!kept.empty()) q["modules_to_not_convert"] = kept;
  Result<WeightFormat> f = WeightFormat::parse(&q, "config.json");
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : WeightFormat{};
}

TEST(WeightFormat, ReadsDeepseekV3sFp8BlocksAndRefusesTheRestByKeyAndValue) {
  const WeightFormat f = Fp8Blocks(128, 128);
  EXPECT_EQ(f.kind, WeightFormat::Kind::kFp8Block);
  EXPECT_EQ(f.describe(), "fp8 e4m3, 128 x 128 blocks");
  EXPECT_FALSE(WeightFormat::parse(nullptr, "config.json")->quantized());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"quant_method": "gptq", "bits": 4})",
       "config.json: quantization_config.quant_method: 'gptq' is not served"},
      {R"({"quant_method": "awq"})", "quantization_config.quant_method: 'awq' is not served"},
      {R"({"bits": 4})", "quantization_config.quant_method: missing"},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})",
       "quantization_config.fmt: \"e5m2\" is not served"},
      {R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [1, 1]})",
       "quantization_config.activation_scheme: \"static\" is not served"},
      {R"({"quant_method": "fp8"})", "quantization_config.weight_block_size: missing"},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 128]})",
       "quantization_config.weight_block_size: expected [rows, cols] of positive integers"},
      {R"("fp8")", "quantization_config: expected an object"},
  };
  for (const auto& [text, message] : refused) {
    const nlohmann::json q = nlohmann::json::parse(text);
    Result<WeightFormat> f = WeightFormat::parse(&q, "config.json");
    ASSERT_FALSE(f.ok()) << text;
    EXPECT_THAT(f.status().message(), HasSubstr(message)) << text;
  }
}

// A 3 x 5 fp8 weight in 2 x 4 blocks (the right and bottom blocks cut short), its scales F32 or
// BF16: each element is its code's value times its block's scale, whatever part is loaded.
TEST(WeightFormat, Fp8BlocksDequantizeByGlobalRowAndColumnForAnyPart) {
  TempDir dir;
  // E4M3 codes: 0x38 = 1.0, 0x40 = 2.0, 0xB8 = -1.0, 0x30 = 0.5, 0x01 = 2^-9 (subnormal).
  const std::vector<uint8_t> codes = {0x38, 0x40, 0xB8, 0x30, 0x01,  //
                                      0x40, 0x38, 0x30, 0xB8, 0x38,  //
                                      0x30, 0x30, 0x40, 0x40, 0xB8};
  const std::vector<float> scales = {0.5f, 4.0f, 0.25f, 8.0f};  // [2][2]
  const std::vector<float> value = {1, 2, -1, 0.5f, 0x1p-9f, 2, 1, 0.5f, -1, 1, 0.5f, 0.5f, 2, 2, -1};
  std::string code_bytes(codes.begin(), codes.end());
  for (const char* scale_dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(scale_dtype);
    WriteSafetensors(dir / "model.safetensors",
                     {{"w.weight_scale_inv", scale_dtype, {2, 2},
                       std::string(scale_dtype) == "F32" ? F32Bytes(scales) : BF16Bytes(scales)},
                      {"w.weight", "F8_E4M3", {3, 5}, code_bytes}});
    Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(dir.path());
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    const WeightFormat f = Fp8Blocks(2, 4);
    for (parallel::Range rows : {parallel::Range{0, 3}, parallel::Range{1, 3}}) {
      for (parallel::Range cols : {parallel::Range{0, 5}, parallel::Range{2, 5}}) {
        std::vector<float> out;
        ASSERT_TRUE(load_block(*ck, f, dir.path(), "w.weight", {3, 5}, rows, cols, out).ok());
        for (int64_t r = rows.begin; r < rows.end; ++r) {
          for (int64_t c = cols.begin; c < cols.end; ++c) {
            const float want = value[r * 5 + c] * scales[(r / 2) * 2 + c / 4];
            EXPECT_EQ(out[(r - rows.begin) * cols.size() + (c - cols.begin)], want)
                << "[" << r << ", " << c << "]";
          }
        }
      }
    }
  }
}

TEST(WeightFormat, HostileFp8CheckpointsAreRefusedByName) {
  TempDir dir;
  const std::string codes(15, '\x38');
  auto refused = [&](const std::vector<RawTensor>& tensors, const WeightFormat& f,
                     const std::string& message) {
    WriteSafetensors(dir / "model.safetensors", tensors);
    Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(dir.path());
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    std::vector<float> out;
    const Status s = load_block(*ck, f, dir.path(), "w.weight", {3, 5}, {0, 3}, {0, 5}, out);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  };
  const RawTensor weight{"w.weight", "F8_E4M3", {3, 5}, codes};
  const RawTensor scale{"w.weight_scale_inv", "F32", {2, 2}, F32Bytes({1, 1, 1, 1})};
  // (Scales first: a 4-byte element must start on a multiple of 4 in the data section.)
  refused({{"w.weight_scale_inv", "F32", {2, 1}, F32Bytes({1, 1})}, weight}, Fp8Blocks(2, 4),
          "'w.weight_scale_inv': expected an F32 or BF16 scale of [2, 2] (2 x 4 blocks of [3, 5]), "
          "found F32 [2, 1]");
  refused({weight}, Fp8Blocks(2, 4), "its scale 'w.weight_scale_inv' ([2, 2]) is missing");
  std::string nan = codes;
  nan[7] = '\x7F';
  refused({scale, {"w.weight", "F8_E4M3", {3, 5}, nan}}, Fp8Blocks(2, 4),
          "'w.weight': element [1, 2] is an E4M3 NaN");
  refused({scale, weight}, WeightFormat{}, "has dtype F8_E4M3 (supported: F32, BF16, F16;");
  refused({scale, weight}, Fp8Blocks(2, 4, {"w"}),
          "quantization_config lists 'w' as not converted");
}

// compressed-tensors pack-quantized int4, symmetric, groups of 8 (as Kimi's, with smaller groups):
// a 2 x 16 weight is 2 x 2 int32 words of 8 codes (q + 8, lowest nibble first) and 2 x 2 scales.
WeightFormat PackedInt4(int64_t group, std::vector<std::string> ignore = {}) {
  nlohmann::json q = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"input_activations", nullptr},
          {"weights",
           {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"},
            {"group_size", group}, {"dynamic", false}}}}}}}};
  if (!ignore.empty()) q["ignore"] = ignore;
  Result<WeightFormat> f = WeightFormat::parse(&q, "config.json");
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : WeightFormat{};
}

std::string I32Bytes(const std::vector<int32_t>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

TEST(WeightFormat, PackedInt4GroupsDequantizeAndHostileOnesAreRefusedByName) {
  TempDir dir;
  // Row r, column c holds q = (c % 16) - 8 (codes 0..15); row 1 negated.
  std::vector<int32_t> words(4, 0);
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 16; ++c) {
      const int q = r == 0 ? (c % 16) - 8 : 7 - (c % 16);
      words[r * 2 + c / 8] |= static_cast<int32_t>(static_cast<uint32_t>(q + 8) << (4 * (c % 8)));
    }
  }
  const std::vector<float> scales = {0.5f, 2.0f, 0.25f, 1.0f};  // [2 rows][2 groups of 8]
  auto write = [&](const std::vector<int32_t>& shape_words, const std::vector<int64_t>& packed_shape,
                   const std::vector<int32_t>& packed) {
    WriteSafetensors(dir / "model.safetensors",
                     {{"w.weight_scale", "BF16", {2, 2}, BF16Bytes(scales)},
                      {"w.weight_shape", "I32", {2}, I32Bytes(shape_words)},
                      {"w.weight_packed", "I32", packed_shape, I32Bytes(packed)}});
    return SafetensorsCheckpoint::open(dir.path());
  };
  {
    Result<SafetensorsCheckpoint> ck = write({2, 16}, {2, 2}, words);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    for (parallel::Range cols : {parallel::Range{0, 16}, parallel::Range{8, 16}}) {
      std::vector<float> out;
      const Status s = load_block(*ck, PackedInt4(8), dir.path(), "w.weight", {2, 16}, {0, 2},
                                  cols, out);
      ASSERT_TRUE(s.ok()) << s.message();
      for (int r = 0; r < 2; ++r) {
        for (int64_t c = cols.begin; c < cols.end; ++c) {
          const int q = r == 0 ? (c % 16) - 8 : 7 - (c % 16);
          EXPECT_EQ(out[r * cols.size() + (c - cols.begin)], q * scales[r * 2 + c / 8])
              << "[" << r << ", " << c << "]";
        }
      }
    }
    // A part that cuts a group (columns 4..16 of groups of 8) is refused, naming the tensor.
    std::vector<float> out;
    const Status cut =
        load_block(*ck, PackedInt4(8), dir.path(), "w.weight", {2, 16}, {0, 2}, {4, 16}, out);
    ASSERT_FALSE(cut.ok());
    EXPECT_THAT(cut.message(), HasSubstr("'w.weight_packed': columns [4, 16) of a TP rank cut a "
                                         "group of 8"));
    // A module the ignore list leaves dense must not be packed.
    const Status ignored = load_block(*ck, PackedInt4(8, {"re:.*w$"}), dir.path(), "w.weight",
                                      {2, 16}, {0, 2}, {0, 16}, out);
    ASSERT_FALSE(ignored.ok());
    EXPECT_THAT(ignored.message(), HasSubstr("lists 're:.*w$' as left dense"));
  }
  auto refused = [&](Result<SafetensorsCheckpoint> ck, const std::string& message) {
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    std::vector<float> out;
    const Status s =
        load_block(*ck, PackedInt4(8), dir.path(), "w.weight", {2, 16}, {0, 2}, {0, 16}, out);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  };
  refused(write({2, 16}, {2, 1}, {words[0], words[2]}),
          "'w.weight_packed': expected I32 [2, 2] (8 codes of 4 bits a word for [2, 16]), found "
          "I32 [2, 1]");
  refused(write({2, 24}, {2, 2}, words), "'w.weight_shape': says [2, 24], the model's weight is "
                                         "[2, 16]");
  const nlohmann::json gptq = {{"quant_method", "gptq"}};
  EXPECT_FALSE(WeightFormat::parse(&gptq, "config.json").ok());
  // Asymmetric fp8 has no zero points to read: refused by key.
  const nlohmann::json asymmetric_fp8 = nlohmann::json::parse(
      R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups":
          {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
          "symmetric": false, "strategy": "channel"}}}})");
  Result<WeightFormat> a = WeightFormat::parse(&asymmetric_fp8, "config.json");
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(),
              HasSubstr("quantization_config.config_groups.g.weights.symmetric: false is served "
                        "for pack-quantized int codes only"));
}

// Asymmetric int4 (compressed-tensors with symmetric false): weight = (q - z) x scale, the zero
// points z packed 8 to a word down the rows ([ceil(out / 8), groups]) as compressed-tensors'
// pack_to_int32(packed_dim=0) writes them; missing or misshapen zero points, and a TP part
// that cuts a word of them, are refused by name.
TEST(WeightFormat, AsymmetricInt4DequantizesWithPackedZeroPoints) {
  TempDir dir;
  const nlohmann::json config = nlohmann::json::parse(
      R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups":
          {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
          "symmetric": false, "strategy": "group", "group_size": 8}}}})");
  Result<WeightFormat> f = WeightFormat::parse(&config, "config.json");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_FALSE(f->symmetric);
  EXPECT_THAT(f->describe(), HasSubstr("zero points"));
  // 10 rows (two words of zero points, the second half full) of 16 columns, groups of 8.
  constexpr int kRows = 10, kCols = 16, kGroups = 2;
  auto q_of = [](int r, int c) { return ((r * 5 + c * 3) % 16) - 8; };
  auto z_of = [](int r, int g) { return ((r * 3 + g * 7) % 16) - 8; };
  std::vector<int32_t> codes(kRows * kCols / 8, 0), zeros(2 * kGroups, 0);
  std::vector<float> scales(kRows * kGroups);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      codes[r * 2 + c / 8] |=
          static_cast<int32_t>(static_cast<uint32_t>(q_of(r, c) + 8) << (4 * (c % 8)));
    }
    for (int g = 0; g < kGroups; ++g) {
      zeros[(r / 8) * kGroups + g] |=
          static_cast<int32_t>(static_cast<uint32_t>(z_of(r, g) + 8) << (4 * (r % 8)));
      scales[r * kGroups + g] = 0.25f * static_cast<float>(1 + (r + g) % 3);
    }
  }
  auto write = [&](const std::vector<int64_t>& zero_shape, bool with_zeros) {
    std::vector<RawTensor> tensors = {
        {"w.weight_scale", "BF16", {kRows, kGroups}, BF16Bytes(scales)},
        {"w.weight_packed", "I32", {kRows, 2}, I32Bytes(codes)}};
    if (with_zeros) {
      std::vector<int32_t> z = zeros;
      z.resize(static_cast<size_t>(zero_shape[0] * zero_shape[1]));
      tensors.push_back({"w.weight_zero_point", "I32", zero_shape, I32Bytes(z)});
    }
    WriteSafetensors(dir / "model.safetensors", tensors);
    return SafetensorsCheckpoint::open(dir.path());
  };
  {
    Result<SafetensorsCheckpoint> ck = write({2, kGroups}, true);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    for (parallel::Range rows : {parallel::Range{0, kRows}, parallel::Range{8, kRows}}) {
      std::vector<float> out;
      const Status s =
          load_block(*ck, *f, dir.path(), "w.weight", {kRows, kCols}, rows, {0, kCols}, out);
      ASSERT_TRUE(s.ok()) << s.message();
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        for (int c = 0; c < kCols; ++c) {
          const int r32 = static_cast<int>(r);
          EXPECT_EQ(
              out[(r - rows.begin) * kCols + c],
              static_cast<float>(q_of(r32, c) - z_of(r32, c / 8)) * scales[r * kGroups + c / 8])
              << "[" << r << ", " << c << "]";
        }
      }
    }
    // Stored bytes count the zero points with the codes and scales.
    Result<uint64_t> bytes =
        stored_quantized_bytes(*ck, *f, "w.weight", {kRows, kCols}, {0, kRows}, {0, kCols});
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    EXPECT_EQ(*bytes, codes.size() * 4 + scales.size() * 2 + 2 * kGroups * 4);
    std::vector<float> out;
    const Status cut =
        load_block(*ck, *f, dir.path(), "w.weight", {kRows, kCols}, {0, 5}, {0, kCols}, out);
    ASSERT_FALSE(cut.ok());
    EXPECT_THAT(cut.message(), HasSubstr("'w.weight_zero_point': rows [0, 5) of a TP rank cut a "
                                         "word of 8 zero points"));
  }
  auto refused = [&](Result<SafetensorsCheckpoint> ck, const std::string& message) {
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    std::vector<float> out;
    const Status s =
        load_block(*ck, *f, dir.path(), "w.weight", {kRows, kCols}, {0, kRows}, {0, kCols}, out);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  };
  refused(write({2, kGroups}, false),
          "its zero points 'w.weight_zero_point' (I32 [2, 2]) are missing, and the config is "
          "asymmetric");
  refused(write({1, kGroups}, true),
          "'w.weight_zero_point': expected I32 [2, 2] (8 zero points a word down the rows of "
          "[10, 16]), found I32 [1, 2]");
}

}  // namespace
}  // namespace kvrt::model
