// attn_cpu through the C ABI, as the core uses it: K/V written through the shipped stores into
// shuffled pages, attention run, and every output element compared with a naive attention in
// double over the store's own dequantized K/V (conformance::check_attention_case; the tolerance
// is 1e-4 of the values' scale, so the attention arithmetic must be exact to f32 rounding while
// quantization error stays the store's business). Covers sequence lengths across page
// boundaries, page sizes 1..128, GQA ratios 1..8, head dims 8..576, decode split over chunks,
// causal prefill after earlier context, mixed batches, bf16 Q and output, the gather fallback,
// V-is-K latents, and the API's refusals; run() is checked to allocate nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"
#include "sdk/conformance/attention_conformance.h"

// Counts operator new while g_count_allocations is set (the plugin's C++ allocations resolve to
// these), to check that run() allocates nothing.
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

// A malloc-based replacement pair, as the standard allows; GCC cannot tell that the free() in
// delete pairs with this new's malloc().
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t bytes) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace kvrt::plugin {
namespace {

using conformance::AttentionCase;
using conformance::AttentionSequence;

class AttnCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    registry_ = std::make_unique<Registry>();
    registry_->set_config_source([this](const std::string& name) -> const toml::table* {
      return name == "attn_cpu" ? &attention_table_ : nullptr;
    });
    Result<const LoadedPlugin*> attn = registry_->load("attn_cpu");
    ASSERT_TRUE(attn.ok()) << attn.status().message();
    attn_ = *attn;
    per_token_head_.insert("scale_mode", "per_token_head");
    per_tensor_.insert("scale_mode", "per_tensor");
    per_tensor_.insert("k_scale", 0.05);
    per_tensor_.insert("v_scale", 0.03);
  }
  void TearDown() override { unsetenv("KVRT_PLUGIN_PATH"); }

  // "" when attn_cpu matches the naive reference on the case.
  std::string check(const AttentionCase& c) {
    return conformance::check_attention_case(*registry_, *attn_, c, seed_++);
  }

  // Decodes of the given KV lengths, one batch.
  static std::vector<AttentionSequence> decodes(std::initializer_list<uint32_t> lengths) {
    std::vector<AttentionSequence> seqs;
    for (uint32_t n : lengths) seqs.push_back({n, 1});
    return seqs;
  }

  std::unique_ptr<Registry> registry_;
  const LoadedPlugin* attn_ = nullptr;
  toml::table attention_table_;  // [attention.attn_cpu]
  toml::table per_token_head_, per_tensor_;
  uint32_t seed_ = 1;
};

TEST_F(AttnCpu, DescribesItselfAsAnAttentionPluginTakingF32AndBf16Queries) {
  EXPECT_EQ(attn_->kind(), KVRT_PLUGIN_ATTENTION);
  EXPECT_EQ(attn_->name, "attn_cpu");
  EXPECT_EQ(attn_->input_dtype_names(), "f32,bf16");
  ASSERT_EQ(attn_->options.size(), 1u);
  EXPECT_STREQ(attn_->options[0].name, "decode_chunk_tokens");
}

// Decode context parallelism (ABI 1.4): a random batch of prefill chunks and decodes whose tokens
// are dealt out over 2 and 4 shards, each in a store of its own, attended with plan_sharded +
// run_lse and merged by log-sum-exp, equals the attention over the whole within f32 rounding
// (check_attention_case's bound, over each shard's own dequantized K/V), for every shipped store
// -- the 4-bit one and the host tier included -- at page sizes 1 and 16.
TEST_F(AttnCpu, ShardedAttentionMergedEqualsTheWholeForEveryStore) {
  std::mt19937 rng(45);
  for (const char* store :
       {"kv_bf16_paged", "kv_f32_paged", "kv_fp8_e4m3", "kv_int4", "kv_host_tiered"}) {
    for (uint32_t page_size : {1u, 16u}) {
      for (uint32_t shards : {2u, 4u}) {
        AttentionCase c;
        c.store = store;
        c.store_config = std::string(store) == "kv_fp8_e4m3" ? &per_token_head_ : nullptr;
        c.page_size = page_size;
        c.shards = shards;
        c.sequences.clear();
        for (int i = 0; i < 6; ++i) {  // decodes and prefill chunks of random lengths
          const uint32_t kv = 1 + rng() % 400;
          c.sequences.push_back({kv, i % 2 == 0 ? 1 : 1 + static_cast<uint32_t>(rng() % kv) % 40});
        }
        EXPECT_EQ(check(c), "") << store << ", page " << page_size << ", " << shards << " shards";
      }
    }
  }
}

