#include "core/model/llama.h"

#include <cmath>

#include "core/model/rope.h"
#include "core/model/weights.h"
#include "core/parallel/linear.h"
#include "core/parallel/vocab_parallel.h"

namespace kvrt::model {

using parallel::append_rows;
using parallel::ColumnParallelLinear;
using parallel::Range;
using parallel::RowParallelLinear;
using parallel::RowsOf;
using parallel::split;

namespace {

class Llama : public Architecture {
 public:
  Llama(const Weights& weights, const LlamaShard& shard, backend::Backend& backend);
  AttentionShape attention_shape() const override;
  Status forward(const StepInputs& inputs, backend::Backend& backend, comm::Communicator& comm,
                 parallel::StepAttention& kv, std::vector<float>* logits) override;

 private:
  struct Layer {
    backend::Buffer input_norm, post_norm;
    ColumnParallelLinear qkv;        // [(nq + 2 nkv) * D][H]: this rank's q, k, v rows (+ biases)
    backend::Buffer q_norm, k_norm;  // [D] each (Qwen3), or empty
    RowParallelLinear o;             // [H][nq * D]: this rank's columns of o_proj
    ColumnParallelLinear gate_up;    // [2 I_r][H]: this rank's gate rows, then up rows
    RowParallelLinear down;          // [H][I_r]: this rank's columns of down_proj
  };

