#include "core/model/deepseek_v3.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/model/rope.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/parallel/linear.h"
#include "core/parallel/vocab_parallel.h"

namespace kvrt::model {

using parallel::ColumnParallelLinear;
using parallel::Range;
using parallel::RowParallelLinear;
using parallel::RowsOf;
using parallel::split;

namespace {

// The router's working arrays, sized once for the model (no allocation per token).
struct RouteScratch {
  std::vector<float> scores, choice, group;  // [E], [E], [n_group]
  std::vector<int64_t> order, groups;        // [E], [n_group]
  std::vector<uint8_t> kept;                 // [n_group]
  explicit RouteScratch(const ModelConfig::Moe& m)
      : scores(m.n_routed_experts), choice(m.n_routed_experts), group(m.n_group),
        order(m.n_routed_experts), groups(m.n_group), kept(m.n_group) {}
};

// The chosen experts of one token: transformers' DeepseekV3TopkRouter on its logits.
void route(const ModelConfig::Moe& m, const float* logits, const float* bias, int64_t* chosen,
           float* weights, RouteScratch& r) {
  const int64_t E = m.n_routed_experts, K = m.num_experts_per_tok;
  std::vector<float>& scores = r.scores;
  std::vector<float>& choice = r.choice;
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = scores[e] + bias[e];
  }
  // Higher first; ties to the lower index, so every rank and run choose alike.
  auto better = [](const std::vector<float>& v) {
    return [&v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  if (m.n_group > 1) {
    const int64_t per = E / m.n_group;
    std::vector<float>& group = r.group;
    for (int64_t g = 0; g < m.n_group; ++g) {
      float first = -INFINITY, second = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > first) {
          second = first;
          first = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group[g] = first + second;
    }
    std::vector<int64_t>& groups = r.groups;
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(groups.begin(), groups.begin() + m.topk_group, groups.end(), better(group));
    std::fill(r.kept.begin(), r.kept.end(), 0);
    for (int64_t i = 0; i < m.topk_group; ++i) r.kept[groups[i]] = 1;
    for (int64_t e = 0; e < E; ++e) {
      if (r.kept[e / per] == 0) choice[e] = 0.0f;
    }
  }
  std::vector<int64_t>& order = r.order;
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), better(choice));
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    chosen[k] = order[k];
    weights[k] = scores[order[k]];
    sum += weights[k];
  }
  for (int64_t k = 0; k < K; ++k) {
    if (m.norm_topk_prob) weights[k] /= sum + 1e-20f;
    weights[k] *= static_cast<float>(m.routed_scaling_factor);
  }
}

class DeepseekV3 : public Architecture {
 public:
  DeepseekV3(const DeepseekV3Weights& weights, const DeepseekV3Shard& shard,
             backend::Backend& backend);
  AttentionShape attention_shape() const override;
  Status forward(const StepInputs& inputs, backend::Backend& backend, comm::Communicator& comm,
                 parallel::StepAttention& kv, std::vector<float>* logits) override;

 private:
  struct Mlp {
    ColumnParallelLinear gate_up;  // [2 I_r][H]: gate rows, then up rows
    RowParallelLinear down;        // [H][I_r]
    int64_t width = 0;             // I_r
  };
  struct Layer {
    backend::Buffer input_norm, post_norm, q_a_norm, kv_a_norm;
    std::unique_ptr<backend::Matrix> q_a;  // null without q_lora_rank
    // [n_r N + n_r R][Lq or H]: the rank's heads' nope rows, then their rope rows, so the
    // rope parts are contiguous heads.
    ColumnParallelLinear q_b;
    std::unique_ptr<backend::Matrix> kv_a;             // [L+R][H]
    std::vector<std::unique_ptr<backend::Matrix>> uk;  // per head [L][N]: W_UK^T
    std::vector<std::unique_ptr<backend::Matrix>> uv;  // per head [V][L]
    RowParallelLinear o;                               // [H][n_r V]
    bool moe = false;
    Mlp mlp;                                   // dense
    std::unique_ptr<backend::Matrix> router;   // [E][H]
    std::vector<float> router_bias;            // host
    std::vector<Mlp> experts;
    Mlp shared;
  };

