#include "sdk/conformance/attention_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

namespace kvrt::conformance {
namespace {

using plugin::LoadedPlugin;
using plugin::status_name;
using plugin::take_last_error;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Unwinds out of check_attention_case with its one-line answer.
struct CaseFailure {
  std::string message;
};

float bf16_value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t to_bf16(float f) {  // round to nearest even; inputs here are finite
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

void check(kvrt_status s, const std::string& what) {
  if (s != KVRT_OK) {
    const std::string message = take_last_error();
    throw CaseFailure{what + " returned " + status_name(s) +
                      (message.empty() ? "" : ": " + message)};
  }
}

struct StoreDeleter {
  const kvrt_kv_store_api* api;
  void operator()(kvrt_kv_store* s) const { api->destroy(s); }
};
struct AttentionDeleter {
  const kvrt_attention_api* api;
  void operator()(kvrt_attention* a) const { api->destroy(a); }
};
using StorePtr = std::unique_ptr<kvrt_kv_store, StoreDeleter>;
using AttentionPtr = std::unique_ptr<kvrt_attention, AttentionDeleter>;

std::string describe(const AttentionCase& c) {
  std::string seqs;
  for (const AttentionSequence& s : c.sequences) {
    seqs += (seqs.empty() ? "" : " ") + std::to_string(s.kv_len) + "/" + std::to_string(s.q_len);
  }
  return c.store + (c.force_gather ? " (gather)" : "") + ", heads " +
         std::to_string(c.num_q_heads) + "/" + std::to_string(c.num_kv_heads) + ", dims " +
         std::to_string(c.qk_head_dim) + "/" + std::to_string(c.v_head_dim) +
         (c.v_width != 0 ? " (V the first " + std::to_string(c.v_width) + " of K)" : "") +
         ", page " +
         std::to_string(c.page_size) + ", kv/q " + seqs + (c.causal ? "" : ", non-causal") +
         (c.q_dtype == KVRT_DTYPE_BF16 ? ", bf16 Q" : "") +
         (c.out_dtype == KVRT_DTYPE_BF16 ? ", bf16 out" : "");
}

// Throws CaseFailure on a mismatch or a failed call, Skip when a store is missing.
void run_case(plugin::Registry& registry, const LoadedPlugin& attention, const AttentionCase& c,
              uint32_t seed, bool* create_unsupported) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Result<const LoadedPlugin*> loaded = registry.load_kv_store(c.store);
  if (!loaded.ok()) throw Skip("cannot load " + c.store + ": " + loaded.status().message());
  const LoadedPlugin& store_plugin = **loaded;
  const kvrt_kv_store_api& kv = store_plugin.kv;
  if (kv.gather == nullptr) throw Skip(c.store + " has no gather() to check against");
  // V's width, and its row's: the K row's when V is in it.
  const uint32_t v_dim = c.v_head_dim != 0 ? c.v_head_dim
                         : c.v_width != 0  ? c.v_width
                                           : c.qk_head_dim;
  const uint32_t v_row_dim = c.v_head_dim == 0 ? c.qk_head_dim : v_dim;
  const uint32_t ps = c.page_size;

  // Pages: each sequence's in order of position, drawn from a shuffled pool with spare pages,
  // so page ids are neither contiguous nor dense.
  std::vector<uint32_t> pages_of;
  uint64_t used_pages = 0;
  for (const AttentionSequence& s : c.sequences) {
    pages_of.push_back((s.kv_len + ps - 1) / ps);
    used_pages += pages_of.back();
  }
  const uint64_t num_pages = used_pages + 3;
  std::vector<int32_t> pool(num_pages);
  std::iota(pool.begin(), pool.end(), 0);
  if (c.shuffle_pages) std::shuffle(pool.begin(), pool.end(), rng);

  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = c.layers;
  g.num_kv_heads = g.total_kv_heads = c.num_kv_heads;
  g.k_head_dim = c.qk_head_dim;
  g.v_head_dim = c.v_head_dim;
  g.v_width = v_dim;
  g.page_size = ps;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  const kvrt_config* store_config = plugin::as_config(
      c.store_config != nullptr ? c.store_config : registry.plugin_config(c.store));
  kvrt_kv_store* raw_store = nullptr;
  check(kv.create(store_plugin.host_api(), &g, num_pages, store_config, &raw_store),
        c.store + " create");
  StorePtr store(raw_store, StoreDeleter{&kv});

  // The batch, CSR.
  const auto batch_size = static_cast<uint32_t>(c.sequences.size());
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, indices, last_len;
  std::vector<int64_t> slots;  // every sequence's slots by position, back to back
  for (uint32_t b = 0; b < batch_size; ++b) {
    const AttentionSequence& s = c.sequences[b];
    for (uint32_t p = 0; p < pages_of[b]; ++p) indices.push_back(pool[indices.size()]);
    for (uint32_t t = 0; t < s.kv_len; ++t) {
      slots.push_back(int64_t{indices[kv_indptr.back() + t / ps]} * ps + t % ps);
    }
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(s.q_len));
    kv_indptr.push_back(static_cast<int32_t>(indices.size()));
    last_len.push_back(s.kv_len == 0 ? 0 : static_cast<int32_t>((s.kv_len - 1) % ps + 1));
  }
  const size_t total_rows = static_cast<size_t>(qo_indptr.back());

