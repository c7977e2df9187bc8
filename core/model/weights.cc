#include "core/model/weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <functional>
#include <tuple>

#include "core/model/safetensors.h"

namespace kvrt::model {

using parallel::Range;

namespace {

// ---- Synthetic presets ----

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator whose output is defined by integer
// arithmetic alone, so the weights are the same with every compiler and standard library.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

// Fills v with n values of mean 0 and standard deviation `stddev`. Each draw sums the four 16-bit
// lanes of one splitmix64 output (Irwin-Hall: close to normal, bounded); the sum is an exact
// integer and becomes a float through one double multiply and one rounding, which IEEE makes
// identical everywhere. The stream depends only on (seed, tensor name).
void fill_random(std::vector<float>& v, size_t n, double stddev, uint64_t seed,
                 const std::string& name) {
  uint64_t start = seed ^ Fnv1a(name);
  SplitMix64(start);  // decorrelates nearby seeds before the first draw
  // Each lane is uniform on 0..65535: variance (65536^2 - 1) / 12, four of them summed.
  const double lane_var = (65536.0 * 65536.0 - 1.0) / 12.0;
  const double scale = stddev / std::sqrt(4.0 * lane_var);
  v.resize(n);
  // splitmix64's state only counts up by its constant, so draw i is known without the draws
  // before it: blocks of the tensor fill in parallel with the same values as one pass (a
  // Llama-3-8B-shaped preset is 8 billion draws).
  constexpr size_t kBlock = size_t{1} << 20;
  const auto blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = static_cast<size_t>(b) * kBlock, end = std::min(n, begin + kBlock);
    uint64_t state = start + begin * 0x9e3779b97f4a7c15ull;
    for (size_t i = begin; i < end; ++i) {
      const uint64_t x = SplitMix64(state);
      const int64_t sum = static_cast<int64_t>((x & 0xffff) + ((x >> 16) & 0xffff) +
                                               ((x >> 32) & 0xffff) + (x >> 48));
      v[i] = static_cast<float>(static_cast<double>(sum - 2 * 65535) * scale);
    }
  }
}

namespace {

struct Preset {
  std::string_view name;
  int64_t hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, max_positions;
};

constexpr Preset kPresets[] = {
    {"synth-76m", 768, 12, 12, 4, 64, 2048, 512, 8192},
    {"synth-tiny", 64, 2, 4, 2, 16, 128, 512, 2048},
    // Cheap enough to run 150 concurrent requests on 2 cores, with head_dim 64 so fp8's
    // per-token-head scales weigh what they do on real models (kvrt bench scenarios).
    {"synth-bench", 256, 2, 4, 2, 64, 512, 512, 8192},
    // Llama-3-8B's shape (8.0B parameters with tied embeddings) for GPU benchmarks
    // (scripts/gpu_check.sh): 32 GB of f32 while it is generated, so not for this CPU's tests.
    {"synth-llama3-8b", 4096, 32, 32, 8, 128, 14336, 128256, 8192},
    // Llama-3.2-1B's shape (1.24B parameters, tied embeddings): a real vocabulary's cost in the
    // logits and the sampler, at a size a CPU benchmark can decode (e2e_bench).
    {"llama-3.2-1b-shape", 2048, 16, 32, 8, 64, 8192, 128256, 8192},
};

ModelConfig ConfigOf(const Preset& p) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.torch_dtype = "float32";
  c.hidden_size = p.hidden;
  c.intermediate_size = p.intermediate;
  c.num_hidden_layers = p.layers;
  c.num_attention_heads = p.heads;
  c.num_key_value_heads = p.kv_heads;
  c.head_dim = p.head_dim;
  c.vocab_size = p.vocab;
  c.max_position_embeddings = p.max_positions;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  c.attention_bias = false;
  c.bos_token_id = 1;  // the byte tokenizer's specials
  c.eos_token_ids = {2};
  return c;
}

Result<const Preset*> FindPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (p.name == name) return &p;
  }
  std::string known;
  for (const std::string& p : preset_names()) known += (known.empty() ? "" : ", ") + p;
  return Status::NotFound("unknown model preset '" + std::string(name) + "' (known: " + known +
                          ")");
}

// Visits every tensor of w in a fixed order (the order fingerprint() hashes in).
void ForEachTensor(const Weights& w, const std::function<void(const std::vector<float>&)>& f) {
  f(w.embed);
  for (const LayerWeights& l : w.layers) {
    for (const auto* t : {&l.input_norm, &l.q, &l.k, &l.v, &l.q_bias, &l.k_bias, &l.v_bias, &l.o,
                          &l.post_norm, &l.gate, &l.up, &l.down}) {
      f(*t);
    }
    // Only where present, so the presets' pinned fingerprints stay as they were.
    for (const auto* t : {&l.q_norm, &l.k_norm}) {
      if (!t->empty()) f(*t);
    }
  }
  f(w.final_norm);
  f(w.lm_head);
}