  Mlp upload_mlp(backend::Backend& be, const MlpWeights& w, Range keep, bool whole);
  Status attention(Layer& l, uint32_t layer, int64_t T, backend::Backend& be,
                   parallel::StepAttention& kv);
  void moe(Layer& l, int64_t T, backend::Backend& be);
  // silu(gate) * up of `rows` rows of x, in act_: the input of m.down.
  const float* activation(const Mlp& m, const float* x, int64_t rows, backend::Backend& be);

  ModelConfig config_;
  int64_t nh_ = 0, N_ = 0, R_ = 0, V_ = 0, L_ = 0, Lq_ = 0;
  std::vector<Layer> layers_;
  std::unique_ptr<parallel::VocabParallel> vocab_;
  std::vector<float> inv_freq_;
  float rope_scale_ = 1, softmax_scale_ = 1;
  // Activations, grown to the largest step seen.
  backend::Buffer x_, h_, cos_, sin_, qa_, q_, lat_, qatt_, olat_, attn_, partial_, gate_up_, act_,
      rows_, out_, router_;
  std::vector<float> router_logits_;
  RouteScratch route_;
  std::vector<int64_t> chosen_;
  std::vector<float> chosen_weights_;
  std::vector<std::vector<int64_t>> expert_rows_;
  std::vector<std::vector<float>> expert_weights_;
};

DeepseekV3::DeepseekV3(const DeepseekV3Weights& w, const DeepseekV3Shard& shard,
                       backend::Backend& be)
    : config_(w.config), route_(w.config.moe) {
  const ModelConfig& c = config_;
  const ModelConfig::Mla& mla = c.mla;
  const int64_t H = c.hidden_size;
  nh_ = shard.heads.size();
  N_ = mla.qk_nope_head_dim;
  R_ = mla.qk_rope_head_dim;
  V_ = mla.v_head_dim;
  L_ = mla.kv_lora_rank;
  Lq_ = mla.q_lora_rank;
  // The shard's heads within what is held.
  const int64_t first_head = w.whole ? shard.heads.begin : shard.heads.begin - w.part.heads.begin;
  const int64_t held_heads = w.whole ? c.num_attention_heads : w.part.heads.size();
  const int64_t q_in = Lq_ > 0 ? Lq_ : H;
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const DeepseekV3Layer& lw = w.layers[li];
    Layer l;
    l.input_norm = be.upload(lw.input_norm);
    l.post_norm = be.upload(lw.post_norm);
    // A projection the checkpoint stores quantized is uploaded as stored (Backend::
    // upload_quantized: the CPU keeps the codes), else its f32 values (as a projection:
    // model.quantization quantizes it).
    auto matrix = [&](const std::vector<float>& dense, const backend::QuantizedMatrix& q,
                      int64_t rows, int64_t cols) {
      return q.empty() ? be.upload_projection(dense, rows, cols) : be.upload_quantized(q);
    };
    if (Lq_ > 0) {
      l.q_a = matrix(lw.q_a, lw.q_a_q, Lq_, H);
      l.q_a_norm = be.upload(lw.q_a_norm);
    }
    // q_b's rows in the order the attention reads them: the rank's heads' nope rows, then their
    // rope rows.
    std::vector<Range> q_order;
    for (const auto& [offset, width] : {std::pair{int64_t{0}, N_}, std::pair{N_, R_}}) {
      for (int64_t h = first_head; h < first_head + nh_; ++h) {
        q_order.push_back({h * (N_ + R_) + offset, h * (N_ + R_) + offset + width});
      }
    }
    if (!lw.q_b_q.empty()) {
      backend::QuantizedMatrix q_b;
      for (const Range& r : q_order) q_b.append_rows(lw.q_b_q, r.begin, r.end);
      // (Empty on a rank without heads: then by its values, none.)
      l.q_b = ColumnParallelLinear(be, {{&lw.q_b, Range{0, q_b.rows}, &q_b}}, q_in);
    } else {
      std::vector<float> q_b;
      q_b.reserve(nh_ * (N_ + R_) * q_in);
      for (const Range& r : q_order) {
        q_b.insert(q_b.end(), lw.q_b.begin() + r.begin * q_in, lw.q_b.begin() + r.end * q_in);
      }
      l.q_b = ColumnParallelLinear(be, std::move(q_b), nh_ * (N_ + R_), q_in);
    }
    l.kv_a = matrix(lw.kv_a, lw.kv_a_q, L_ + R_, H);
    l.kv_a_norm = be.upload(lw.kv_a_norm);
    for (int64_t h = first_head; h < first_head + nh_; ++h) {
      const float* k_part = lw.kv_b.data() + h * (N_ + V_) * L_;  // [N][L]
      std::vector<float> uk(L_ * N_);
      for (int64_t n = 0; n < N_; ++n) {
        for (int64_t j = 0; j < L_; ++j) uk[j * N_ + n] = k_part[n * L_ + j];
      }
      l.uk.push_back(be.upload_matrix(std::move(uk), L_, N_));
      const float* v_part = k_part + N_ * L_;  // [V][L]
      l.uv.push_back(be.upload_matrix(std::vector<float>(v_part, v_part + V_ * L_), V_, L_));
    }
    const Range o_keep{first_head * V_, (first_head + nh_) * V_};
    l.o = RowParallelLinear(be, lw.o, H, held_heads * V_, o_keep, &lw.o_q);
    l.moe = c.moe_layer(static_cast<int64_t>(li));
    if (l.moe) {
      l.router = be.upload_matrix(lw.router, c.moe.n_routed_experts, H);
      l.router_bias = lw.router_bias;
      for (const MlpWeights& e : lw.experts) {
        l.experts.push_back(upload_mlp(be, e, shard.expert, w.whole));
      }
      if (c.moe.n_shared_experts > 0) l.shared = upload_mlp(be, lw.shared, shard.shared, w.whole);
    } else {
      l.mlp = upload_mlp(be, lw.mlp, shard.intermediate, w.whole);
    }
    layers_.push_back(std::move(l));
  }
  const Range vocab = w.whole ? shard.vocab : Range{0, shard.vocab.size()};
  vocab_ = std::make_unique<parallel::VocabParallel>(
      be, shard.rank, shard.tp, c.vocab_size, H, parallel::rows_of(w.embed, H, vocab),
      parallel::rows_of(w.lm_head.empty() ? w.embed : w.lm_head, H, vocab), w.final_norm);
  rope_frequencies(c, R_, &inv_freq_, &rope_scale_);
  softmax_scale_ = mla_softmax_scale(c);
  expert_rows_.resize(c.moe.n_routed_experts);
  expert_weights_.resize(c.moe.n_routed_experts);
}