  // K/V per layer: unit normals scaled per token by 2^-2 .. 2^2, so per-token scales matter;
  // the reference reads back what the store holds.
  const size_t k_row = size_t{c.num_kv_heads} * c.qk_head_dim;
  const size_t v_row = size_t{c.num_kv_heads} * c.v_head_dim;
  std::vector<std::vector<float>> ref_k(c.layers), ref_v(c.layers);
  for (uint32_t layer = 0; layer < c.layers; ++layer) {
    std::vector<float> k(slots.size() * k_row), v(slots.size() * v_row);
    for (size_t i = 0; i < slots.size(); ++i) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 2);
      for (size_t j = 0; j < k_row; ++j) k[i * k_row + j] = normal(rng) * magnitude;
      for (size_t j = 0; j < v_row; ++j) v[i * v_row + j] = normal(rng) * magnitude;
    }
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.layer = layer;
    w.dtype = KVRT_DTYPE_F32;
    w.num_tokens = static_cast<uint32_t>(slots.size());
    w.slots = slots.data();
    w.k = k.data();
    w.v = c.v_head_dim != 0 ? v.data() : nullptr;
    check(kv.write(store.get(), &w), c.store + " write");
    ref_k[layer].assign(k.size(), NAN);
    ref_v[layer].assign(v.size(), NAN);
    check(kv.gather(store.get(), layer, w.num_tokens, slots.data(), ref_k[layer].data(),
                    c.v_head_dim != 0 ? ref_v[layer].data() : nullptr),
          c.store + " gather");
    if (c.v_head_dim == 0) ref_v[layer] = ref_k[layer];
  }

  // Q, padded rows; the reference uses what the plugin is given.
  const size_t q_row = size_t{c.num_q_heads} * c.qk_head_dim;
  const size_t out_row = size_t{c.num_q_heads} * v_dim;
  const size_t q_stride = q_row + c.row_padding, out_stride = out_row + c.row_padding;
  std::vector<float> q(total_rows * q_stride, 0.0f);
  std::vector<uint16_t> q16(q.size(), 0);
  for (size_t r = 0; r < total_rows; ++r) {
    for (size_t j = 0; j < q_row; ++j) {
      float x = normal(rng) * c.q_scale;
      if (c.q_dtype == KVRT_DTYPE_BF16) {
        q16[r * q_stride + j] = to_bf16(x);
        x = bf16_value(q16[r * q_stride + j]);
      }
      q[r * q_stride + j] = x;
    }
  }

  // The plugin.
  const kvrt_attention_api& api = attention.attention;
  kvrt_attention_params params{};
  params.struct_size = sizeof(params);
  params.num_q_heads = c.num_q_heads;
  params.num_kv_heads = c.num_kv_heads;
  params.qk_head_dim = c.qk_head_dim;
  params.v_head_dim = c.v_head_dim != 0 ? c.v_head_dim : c.v_width;
  params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim));
  params.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  const kvrt_config* attention_config = plugin::as_config(
      c.attention_config != nullptr ? c.attention_config : registry.plugin_config(attention.name));
  kvrt_attention* raw = nullptr;
  const kvrt_status created = api.create(attention.host_api(), &params, attention_config, &raw);
  if (created == KVRT_ERR_UNSUPPORTED && create_unsupported != nullptr) {
    take_last_error();
    *create_unsupported = true;
    return;
  }
  check(created, "create");
  AttentionPtr attn(raw, AttentionDeleter{&api});

  kvrt_attention_batch batch{};
  batch.struct_size = sizeof(batch);
  batch.batch_size = batch_size;
  batch.page_size = ps;
  batch.causal = c.causal ? 1 : 0;
  batch.qo_indptr = qo_indptr.data();
  batch.kv_page_indptr = kv_indptr.data();
  batch.kv_page_indices = indices.data();
  batch.kv_last_page_len = last_len.data();
  uint64_t ws_bytes = 0;
  check(api.workspace_size(attn.get(), &batch, &ws_bytes), "workspace_size");
  // Offset by 8 bytes: the caller's workspace need not be more aligned than malloc's.
  std::vector<uint8_t> workspace(ws_bytes + 8);
  check(api.plan(attn.get(), &batch, workspace.data() + 8, ws_bytes), "plan");

  const float sentinel = 1536.0f;  // exact in bf16 too
  for (uint32_t layer = 0; layer < c.layers; ++layer) {
    kvrt_kv_layout layout{};
    layout.struct_size = sizeof(layout);
    check(kv.layout(store.get(), layer, &layout), c.store + " layout");
    if (c.force_gather) {
      layout.k_dtype = layout.v_dtype = KVRT_DTYPE_INT8;
      layout.scale_mode = KVRT_SCALE_PER_TOKEN_HEAD;
      layout.k_base = layout.v_base = nullptr;
      layout.k_scale = layout.v_scale = nullptr;
      take_last_error();
      const kvrt_status s = api.supports(attn.get(), &layout);
      const std::string why = take_last_error();
      if (s != KVRT_ERR_UNSUPPORTED || why.empty()) {
        throw CaseFailure{"supports() of an INT8 layout with NULL pointers returned " +
                          std::string(status_name(s)) +
                          (why.empty() ? " without a reason (set_error)" : "")};
      }
    }
    std::vector<float> out(total_rows * out_stride, sentinel);
    std::vector<uint16_t> out16(out.size(), to_bf16(sentinel));
    kvrt_attention_run_args args{};
    args.struct_size = sizeof(args);
    args.layer = layer;
    args.q_dtype = c.q_dtype;
    args.out_dtype = c.out_dtype;
    args.layout = &layout;
    args.store_api = &kv;
    args.store = store.get();
    args.q = c.q_dtype == KVRT_DTYPE_BF16 ? static_cast<const void*>(q16.data()) : q.data();
    args.out = c.out_dtype == KVRT_DTYPE_BF16 ? static_cast<void*>(out16.data()) : out.data();
    args.q_row_stride = static_cast<int64_t>(q_stride);
    args.out_row_stride = static_cast<int64_t>(out_stride);
    check(api.run(attn.get(), &args), "run (layer " + std::to_string(layer) + ")");
    if (c.out_dtype == KVRT_DTYPE_BF16) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_value(out16[i]);
    }

    // The naive reference, row by row, in double (raw pointers: this runs in sanitizer builds
    // too).
    const float* K = ref_k[layer].data();
    const float* V = ref_v[layer].data();
    const uint32_t group = c.num_q_heads / c.num_kv_heads;
    const double scale = params.softmax_scale;
    std::vector<double> p, want(v_dim);
    size_t slot_base = 0;  // the sequence's first entry in `slots`
    for (uint32_t b = 0; b < batch_size; ++b) {
      const AttentionSequence& s = c.sequences[b];
      for (uint32_t j = 0; j < s.q_len; ++j) {
        const size_t row = static_cast<size_t>(qo_indptr[b]) + j;
        const uint32_t limit = c.causal ? s.kv_len - s.q_len + j : s.kv_len - 1;
        for (uint32_t h = 0; h < c.num_q_heads; ++h) {
          const uint32_t kvh = h / group;
          const float* qh = q.data() + row * q_stride + size_t{h} * c.qk_head_dim;
          p.assign(limit + 1, 0.0);
          double max = -INFINITY, sum = 0, v_max = 0;
          for (uint32_t t = 0; t <= limit; ++t) {
            const float* k = K + ((slot_base + t) * c.num_kv_heads + kvh) * c.qk_head_dim;
            double dot = 0;
            for (uint32_t d = 0; d < c.qk_head_dim; ++d) dot += double{qh[d]} * k[d];
            p[t] = dot * scale;
            max = std::max(max, p[t]);
          }
          for (double& x : p) sum += (x = std::exp(x - max));
          std::fill(want.begin(), want.end(), 0.0);
          double* w = want.data();
          for (uint32_t t = 0; t <= limit; ++t) {
            const float* v = V + ((slot_base + t) * c.num_kv_heads + kvh) * v_row_dim;
            const double weight = p[t] / sum;
            for (uint32_t d = 0; d < v_dim; ++d) {
              w[d] += weight * v[d];
              v_max = std::max(v_max, double{std::fabs(v[d])});
            }
          }
          // The output is a convex combination of the V rows: its scale is max |V|.
          const double bound = 1e-4 * v_max + 1e-30;
          for (uint32_t d = 0; d < v_dim; ++d) {
            const double got = out[row * out_stride + size_t{h} * v_dim + d];
            const double allowed =
                bound + (c.out_dtype == KVRT_DTYPE_BF16 ? std::ldexp(std::fabs(want[d]), -8) : 0);
            if (!(std::fabs(got - want[d]) <= allowed)) {
              throw CaseFailure{
                  "layer " + std::to_string(layer) + ", sequence " + std::to_string(b) + " (kv " +
                  std::to_string(s.kv_len) + ", q " + std::to_string(s.q_len) + "), row " +
                  std::to_string(j) + ", head " + std::to_string(h) + ", element " +
                  std::to_string(d) + ": got " + std::to_string(got) + ", want " +
                  std::to_string(want[d]) + " (error " + std::to_string(std::fabs(got - want[d])) +
                  " > " + std::to_string(allowed) + ")"};
            }
          }
        }
      }
      slot_base += s.kv_len;
    }
    for (size_t r = 0; r < total_rows; ++r) {
      for (size_t i = out_row; i < out_stride; ++i) {
        if (out[r * out_stride + i] != sentinel) {
          throw CaseFailure{"run wrote into the padding between output rows (row " +
                            std::to_string(r) + ")"};
        }
      }
    }
  }
}