  ModelConfig config_;
  LlamaShard shard_;
  int64_t head_dim_ = 0, nq_ = 0, nkv_ = 0;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;           // [D / 2]
  float rope_scale_ = 1;                  // YaRN's attention factor on cos and sin
  std::unique_ptr<parallel::VocabParallel> vocab_;  // the embedding, final norm and LM head
  // Activations, grown to the largest step seen.
  backend::Buffer x_, cos_, sin_, h_, qkv_, attn_, partial_, gate_up_, act_;
};

Llama::Llama(const Weights& weights, const LlamaShard& shard, backend::Backend& backend)
    : config_(weights.config), shard_(shard) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  head_dim_ = c.head_dim;
  rope_frequencies(c, head_dim_, &inv_freq_, &rope_scale_);
  nq_ = shard.q_heads.size();
  nkv_ = shard.kv_heads.size();
  // The shard's rows and columns within the tensors as held: all of each, or one rank's part.
  const HeldPart& held = weights.held;
  auto within = [&](Range want, Range have) {
    return held.whole ? want : Range{want.begin - have.begin, want.end - have.begin};
  };
  const Range q_heads = within(shard.q_heads, held.q_heads);
  const Range kv_heads = within(shard.kv_heads, held.kv_heads);
  const Range q_rows{q_heads.begin * head_dim_, q_heads.end * head_dim_};
  const Range kv_rows{kv_heads.begin * head_dim_, kv_heads.end * head_dim_};
  const Range mlp = within(shard.intermediate, held.intermediate);
  const Range vocab = within(shard.vocab, held.vocab);
  const int64_t o_cols =
      held.whole ? c.num_attention_heads * head_dim_ : held.q_heads.size() * head_dim_;
  const int64_t down_cols = held.whole ? c.intermediate_size : held.intermediate.size();
  for (const LayerWeights& lw : weights.layers) {
    Layer l;
    l.input_norm = backend.upload(lw.input_norm);
    l.post_norm = backend.upload(lw.post_norm);
    // Column-parallel q, k and v fused (with their biases where the model has them); row-parallel
    // o over this rank's heads' columns.
    const std::initializer_list<RowsOf> no_bias{};
    const std::initializer_list<RowsOf> qkv_bias{
        {&lw.q_bias, q_rows}, {&lw.k_bias, kv_rows}, {&lw.v_bias, kv_rows}};
    l.qkv = ColumnParallelLinear(
        backend, {{&lw.q, q_rows, &lw.q_q}, {&lw.k, kv_rows, &lw.k_q}, {&lw.v, kv_rows, &lw.v_q}},
        hidden, lw.q_bias.empty() ? no_bias : qkv_bias);
    if (!lw.q_norm.empty()) {
      l.q_norm = backend.upload(lw.q_norm);
      l.k_norm = backend.upload(lw.k_norm);
    }
    l.o = RowParallelLinear(backend, lw.o, hidden, o_cols, q_rows, &lw.o_q);
    // The MLP: column-parallel gate and up fused, row-parallel down.
    l.gate_up = ColumnParallelLinear(
        backend, {{&lw.gate, mlp, &lw.gate_q}, {&lw.up, mlp, &lw.up_q}}, hidden);
    l.down = RowParallelLinear(backend, lw.down, hidden, down_cols, mlp, &lw.down_q);
    layers_.push_back(std::move(l));
  }
  std::vector<float> embed, lm_head;
  append_rows(weights.embed, hidden, vocab, &embed);
  append_rows(weights.output_embedding(), hidden, vocab, &lm_head);
  vocab_ =
      std::make_unique<parallel::VocabParallel>(backend, shard.rank, shard.tp, c.vocab_size, hidden,
                                                embed, std::move(lm_head), weights.final_norm);
}

AttentionShape Llama::attention_shape() const {
  AttentionShape s;
  s.q_heads = nq_;
  s.kv_heads = nkv_;
  s.qk_head_dim = s.v_head_dim = head_dim_;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  return s;
}

Status Llama::forward(const StepInputs& in, backend::Backend& be, comm::Communicator& comm,
                      parallel::StepAttention& kv, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, D = head_dim_, T = static_cast<int64_t>(in.ids.size());
  const int64_t qkv_width = (nq_ + 2 * nkv_) * D, I = shard_.intermediate.size();
  const float eps = static_cast<float>(c.rms_norm_eps);
  Status status;  // the first failure; collectives go on regardless
  auto check = [&status](Status s) {
    if (status.ok() && !s.ok()) status = s;
    return status.ok();
  };

  // Vocab-parallel embedding: each rank fills its rows, the all-reduce completes them.
  be.reserve(&x_, T * H);
  check(vocab_->embed(be, comm, in.ids, x_.data()));

  for (backend::Buffer* b : {&cos_, &sin_}) be.reserve(b, T * D / 2);
  be.rope_tables_from(in.positions, inv_freq_, rope_scale_, cos_.data(), sin_.data());
  be.reserve(&h_, T * H);
  be.reserve(&qkv_, T * qkv_width);
  be.reserve(&attn_, T * nq_ * D);
  be.reserve(&partial_, T * H);
  be.reserve(&gate_up_, T * 2 * I);
  be.reserve(&act_, T * I);
  float* x = x_.data();
  float* h = h_.data();
  float* qkv = qkv_.data();
  float* partial = partial_.data();
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    const auto layer = static_cast<uint32_t>(li);
    be.rms_norm(x, l.input_norm, h, T, H, eps);
    // None on a rank without query heads, or after a failure (when attention meets the other
    // ranks in collectives, it still runs, and fails).
    const float* attn = nullptr;
    if (nq_ > 0 && (status.ok() || kv.collective())) {
      l.qkv.forward(be, h, T, qkv);
      if (l.q_norm.size() > 0) {
        // Qwen3: each head of q and of k normalised on its own, before RoPE.
        for (int64_t head = 0; head < nq_ + nkv_; ++head) {
          float* x = qkv + head * D;
          be.rms_norm_strided(x, qkv_width, head < nq_ ? l.q_norm : l.k_norm, x, qkv_width, T, D,
                              eps);
        }
      }
      be.apply_rope(qkv, T, nq_ + nkv_, D, qkv_width, cos_.data(), sin_.data());
      if (check(kv.attention(layer, T, qkv, qkv_width, qkv + nq_ * D, qkv + (nq_ + nkv_) * D,
                             qkv_width, attn_.data(), nq_ * D)) &&
          status.ok()) {
        attn = attn_.data();
      }
    }
    check(l.o.forward(be, comm, attn, T, partial));
    be.add(x, partial, T * H);

    be.rms_norm(x, l.post_norm, h, T, H, eps);
    l.gate_up.forward(be, h, T, gate_up_.data());
    be.silu_mul(gate_up_.data(), T, I, act_.data());
    check(l.down.forward(be, comm, act_.data(), T, partial));
    be.add(x, partial, T * H);
  }

  // Logits of each sequence's last token: this rank's vocab slice, gathered on every rank.
  check(vocab_->logits(be, comm, x, in.last_rows, eps, logits));
  return status;
}

Status check_tp(const ModelConfig& c, int tp) {
  return llama_shard(c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                     c.vocab_size, 0, tp)
      .status();
}

// What rank `rank` of `tp` holds of each tensor: all of it at TP 1.
Result<HeldPart> held_part(const ModelConfig& c, int rank, int tp) {
  if (tp <= 1) return HeldPart{};
  Result<LlamaShard> shard = llama_shard(c.num_attention_heads, c.num_key_value_heads,
                                         c.intermediate_size, c.vocab_size, rank, tp);
  if (!shard.ok()) return shard.status();
  return HeldPart{false, shard->q_heads, shard->kv_heads, shard->intermediate, shard->vocab};
}