DeepseekV3::Mlp DeepseekV3::upload_mlp(backend::Backend& be, const MlpWeights& w, Range keep,
                                       bool whole) {
  const int64_t H = config_.hidden_size;
  const Range cols = whole ? keep : Range{0, keep.size()};
  Mlp m;
  m.width = keep.size();
  // A checkpoint's quantized projections as stored, else f32 (one of gate and up kept as stored
  // and the other not -- a config that leaves one dense -- goes by both's values).
  m.gate_up = ColumnParallelLinear(be, {{&w.gate, cols, &w.gate_q}, {&w.up, cols, &w.up_q}}, H);
  const int64_t held = H == 0 ? 0 : static_cast<int64_t>(w.down.size()) / H;
  m.down = RowParallelLinear(be, w.down, H, held, cols, &w.down_q);
  return m;
}

AttentionShape DeepseekV3::attention_shape() const {
  AttentionShape s;
  s.q_heads = nh_;
  s.kv_heads = 1;            // one latent, shared by every head (MQA in the latent space)
  s.qk_head_dim = L_ + R_;   // [W_UK^T q_nope | rope(q_pe)] against [c | rope(k_pe)]
  s.v_head_dim = L_;         // the values are the latent itself
  s.softmax_scale = softmax_scale_;  // of the unabsorbed qk_nope + qk_rope head
  return s;
}