// ---- the suite ----------------------------------------------------------------------------

class Suite {
 public:
  Suite(plugin::Registry& registry, const LoadedPlugin& p, const Options& options)
      : registry_(registry),
        plugin_(p),
        api_(p.attention),
        host_(p.host_api()),
        config_(plugin::as_config(registry.plugin_config(p.name))),
        seed_(options.seed) {
    per_tensor_.insert("scale_mode", "per_tensor");
    per_tensor_.insert("k_scale", 0.05);
    per_tensor_.insert("v_scale", 0.03);
  }

  void reference_kv_bf16_paged() { store_shapes("kv_bf16_paged", nullptr); }
  void reference_kv_fp8_e4m3_per_token_head() {
    per_token_head_.insert("scale_mode", "per_token_head");
    store_shapes("kv_fp8_e4m3", &per_token_head_);
  }
  void reference_kv_fp8_e4m3_per_tensor() { store_shapes("kv_fp8_e4m3", &per_tensor_); }

  void decode_many_pages() {
    // Long decodes over hundreds of scattered pages, beside short ones, in one batch: the
    // case flash-decoding style plugins split over chunks.
    AttentionCase c;
    c.num_q_heads = 8;
    c.num_kv_heads = 2;
    c.qk_head_dim = c.v_head_dim = 64;
    c.sequences = {{3000, 1}, {1, 1}, {777, 1}, {4099, 1}};
    expect(c);
    c.page_size = 1;
    c.sequences = {{1500, 1}, {2, 1}};
    expect(c);
  }

