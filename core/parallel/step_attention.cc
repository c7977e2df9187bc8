#include "core/parallel/step_attention.h"

#include <algorithm>
#include <cstring>

namespace kvrt::parallel {

namespace {

// Copies `rows` rows of `width` floats, `stride` apart, into `to`, dense.
void pack_rows(const float* from, int64_t stride, int64_t rows, int64_t width, float* to) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(to + r * width, from + r * stride, width * 4);
}

}  // namespace

Status StepAttention::write(uint32_t layer, const float* k, const float* v,
                            int64_t kv_row_stride) {
  kvrt_kv_write w{};
  w.struct_size = sizeof(w);
  w.layer = layer;
  w.dtype = KVRT_DTYPE_F32;
  w.num_tokens = static_cast<uint32_t>(slots_.size());
  w.slots = slots_.data();
  w.k = k;
  w.v = v;
  w.k_token_stride = w.v_token_stride = kv_row_stride;
  w.device_slots = device_slots_;
  w.stream = stream_;
  if (rows_.empty() || slots_.empty()) return store_->write(w);
  // Only the rows this rank keeps: packed, so the store sees dense rows.
  const kvrt_kv_geometry& g = store_->geometry();
  const int64_t k_width = int64_t{g.num_kv_heads} * g.k_head_dim;
  const int64_t v_width = v != nullptr ? int64_t{g.num_kv_heads} * g.v_head_dim : 0;
  kept_k_.resize(rows_.size() * k_width);
  kept_v_.resize(rows_.size() * v_width);
  for (size_t i = 0; i < rows_.size(); ++i) {
    std::memcpy(kept_k_.data() + i * k_width, k + rows_[i] * kv_row_stride, k_width * 4);
    if (v != nullptr) {
      std::memcpy(kept_v_.data() + i * v_width, v + rows_[i] * kv_row_stride, v_width * 4);
    }
  }
  w.k = kept_k_.data();
  w.v = v != nullptr ? kept_v_.data() : nullptr;
  w.k_token_stride = k_width;
  w.v_token_stride = v_width;
  return store_->write(w);
}

Status StepAttention::attention(uint32_t layer, int64_t num_rows, const float* q,
                                int64_t q_row_stride, const float* k, const float* v,
                                int64_t kv_row_stride, float* out, int64_t out_row_stride) {
  Status written = plan_.ok() ? write(layer, k, v, kv_row_stride) : plan_;
  if (cp_.on()) return sharded(layer, num_rows, q, q_row_stride, out, out_row_stride, written);
  if (!written.ok()) return written;
  kvrt_attention_run_args args{};
  args.layer = layer;
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.q = q;
  args.out = out;
  args.q_row_stride = q_row_stride;
  args.out_row_stride = out_row_stride;
  args.stream = stream_;
  return attention_->run(*store_, store_->checked_layout(layer), args);
}

Status StepAttention::sharded(uint32_t layer, int64_t num_rows, const float* q,
                              int64_t q_row_stride, float* out, int64_t out_row_stride,
                              Status written) {
  const kvrt_attention_params& p = attention_->params();
  const int group_heads = static_cast<int>(p.num_q_heads);
  const int heads = group_heads / cp_.size;  // this rank's
  const int64_t qk = p.qk_head_dim, dv = p.v_head_dim;
  const int tp = comm_->size();
  // 1. The group's query rows: every rank's [rows][heads][qk], gathered; this group's ranks'
  //    side by side make [rows][group_heads][qk] (the group's heads are its ranks' in order).
  const size_t q_count = static_cast<size_t>(num_rows * heads * qk);
  q_mine_.resize(q_count);
  pack_rows(q, q_row_stride, num_rows, heads * qk, q_mine_.data());
  q_all_.resize(q_count * tp);
  const std::vector<size_t> q_counts(tp, q_count);
  Status s = comm_->all_gather(q_mine_.data(), q_counts, q_all_.data(), comm::ElementType::kF32,
                               nullptr);
  if (!s.ok()) return s;
  q_group_.resize(q_count * cp_.size);
  for (int m = 0; m < cp_.size; ++m) {
    const float* from = q_all_.data() + (cp_.first + m) * q_count;
    for (int64_t r = 0; r < num_rows; ++r) {
      std::memcpy(q_group_.data() + (r * group_heads + m * heads) * qk,
                  from + r * heads * qk, heads * qk * 4);
    }
  }
  // 2. Attention of the group's heads over this rank's tokens: [rows][group_heads][dv], then
  //    [rows][group_heads] log-sum-exps.
  const size_t part_outputs = static_cast<size_t>(num_rows * group_heads * dv);
  const size_t part = part_outputs + static_cast<size_t>(num_rows * group_heads);
  partial_.assign(part, 0.0f);
  if (written.ok()) {
    kvrt_attention_run_args args{};
    args.layer = layer;
    args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
    args.q = q_group_.data();
    args.out = partial_.data();
    args.stream = stream_;
    written = attention_->run(*store_, store_->checked_layout(layer), args,
                              partial_.data() + part_outputs);
  }
  // 3. Every rank's partials, and the merge of this rank's heads over its group.
  gathered_.resize(part * tp);
  const std::vector<size_t> counts(tp, part);
  s = comm_->all_gather(partial_.data(), counts, gathered_.data(), comm::ElementType::kF32,
                        nullptr);
  if (!s.ok()) return s;
  if (!written.ok()) return written;
  merge_partials(cp_, gathered_.data(), part, num_rows, group_heads, heads,
                 static_cast<int>(dv), out, out_row_stride);
  return Status::Ok();
}

}  // namespace kvrt::parallel