const float* DeepseekV3::activation(const Mlp& m, const float* x, int64_t rows,
                                    backend::Backend& be) {
  be.reserve(&gate_up_, rows * 2 * m.width);
  be.reserve(&act_, rows * m.width);
  m.gate_up.forward(be, x, rows, gate_up_.data());
  be.silu_mul(gate_up_.data(), rows, m.width, act_.data());
  return act_.data();
}

Status DeepseekV3::attention(Layer& l, uint32_t layer, int64_t T, backend::Backend& be,
                             parallel::StepAttention& kv) {
  const int64_t q_width = nh_ * (N_ + R_), row = L_ + R_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* h = h_.data();
  // The query: nope parts of every head, then rope parts.
  be.reserve(&q_, T * q_width);
  if (l.q_a != nullptr) {
    be.reserve(&qa_, T * Lq_);
    be.matmul(h, T, *l.q_a, qa_.data());
    be.rms_norm(qa_.data(), l.q_a_norm, qa_.data(), T, Lq_, eps);
    l.q_b.forward(be, qa_.data(), T, q_.data());
  } else {
    l.q_b.forward(be, h, T, q_.data());
  }
  // The latent row: [kv_a_layernorm(c) | rope(k_pe)], stored for every head.
  be.reserve(&lat_, T * row);
  be.matmul(h, T, *l.kv_a, lat_.data());
  be.rms_norm_strided(lat_.data(), row, l.kv_a_norm, lat_.data(), row, T, L_, eps);
  float* q_rope = q_.data() + nh_ * N_;
  if (config_.mla.rope_interleave) {
    be.apply_rope_interleaved(lat_.data() + L_, T, 1, R_, row, cos_.data(), sin_.data());
    be.apply_rope_interleaved(q_rope, T, nh_, R_, q_width, cos_.data(), sin_.data());
  } else {
    be.apply_rope(lat_.data() + L_, T, 1, R_, row, cos_.data(), sin_.data());
    be.apply_rope(q_rope, T, nh_, R_, q_width, cos_.data(), sin_.data());
  }
  // Absorbed queries: per head [W_UK^T q_nope | rope(q_pe)].
  be.reserve(&qatt_, T * nh_ * row);
  for (int64_t hd = 0; hd < nh_; ++hd) {
    be.matmul_strided(q_.data() + hd * N_, T, q_width, *l.uk[hd], qatt_.data() + hd * row,
                      nh_ * row);
    be.copy_rows(q_rope + hd * R_, q_width, qatt_.data() + hd * row + L_, nh_ * row, T, R_);
  }
  // The latent row stored (no separate values), then attention over the layer's latents.
  be.reserve(&olat_, T * nh_ * L_);
  if (Status s = kv.attention(layer, T, qatt_.data(), nh_ * row, lat_.data(), nullptr, row,
                              olat_.data(), nh_ * L_);
      !s.ok()) {
    return s;
  }
  // Out of the latent space by each head's W_UV, into attn_ (o_proj's input on this rank).
  be.reserve(&attn_, T * nh_ * V_);
  for (int64_t hd = 0; hd < nh_; ++hd) {
    be.matmul_strided(olat_.data() + hd * L_, T, nh_ * L_, *l.uv[hd], attn_.data() + hd * V_,
                      nh_ * V_);
  }
  return Status::Ok();
}