  void causal_prefill() {
    AttentionCase c;
    for (uint32_t page_size : {1u, 16u}) {
      c.page_size = page_size;
      c.sequences = {{50, 50}};  // a whole prompt
      expect(c);
      c.sequences = {{300, 40}};  // a chunk after earlier context
      expect(c);
      c.sequences = {{33, 33}, {100, 17}};
      expect(c);
    }
    c.causal = false;  // and the non-causal form: every row sees every position
    c.sequences = {{40, 7}};
    expect(c);
  }

  void gqa() {
    AttentionCase c;
    c.sequences = {{70, 1}, {45, 9}};
    for (uint32_t group : {1u, 2u, 4u, 8u}) {
      c.num_kv_heads = 2;
      c.num_q_heads = 2 * group;
      expect(c);
    }
    c.num_kv_heads = 1;  // MQA
    c.num_q_heads = 7;
    expect(c);
  }

  void mixed_batch() {
    AttentionCase c;
    c.sequences = {{500, 1}, {64, 64}, {2, 1}, {200, 31}, {17, 1}, {300, 5}};
    expect(c);
  }

  void q_and_out_dtypes() {
    AttentionCase c;
    c.sequences = {{90, 1}, {40, 12}};
    c.row_padding = 8;
    for (kvrt_dtype q : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
      if ((plugin_.desc.input_dtypes & KVRT_DTYPE_BIT(q)) == 0) continue;
      for (kvrt_dtype out : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
        c.q_dtype = q;
        c.out_dtype = out;
        expect(c);
      }
    }
  }

