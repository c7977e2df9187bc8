// One TP rank's share of the forward pass: its shard of the weights, its KV store (this rank's
// KV heads) and its attention handle. All ranks of a step run forward() at once, each in its own
// thread, meeting in the communicator's collectives.
#pragma once

#include <memory>
#include <vector>

#include "core/exec/batch.h"
#include "core/exec/communicator.h"
#include "core/exec/shard.h"
#include "core/model/weights.h"
#include "core/plugin/registry.h"
#include "core/util/status.h"

namespace kvrt::exec {

struct RankPlugins {
  const plugin::LoadedPlugin* store = nullptr;
  const kvrt_config* store_config = nullptr;
  const plugin::LoadedPlugin* attention = nullptr;
  const kvrt_config* attention_config = nullptr;
};

class RankExecutor {
 public:
  // Takes this rank's shard out of `weights` (which stay the caller's) and creates its KV store
  // of `num_pages` pages and its attention handle.
  // With bf16_weights the matrices are held in bf16 (rounded to nearest even); `threads` is
  // how many threads this rank's matrix products may use.
  static Result<std::unique_ptr<RankExecutor>> create(const model::Weights& weights,
                                                      const RankShard& shard, Communicator* comm,
                                                      const RankPlugins& plugins,
                                                      uint32_t page_size, uint64_t num_pages,
                                                      bool bf16_weights = false, int threads = 1);
  ~RankExecutor();
  RankExecutor(const RankExecutor&) = delete;
  RankExecutor& operator=(const RankExecutor&) = delete;

  // Runs one step. Every rank must call it with the same batch. Rank 0 fills `logits` with
  // [num_sequences][vocab] for each sequence's last new token; other ranks leave it alone. A
  // failure on one rank still takes part in every collective, so no rank is left waiting.
  Status forward(const Batch& batch, std::vector<float>* logits);

  const RankShard& shard() const { return shard_; }
  // This rank's KV store and its plugin (for the tier operations the scheduler drives).
  kvrt_kv_store* store() const { return store_; }
  const plugin::LoadedPlugin* store_plugin() const { return plugins_.store; }

 private:
  // A weight matrix [rows][cols] held in f32 or in bf16 (half the bytes to stream per step).
  struct Matrix {
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    int64_t rows = 0, cols = 0;
  };
  struct Layer {
    std::vector<float> input_norm, post_norm;
    Matrix qkv;                   // [(nq + 2 nkv) * D][H]: this rank's q, k, v rows
    std::vector<float> qkv_bias;  // [(nq + 2 nkv) * D] or empty
    Matrix o;                     // [H][nq * D]: this rank's columns of o_proj
    Matrix gate_up;               // [2 I_r][H]: this rank's gate rows, then up rows
    Matrix down;                  // [H][I_r]: this rank's columns of down_proj
  };

  RankExecutor(const model::Weights& weights, const RankShard& shard, Communicator* comm,
               const RankPlugins& plugins, bool bf16_weights, int threads);
  Matrix make_matrix(std::vector<float> data, int64_t rows, int64_t cols) const;
  // y[m][rows] = x[m][cols] * w^T.
  void matmul(const float* x, int64_t m, const Matrix& w, float* y);
  Status attend(uint32_t layer, const float* q, float* out);
  Status plan_attention(const Batch& batch);

  model::ModelConfig config_;
  RankShard shard_;
  Communicator* comm_;
  RankPlugins plugins_;
  int64_t head_dim_ = 0, nq_ = 0, nkv_ = 0;
  std::vector<Layer> layers_;
  bool bf16_weights_ = false;
  int threads_ = 1;
  std::vector<float> scratch_;  // bf16 weights widened for large products
  std::vector<float> embed_;    // [V_r][H] rows of this rank's vocab range
  Matrix lm_head_;              // [V_r][H]
  std::vector<float> final_norm_;

  kvrt_kv_store* store_ = nullptr;
  uint32_t page_size_ = 0;
  kvrt_attention* attention_ = nullptr;
  std::vector<uint8_t> workspace_;
  // The planned batch as CSR (kept alive for run()).
  std::vector<int32_t> qo_indptr_, kv_page_indptr_, kv_page_indices_, kv_last_page_len_;
};

}  // namespace kvrt::exec