TEST_F(AttnCpu, SequenceLengthsAcrossPageBoundaries) {
  AttentionCase c;
  for (uint32_t page_size : {1u, 2u, 16u, 128u}) {
    c.page_size = page_size;
    c.sequences = decodes({1, 2, 15, 16, 17, 100, 127, 128, 129, 1000, 1025});
    EXPECT_EQ(check(c), "") << "page size " << page_size;
  }
}

TEST_F(AttnCpu, PageSizesOneTo128) {
  AttentionCase c;
  for (uint32_t page_size : {1u, 3u, 7u, 8u, 32u, 64u, 128u}) {
    c.page_size = page_size;
    c.sequences = {{1, 1}, {page_size, 1}, {2 * page_size + 1, 1}, {300, 1}, {90, 20}};
    EXPECT_EQ(check(c), "") << "page size " << page_size;
  }
}

TEST_F(AttnCpu, GqaRatiosOneToEight) {
  AttentionCase c;
  c.sequences = {{5, 1}, {200, 1}, {50, 17}};
  for (uint32_t kv_heads : {1u, 2u, 4u}) {
    for (uint32_t ratio : {1u, 2u, 3u, 4u, 5u, 8u}) {
      c.num_kv_heads = kv_heads;
      c.num_q_heads = kv_heads * ratio;
      EXPECT_EQ(check(c), "") << kv_heads << " KV heads, ratio " << ratio;
    }
  }
}

TEST_F(AttnCpu, HeadDimsEightTo256AndUnequalQkAndV) {
  AttentionCase c;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.sequences = {{1, 1}, {40, 1}, {300, 1}, {30, 9}};
  for (uint32_t dim : {8u, 16u, 24u, 40u, 64u, 80u, 96u, 128u, 256u}) {
    c.qk_head_dim = c.v_head_dim = dim;
    EXPECT_EQ(check(c), "") << "head dim " << dim;
  }
  c.qk_head_dim = 192;  // as DeepSeek's non-latent heads: Q.K over 192, V of 128
  c.v_head_dim = 128;
  EXPECT_EQ(check(c), "");
  c.qk_head_dim = 64;
  c.v_head_dim = 256;
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, DecodeSplitIntoChunksMatchesOnePass) {
  // decode_chunk_tokens from tiny (dozens of chunks per sequence, chunk edges inside pages
  // rounded to whole pages) to larger than any context (no split); rows of up to 4 split,
  // 5 do not.
  AttentionCase c;
  c.sequences = {{900, 1}, {3, 1}, {700, 4}, {700, 5}, {257, 2}};
  for (int64_t chunk : {1, 16, 100, 1 << 20}) {
    attention_table_.insert_or_assign("decode_chunk_tokens", chunk);
    c.page_size = chunk == 100 ? 16 : 7;
    EXPECT_EQ(check(c), "") << "decode_chunk_tokens " << chunk;
  }
}

TEST_F(AttnCpu, CausalPrefillOverEarlierContext) {
  AttentionCase c;
  for (uint32_t page_size : {1u, 16u}) {
    c.page_size = page_size;
    // Whole prompts, and chunks after earlier context; 15, 16, 17 and 33 rows straddle the
    // plugin's 16-row blocks.
    for (auto seqs : std::vector<std::vector<AttentionSequence>>{
             {{100, 100}}, {{400, 37}}, {{64, 16}}, {{15, 15}, {16, 16}, {17, 17}, {50, 33}}}) {
      c.sequences = seqs;
      EXPECT_EQ(check(c), "") << "page size " << page_size;
    }
  }
  c.q_scale = 4.0f;  // a sharp softmax: the diagonal dominates, so a mask off by one shows
  c.sequences = {{200, 40}};
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, NonCausalRowsSeeEveryPosition) {
  AttentionCase c;
  c.causal = false;
  c.sequences = {{40, 7}, {300, 1}, {20, 20}};
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, MixedBatchOfPrefillChunksDecodesAndIdleSequences) {
  AttentionCase c;
  c.sequences = {{500, 1}, {64, 64}, {2, 1}, {200, 31}, {50, 0}, {0, 0}, {17, 1}, {1300, 3}};
  EXPECT_EQ(check(c), "");
  c.page_size = 1;
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, LargeDecodeBatch) {
  AttentionCase c;
  c.num_q_heads = 16;
  c.num_kv_heads = 4;
  std::mt19937 rng(5);
  for (int i = 0; i < 32; ++i) c.sequences.push_back({50 + static_cast<uint32_t>(rng() % 400), 1});
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, Bf16QueriesAndOutputsWithPaddedRows) {
  AttentionCase c;
  c.sequences = {{90, 1}, {40, 12}, {700, 1}};
  c.row_padding = 8;
  for (kvrt_dtype q : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
    for (kvrt_dtype out : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
      c.q_dtype = q;
      c.out_dtype = out;
      EXPECT_EQ(check(c), "") << "q " << dtype_name(q) << " out " << dtype_name(out);
    }
  }
}