  void gather_fallback() {
    AttentionCase c;
    c.force_gather = true;
    c.sequences = {{600, 1}, {70, 20}};
    expect(c);
    c.store = "kv_fp8_e4m3";
    expect(c);
  }

  void one_plan_many_layers() {
    AttentionCase c;
    c.layers = 3;
    c.sequences = {{400, 1}, {30, 10}};
    expect(c);
  }

  void mla_v_is_k() {
    AttentionCase c;
    c.num_q_heads = 8;
    c.num_kv_heads = 1;
    c.qk_head_dim = 96;
    c.v_head_dim = 0;
    c.sequences = {{300, 1}, {20, 6}};
    bool unsupported = false;
    expect(c, &unsupported);
    if (unsupported) throw NotApplicable("the plugin does not serve v_head_dim 0 (V is K)");
    // MLA's latent (DeepSeek-V3 / Kimi-K2: 512 + 64; V its first 512 values), decode and a
    // prefill chunk after earlier context, across page boundaries.
    c.num_q_heads = 16;
    c.qk_head_dim = 576;
    c.v_width = 512;
    c.page_size = 64;
    c.sequences = {{1, 1}, {129, 1}, {70, 6}};
    expect(c, &unsupported);
    if (unsupported) {
      throw NotApplicable("the plugin does not serve an MLA latent (V the first 512 of 576)");
    }
  }

  void bad_arguments();

 private:
  void expect(const AttentionCase& c, bool* create_unsupported = nullptr) {
    try {
      run_case(registry_, plugin_, c, seed_++, create_unsupported);
    } catch (const CaseFailure& f) {
      throw Failure(describe(c) + ": " + f.message);
    }
  }

  void store_shapes(const std::string& store, const toml::table* config) {
    AttentionCase c;
    c.store = store;
    c.store_config = config;
    struct Shape {
      uint32_t q_heads, kv_heads, dim, page_size;
    };
    for (Shape s : {Shape{4, 4, 16, 16}, Shape{8, 2, 64, 16}, Shape{16, 4, 128, 32},
                    Shape{4, 1, 256, 8}, Shape{2, 2, 8, 3}}) {
      c.num_q_heads = s.q_heads;
      c.num_kv_heads = s.kv_heads;
      c.qk_head_dim = c.v_head_dim = s.dim;
      c.page_size = s.page_size;
      // Page boundaries, a long decode (split by plugins that split) and a prefill chunk.
      c.sequences = {{1, 1}, {s.page_size, 1}, {s.page_size + 1, 1}, {700, 1}, {60, 12}};
      c.q_scale = s.dim >= 128 ? 2.0f : 1.0f;  // sharper softmax too
      expect(c);
    }
  }

  plugin::Registry& registry_;
  const LoadedPlugin& plugin_;
  const kvrt_attention_api& api_;
  const kvrt_host_api* host_;
  const kvrt_config* config_;
  uint32_t seed_;
  toml::table per_tensor_, per_token_head_;
};