void DeepseekV3::moe(Layer& l, int64_t T, backend::Backend& be) {
  const ModelConfig::Moe& m = config_.moe;
  const int64_t H = config_.hidden_size, E = m.n_routed_experts, K = m.num_experts_per_tok;
  const float* h = h_.data();
  float* partial = partial_.data();
  be.reserve(&router_, T * E);
  be.matmul(h, T, *l.router, router_.data());
  router_logits_.resize(T * E);
  be.download(router_.data(), router_logits_.size(), router_logits_.data());
  chosen_.resize(K);
  chosen_weights_.resize(K);
  for (int64_t e = 0; e < E; ++e) {
    expert_rows_[e].clear();
    expert_weights_[e].clear();
  }
  for (int64_t t = 0; t < T; ++t) {
    route(m, router_logits_.data() + t * E, l.router_bias.data(), chosen_.data(),
          chosen_weights_.data(), route_);
    for (int64_t k = 0; k < K; ++k) {
      expert_rows_[chosen_[k]].push_back(t);
      expert_weights_[chosen_[k]].push_back(chosen_weights_[k]);
    }
  }
  // Each expert over its tokens, in expert order (as transformers sums them), then the shared.
  for (int64_t e = 0; e < E; ++e) {
    const auto n = static_cast<int64_t>(expert_rows_[e].size());
    if (n == 0 || l.experts[e].width == 0) continue;
    be.reserve(&rows_, n * H);
    be.reserve(&out_, n * H);
    be.gather_rows(h, expert_rows_[e], H, rows_.data());
    l.experts[e].down.partial(be, activation(l.experts[e], rows_.data(), n, be), n, out_.data());
    be.scatter_add_rows(out_.data(), expert_rows_[e], expert_weights_[e], H, partial);
  }
  if (l.shared.width > 0) {
    be.reserve(&out_, T * H);
    l.shared.down.partial(be, activation(l.shared, h, T, be), T, out_.data());
    be.add(partial, out_.data(), T * H);
  }
}

Status DeepseekV3::forward(const StepInputs& in, backend::Backend& be, comm::Communicator& comm,
                           parallel::StepAttention& kv, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, T = static_cast<int64_t>(in.ids.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  Status status;  // the first failure; collectives go on regardless
  auto check = [&status](Status s) {
    if (status.ok() && !s.ok()) status = s;
    return status.ok();
  };

  be.reserve(&x_, T * H);
  check(vocab_->embed(be, comm, in.ids, x_.data()));
  for (backend::Buffer* b : {&cos_, &sin_}) be.reserve(b, T * R_ / 2);
  be.rope_tables_from(in.positions, inv_freq_, rope_scale_, cos_.data(), sin_.data());
  be.reserve(&h_, T * H);
  be.reserve(&partial_, T * H);
  float* x = x_.data();
  float* partial = partial_.data();
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& l = layers_[li];
    be.rms_norm(x, l.input_norm, h_.data(), T, H, eps);
    // o_proj's input: none on a rank without heads, or after a failure (when attention meets
    // the other ranks in collectives, it still runs, and fails).
    const float* attn = nullptr;
    if (nh_ > 0 && (status.ok() || kv.collective()) &&
        check(attention(l, static_cast<uint32_t>(li), T, be, kv)) && status.ok()) {
      attn = attn_.data();
    }
    check(l.o.forward(be, comm, attn, T, partial));
    be.add(x, partial, T * H);

    be.rms_norm(x, l.post_norm, h_.data(), T, H, eps);
    if (l.moe) {
      // The experts' row-parallel products (and the shared experts'), added here and summed
      // over the group once.
      be.fill_zero(partial, T * H);
      moe(l, T, be);
      check(RowParallelLinear::reduce(be, comm, partial, T, H));
    } else {
      const float* act = l.mlp.width > 0 ? activation(l.mlp, h_.data(), T, be) : nullptr;
      check(l.mlp.down.forward(be, comm, act, T, partial));
    }
    be.add(x, partial, T * H);
  }
  check(vocab_->logits(be, comm, x, in.last_rows, eps, logits));
  return status;
}