TEST_F(AttnCpu, Fp8StoresInBothScaleModes) {
  AttentionCase c;
  c.store = "kv_fp8_e4m3";
  for (const toml::table* config : {&per_token_head_, &per_tensor_}) {
    c.store_config = config;
    for (uint32_t dim : {16u, 128u}) {
      c.qk_head_dim = c.v_head_dim = dim;
      c.sequences = {{1, 1}, {17, 1}, {1100, 1}, {60, 13}};
      EXPECT_EQ(check(c), "") << *config << " dim " << dim;
    }
  }
}

// kv_f32_paged keeps K and V exactly, so the naive attention in double reads the very values
// attn_cpu reads, and what is left is f32 arithmetic: each score is a dot product of length
// d <= 576 whose rounding error is at most d * 2^-24 ~ 3.4e-5 of the sum of |q_i k_i| (the
// order of summation changes only which terms round), the online softmax's rescalings add a few
// ulps, and the output is a convex combination of V rows. That stays under the suite's 1e-4 of
// the values' scale, the bound check_attention_case applies.
TEST_F(AttnCpu, F32StoreMatchesTheNaiveAttentionToF32Rounding) {
  AttentionCase c;
  c.store = "kv_f32_paged";
  for (uint32_t dim : {16u, 64u, 128u, 576u}) {
    c.qk_head_dim = c.v_head_dim = dim;
    c.sequences = {{1, 1}, {17, 1}, {1100, 1}, {60, 13}};
    EXPECT_EQ(check(c), "") << "dim " << dim;
  }
  c.qk_head_dim = 64;
  c.v_head_dim = 64;
  c.force_gather = true;  // and through its gather()
  EXPECT_EQ(check(c), "");
}

// Calibrated per-layer scales (kvrt eval --calibrate): each layer's layout carries its own K and
// V scale, and each layer's attention must read its own.
TEST_F(AttnCpu, Fp8PerTensorScalesThatDifferByLayer) {
  toml::table calibrated;
  calibrated.insert("k", toml::array{0.02, 0.05, 0.11});
  calibrated.insert("v", toml::array{0.004, 0.03, 0.009});
  toml::table config;
  config.insert("scale_mode", "per_tensor");
  config.insert("calibrated", calibrated);
  AttentionCase c;
  c.store = "kv_fp8_e4m3";
  c.store_config = &config;
  c.layers = 3;
  c.sequences = {{1, 1}, {130, 1}, {40, 9}};
  EXPECT_EQ(check(c), "");
  c.force_gather = true;
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, GatherFallbackForLayoutsItCannotRead) {
  AttentionCase c;
  c.force_gather = true;
  c.sequences = {{1, 1}, {600, 1}, {70, 20}};
  for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3"}) {
    c.store = store;
    EXPECT_EQ(check(c), "") << store;
  }
  c.v_head_dim = 0;  // V is K: gather() gives no V
  EXPECT_EQ(check(c), "");
}

TEST_F(AttnCpu, LatentWhereVIsK) {
  AttentionCase c;
  c.num_q_heads = 8;
  c.num_kv_heads = 1;
  c.qk_head_dim = 576;  // DeepSeek-V3 / Kimi latent: 512 + 64
  c.v_head_dim = 0;
  c.page_size = 64;
  c.sequences = {{1, 1}, {300, 1}, {50, 10}};
  for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3"}) {
    c.store = store;
    EXPECT_EQ(check(c), "") << store;
  }
}