Result<std::unique_ptr<LoadedWeights>> load(const std::string& dir, int rank, int tp) {
  HeldPart part;
  if (tp > 1) {
    Result<ModelConfig> c = parse_hf_config(dir + "/config.json");
    if (!c.ok()) return c.status();
    Result<HeldPart> held = held_part(*c, rank, tp);
    if (!held.ok()) return held.status();
    part = *held;
  }
  Result<Weights> weights = load_hf(dir, tp > 1 ? &part : nullptr);
  if (!weights.ok()) return weights.status();
  return std::unique_ptr<LoadedWeights>(new Weights(std::move(*weights)));
}

Result<std::vector<TensorBlock>> tensors(const ModelConfig& c, int rank, int tp) {
  Weights w;
  w.config = c;
  Result<HeldPart> held = held_part(c, rank, tp);
  if (!held.ok()) return held.status();
  w.held = *held;
  std::vector<TensorBlock> blocks = llama_blocks(w);
  for (TensorBlock& b : blocks) b.out = nullptr;  // w goes
  return blocks;
}

Result<std::unique_ptr<LoadedWeights>> generate(const ModelConfig& config, uint64_t seed) {
  return std::unique_ptr<LoadedWeights>(new Weights(generate_llama(config, seed)));
}

Result<std::unique_ptr<Architecture>> create(const LoadedWeights& loaded, int rank, int tp,
                                             backend::Backend& backend) {
  const auto* llama = dynamic_cast<const Weights*>(&loaded);
  if (llama == nullptr) {
    return Status::Internal("the llama family was given another family's weights (" +
                            loaded.model_config().architecture + ")");
  }
  const Weights& weights = *llama;
  const ModelConfig& c = weights.config;
  Result<LlamaShard> shard = llama_shard(c.num_attention_heads, c.num_key_value_heads,
                                         c.intermediate_size, c.vocab_size, rank, tp);
  if (!shard.ok()) return shard.status();
  const HeldPart& held = weights.held;
  auto same = [](Range a, Range b) { return a.begin == b.begin && a.end == b.end; };
  if (!held.whole &&
      !(same(held.q_heads, shard->q_heads) && same(held.kv_heads, shard->kv_heads) &&
        same(held.intermediate, shard->intermediate) && same(held.vocab, shard->vocab))) {
    return Status::Internal("weights loaded for another TP rank than rank " + std::to_string(rank) +
                            " of " + std::to_string(tp));
  }
  return std::unique_ptr<Architecture>(new Llama(weights, *shard, backend));
}

}  // namespace

Result<LlamaShard> llama_shard(int64_t num_heads, int64_t num_kv_heads, int64_t intermediate,
                               int64_t vocab, int rank, int tp) {
  if (tp < 1 || rank < 0 || rank >= tp) return Status::InvalidArgument("bad TP rank");
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    return Status::InvalidArgument("num_attention_heads " + std::to_string(num_heads) +
                                   " is not a multiple of num_key_value_heads " +
                                   std::to_string(num_kv_heads));
  }
  const int64_t group = num_heads / num_kv_heads;
  LlamaShard s;
  s.rank = rank;
  s.tp = tp;
  if (num_kv_heads % tp == 0) {
    s.kv_heads = split(num_kv_heads, tp, rank);
    s.q_heads = {s.kv_heads.begin * group, s.kv_heads.end * group};
  } else if (tp % num_kv_heads == 0) {
    // Each KV head is replicated on tp / kv ranks, which split its query heads between them.
    const int replicas = tp / static_cast<int>(num_kv_heads);
    const int64_t kv = rank / replicas;
    s.kv_heads = {kv, kv + 1};
    const Range part = split(group, replicas, rank % replicas);
    s.q_heads = {kv * group + part.begin, kv * group + part.end};
  } else {
    return Status::InvalidArgument(std::to_string(num_kv_heads) +
                                   " KV heads cannot be split over " + std::to_string(tp) +
                                   " TP ranks (need one to divide the other)");
  }
  s.intermediate = split(intermediate, tp, rank);
  s.vocab = split(vocab, tp, rank);
  return s;
}

const ArchitectureFamily& llama_family() {
  static const ArchitectureFamily kFamily{"llama", check_tp, load, tensors, generate, create};
  return kFamily;
}

}  // namespace kvrt::model