Status check_tp(const ModelConfig& c, int tp) {
  if (Status s = deepseek_v3_shard(c, 0, tp).status(); !s.ok()) return s;
  // Packed int experts (compressed-tensors): each rank's columns of a routed expert's down
  // projection must be whole groups and whole words, as a packed shard needs them (with threads
  // or MPI alike: the CPU keeps the experts as stored).
  const WeightFormat& f = c.weight_format;
  if (f.kind == WeightFormat::Kind::kPackedInt && tp > 1 && c.moe.n_routed_experts > 0) {
    const int64_t Ie = c.moe.moe_intermediate_size;
    const int64_t unit = std::max<int64_t>(f.group_size, 32 / f.bits);
    if (Ie % tp != 0 || (Ie / tp) % unit != 0) {
      return Status::InvalidArgument(
          std::to_string(tp) + " ranks split each routed expert's down_proj input "
          "(moe_intermediate_size " + std::to_string(Ie) + ") into parts that cut its " +
          f.describe() + " (model.layers.N.mlp.experts.E.down_proj.weight_packed: a part must "
          "be whole groups of " + std::to_string(unit) + " columns)");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<LoadedWeights>> load(const std::string& dir, int rank, int tp) {
  DeepseekV3Shard part;
  if (tp > 1) {
    Result<ModelConfig> c = parse_hf_config(dir + "/config.json");
    if (!c.ok()) return c.status();
    Result<DeepseekV3Shard> shard = deepseek_v3_shard(*c, rank, tp);
    if (!shard.ok()) return shard.status();
    part = *shard;
  }
  Result<DeepseekV3Weights> w = load_deepseek_v3(dir, tp > 1 ? &part : nullptr);
  if (!w.ok()) return w.status();
  return std::unique_ptr<LoadedWeights>(new DeepseekV3Weights(std::move(*w)));
}

Result<std::vector<TensorBlock>> tensors(const ModelConfig& c, int rank, int tp) {
  DeepseekV3Weights w;
  w.config = c;
  if (tp > 1) {
    Result<DeepseekV3Shard> shard = deepseek_v3_shard(c, rank, tp);
    if (!shard.ok()) return shard.status();
    w.whole = false;
    w.part = *shard;
  }
  std::vector<TensorBlock> blocks = deepseek_v3_blocks(w);
  for (TensorBlock& b : blocks) b.out = nullptr;  // w goes
  return blocks;
}

Result<std::unique_ptr<LoadedWeights>> generate(const ModelConfig& c, uint64_t seed) {
  return std::unique_ptr<LoadedWeights>(new DeepseekV3Weights(generate_deepseek_v3(c, seed)));
}

Result<std::unique_ptr<Architecture>> create(const LoadedWeights& loaded, int rank, int tp,
                                             backend::Backend& backend) {
  const auto* w = dynamic_cast<const DeepseekV3Weights*>(&loaded);
  if (w == nullptr) {
    return Status::Internal("the deepseek_v3 family was given another family's weights (" +
                            loaded.model_config().architecture + ")");
  }
  Result<DeepseekV3Shard> shard = deepseek_v3_shard(w->config, rank, tp);
  if (!shard.ok()) return shard.status();
  if (!w->whole && (w->part.rank != rank || w->part.tp != tp)) {
    return Status::Internal("weights loaded for another TP rank than rank " +
                            std::to_string(rank) + " of " + std::to_string(tp));
  }
  return std::unique_ptr<Architecture>(new DeepseekV3(*w, *shard, backend));
}

}  // namespace

float mla_softmax_scale(const ModelConfig& c) {
  float scale = 1.0f / std::sqrt(static_cast<float>(c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim));
  if (c.yarn.factor > 0 && c.yarn.mscale_all_dim > 0) {
    const auto m = static_cast<float>(yarn_mscale(c.yarn.factor, c.yarn.mscale_all_dim));
    scale *= m * m;
  }
  return scale;
}

Result<DeepseekV3Shard> deepseek_v3_shard(const ModelConfig& c, int rank, int tp) {
  if (tp < 1 || rank < 0 || rank >= tp) return Status::InvalidArgument("bad TP rank");
  DeepseekV3Shard s;
  s.rank = rank;
  s.tp = tp;
  s.heads = split(c.num_attention_heads, tp, rank);
  s.intermediate = split(c.intermediate_size, tp, rank);
  s.expert = split(c.moe.moe_intermediate_size, tp, rank);
  s.shared = split(c.moe.n_shared_experts * c.moe.moe_intermediate_size, tp, rank);
  s.vocab = split(c.vocab_size, tp, rank);
  return s;
}

std::vector<TensorBlock> deepseek_v3_blocks(DeepseekV3Weights& w) {
  const ModelConfig& c = w.config;
  const ModelConfig::Mla& mla = c.mla;
  const int64_t H = c.hidden_size, n = c.num_attention_heads, E = c.moe.n_routed_experts;
  const int64_t N = mla.qk_nope_head_dim, R = mla.qk_rope_head_dim, V = mla.v_head_dim;
  const int64_t L = mla.kv_lora_rank, Lq = mla.q_lora_rank, I = c.intermediate_size;
  const int64_t Ie = c.moe.moe_intermediate_size, Is = c.moe.n_shared_experts * Ie;
  auto all = [](int64_t size) { return Range{0, size}; };
  auto held = [&](Range r, int64_t size, int64_t unit) {
    return w.whole ? all(size) : Range{r.begin * unit, r.end * unit};
  };
  const DeepseekV3Shard& p = w.part;
  const Range q_rows = held(p.heads, n * (N + R), N + R), kv_b_rows = held(p.heads, n * (N + V), N + V);
  const Range o_cols = held(p.heads, n * V, V), vocab = held(p.vocab, c.vocab_size, 1);
  // An MLP under `prefix` holding columns `keep` of `width`.
  auto mlp_blocks = [&](const std::string& prefix, MlpWeights& m, int64_t width, Range keep) {
    const Range cols = w.whole ? all(width) : keep;
    return std::vector<TensorBlock>{
        {prefix + "gate_proj.weight", {width, H}, cols, all(H), &m.gate, &m.gate_q},
        {prefix + "up_proj.weight", {width, H}, cols, all(H), &m.up, &m.up_q},
        {prefix + "down_proj.weight", {H, width}, all(H), cols, &m.down, &m.down_q}};
  };
  std::vector<TensorBlock> plan = {
      {"model.embed_tokens.weight", {c.vocab_size, H}, vocab, all(H), &w.embed},
      {"model.norm.weight", {H}, all(H), {}, &w.final_norm}};
  if (!c.tie_word_embeddings) {
    plan.push_back({"lm_head.weight", {c.vocab_size, H}, vocab, all(H), &w.lm_head});
  }
  w.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DeepseekV3Layer& l = w.layers[i];
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    const std::string at = pre + "self_attn.";
    std::vector<TensorBlock> layer = {
        {pre + "input_layernorm.weight", {H}, all(H), {}, &l.input_norm},
        {pre + "post_attention_layernorm.weight", {H}, all(H), {}, &l.post_norm},
        {at + "kv_a_proj_with_mqa.weight", {L + R, H}, all(L + R), all(H), &l.kv_a, &l.kv_a_q},
        {at + "kv_a_layernorm.weight", {L}, all(L), {}, &l.kv_a_norm},
        {at + "kv_b_proj.weight", {n * (N + V), L}, kv_b_rows, all(L), &l.kv_b},
        {at + "o_proj.weight", {H, n * V}, all(H), o_cols, &l.o, &l.o_q}};
    if (Lq > 0) {
      layer.push_back({at + "q_a_proj.weight", {Lq, H}, all(Lq), all(H), &l.q_a, &l.q_a_q});
      layer.push_back({at + "q_a_layernorm.weight", {Lq}, all(Lq), {}, &l.q_a_norm});
      layer.push_back(
          {at + "q_b_proj.weight", {n * (N + R), Lq}, q_rows, all(Lq), &l.q_b, &l.q_b_q});
    } else {
      layer.push_back({at + "q_proj.weight", {n * (N + R), H}, q_rows, all(H), &l.q_b, &l.q_b_q});
    }
    if (c.moe_layer(i)) {
      layer.push_back({pre + "mlp.gate.weight", {E, H}, all(E), all(H), &l.router});
      layer.push_back({pre + "mlp.gate.e_score_correction_bias", {E}, all(E), {}, &l.router_bias});
      l.experts.resize(E);
      for (int64_t e = 0; e < E; ++e) {
        for (TensorBlock& b : mlp_blocks(pre + "mlp.experts." + std::to_string(e) + ".",
                                         l.experts[e], Ie, p.expert)) {
          layer.push_back(std::move(b));
        }
      }
      if (Is > 0) {
        for (TensorBlock& b : mlp_blocks(pre + "mlp.shared_experts.", l.shared, Is, p.shared)) {
          layer.push_back(std::move(b));
        }
      }
    } else {
      for (TensorBlock& b : mlp_blocks(pre + "mlp.", l.mlp, I, p.intermediate)) {
        layer.push_back(std::move(b));
      }
    }
    for (TensorBlock& b : layer) plan.push_back(std::move(b));
  }
  return plan;
}

Result<DeepseekV3Weights> load_deepseek_v3(const std::string& dir, const DeepseekV3Shard* part) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  Result<ModelConfig> config = parse_hf_config(config_path);
  if (!config.ok()) return config.status();
  Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(dir);
  if (!ck.ok()) return ck.status();
  DeepseekV3Weights w;
  w.config = std::move(*config);
  if (part != nullptr) {
    w.whole = false;
    w.part = *part;
  }
  const std::vector<TensorBlock> plan = deepseek_v3_blocks(w);
  if (Status s = load_blocks(*ck, w.config.weight_format, dir, plan); !s.ok()) return s;
  return w;
}

