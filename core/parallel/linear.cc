#include "core/parallel/linear.h"

#include <utility>

namespace kvrt::parallel {

ColumnParallelLinear::ColumnParallelLinear(backend::Backend& be, std::vector<float> shard,
                                           int64_t out, int64_t in)
    : weight_(be.upload_projection(std::move(shard), out, in)) {}

ColumnParallelLinear::ColumnParallelLinear(backend::Backend& be,
                                           std::initializer_list<RowsOf> parts, int64_t in,
                                           std::initializer_list<RowsOf> bias_parts) {
  auto stored = [](const RowsOf& p) { return p.quantized != nullptr && !p.quantized->empty(); };
  const backend::QuantizedMatrix* first = parts.size() > 0 ? parts.begin()->quantized : nullptr;
  bool alike = first != nullptr;
  for (const RowsOf& p : parts) {
    alike = alike && stored(p) && p.quantized->kind == first->kind &&
            p.quantized->group == first->group &&
            p.quantized->zeros.empty() == first->zeros.empty();
  }
  if (alike) {
    backend::QuantizedMatrix rows;
    for (const RowsOf& p : parts) rows.append_rows(*p.quantized, p.rows.begin, p.rows.end);
    weight_ = be.upload_quantized(rows);
  } else {
    std::vector<float> rows;
    int64_t out = 0;
    for (const RowsOf& p : parts) {
      append_rows(stored(p) ? p.quantized->dequantized() : *p.matrix, in, p.rows, &rows);
      out += p.rows.size();
    }
    weight_ = be.upload_projection(std::move(rows), out, in);
  }
  std::vector<float> bias;
  for (const RowsOf& p : bias_parts) append_rows(*p.matrix, 1, p.rows, &bias);
  if (!bias.empty()) bias_ = be.upload(bias);
}

void ColumnParallelLinear::forward(backend::Backend& be, const float* x, int64_t m,
                                   float* y) const {
  be.matmul(x, m, *weight_, y);
  if (bias_.size() > 0) be.add_bias(y, m, weight_->rows, bias_);
}

RowParallelLinear::RowParallelLinear(backend::Backend& be, const std::vector<float>& w, int64_t out,
                                     int64_t cols, Range keep,
                                     const backend::QuantizedMatrix* quantized) {
  if (quantized == nullptr || quantized->empty()) {
    weight_ = be.upload_projection(columns_of(w, cols, keep), out, keep.size());
  } else if (keep.begin == 0 && keep.end == quantized->cols) {
    weight_ = be.upload_quantized(*quantized);
  } else if (keep.begin % quantized->group == 0) {
    weight_ = be.upload_quantized(quantized->columns(keep.begin, keep.end));
  } else {
    weight_ = be.upload_projection(columns_of(quantized->dequantized(), quantized->cols, keep),
                                   quantized->rows, keep.size());
  }
}

Status RowParallelLinear::forward(backend::Backend& be, comm::Communicator& comm, const float* x,
                                  int64_t m, float* y) const {
  if (x != nullptr) {
    partial(be, x, m, y);
  } else {
    be.fill_zero(y, m * weight_->rows);
  }
  return reduce(be, comm, y, m, weight_->rows);
}

void RowParallelLinear::partial(backend::Backend& be, const float* x, int64_t m, float* y) const {
  be.matmul(x, m, *weight_, y);
}

Status RowParallelLinear::reduce(backend::Backend& be, comm::Communicator& comm, float* y,
                                 int64_t m, int64_t width) {
  return comm.all_reduce_sum(y, m * width, comm::ElementType::kF32, be.stream());
}

}  // namespace kvrt::parallel