// MLA's latent: one row of kv_lora_rank + qk_rope per token, V its first kv_lora_rank values,
// every query head over it (the absorbed form's attention), against the naive attention on
// random batches: lengths across page boundaries, page sizes 1 to 128, decode (split over
// chunks when long) and prefill after earlier context, every store, the gather path too.
TEST_F(AttnCpu, MlaLatentWithVItsFirstValues) {
  std::mt19937 rng(11);
  const uint32_t pages[] = {1, 2, 16, 64, 128};
  struct Shape {
    uint32_t heads, latent, rope;
  };
  for (const Shape shape : {Shape{16, 512, 64}, Shape{4, 32, 8}, Shape{2, 32, 8}}) {
    for (uint32_t page_size : pages) {
      AttentionCase c;
      c.num_q_heads = shape.heads;
      c.num_kv_heads = 1;
      c.qk_head_dim = shape.latent + shape.rope;
      c.v_head_dim = 0;
      c.v_width = shape.latent;
      c.page_size = page_size;
      std::uniform_int_distribution<uint32_t> len(1, 3 * page_size + 40);
      const uint32_t a = len(rng), b = len(rng) + 8;
      c.sequences = {{a, 1}, {b, std::min<uint32_t>(b, 7)}, {page_size, 1}, {page_size + 1, 1}};
      for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_f32_paged"}) {
        c.store = store;
        EXPECT_EQ(check(c), "") << store << " page " << page_size;
      }
      c.store = "kv_bf16_paged";
      c.force_gather = true;
      EXPECT_EQ(check(c), "") << "gather, page " << page_size;
    }
  }
}

