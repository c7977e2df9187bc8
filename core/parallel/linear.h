// Megatron's linear layers over a TP group, as vLLM's ColumnParallelLinear and RowParallelLinear:
// each owns this rank's shard of one weight and knows whether its product needs the group. A
// column-parallel layer holds a slice of the output rows and needs no communication; a
// row-parallel one holds a slice of the input columns, and its partial products are summed over
// the group's communicator.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/comm/communicator.h"
#include "core/parallel/shard.h"
#include "core/util/status.h"

namespace kvrt::parallel {

// Rows `rows` of a row-major matrix with `cols` columns ([out][in], as checkpoints store it):
// one part of a layer's shard. A projection a checkpoint stores quantized gives its codes in
// `quantized` (when not null and not empty; `matrix` is then not read).
struct RowsOf {
  const std::vector<float>* matrix;
  Range rows;
  const backend::QuantizedMatrix* quantized = nullptr;
};

// Y = X W^T for this rank's output rows of W: Y's columns are this rank's slice.
class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  // This rank's rows of W, already taken ([out][in]).
  ColumnParallelLinear(backend::Backend& be, std::vector<float> shard, int64_t out, int64_t in);
  // The concatenation of `parts` (fused projections: q, k and v rows; gate rows, then up rows),
  // each a matrix of `in` columns, with the matching rows of `bias_parts` (vectors) as the bias
  // when they are given. Kept as stored (Backend::upload_quantized) when every part is stored
  // quantized alike (one format, group and zero-point scheme), else by their values.
  ColumnParallelLinear(backend::Backend& be, std::initializer_list<RowsOf> parts, int64_t in,
                       std::initializer_list<RowsOf> bias_parts = {});

  // y[m][out] = x[m][in] * W^T (+ bias).
  void forward(backend::Backend& be, const float* x, int64_t m, float* y) const;
  int64_t out() const { return weight_ == nullptr ? 0 : weight_->rows; }
  int64_t in() const { return weight_ == nullptr ? 0 : weight_->cols; }

 private:
  std::unique_ptr<backend::Matrix> weight_;
  backend::Buffer bias_;  // [out], or empty
};

// Y = X W^T with X's columns (W's input columns) split over the ranks: each rank's product is
// a partial sum, and the group's all-reduce completes it on every rank.
class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  // Columns `keep` of W ([out][cols], the whole matrix or the part a rank holds). A W stored
  // quantized gives its codes in `quantized` (when not null and not empty; `w` is then not read):
  // kept as stored when `keep` starts on a group, else by its values.
  RowParallelLinear(backend::Backend& be, const std::vector<float>& w, int64_t out, int64_t cols,
                    Range keep, const backend::QuantizedMatrix* quantized = nullptr);

  // y[m][out] = x[m][in] * W^T summed over the group, on every rank. x null: this rank adds
  // nothing (zeros: no heads here, or its attention failed) and still takes part in the sum.
  Status forward(backend::Backend& be, comm::Communicator& comm, const float* x, int64_t m,
                 float* y) const;
  // This rank's partial product alone, for a sum of several row-parallel products completed
  // once (a mixture of experts' experts): reduce() then completes it.
  void partial(backend::Backend& be, const float* x, int64_t m, float* y) const;
  int64_t out() const { return weight_ == nullptr ? 0 : weight_->rows; }
  int64_t in() const { return weight_ == nullptr ? 0 : weight_->cols; }

  // Completes partial products: y[0..m * width) summed over the group, in rank order, so every
  // rank holds bit-identical results.
  static Status reduce(backend::Backend& be, comm::Communicator& comm, float* y, int64_t m,
                       int64_t width);

 private:
  std::unique_ptr<backend::Matrix> weight_;
};

}  // namespace kvrt::parallel
