#include "core/capacity/capacity.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/capacity/model_shape.h"

namespace kvrt::capacity {
namespace {

TEST(Capacity, SglangBudgetRule) {
  // 24 GiB, 15 GiB of weights, fraction 0.88: reserve 0.12 * 24 GiB; the rest after weights is
  // the KV budget, floored to whole pages.
  Budget b{24ull << 30, 15ull << 30, 0.88, ""};
  Result<Plan> p = plan(b, 2u << 20, 16);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const double kv = (24.0 - 15.0 - 0.12 * 24.0) * (1ull << 30);
  EXPECT_NEAR(static_cast<double>(p->kv_budget), kv, 1.0);
  EXPECT_EQ(p->num_pages, p->kv_budget / (2u << 20));
  EXPECT_EQ(p->max_total_num_tokens, p->num_pages * 16);
  EXPECT_EQ(p->bytes_per_token(), 131072u);
  EXPECT_EQ(p->concurrent_decodes(4096), p->max_total_num_tokens / 4096);
}

TEST(Capacity, RefusesWithTheShortfallInBytes) {
  Budget b{2ull << 30, 15ull << 30, 0.88, ""};
  Result<Plan> p = plan(b, 1u << 20, 16);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsNoMemory());
  // (15 GiB weights + 0.12 * 2 GiB reserve + one 1 MiB page) - 2 GiB
  const uint64_t shortfall =
      (15ull << 30) + static_cast<uint64_t>(0.12 * (2ull << 30)) + (1u << 20) - (2ull << 30);
  EXPECT_NE(p.status().message().find("short by " + std::to_string(shortfall) + " bytes"),
            std::string::npos)
      << p.status().message();
}

TEST(Capacity, RefusalNamesEveryTerm) {
  Budget b{2ull << 30, 15ull << 30, 0.875, ""};
  Result<Plan> p = plan(b, 1u << 20, 16);
  ASSERT_FALSE(p.ok());
  const std::string& m = p.status().message();
  for (const char* term :
       {"device memory 2.0 GiB (2147483648 bytes)", "weights per rank 15.0 GiB (16106127360 bytes)",
        "reserve 256.0 MiB (268435456 bytes)", "mem_fraction_static 0.875",
        "one KV page of 1.0 MiB (1048576 bytes)"}) {
    EXPECT_NE(m.find(term), std::string::npos) << term << " not in: " << m;
  }
}

TEST(Capacity, KvHeadsPerRank) {
  EXPECT_EQ(*kv_heads_per_rank(8, 2), 4u);
  EXPECT_EQ(*kv_heads_per_rank(4, 8), 1u);
  EXPECT_EQ(*kv_heads_per_rank(1, 8), 1u);
  Result<uint32_t> bad = kv_heads_per_rank(6, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("6 KV heads cannot be split over 4 TP ranks"),
            std::string::npos);
}

TEST(Capacity, GqaGeometryIsSplitOverRanks) {
  KvShape llama{32, 8, 128, 128, 0, 0};
  Result<kvrt_kv_geometry> g = kv_geometry(llama, 2, 16);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->num_layers, 32u);
  EXPECT_EQ(g->num_kv_heads, 4u);
  EXPECT_EQ(g->total_kv_heads, 8u);
  EXPECT_EQ(g->k_head_dim, 128u);
  EXPECT_EQ(g->v_head_dim, 128u);
  EXPECT_EQ(g->page_size, 16u);
  EXPECT_EQ(g->tp_size, 2u);
  EXPECT_EQ(kv_geometry(llama, 16, 16)->num_kv_heads, 1u);  // more ranks than heads: replicated
  Result<kvrt_kv_geometry> bad = kv_geometry({32, 6, 128, 128, 0, 0}, 4, 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("6 KV heads cannot be split over 4"), std::string::npos);
  EXPECT_FALSE(kv_geometry({32, 8, 0, 128, 0, 0}, 1, 16).ok());
}

TEST(Capacity, MlaLatentIsOneHeadOnEveryRank) {
  // Kimi-K2: 61 layers of a 512 + 64 latent; V shares K's storage; TP does not divide it.
  KvShape kimi{61, 64, 0, 0, 512, 64};
  for (uint32_t tp : {1u, 8u}) {
    Result<kvrt_kv_geometry> g = kv_geometry(kimi, tp, 64);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->num_layers, 61u);
    EXPECT_EQ(g->num_kv_heads, 1u);
    EXPECT_EQ(g->k_head_dim, 576u);
    EXPECT_EQ(g->v_head_dim, 0u);
    EXPECT_EQ(g->tp_size, tp);
  }
  EXPECT_FALSE(kv_geometry({61, 0, 0, 0, 512, 0}, 1, 16).ok());  // a latent needs its rope part
}