// The tensor `name` as `ck` stores it (under `stored`), or NotFound naming it, `dir` and the
// shape expected.
Result<TensorView> stored_tensor(const SafetensorsCheckpoint& ck, const std::string& dir,
                                 const std::string& name, const std::string& stored,
                                 const std::vector<int64_t>& shape) {
  if (!ck.contains(stored)) {
    return Status::NotFound(dir + ": tensor '" + name + "' is missing (expected shape " +
                            shape_string(shape) + ")");
  }
  return ck.get(stored);
}

Status check_shape(const TensorView& t, const std::string& name,
                   const std::vector<int64_t>& shape) {
  if (t.shape == shape) return Status::Ok();
  return Status::InvalidArgument(t.file + ": tensor '" + name + "': expected shape " +
                                 shape_string(shape) + ", found " + shape_string(t.shape));
}

}  // namespace

Status load_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                  const std::string& dir, const std::string& name, std::vector<int64_t> shape,
                  Range rows, Range cols, std::vector<float>& out,
                  backend::QuantizedMatrix* packed) {
  // As stored: under a multimodal wrapper's "language_model." too, and packed.
  const std::string stored = stored_tensor_name(ck, name);
  if (format.quantized()) {
    Status q = load_quantized_block(ck, format, stored, shape, rows, cols, out, packed);
    if (!q.IsNotFound()) return q;  // dequantized, or refused by name
  }
  Result<TensorView> t = stored_tensor(ck, dir, name, stored, shape);
  if (!t.ok()) return t.status();
  if (t->dtype == DType::kF8E4M3 || t->dtype == DType::kI32) {
    return Status::Unsupported(t->file + ": tensor '" + name + "' has dtype " +
                               std::string(dtype_name(t->dtype)) +
                               " (supported: F32, BF16, F16; F8_E4M3 and I32 hold quantized "
                               "weights, read with their scales as " + dir +
                               "/config.json's quantization_config says, and it has none)");
  }
  if (Status s = check_shape(*t, name, shape); !s.ok()) return s;
  const int64_t width = shape.size() > 1 ? shape[1] : 1;
  if (shape.size() == 1) cols = {0, 1};
  const size_t elem = dtype_size(t->dtype);
  out.resize(static_cast<size_t>(rows.size() * cols.size()));
  TensorView piece = *t;
  piece.shape = {cols.size()};
  piece.bytes = static_cast<size_t>(cols.size()) * elem;
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    piece.data = static_cast<const char*>(t->data) + (r * width + cols.begin) * elem;
    to_f32(piece, out.data() + (r - rows.begin) * cols.size());
  }
  return Status::Ok();
}

std::vector<TensorBlock> llama_blocks(Weights& w) {
  const ModelConfig& c = w.config;
  const HeldPart& held = w.held;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), in = c.intermediate_size;
  const int64_t d = c.head_dim;
  // Every tensor's rows and columns this Weights keeps (all of them when whole).
  auto all = [](int64_t n) { return Range{0, n}; };
  auto heads = [&](Range r, int64_t n) { return held.whole ? all(n) : Range{r.begin * d, r.end * d}; };
  const Range q_rows = heads(held.q_heads, q), kv_rows = heads(held.kv_heads, kv);
  const Range mlp = held.whole ? all(in) : held.intermediate;
  const Range vocab = held.whole ? all(c.vocab_size) : held.vocab;
  std::vector<TensorBlock> plan = {
      {"model.embed_tokens.weight", {c.vocab_size, h}, vocab, all(h), &w.embed}};
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    std::vector<TensorBlock> layer = {
        {p + "input_layernorm.weight", {h}, all(h), {}, &l.input_norm},
        {p + "self_attn.q_proj.weight", {q, h}, q_rows, all(h), &l.q, &l.q_q},
        {p + "self_attn.k_proj.weight", {kv, h}, kv_rows, all(h), &l.k, &l.k_q},
        {p + "self_attn.v_proj.weight", {kv, h}, kv_rows, all(h), &l.v, &l.v_q},
        {p + "self_attn.o_proj.weight", {h, q}, all(h), q_rows, &l.o, &l.o_q},
        {p + "post_attention_layernorm.weight", {h}, all(h), {}, &l.post_norm},
        {p + "mlp.gate_proj.weight", {in, h}, mlp, all(h), &l.gate, &l.gate_q},
        {p + "mlp.up_proj.weight", {in, h}, mlp, all(h), &l.up, &l.up_q},
        {p + "mlp.down_proj.weight", {h, in}, all(h), mlp, &l.down, &l.down_q},
    };
    if (c.qk_norm) {  // one weight for every head, so whole on every rank
      layer.push_back({p + "self_attn.q_norm.weight", {d}, all(d), {}, &l.q_norm});
      layer.push_back({p + "self_attn.k_norm.weight", {d}, all(d), {}, &l.k_norm});
    }
    if (c.attention_bias) {
      layer.push_back({p + "self_attn.q_proj.bias", {q}, q_rows, {}, &l.q_bias});
      layer.push_back({p + "self_attn.k_proj.bias", {kv}, kv_rows, {}, &l.k_bias});
      layer.push_back({p + "self_attn.v_proj.bias", {kv}, kv_rows, {}, &l.v_bias});
    }
    for (TensorBlock& b : layer) plan.push_back(std::move(b));
  }
  plan.push_back({"model.norm.weight", {h}, all(h), {}, &w.final_norm});
  if (!c.tie_word_embeddings) {
    plan.push_back({"lm_head.weight", {c.vocab_size, h}, vocab, all(h), &w.lm_head});
  }
  return plan;
}