// The weight-absorbed MLA the DeepSeek-V3 architecture runs (queries mapped into the latent
// space by W_UK, attention over the cached [latent | rope key] rows with V the latent, out by
// W_UV) against a naive MLA in double that expands every cached latent into per-head K and V
// (K = [W_UK c | k_pe], V = W_UV c) from the f32 latents the store holds: random weights,
// latents and queries, causal rows across page boundaries, page sizes 1 to 128.
TEST_F(AttnCpu, AbsorbedMlaEqualsTheNaiveExpandedOne) {
  constexpr uint32_t H = 4, L = 32, R = 8, N = 16, V = 16, D = L + R;
  const float scale = 1.0f / std::sqrt(static_cast<float>(N + R));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  auto random = [&](size_t n, float sd) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng) * sd;
    return v;
  };
  Result<const LoadedPlugin*> store_plugin = registry_->load_kv_store("kv_f32_paged");
  ASSERT_TRUE(store_plugin.ok()) << store_plugin.status().message();
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  const kvrt_attention_api& api = attn_->attention;
  for (uint32_t page_size : {1u, 3u, 16u, 128u}) {
    SCOPED_TRACE("page size " + std::to_string(page_size));
    // Sequences (KV length, query rows): decodes at and around page boundaries, a prefill
    // chunk after earlier context.
    const std::vector<std::pair<uint32_t, uint32_t>> seqs = {
        {1, 1}, {page_size, 1}, {page_size + 1, 1}, {2 * page_size + 37, 6}, {150, 1}};
    std::vector<int32_t> qo{0}, indptr{0}, pages, last;
    std::vector<int64_t> slots;
    int32_t next_page = 0;
    for (const auto& [kv_len, q_len] : seqs) {
      const uint32_t n = (kv_len + page_size - 1) / page_size;
      for (uint32_t p = 0; p < n; ++p) pages.push_back(next_page++);
      for (uint32_t t = 0; t < kv_len; ++t) {
        slots.push_back(int64_t{pages[indptr.back() + t / page_size]} * page_size + t % page_size);
      }
      qo.push_back(qo.back() + static_cast<int32_t>(q_len));
      indptr.push_back(static_cast<int32_t>(pages.size()));
      last.push_back(static_cast<int32_t>((kv_len - 1) % page_size + 1));
    }
    std::shuffle(pages.begin(), pages.end(), rng);  // page ids in no order (slots follow them)
    slots.clear();
    for (size_t b = 0; b < seqs.size(); ++b) {
      for (uint32_t t = 0; t < seqs[b].first; ++t) {
        slots.push_back(int64_t{pages[indptr[b] + t / page_size]} * page_size + t % page_size);
      }
    }
    // The store: one latent row per token (the geometry the runtime gives an MLA model).
    Result<kvrt_kv_geometry> geometry =
        capacity::kv_geometry({.layers = 1, .kv_lora_rank = L, .qk_rope_head_dim = R}, 1,
                              page_size, KVRT_DTYPE_F32);
    ASSERT_TRUE(geometry.ok()) << geometry.status().message();
    const kvrt_kv_geometry& g = *geometry;
    kvrt_kv_store* store = nullptr;
    ASSERT_EQ(kv.create((*store_plugin)->host_api(), &g, static_cast<uint64_t>(next_page), nullptr,
                        &store),
              KVRT_OK)
        << take_last_error();
    const std::vector<float> rows = random(slots.size() * D, 1.0f);  // [c | roped k_pe]
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.dtype = KVRT_DTYPE_F32;
    w.num_tokens = static_cast<uint32_t>(slots.size());
    w.slots = slots.data();
    w.k = rows.data();
    ASSERT_EQ(kv.write(store, &w), KVRT_OK) << take_last_error();
    kvrt_kv_layout layout{};
    layout.struct_size = sizeof(layout);
    ASSERT_EQ(kv.layout(store, 0, &layout), KVRT_OK);

    // Weights and queries: W_UK [H][N][L], W_UV [H][V][L], q [rows][H][N + R].
    const std::vector<float> uk = random(size_t{H} * N * L, 0.2f), uv = random(size_t{H} * V * L, 0.2f);
    const size_t total_rows = static_cast<size_t>(qo.back());
    const std::vector<float> q = random(total_rows * H * (N + R), 1.0f);
    std::vector<float> absorbed(total_rows * H * D, 0.0f);
    for (size_t r = 0; r < total_rows; ++r) {
      for (uint32_t h = 0; h < H; ++h) {
        const float* qh = q.data() + (r * H + h) * (N + R);
        float* a = absorbed.data() + (r * H + h) * D;
        for (uint32_t j = 0; j < L; ++j) {
          for (uint32_t n = 0; n < N; ++n) a[j] += qh[n] * uk[(size_t{h} * N + n) * L + j];
        }
        std::copy_n(qh + N, R, a + L);
      }
    }
    kvrt_attention_params p{};
    p.struct_size = sizeof(p);
    p.num_q_heads = H;
    p.num_kv_heads = 1;
    p.qk_head_dim = D;
    p.v_head_dim = L;
    p.softmax_scale = scale;
    p.device = g.device;
    kvrt_attention* attn = nullptr;
    ASSERT_EQ(api.create(attn_->host_api(), &p, nullptr, &attn), KVRT_OK) << take_last_error();
    kvrt_attention_batch batch{sizeof(batch), static_cast<uint32_t>(seqs.size()), page_size, 1,
                               qo.data(),     indptr.data(),                      pages.data(),
                               last.data()};
    uint64_t bytes = 0;
    ASSERT_EQ(api.workspace_size(attn, &batch, &bytes), KVRT_OK);
    std::vector<uint8_t> workspace(bytes);
    ASSERT_EQ(api.plan(attn, &batch, workspace.data(), bytes), KVRT_OK) << take_last_error();
    std::vector<float> latent_out(total_rows * H * L);
    kvrt_attention_run_args args{};
    args.struct_size = sizeof(args);
    args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
    args.layout = &layout;
    args.store_api = &kv;
    args.store = store;
    args.q = absorbed.data();
    args.out = latent_out.data();
    ASSERT_EQ(api.run(attn, &args), KVRT_OK) << take_last_error();

    // The naive MLA, row by row, and the absorbed output mapped out by W_UV.
    size_t slot_base = 0;
    for (size_t b = 0; b < seqs.size(); ++b) {
      const auto [kv_len, q_len] = seqs[b];
      for (uint32_t i = 0; i < q_len; ++i) {
        const size_t r = static_cast<size_t>(qo[b]) + i;
        const uint32_t visible = kv_len - q_len + i + 1;
        for (uint32_t h = 0; h < H; ++h) {
          const float* qh = q.data() + (r * H + h) * (N + R);
          std::vector<double> score(visible), want(V, 0.0);
          double max = -INFINITY, sum = 0, v_max = 0;
          for (uint32_t t = 0; t < visible; ++t) {
            const float* c = rows.data() + (slot_base + t) * D;
            double dot = 0;
            for (uint32_t n = 0; n < N; ++n) {
              double k = 0;  // K-nope of head h at t: W_UK[h] c
              for (uint32_t j = 0; j < L; ++j) k += double{uk[(size_t{h} * N + n) * L + j]} * c[j];
              dot += qh[n] * k;
            }
            for (uint32_t j = 0; j < R; ++j) dot += double{qh[N + j]} * c[L + j];
            score[t] = dot * scale;
            max = std::max(max, score[t]);
          }
          for (double& x : score) sum += (x = std::exp(x - max));
          for (uint32_t t = 0; t < visible; ++t) {
            const float* c = rows.data() + (slot_base + t) * D;
            for (uint32_t d = 0; d < V; ++d) {
              double v = 0;  // V of head h at t: W_UV[h] c
              for (uint32_t j = 0; j < L; ++j) v += double{uv[(size_t{h} * V + d) * L + j]} * c[j];
              want[d] += score[t] / sum * v;
              v_max = std::max(v_max, std::fabs(v));
            }
          }
          const float* o = latent_out.data() + (r * H + h) * L;
          for (uint32_t d = 0; d < V; ++d) {
            double got = 0;
            for (uint32_t j = 0; j < L; ++j) got += double{uv[(size_t{h} * V + d) * L + j]} * o[j];
            ASSERT_NEAR(got, want[d], 1e-4 * v_max)
                << "sequence " << b << " row " << i << " head " << h << " element " << d;
          }
        }
      }
      slot_base += kv_len;
    }
    api.destroy(attn);
    kv.destroy(store);
  }
}