void Suite::bad_arguments() {
  auto expect_status = [&](auto&& call, std::initializer_list<kvrt_status> allowed,
                           const std::string& name) {
    take_last_error();
    const kvrt_status got = call();
    const std::string message = take_last_error();
    if (std::find(allowed.begin(), allowed.end(), got) == allowed.end()) {
      std::string want;
      for (kvrt_status s : allowed)
        want += (want.empty() ? "" : " or ") + std::string(status_name(s));
      throw Failure(name + " returned " + status_name(got) + ", expected " + want);
    }
    if (got != KVRT_ERR_INVALID_ARGUMENT && message.empty()) {
      throw Failure(name + " returned " + status_name(got) + " without a message (set_error)");
    }
  };
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.qk_head_dim = p.v_head_dim = 64;
  p.softmax_scale = 0.125f;
  p.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  kvrt_attention* never = nullptr;
  expect_status([&] { return api_.create(host_, nullptr, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT}, "create(params = NULL)");
  expect_status([&] { return api_.create(host_, &p, config_, nullptr); },
                {KVRT_ERR_INVALID_ARGUMENT}, "create(out = NULL)");
  kvrt_attention_params no_kv_heads = p, uneven = p;
  no_kv_heads.num_kv_heads = 0;
  uneven.num_q_heads = 6;  // not a multiple of 4 KV heads
  uneven.num_kv_heads = 4;
  expect_status([&] { return api_.create(host_, &no_kv_heads, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT, KVRT_ERR_UNSUPPORTED}, "create with 0 KV heads");
  expect_status([&] { return api_.create(host_, &uneven, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT, KVRT_ERR_UNSUPPORTED},
                "create with 6 query heads over 4 KV heads");
  {
    // No plugin serves a head of 16M elements; the refusal must say so as UNSUPPORTED.
    kvrt_attention_params bad = p;
    bad.qk_head_dim = bad.v_head_dim = 1u << 24;
    expect_status([&] { return api_.create(host_, &bad, config_, &never); }, {KVRT_ERR_UNSUPPORTED},
                  "create with head dims 2^24");
  }
  if (never != nullptr) throw Failure("a create that failed returned a handle");
  api_.destroy(nullptr);  // a no-op

  kvrt_attention* raw = nullptr;
  if (api_.create(host_, &p, config_, &raw) != KVRT_OK) {
    throw Failure("create of 4 q heads / 2 KV heads / dim 64 failed: " + take_last_error());
  }
  AttentionPtr attn(raw, AttentionDeleter{&api_});
  const int32_t qo[] = {0, 1}, kv_indptr[] = {0, 1}, pages[] = {0}, last[] = {4};
  kvrt_attention_batch batch{};
  batch.struct_size = sizeof(batch);
  batch.batch_size = 1;
  batch.page_size = 4;
  batch.causal = 1;
  batch.qo_indptr = qo;
  batch.kv_page_indptr = kv_indptr;
  batch.kv_page_indices = pages;
  batch.kv_last_page_len = last;
  uint64_t bytes = 0;
  expect_status([&] { return api_.supports(attn.get(), nullptr); }, {KVRT_ERR_INVALID_ARGUMENT},
                "supports(layout = NULL)");
  expect_status([&] { return api_.workspace_size(attn.get(), nullptr, &bytes); },
                {KVRT_ERR_INVALID_ARGUMENT}, "workspace_size(batch = NULL)");
  expect_status([&] { return api_.workspace_size(attn.get(), &batch, nullptr); },
                {KVRT_ERR_INVALID_ARGUMENT}, "workspace_size(out = NULL)");
  if (api_.workspace_size(attn.get(), &batch, &bytes) != KVRT_OK) {
    throw Failure("workspace_size of a one-token batch failed: " + take_last_error());
  }
  std::vector<uint8_t> workspace(bytes + 1);
  expect_status([&] { return api_.plan(attn.get(), nullptr, workspace.data(), bytes); },
                {KVRT_ERR_INVALID_ARGUMENT}, "plan(batch = NULL)");
  if (bytes > 0) {
    expect_status([&] { return api_.plan(attn.get(), &batch, nullptr, bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan(workspace = NULL)");
    expect_status([&] { return api_.plan(attn.get(), &batch, workspace.data(), bytes - 1); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with a workspace 1 byte short");
  }
  {
    const int32_t bad_last[] = {5};  // more than page_size
    kvrt_attention_batch bad = batch;
    bad.kv_last_page_len = bad_last;
    expect_status([&] { return api_.plan(attn.get(), &bad, workspace.data(), bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with kv_last_page_len > page_size");
    const int32_t bad_qo[] = {1, 0};
    bad = batch;
    bad.qo_indptr = bad_qo;
    expect_status([&] { return api_.plan(attn.get(), &bad, workspace.data(), bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with a decreasing qo_indptr");
  }
  if (api_.plan(attn.get(), &batch, workspace.data(), bytes) != KVRT_OK) {
    throw Failure("plan of a one-token batch failed: " + take_last_error());
  }
  // A real layout to run against.
  Result<const LoadedPlugin*> store_plugin = registry_.load_kv_store("kv_bf16_paged");
  if (!store_plugin.ok()) throw Skip("cannot load kv_bf16_paged for run()");
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = 1;
  g.num_kv_heads = g.total_kv_heads = 2;
  g.k_head_dim = g.v_head_dim = 64;
  g.page_size = 4;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  kvrt_kv_store* raw_store = nullptr;
  if (kv.create((*store_plugin)->host_api(), &g, 1, nullptr, &raw_store) != KVRT_OK) {
    throw Failure("kv_bf16_paged create failed: " + take_last_error());
  }
  StorePtr store(raw_store, StoreDeleter{&kv});
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  if (kv.layout(store.get(), 0, &layout) != KVRT_OK) throw Failure("layout failed");
  std::vector<float> q(4 * 64, 0.5f), out(4 * 64);
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &kv;
  args.store = store.get();
  args.q = q.data();
  args.out = out.data();
  expect_status([&] { return api_.run(attn.get(), nullptr); }, {KVRT_ERR_INVALID_ARGUMENT},
                "run(args = NULL)");
  for (int which = 0; which < 3; ++which) {
    kvrt_attention_run_args bad = args;
    const char* name = which == 0   ? "run with q = NULL"
                       : which == 1 ? "run with out = NULL"
                                    : "run with layout = NULL";
    if (which == 0) bad.q = nullptr;
    if (which == 1) bad.out = nullptr;
    if (which == 2) bad.layout = nullptr;
    expect_status([&] { return api_.run(attn.get(), &bad); }, {KVRT_ERR_INVALID_ARGUMENT}, name);
  }
  // A page id beyond the store: refused, not read.
  const int32_t far_page[] = {1};
  kvrt_attention_batch far = batch;
  far.kv_page_indices = far_page;
  if (api_.plan(attn.get(), &far, workspace.data(), bytes) == KVRT_OK) {
    expect_status([&] { return api_.run(attn.get(), &args); },
                  {KVRT_ERR_OUT_OF_RANGE, KVRT_ERR_INVALID_ARGUMENT},
                  "run over page 1 of a 1-page store");
  } else {
    take_last_error();
  }
  // After all that, a good call still works.
  if (api_.plan(attn.get(), &batch, workspace.data(), bytes) != KVRT_OK ||
      api_.run(attn.get(), &args) != KVRT_OK) {
    throw Failure("a valid plan + run failed after the bad calls: " + take_last_error());
  }
}

struct Property {
  const char* name;
  void (Suite::*run)();
};

const std::vector<Property>& properties() {
  static const std::vector<Property> all = {
      {"reference_kv_bf16_paged", &Suite::reference_kv_bf16_paged},
      {"reference_kv_fp8_e4m3_per_token_head", &Suite::reference_kv_fp8_e4m3_per_token_head},
      {"reference_kv_fp8_e4m3_per_tensor", &Suite::reference_kv_fp8_e4m3_per_tensor},
      {"decode_many_pages", &Suite::decode_many_pages},
      {"causal_prefill", &Suite::causal_prefill},
      {"gqa", &Suite::gqa},
      {"mixed_batch", &Suite::mixed_batch},
      {"q_and_out_dtypes", &Suite::q_and_out_dtypes},
      {"gather_fallback", &Suite::gather_fallback},
      {"one_plan_many_layers", &Suite::one_plan_many_layers},
      {"mla_v_is_k", &Suite::mla_v_is_k},
      {"bad_arguments", &Suite::bad_arguments},
  };
  return all;
}

}  // namespace

std::string check_attention_case(plugin::Registry& registry, const LoadedPlugin& attention,
                                 const AttentionCase& c, uint32_t seed, bool* create_unsupported) {
  try {
    run_case(registry, attention, c, seed, create_unsupported);
    return "";
  } catch (const CaseFailure& f) {
    return describe(c) + ": " + f.message;
  } catch (const std::exception& e) {
    return describe(c) + ": " + e.what();
  }
}

std::vector<PropertyResult> run_attention_suite(plugin::Registry& registry,
                                                const LoadedPlugin& plugin, const Options& options,
                                                std::ostream& log) {
  std::vector<PropertyResult> results;
  for (const Property& p : properties()) {
    Suite suite(registry, plugin, options);
    auto body = [&] {
      try {
        (suite.*p.run)();
      } catch (const CaseFailure& e) {
        throw Failure(e.message);
      }
    };
    results.push_back(run_property(plugin.name, p.name, body, log));
  }
  return results;
}

}  // namespace kvrt::conformance