TEST(Capacity, ReportPrintsEveryTerm) {
  // 80 GiB, 40 GiB of weights per rank, fraction 0.875: reserve 10 GiB, KV budget 30 GiB.
  Budget b{80ull << 30, 40ull << 30, 0.875, ""};
  StoreCapacity c;
  c.store = "kv_bf16_paged";
  c.page_bytes = 70272ull * 16;
  c.plan = *plan(b, c.page_bytes, 16);
  ASSERT_EQ(c.plan.num_pages, 28649u);  // 32212254720 / 1124352
  std::string r = format_report(c, b);
  for (const char* line : {
           "capacity of kv_bf16_paged (per TP rank):\n",
           "  device memory          80.0 GiB (85899345920 bytes)\n",
           "  weights per rank       40.0 GiB (42949672960 bytes)\n",
           "  reserve                10.0 GiB (10737418240 bytes) = device memory * (1 - "
           "mem_fraction_static 0.875)\n",
           "  KV budget              30.0 GiB (32212254720 bytes) = device memory - weights - "
           "reserve\n",
           "  bytes per token        70272\n",
           "  page size              16 tokens\n",
           "  page bytes             1.1 MiB (1124352 bytes)\n",
           "  num pages              28649 = floor(KV budget / page bytes)\n",
           "  max_total_num_tokens   458384 = num pages * page size\n",
           "  host tier tokens       none\n",
           "  concurrent decodes     @1K 447, @4K 111, @16K 27 (max_total_num_tokens / mean live "
           "length)\n",
       }) {
    EXPECT_NE(r.find(line), std::string::npos) << "missing: " << line << "in:\n" << r;
  }
  c.host_tier = true;
  c.host_tier_sized = true;
  c.host_tier_tokens = 2 * 458384;
  EXPECT_NE(format_report(c, b).find("  host tier tokens       916768 (evicted prefixes kept for "
                                     "reuse; no extra concurrent decodes)\n"),
            std::string::npos)
      << format_report(c, b);
}

TEST(ModelShape, Llama3_8BNamedShape) {
  Result<ModelShape> s = read_model_shape("llama3-8b-shape");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->kv.layers, 32u);
  EXPECT_EQ(s->kv.kv_heads, 8u);
  EXPECT_EQ(s->kv.head_dim, 128u);
  EXPECT_EQ(s->kv.v_head_dim, 128u);
  EXPECT_FALSE(s->kv.mla());
  EXPECT_EQ(s->parameters, 8030261248u);  // Llama-3-8B's published count
  EXPECT_EQ(*weight_bytes(*s, "auto"), 8030261248u * 2);
  EXPECT_EQ(*weight_bytes(*s, "f32"), 8030261248u * 4);
}

TEST(ModelShape, PresetsAreServedInBf16) {
  Result<ModelShape> s = read_model_shape("synth-76m");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->kv.layers, 12u);
  EXPECT_EQ(s->kv.kv_heads, 4u);
  EXPECT_EQ(s->kv.head_dim, 64u);
  EXPECT_EQ(*weight_bytes(*s, "auto"), 75909888u * 2);
}

TEST(ModelShape, KimiK2IsMlaWithFp8Projections) {
  Result<ModelShape> s = read_model_shape("kimi-k2-shape");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->kv.mla());
  EXPECT_EQ(s->kv.layers, 61u);
  EXPECT_EQ(s->kv.kv_lora_rank, 512u);
  EXPECT_EQ(s->kv.qk_rope_head_dim, 64u);
  // About 1.03e12 parameters, nearly all in fp8 projections: embeddings, lm_head, norms,
  // routers and their correction biases stay in bf16.
  const uint64_t total = s->parameters + s->fp8_parameters;
  EXPECT_NEAR(static_cast<double>(total), 1.0264e12, 0.001e12);
  EXPECT_EQ(s->parameters, 2ull * 163840 * 7168 + 60ull * 384 * (7168 + 1) +
                               61ull * (1536 + 512 + 2 * 7168) + 7168);
  EXPECT_EQ(*weight_bytes(*s, "auto"), s->parameters * 2 + s->fp8_parameters);
  EXPECT_EQ(*weight_bytes(*s, "bf16"), total * 2);
}

TEST(ModelShape, DeepSeekV3CountMatchesItsPublished671B) {
  // DeepSeek-V3's config.json shape fields (the MTP layer is left out, as a server does).
  Result<ModelShape> s = parse_model_shape(R"({
      "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
      "first_k_dense_replace": 3, "num_attention_heads": 128, "num_key_value_heads": 128,
      "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
      "n_shared_experts": 1, "vocab_size": 129280, "num_nextn_predict_layers": 1})",
                                           "deepseek-v3.json");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->fp8_parameters, 0u);  // no quantization_config: all at the weights' dtype
  EXPECT_NEAR(static_cast<double>(s->parameters), 671e9, 0.5e9);
}

TEST(ModelShape, ReadsADirectoryAndATextConfig) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvrt_capacity_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  // A multimodal wrapper around a MoE the count does not cover: the checkpoint's own total.
  std::ofstream(dir / "config.json") << R"({"architectures": ["SomeVLForConditionalGeneration"],
      "text_config": {"num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "hidden_size": 4096, "head_dim": 128,
                      "intermediate_size": 12288, "vocab_size": 151936, "num_experts": 128,
                      "torch_dtype": "bfloat16"}})";
  Result<ModelShape> s = read_model_shape(dir.string());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->architecture, "SomeVLForConditionalGeneration");
  EXPECT_EQ(s->kv.layers, 48u);
  EXPECT_EQ(s->kv.kv_heads, 4u);
  EXPECT_EQ(s->kv.head_dim, 128u);
  EXPECT_EQ(s->parameters, 0u);
  Result<uint64_t> none = weight_bytes(*s, "auto");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("give --weights-gib"), std::string::npos);

  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 61064245248}, "weight_map": {}})";
  s = read_model_shape(dir.string());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*weight_bytes(*s, "auto"), 61064245248u);
  std::filesystem::remove_all(dir);
}