TEST_F(AttnCpu, ContiguousPagesAndManyLayersOnOnePlan) {
  AttentionCase c;
  c.shuffle_pages = false;
  c.layers = 3;
  c.sequences = {{400, 1}, {30, 10}};
  EXPECT_EQ(check(c), "");
}

// ---- the API directly ---------------------------------------------------------------------

// A store of `pages` pages with random K/V and an attn_cpu handle over it.
class AttnCpuApi : public AttnCpu {
 protected:
  void make(const std::string& store, const toml::table* store_config, uint32_t pages,
            uint32_t page_size = 16) {
    Result<const LoadedPlugin*> loaded = registry_->load_kv_store(store);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    kv_ = &(*loaded)->kv;
    kvrt_kv_geometry g{};
    g.struct_size = sizeof(g);
    g.num_layers = 1;
    g.num_kv_heads = g.total_kv_heads = 2;
    g.k_head_dim = g.v_head_dim = 64;
    g.page_size = page_size;
    g.input_dtype = KVRT_DTYPE_F32;
    g.tp_size = 1;
    g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
    ASSERT_EQ(kv_->create((*loaded)->host_api(), &g, pages, as_config(store_config), &store_),
              KVRT_OK)
        << take_last_error();
    std::vector<int64_t> slots(size_t{pages} * page_size);
    std::iota(slots.begin(), slots.end(), 0);
    std::vector<float> k(slots.size() * 128), v(k.size());
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.dtype = KVRT_DTYPE_F32;
    w.num_tokens = static_cast<uint32_t>(slots.size());
    w.slots = slots.data();
    w.k = k.data();
    w.v = v.data();
    ASSERT_EQ(kv_->write(store_, &w), KVRT_OK) << take_last_error();
    layout_.struct_size = sizeof(layout_);
    ASSERT_EQ(kv_->layout(store_, 0, &layout_), KVRT_OK);
    ASSERT_EQ(create(params(8, 2, 64, 64), &attn_handle_), KVRT_OK) << take_last_error();
  }
  void TearDown() override {
    if (attn_handle_ != nullptr) api().destroy(attn_handle_);
    if (store_ != nullptr) kv_->destroy(store_);
    AttnCpu::TearDown();
  }

  const kvrt_attention_api& api() const { return attn_->attention; }
  static kvrt_attention_params params(uint32_t q, uint32_t kv, uint32_t qk, uint32_t v) {
    kvrt_attention_params p{};
    p.struct_size = sizeof(p);
    p.num_q_heads = q;
    p.num_kv_heads = kv;
    p.qk_head_dim = qk;
    p.v_head_dim = v;
    p.softmax_scale = 0.125f;
    p.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
    return p;
  }
  kvrt_status create(const kvrt_attention_params& p, kvrt_attention** out) {
    return api().create(attn_->host_api(), &p, as_config(&attention_table_), out);
  }

  // One decode per sequence over `kv_lens` tokens, pages 0, 1, 2, ... in turn: batch_ and
  // args_, then plan().
  void plan(std::vector<uint32_t> kv_lens) {
    describe_batch(kv_lens);
    uint64_t bytes = 0;
    ASSERT_EQ(api().workspace_size(attn_handle_, &batch_, &bytes), KVRT_OK) << take_last_error();
    workspace_.assign(bytes, 0);
    ASSERT_EQ(api().plan(attn_handle_, &batch_, workspace_.data(), bytes), KVRT_OK)
        << take_last_error();
  }

