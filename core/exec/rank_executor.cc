#include "core/exec/rank_executor.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace kvrt::exec {
namespace {

// Rows [begin, end) of a row-major matrix with `cols` columns.
void append_rows(const std::vector<float>& m, int64_t cols, Range rows, std::vector<float>* out) {
  out->insert(out->end(), m.begin() + rows.begin * cols, m.begin() + rows.end * cols);
}

// Columns [begin, end) of a row-major matrix with `rows` rows and `cols` columns.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, Range keep) {
  std::vector<float> out;
  out.reserve(rows * keep.size());
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), m.begin() + r * cols + keep.begin, m.begin() + r * cols + keep.end);
  }
  return out;
}

Status plugin_call(const plugin::LoadedPlugin* p, const char* what, kvrt_status status) {
  return status == KVRT_OK ? Status::Ok() : plugin::plugin_failure(p->name, what, status);
}

}  // namespace

RankExecutor::Matrix RankExecutor::make_matrix(std::vector<float> data, int64_t rows,
                                               int64_t cols) const {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  if (bf16_weights_) {
    m.bf16.resize(data.size());
    kernels::f32_to_bf16(data.data(), m.bf16.data(), data.size());
  } else {
    m.f32 = std::move(data);
  }
  return m;
}

// y[m][n] = x[m][k] * w[n][k]^T (w in Hugging Face's [out][in] layout). Decode-sized products
// stream bf16 weights through the SIMD kernel; larger ones widen the weights once and use the
// BLAS, where the arithmetic, not the bytes, is the cost.
void RankExecutor::matmul(const float* x, int64_t m, const Matrix& w, float* y) {
  if (!w.bf16.empty() && (m <= 16 || w.cols == 0)) {
    kernels::matmul_bf16(x, m, w.cols, w.bf16.data(), w.rows, y, threads_);
    return;
  }
  // The BLAS runs single-threaded (see Engine::create); the rank's OpenMP threads each take a
  // band of output columns, so BLAS threads never spin against OpenMP's on the same cores.
  const int64_t n = w.rows, k = w.cols;
  if (!w.bf16.empty()) scratch_.resize(w.bf16.size());
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads_, n / 64)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t parts = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t band = (n + parts - 1) / parts;
    const int64_t begin = std::min(n, t * band), end = std::min(n, begin + band);
    if (begin < end) {
      const float* rows = nullptr;
      if (w.bf16.empty()) {
        rows = w.f32.data() + begin * k;
      } else {
        kernels::bf16_to_f32(w.bf16.data() + begin * k, scratch_.data() + begin * k,
                             static_cast<size_t>((end - begin) * k));
        rows = scratch_.data() + begin * k;
      }
      if (m > 0 && k == 0) {
        for (int64_t i = 0; i < m; ++i) std::fill(y + i * n + begin, y + i * n + end, 0.0f);
      } else if (m > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                    static_cast<int>(end - begin), static_cast<int>(k), 1.0f, x,
                    static_cast<int>(k), rows, static_cast<int>(k), 0.0f, y + begin,
                    static_cast<int>(n));
      }
    }
  }
}