// One parser (model::read_hf_config) serves the runtime and the planner: the real tiny
// DeepSeek-V3 checkpoint reads as MLA with its experts, the planner's geometry is the latent,
// the runtime runs it, and its weights are what the planner counts.
TEST(ModelShape, OneParserPlansWhatTheRuntimeRuns) {
  const std::string dir =
      std::string(std::getenv("KVRT_SOURCE_DIR") ? std::getenv("KVRT_SOURCE_DIR") : ".") +
      "/../shared/models/tiny-deepseek-v3";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found";
  Result<model::ModelConfig> c = model::read_hf_config_file(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c->mla.kv_lora_rank, 32);
  EXPECT_EQ(c->mla.qk_rope_head_dim, 8);
  EXPECT_EQ(c->mla.q_lora_rank, 32);
  EXPECT_EQ(c->moe.n_routed_experts, 8);
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  Result<ModelShape> s = read_model_shape(dir);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->kv.mla());
  Result<kvrt_kv_geometry> g = kv_geometry(kv_shape(*c), 2, 16);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->k_head_dim, 40u);  // the latent of 32 plus the rope dims, on every rank
  EXPECT_EQ(g->v_head_dim, 0u);
  EXPECT_EQ(g->v_width, 32u);
  Status runnable = model::check_runnable(*c, "config.json");
  EXPECT_TRUE(runnable.ok()) << runnable.message();
  EXPECT_EQ(s->parameters + s->fp8_parameters, static_cast<uint64_t>(c->parameter_count()));
}

// `kvrt capacity --model DIR` on the Qwen3 and Llama-3 checkpoints (explicit head_dim, q/k norms,
// rope_scaling llama3): the KV shape the runtime runs and, in bf16 as stored, the weights the
// checkpoint holds (its bytes less the safetensors header).
TEST(ModelShape, PlansTinyQwen3AndTinyLlama3) {
  const std::string models =
      std::string(std::getenv("KVRT_SOURCE_DIR") ? std::getenv("KVRT_SOURCE_DIR") : ".") +
      "/../shared/models/";
  struct Case {
    const char* name;
    const char* architecture;
    uint32_t head_dim;
  };
  for (const Case& m :
       {Case{"tiny-qwen3", "Qwen3ForCausalLM", 16}, Case{"tiny-llama3", "LlamaForCausalLM", 8}}) {
    SCOPED_TRACE(m.name);
    const std::string dir = models + m.name;
    if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found";
    Result<ModelShape> s = read_model_shape(dir);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->architecture, m.architecture);
    EXPECT_EQ(s->torch_dtype, "bfloat16");
    EXPECT_EQ(s->kv.layers, 2u);
    EXPECT_EQ(s->kv.kv_heads, 2u);
    EXPECT_EQ(s->kv.head_dim, m.head_dim);
    EXPECT_EQ(s->kv.v_head_dim, m.head_dim);
    Result<model::ModelConfig> c = model::read_hf_config_file(dir + "/config.json");
    ASSERT_TRUE(c.ok()) << c.status().message();
    Status runnable = model::check_runnable(*c, "config.json");
    EXPECT_TRUE(runnable.ok()) << runnable.message();
    EXPECT_EQ(s->parameters, static_cast<uint64_t>(c->parameter_count()));
    Result<uint64_t> bytes = weight_bytes(*s, "auto");
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    uint64_t header = 0;
    std::ifstream(dir + "/model.safetensors", std::ios::binary)
        .read(reinterpret_cast<char*>(&header), sizeof(header));  // little-endian, as this host
    EXPECT_EQ(*bytes, s->checkpoint_bytes - 8 - header);
    Result<kvrt_kv_geometry> g = kv_geometry(s->kv, 2, 16);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->num_kv_heads, 1u);  // one of the two KV heads per rank at TP 2
    EXPECT_EQ(g->k_head_dim, m.head_dim);
  }
}

TEST(ModelShape, UnknownNamesListTheKnownOnes) {
  Result<ModelShape> s = read_model_shape("llama-3-8b");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("synth-76m"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("kimi-k2-shape"), std::string::npos);
  Result<ModelShape> bad = parse_model_shape(R"({"num_hidden_layers": "61"})", "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("x.json: num_hidden_layers"), std::string::npos)
      << bad.status().message();
}

TEST(Capacity, FormatsBytes) {
  EXPECT_EQ(format_bytes(980), "980 B");
  EXPECT_EQ(format_bytes(24ull << 30), "24.0 GiB");
}

}  // namespace
}  // namespace kvrt::capacity