  void describe_batch(const std::vector<uint32_t>& kv_lens) {
    const uint32_t ps = layout_.page_size;
    qo_ = {0};
    indptr_ = {0};
    indices_.clear();
    last_.clear();
    for (uint32_t n : kv_lens) {
      for (uint32_t p = 0; p < (n + ps - 1) / ps; ++p) {
        indices_.push_back(static_cast<int32_t>(indices_.size() % layout_.num_pages));
      }
      qo_.push_back(qo_.back() + 1);
      indptr_.push_back(static_cast<int32_t>(indices_.size()));
      last_.push_back(static_cast<int32_t>((n - 1) % ps + 1));
    }
    batch_ = {};
    batch_.struct_size = sizeof(batch_);
    batch_.batch_size = static_cast<uint32_t>(kv_lens.size());
    batch_.page_size = ps;
    batch_.causal = 1;
    batch_.qo_indptr = qo_.data();
    batch_.kv_page_indptr = indptr_.data();
    batch_.kv_page_indices = indices_.data();
    batch_.kv_last_page_len = last_.data();
    q_.assign(kv_lens.size() * 8 * 64, 0.25f);
    out_.assign(q_.size(), 0.0f);
    args_ = {};
    args_.struct_size = sizeof(args_);
    args_.q_dtype = args_.out_dtype = KVRT_DTYPE_F32;
    args_.layout = &layout_;
    args_.store_api = kv_;
    args_.store = store_;
    args_.q = q_.data();
    args_.out = out_.data();
  }

  const kvrt_kv_store_api* kv_ = nullptr;
  kvrt_kv_store* store_ = nullptr;
  kvrt_kv_layout layout_{};
  kvrt_attention* attn_handle_ = nullptr;
  std::vector<int32_t> qo_, indptr_, indices_, last_;
  kvrt_attention_batch batch_{};
  std::vector<uint8_t> workspace_;
  std::vector<float> q_, out_;
  kvrt_attention_run_args args_{};
};

TEST_F(AttnCpuApi, ReadsTheShippedLayoutsNativelyAndSaysWhyNotOthers) {
  make("kv_bf16_paged", nullptr, 4);
  EXPECT_EQ(api().supports(attn_handle_, &layout_), KVRT_OK) << take_last_error();
  for (const toml::table* config : {&per_token_head_, &per_tensor_}) {
    kv_->destroy(store_);
    store_ = nullptr;
    api().destroy(attn_handle_);
    attn_handle_ = nullptr;
    make("kv_fp8_e4m3", config, 4);
    EXPECT_EQ(api().supports(attn_handle_, &layout_), KVRT_OK) << *config << take_last_error();
  }
  kvrt_kv_layout int8 = layout_;
  int8.k_dtype = int8.v_dtype = KVRT_DTYPE_INT8;
  EXPECT_EQ(api().supports(attn_handle_, &int8), KVRT_ERR_UNSUPPORTED);
  EXPECT_NE(take_last_error().find("dtype int8 is not read natively"), std::string::npos);
  kvrt_kv_layout other_heads = layout_;
  other_heads.num_kv_heads = 4;
  EXPECT_EQ(api().supports(attn_handle_, &other_heads), KVRT_ERR_UNSUPPORTED);
  EXPECT_NE(take_last_error().find("num_kv_heads is 4"), std::string::npos);
}

TEST_F(AttnCpuApi, RefusesShapesItCannotServeNamingTheField) {
  kvrt_attention* a = nullptr;
  auto refused = [&](const kvrt_attention_params& p, kvrt_status want, const std::string& text) {
    EXPECT_EQ(create(p, &a), want) << text;
    EXPECT_EQ(a, nullptr);
    const std::string message = take_last_error();
    EXPECT_NE(message.find(text), std::string::npos) << message;
  };
  refused(params(8, 2, 12, 64), KVRT_ERR_UNSUPPORTED, "qk_head_dim 12");
  refused(params(8, 2, 64, 4104), KVRT_ERR_UNSUPPORTED, "v_head_dim 4104");
  refused(params(6, 4, 64, 64), KVRT_ERR_INVALID_ARGUMENT, "not a multiple of num_kv_heads 4");
  refused(params(8, 0, 64, 64), KVRT_ERR_INVALID_ARGUMENT, "num_kv_heads");
  kvrt_attention_params cuda = params(8, 2, 64, 64);
  cuda.device.kind = KVRT_DEVICE_CUDA;
  refused(cuda, KVRT_ERR_UNSUPPORTED, "CPU devices only");
  attention_table_.insert_or_assign("decode_chunk_tokens", 0);
  refused(params(8, 2, 64, 64), KVRT_ERR_CONFIG, "decode_chunk_tokens");
}