DeepseekV3Weights generate_deepseek_v3(const ModelConfig& c, uint64_t seed) {
  DeepseekV3Weights w;
  w.config = c;
  const ModelConfig::Mla& mla = c.mla;
  const auto H = static_cast<size_t>(c.hidden_size), n = static_cast<size_t>(c.num_attention_heads);
  const auto N = static_cast<size_t>(mla.qk_nope_head_dim), R = static_cast<size_t>(mla.qk_rope_head_dim);
  const auto V = static_cast<size_t>(mla.v_head_dim), L = static_cast<size_t>(mla.kv_lora_rank);
  const auto Lq = static_cast<size_t>(mla.q_lora_rank), I = static_cast<size_t>(c.intermediate_size);
  const auto E = static_cast<size_t>(c.moe.n_routed_experts);
  const auto Ie = static_cast<size_t>(c.moe.moe_intermediate_size);
  const size_t Is = static_cast<size_t>(c.moe.n_shared_experts) * Ie;
  constexpr double kStd = 0.02;
  auto draw = [&](std::vector<float>& v, size_t size, const std::string& name) {
    fill_random(v, size, kStd, seed, name);
  };
  auto draw_mlp = [&](MlpWeights& m, size_t width, const std::string& prefix) {
    draw(m.gate, width * H, prefix + "gate_proj.weight");
    draw(m.up, width * H, prefix + "up_proj.weight");
    draw(m.down, H * width, prefix + "down_proj.weight");
  };
  draw(w.embed, c.vocab_size * H, "model.embed_tokens.weight");
  w.layers.resize(c.num_hidden_layers);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    DeepseekV3Layer& l = w.layers[i];
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    const std::string at = pre + "self_attn.";
    l.input_norm.assign(H, 1.0f);
    l.post_norm.assign(H, 1.0f);
    if (Lq > 0) {
      draw(l.q_a, Lq * H, at + "q_a_proj.weight");
      l.q_a_norm.assign(Lq, 1.0f);
      draw(l.q_b, n * (N + R) * Lq, at + "q_b_proj.weight");
    } else {
      draw(l.q_b, n * (N + R) * H, at + "q_proj.weight");
    }
    draw(l.kv_a, (L + R) * H, at + "kv_a_proj_with_mqa.weight");
    l.kv_a_norm.assign(L, 1.0f);
    draw(l.kv_b, n * (N + V) * L, at + "kv_b_proj.weight");
    draw(l.o, H * n * V, at + "o_proj.weight");
    if (c.moe_layer(static_cast<int64_t>(i))) {
      draw(l.router, E * H, pre + "mlp.gate.weight");
      draw(l.router_bias, E, pre + "mlp.gate.e_score_correction_bias");
      l.experts.resize(E);
      for (size_t e = 0; e < E; ++e) {
        draw_mlp(l.experts[e], Ie, pre + "mlp.experts." + std::to_string(e) + ".");
      }
      if (Is > 0) draw_mlp(l.shared, Is, pre + "mlp.shared_experts.");
    } else {
      draw_mlp(l.mlp, I, pre + "mlp.");
    }
  }
  w.final_norm.assign(H, 1.0f);
  if (!c.tie_word_embeddings) draw(w.lm_head, c.vocab_size * H, "lm_head.weight");
  return w;
}

const ArchitectureFamily& deepseek_v3_family() {
  static const ArchitectureFamily kFamily{"deepseek_v3", check_tp, load, tensors, generate, create};
  return kFamily;
}

}  // namespace kvrt::model