RankExecutor::RankExecutor(const model::Weights& weights, const RankShard& shard,
                           Communicator* comm, const RankPlugins& plugins, bool bf16_weights,
                           int threads)
    : config_(weights.config),
      shard_(shard),
      comm_(comm),
      plugins_(plugins),
      bf16_weights_(bf16_weights),
      threads_(threads) {
  const model::ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  head_dim_ = c.head_dim;
  nq_ = shard.q_heads.size();
  nkv_ = shard.kv_heads.size();
  const Range q_rows{shard.q_heads.begin * head_dim_, shard.q_heads.end * head_dim_};
  const Range kv_rows{shard.kv_heads.begin * head_dim_, shard.kv_heads.end * head_dim_};
  const int64_t qkv_rows = (nq_ + 2 * nkv_) * head_dim_, I = shard.intermediate.size();
  for (const model::LayerWeights& lw : weights.layers) {
    Layer l;
    l.input_norm = lw.input_norm;
    l.post_norm = lw.post_norm;
    std::vector<float> qkv, gate_up;
    append_rows(lw.q, hidden, q_rows, &qkv);
    append_rows(lw.k, hidden, kv_rows, &qkv);
    append_rows(lw.v, hidden, kv_rows, &qkv);
    l.qkv = make_matrix(std::move(qkv), qkv_rows, hidden);
    if (!lw.q_bias.empty()) {
      append_rows(lw.q_bias, 1, q_rows, &l.qkv_bias);
      append_rows(lw.k_bias, 1, kv_rows, &l.qkv_bias);
      append_rows(lw.v_bias, 1, kv_rows, &l.qkv_bias);
    }
    l.o = make_matrix(columns(lw.o, hidden, c.num_attention_heads * head_dim_, q_rows), hidden,
                      nq_ * head_dim_);
    append_rows(lw.gate, hidden, shard.intermediate, &gate_up);
    append_rows(lw.up, hidden, shard.intermediate, &gate_up);
    l.gate_up = make_matrix(std::move(gate_up), 2 * I, hidden);
    l.down =
        make_matrix(columns(lw.down, hidden, c.intermediate_size, shard.intermediate), hidden, I);
    layers_.push_back(std::move(l));
  }
  append_rows(weights.embed, hidden, shard.vocab, &embed_);
  std::vector<float> lm_head;
  append_rows(weights.output_embedding(), hidden, shard.vocab, &lm_head);
  lm_head_ = make_matrix(std::move(lm_head), shard.vocab.size(), hidden);
  final_norm_ = weights.final_norm;
}

RankExecutor::~RankExecutor() {
  if (attention_ != nullptr) plugins_.attention->attention.destroy(attention_);
  if (store_ != nullptr) plugins_.store->kv.destroy(store_);
}

Result<std::unique_ptr<RankExecutor>> RankExecutor::create(const model::Weights& weights,
                                                           const RankShard& shard,
                                                           Communicator* comm,
                                                           const RankPlugins& plugins,
                                                           uint32_t page_size, uint64_t num_pages,
                                                           bool bf16_weights, int threads) {
  std::unique_ptr<RankExecutor> r(
      new RankExecutor(weights, shard, comm, plugins, bf16_weights, std::max(1, threads)));
  r->page_size_ = page_size;
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = static_cast<uint32_t>(weights.config.num_hidden_layers);
  g.num_kv_heads = static_cast<uint32_t>(std::max<int64_t>(1, r->nkv_));
  g.total_kv_heads = static_cast<uint32_t>(weights.config.num_key_value_heads);
  g.k_head_dim = g.v_head_dim = static_cast<uint32_t>(r->head_dim_);
  g.page_size = page_size;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_rank = static_cast<uint32_t>(shard.rank);
  g.tp_size = static_cast<uint32_t>(shard.tp);
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  const plugin::LoadedPlugin* sp = plugins.store;
  plugin::clear_last_error();
  if (Status s = plugin_call(
          sp, "create",
          sp->kv.create(sp->host_api(), &g, num_pages, plugins.store_config, &r->store_));
      !s.ok()) {
    return s;
  }
  if (r->nq_ > 0) {
    kvrt_attention_params p{};
    p.struct_size = sizeof(p);
    p.num_q_heads = static_cast<uint32_t>(r->nq_);
    p.num_kv_heads = static_cast<uint32_t>(r->nkv_);
    p.qk_head_dim = p.v_head_dim = static_cast<uint32_t>(r->head_dim_);
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(r->head_dim_));
    p.device = g.device;
    const plugin::LoadedPlugin* ap = plugins.attention;
    if (Status s = plugin_call(
            ap, "create",
            ap->attention.create(ap->host_api(), &p, plugins.attention_config, &r->attention_));
        !s.ok()) {
      return s;
    }
  }
  return r;
}