Result<Weights> load_hf(const std::string& dir, const HeldPart* part) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  auto config = parse_hf_config(config_path);
  if (!config.ok()) return config.status();
  auto ck = SafetensorsCheckpoint::open(dir);
  if (!ck.ok()) return ck.status();
  Weights w;
  w.config = std::move(config.value());
  if (part != nullptr) w.held = *part;
  const std::vector<TensorBlock> plan = llama_blocks(w);
  if (Status s = load_blocks(*ck, w.config.weight_format, dir, plan); !s.ok()) return s;
  return w;
}

Status load_blocks(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                   const std::string& dir, const std::vector<TensorBlock>& blocks) {
  for (const TensorBlock& b : blocks) {
    if (Status s = load_block(ck, format, dir, b.name, b.shape, b.rows, b.cols, *b.out, b.packed);
        !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

Result<uint64_t> stored_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                              const std::string& dir, const std::vector<TensorBlock>& blocks,
                              int dense_element_bytes, bool keep_packed,
                              std::set<std::string>* counted) {
  uint64_t total = 0;
  for (const TensorBlock& b : blocks) {
    const std::string stored = stored_tensor_name(ck, b.name);
    if (format.quantized()) {
      Result<uint64_t> q =
          stored_quantized_bytes(ck, format, stored, b.shape, b.rows, b.cols, counted);
      if (!q.ok() && !q.status().IsNotFound()) return q.status();
      if (q.ok()) {
        if (dense_element_bytes > 0 && keep_packed && b.packed != nullptr &&
            keeps_as_stored(format, b.shape[1], b.cols)) {  // held packed
          q = packed_quantized_bytes(ck, format, stored, b.shape, b.rows, b.cols);
          if (!q.ok()) return q.status();
        } else if (dense_element_bytes > 0) {  // dequantized at load
          q = static_cast<uint64_t>(b.rows.size()) * static_cast<uint64_t>(b.cols.size()) *
              static_cast<uint64_t>(dense_element_bytes);
        }
        total += *q;
        continue;
      }
    }
    Result<TensorView> t = stored_tensor(ck, dir, b.name, stored, b.shape);
    if (!t.ok()) return t.status();
    if (Status s = check_shape(*t, b.name, b.shape); !s.ok()) return s;
    if (counted != nullptr) counted->insert(stored);
    const int64_t numel = t->numel();
    const int64_t held = b.rows.size() * (b.shape.size() > 1 ? b.cols.size() : 1);
    const uint64_t bytes = dense_element_bytes > 0
                               ? static_cast<uint64_t>(numel) * dense_element_bytes
                               : static_cast<uint64_t>(t->bytes);
    total += numel > 0
                 ? static_cast<uint64_t>(std::llround(static_cast<double>(bytes) * held / numel))
                 : 0;
  }
  return total;
}

namespace {

// MLA + MoE presets: DeepSeek-V3 / Kimi-K2's proportions scaled down.
struct MlaPreset {
  std::string_view name;
  int64_t hidden, layers, heads, q_lora, kv_lora, nope, rope, v, intermediate;
  int64_t experts, shared, expert_width, top_k, groups, top_groups;
  double yarn_factor;
  int64_t original_max, max_positions;
};

constexpr MlaPreset kMlaPresets[] = {
    // Kimi-K2's attention (16 heads of 128 + 64 over a 512 + 64 latent) on a 1024 hidden, one
    // dense layer then three of 64 experts, top 8, one shared; yarn as Kimi-K2 sets it.
    {"synth-mla", 1024, 4, 16, 384, 512, 128, 64, 128, 2816, 64, 1, 256, 8, 1, 1, 32, 4096,
     131072},
    // For tests: two expert groups (group-limited routing) and yarn, small enough for sanitizers.
    {"synth-mla-tiny", 64, 3, 4, 32, 32, 16, 8, 16, 128, 8, 1, 32, 2, 2, 1, 4, 512, 2048},
};

ModelConfig MlaConfigOf(const MlaPreset& p) {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.torch_dtype = "float32";
  c.hidden_size = p.hidden;
  c.intermediate_size = p.intermediate;
  c.num_hidden_layers = p.layers;
  c.num_attention_heads = c.num_key_value_heads = p.heads;
  c.head_dim = p.nope + p.rope;
  c.vocab_size = 512;
  c.max_position_embeddings = p.max_positions;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 50000.0;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.mla = {p.kv_lora, p.rope, p.nope, p.v, p.q_lora, true};
  c.moe.n_routed_experts = p.experts;
  c.moe.n_shared_experts = p.shared;
  c.moe.moe_intermediate_size = p.expert_width;
  c.moe.first_k_dense_replace = 1;
  c.moe.num_experts_per_tok = p.top_k;
  c.moe.n_group = p.groups;
  c.moe.topk_group = p.top_groups;
  c.moe.routed_scaling_factor = 2.827;
  c.rope_scaling = true;
  c.rope_scaling_type = "yarn";
  c.yarn.factor = p.yarn_factor;
  c.yarn.original_max_position_embeddings = p.original_max;
  c.yarn.beta_fast = c.yarn.beta_slow = 1;
  c.yarn.mscale = c.yarn.mscale_all_dim = 1;
  return c;
}

}  // namespace

Result<ModelConfig> preset_config(std::string_view name) {
  for (const MlaPreset& p : kMlaPresets) {
    if (p.name == name) return MlaConfigOf(p);
  }
  auto p = FindPreset(name);
  if (!p.ok()) return p.status();
  return ConfigOf(**p);
}

Result<Weights> make_preset(std::string_view name, uint64_t seed) {
  auto p = FindPreset(name);
  if (!p.ok()) return p.status();
  return generate_llama(ConfigOf(**p), seed);
}

Weights generate_llama(const ModelConfig& config, uint64_t seed) {
  Weights w;
  w.config = config;
  const ModelConfig& c = w.config;
  const auto h = static_cast<size_t>(c.hidden_size), q = static_cast<size_t>(c.q_dim()),
             kv = static_cast<size_t>(c.kv_dim()), in = static_cast<size_t>(c.intermediate_size),
             vocab = static_cast<size_t>(c.vocab_size);
  constexpr double kStd = 0.02;  // GPT-2's init: keeps q.k and MLP activations O(1) at any depth
  fill_random(w.embed, vocab * h, kStd, seed, "model.embed_tokens.weight");
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    l.input_norm.assign(h, 1.0f);
    l.post_norm.assign(h, 1.0f);
    fill_random(l.q, q * h, kStd, seed, p + "self_attn.q_proj.weight");
    fill_random(l.k, kv * h, kStd, seed, p + "self_attn.k_proj.weight");
    fill_random(l.v, kv * h, kStd, seed, p + "self_attn.v_proj.weight");
    fill_random(l.o, h * q, kStd, seed, p + "self_attn.o_proj.weight");
    fill_random(l.gate, in * h, kStd, seed, p + "mlp.gate_proj.weight");
    fill_random(l.up, in * h, kStd, seed, p + "mlp.up_proj.weight");
    fill_random(l.down, h * in, kStd, seed, p + "mlp.down_proj.weight");
    if (c.qk_norm) {
      l.q_norm.assign(static_cast<size_t>(c.head_dim), 1.0f);
      l.k_norm.assign(static_cast<size_t>(c.head_dim), 1.0f);
    }
    if (c.attention_bias) {
      l.q_bias.assign(q, 0.0f);
      l.k_bias.assign(kv, 0.0f);
      l.v_bias.assign(kv, 0.0f);
    }
  }
  w.final_norm.assign(h, 1.0f);
  if (!c.tie_word_embeddings) fill_random(w.lm_head, vocab * h, kStd, seed, "lm_head.weight");
  return w;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  for (const MlaPreset& p : kMlaPresets) out.emplace_back(p.name);
  return out;
}

uint64_t fingerprint(const Weights& w) {
  // FNV-1a over 32-bit words (bit patterns, so endianness does not matter), lengths included so
  // that moving a value between tensors changes the result.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t word) { h = (h ^ word) * 0x100000001b3ull; };
  ForEachTensor(w, [&](const std::vector<float>& t) {
    mix(t.size());
    for (float x : t) mix(std::bit_cast<uint32_t>(x));
  });
  return h;
}

}  // namespace kvrt::model