TEST_F(AttnCpuApi, RunAllocatesNothing) {
  // Native bf16, native fp8 and the gather fallback, each after a warm-up run.
  for (int path = 0; path < 3; ++path) {
    if (attn_handle_ != nullptr) api().destroy(attn_handle_);
    if (store_ != nullptr) kv_->destroy(store_);
    attn_handle_ = nullptr;
    store_ = nullptr;
    make(path == 1 ? "kv_fp8_e4m3" : "kv_bf16_paged", nullptr, 64);
    plan({1000, 600, 3});
    if (path == 2) {
      layout_.k_dtype = layout_.v_dtype = KVRT_DTYPE_INT8;
      layout_.k_base = layout_.v_base = nullptr;
    }
    ASSERT_EQ(api().run(attn_handle_, &args_), KVRT_OK) << take_last_error();
    g_allocations = 0;
    g_count_allocations = true;
    const kvrt_status s = api().run(attn_handle_, &args_);
    g_count_allocations = false;
    ASSERT_EQ(s, KVRT_OK) << take_last_error();
    EXPECT_EQ(g_allocations.load(), 0) << "path " << path;
    for (float x : out_) ASSERT_TRUE(std::isfinite(x));
  }
  // The counter does see the plugin's allocations: a refused plan() builds its message.
  last_[0] = 0;
  g_allocations = 0;
  g_count_allocations = true;
  const kvrt_status s = api().plan(attn_handle_, &batch_, workspace_.data(), workspace_.size());
  g_count_allocations = false;
  EXPECT_EQ(s, KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_GT(g_allocations.load(), 0);
  take_last_error();
}

TEST_F(AttnCpuApi, PlanChecksTheWorkspaceAndRunNeedsAPlan) {
  make("kv_bf16_paged", nullptr, 8);
  describe_batch({100});
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(take_last_error().find("without a successful plan()"), std::string::npos);
  plan({100});
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_OK);
  EXPECT_EQ(api().plan(attn_handle_, &batch_, workspace_.data(), workspace_.size() - 1),
            KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(take_last_error().find("smaller than workspace_size()"), std::string::npos);
  // The failed plan leaves nothing to run on.
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_ERR_INVALID_ARGUMENT);
  take_last_error();
  // A longer batch needs more workspace (chunk partials), a larger one never less.
  uint64_t small = 0, large = 0;
  ASSERT_EQ(api().workspace_size(attn_handle_, &batch_, &small), KVRT_OK);
  plan({100, 100, 100});
  ASSERT_EQ(api().workspace_size(attn_handle_, &batch_, &large), KVRT_OK);
  EXPECT_GT(large, small);
}

TEST_F(AttnCpuApi, RunRefusesPagesBeyondTheStoreAndMismatchedLayouts) {
  make("kv_bf16_paged", nullptr, 4);
  plan({20});
  indices_[1] = 4;  // the store has pages 0..3
  ASSERT_EQ(api().plan(attn_handle_, &batch_, workspace_.data(), workspace_.size()), KVRT_OK);
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_ERR_OUT_OF_RANGE);
  EXPECT_NE(take_last_error().find("page id 4"), std::string::npos);
  indices_[1] = 1;
  ASSERT_EQ(api().plan(attn_handle_, &batch_, workspace_.data(), workspace_.size()), KVRT_OK);
  kvrt_kv_layout other = layout_;
  other.k_head_dim = 128;
  args_.layout = &other;
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(take_last_error().find("k_head_dim is 128"), std::string::npos);
  args_.layout = &layout_;
  args_.store_api = nullptr;  // an unreadable layout and no gather to fall back on
  other = layout_;
  other.k_dtype = KVRT_DTYPE_F16;
  args_.layout = &other;
  EXPECT_EQ(api().run(attn_handle_, &args_), KVRT_ERR_UNSUPPORTED);
  EXPECT_NE(take_last_error().find("no store with a gather()"), std::string::npos);
}

TEST_F(AttnCpuApi, PlanRefusesMalformedBatches) {
  make("kv_bf16_paged", nullptr, 8);
  plan({20});
  auto refused = [&](const std::string& text) {
    EXPECT_EQ(api().plan(attn_handle_, &batch_, workspace_.data(), workspace_.size()),
              KVRT_ERR_INVALID_ARGUMENT)
        << text;
    const std::string message = take_last_error();
    EXPECT_NE(message.find(text), std::string::npos) << message;
  };
  last_[0] = 17;
  refused("kv_last_page_len 17 outside 1..16");
  last_[0] = 4;
  indices_[0] = -1;
  refused("negative page id -1");
  indices_[0] = 0;
  qo_[1] = 30;
  refused("30 causal query rows but only 20 KV tokens");
}

}  // namespace
}  // namespace kvrt::plugin