Status RankExecutor::plan_attention(const Batch& batch) {
  qo_indptr_.assign(1, 0);
  kv_page_indptr_.assign(1, 0);
  kv_page_indices_.clear();
  kv_last_page_len_.clear();
  for (const SequenceStep& s : batch.sequences) {
    const int64_t kv_len = s.start + static_cast<int64_t>(s.tokens.size());
    const int64_t pages = (kv_len + page_size_ - 1) / page_size_;
    qo_indptr_.push_back(qo_indptr_.back() + static_cast<int32_t>(s.tokens.size()));
    kv_page_indices_.insert(kv_page_indices_.end(), s.pages.begin(), s.pages.begin() + pages);
    kv_page_indptr_.push_back(static_cast<int32_t>(kv_page_indices_.size()));
    kv_last_page_len_.push_back(static_cast<int32_t>(kv_len - (pages - 1) * page_size_));
  }
  if (attention_ == nullptr) return Status::Ok();
  kvrt_attention_batch b{};
  b.struct_size = sizeof(b);
  b.batch_size = static_cast<uint32_t>(batch.sequences.size());
  b.page_size = page_size_;
  b.causal = 1;
  b.qo_indptr = qo_indptr_.data();
  b.kv_page_indptr = kv_page_indptr_.data();
  b.kv_page_indices = kv_page_indices_.data();
  b.kv_last_page_len = kv_last_page_len_.data();
  const plugin::LoadedPlugin* ap = plugins_.attention;
  uint64_t bytes = 0;
  if (Status s =
          plugin_call(ap, "workspace_size", ap->attention.workspace_size(attention_, &b, &bytes));
      !s.ok()) {
    return s;
  }
  if (workspace_.size() < bytes) workspace_.resize(bytes);
  return plugin_call(ap, "plan", ap->attention.plan(attention_, &b, workspace_.data(), bytes));
}

Status RankExecutor::attend(uint32_t layer, const float* q, float* out) {
  const plugin::LoadedPlugin* sp = plugins_.store;
  const plugin::LoadedPlugin* ap = plugins_.attention;
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  if (Status s = plugin_call(sp, "layout", sp->kv.layout(store_, layer, &layout)); !s.ok()) {
    return s;
  }
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.layer = layer;
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &sp->kv;
  args.store = store_;
  args.q = q;
  args.out = out;
  args.q_row_stride = (nq_ + 2 * nkv_) * head_dim_;  // q sits in the fused qkv rows
  args.out_row_stride = nq_ * head_dim_;
  return plugin_call(ap, "run", ap->attention.run(attention_, &args));
}

Status RankExecutor::forward(const Batch& batch, std::vector<float>* logits) {
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, D = head_dim_, T = batch.num_tokens();
  const int64_t qkv_width = (nq_ + 2 * nkv_) * D, I = shard_.intermediate.size();
  const int64_t B = static_cast<int64_t>(batch.sequences.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  // This rank's share of the cores, for what runs on OpenMP in this thread (the bf16 products
  // and the attention plugin's work items).
  omp_set_num_threads(threads_);
  Status status;  // the first failure; collectives go on regardless
  auto check = [&status](Status s) {
    if (status.ok() && !s.ok()) status = s;
    return status.ok();
  };

  // Token ids, positions and KV slots of the new tokens, in batch order.
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> slots;
  for (const SequenceStep& s : batch.sequences) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t pos = s.start + static_cast<int32_t>(i);
      ids.push_back(s.tokens[i]);
      positions.push_back(pos);
      slots.push_back(int64_t{s.pages[pos / page_size_]} * page_size_ + pos % page_size_);
    }
  }
  check(plan_attention(batch));

  // Vocab-parallel embedding: each rank fills its rows, the all-reduce completes them.
  std::vector<float> x(T * H, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] >= shard_.vocab.begin && ids[t] < shard_.vocab.end) {
      std::memcpy(&x[t * H], &embed_[(ids[t] - shard_.vocab.begin) * H], H * sizeof(float));
    }
  }
  comm_->all_reduce_sum(shard_.rank, x.data(), x.size());

  std::vector<float> cos(T * D / 2), sin(T * D / 2);
  kernels::rope_tables(positions.data(), T, D, static_cast<float>(c.rope_theta), cos.data(),
                       sin.data());
  std::vector<float> h(T * H), qkv(T * qkv_width), attn(T * nq_ * D), partial(T * H);
  std::vector<float> gate_up(T * 2 * I), act(T * I);
  std::vector<float> k_rows(T * nkv_ * D), v_rows(T * nkv_ * D);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    const uint32_t layer = static_cast<uint32_t>(li);
    kernels::rms_norm(x.data(), l.input_norm.data(), h.data(), T, H, eps);
    std::fill(partial.begin(), partial.end(), 0.0f);
    if (nq_ > 0 && status.ok()) {
      matmul(h.data(), T, l.qkv, qkv.data());
      if (!l.qkv_bias.empty()) {
        for (int64_t t = 0; t < T; ++t)
          kernels::add_inplace(&qkv[t * qkv_width], l.qkv_bias.data(), qkv_width);
      }
      kernels::apply_rope(qkv.data(), T, nq_ + nkv_, D, qkv_width, cos.data(), sin.data());
      kvrt_kv_write w{};
      w.struct_size = sizeof(w);
      w.layer = layer;
      w.dtype = KVRT_DTYPE_F32;
      w.num_tokens = static_cast<uint32_t>(T);
      w.slots = slots.data();
      w.k = qkv.data() + nq_ * D;
      w.v = qkv.data() + (nq_ + nkv_) * D;
      w.k_token_stride = w.v_token_stride = qkv_width;
      const plugin::LoadedPlugin* sp = plugins_.store;
      if (check(plugin_call(sp, "write", sp->kv.write(store_, &w))) &&
          check(attend(layer, qkv.data(), attn.data()))) {
        matmul(attn.data(), T, l.o, partial.data());
      }
    }
    comm_->all_reduce_sum(shard_.rank, partial.data(), partial.size());
    kernels::add_inplace(x.data(), partial.data(), x.size());

    kernels::rms_norm(x.data(), l.post_norm.data(), h.data(), T, H, eps);
    matmul(h.data(), T, l.gate_up, gate_up.data());
    for (int64_t t = 0; t < T; ++t) {
      kernels::silu_mul(&gate_up[t * 2 * I], &gate_up[t * 2 * I + I], &act[t * I], I);
    }
    matmul(act.data(), T, l.down, partial.data());
    comm_->all_reduce_sum(shard_.rank, partial.data(), partial.size());
    kernels::add_inplace(x.data(), partial.data(), x.size());
  }

  // Logits of each sequence's last token: this rank's vocab slice, gathered on every rank.
  std::vector<float> last(B * H);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    row += static_cast<int64_t>(batch.sequences[b].tokens.size());
    std::memcpy(&last[b * H], &x[(row - 1) * H], H * sizeof(float));
  }
  kernels::rms_norm(last.data(), final_norm_.data(), last.data(), B, H, eps);
  const int64_t Vr = shard_.vocab.size();
  std::vector<float> local(B * Vr);
  matmul(last.data(), B, lm_head_, local.data());
  std::vector<size_t> counts(shard_.tp);
  for (int r = 0; r < shard_.tp; ++r) counts[r] = B * split(c.vocab_size, shard_.tp, r).size();
  std::vector<float> gathered(B * c.vocab_size);
  comm_->all_gather(shard_.rank, local.data(), counts, gathered.data());
  if (shard_.rank == 0) {
    // gathered is [rank][B][V_r]; logits are [B][V].
    logits->assign(B * c.vocab_size, 0.0f);
    int64_t offset = 0;
    for (int r = 0; r < shard_.tp; ++r) {
      const Range vr = split(c.vocab_size, shard_.tp, r);
      for (int64_t b = 0; b < B; ++b) {
        std::memcpy(&(*logits)[b * c.vocab_size + vr.begin], &gathered[offset + b * vr.size()],
                    vr.size() * sizeof(float));
      }
      offset += B * vr.size();
    }
  }
  return status;
}

}  // namespace kvrt::exec
