// The ends of a decoder every architecture shares: the vocab-parallel embedding (each rank
// holds the rows of its vocab range; an all-reduce completes the rows) and the final RMSNorm
// with the vocab-parallel LM head (each rank scores its vocab range; an all-gather gives rank 0
// the whole row of logits).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend/backend.h"
#include "core/comm/communicator.h"
#include "core/parallel/shard.h"
#include "core/util/status.h"

namespace kvrt::parallel {

class VocabParallel {
 public:
  // `embed` and `lm_head` are this rank's rows ([vocab.size()][hidden] each, the vocab range
  // of split(vocab_size, tp, rank)); `final_norm` is [hidden].
  VocabParallel(backend::Backend& backend, int rank, int tp, int64_t vocab_size, int64_t hidden,
                const std::vector<float>& embed, std::vector<float> lm_head,
                const std::vector<float>& final_norm);

  // x[T][hidden] = the embedding rows of `ids`, on every rank.
  Status embed(backend::Backend& be, comm::Communicator& comm, std::span<const int32_t> ids,
               float* x);
  // Rank 0's `logits` = [rows][vocab] of the rows `last_rows` of x, after the final norm.
  Status logits(backend::Backend& be, comm::Communicator& comm, const float* x,
                std::span<const int64_t> last_rows, float eps, std::vector<float>* logits);

 private:
  int rank_, tp_;
  int64_t vocab_size_, hidden_;
  Range vocab_;
  backend::Buffer embed_, final_norm_;
  std::unique_ptr<backend::Matrix> lm_head_;
  backend::Buffer last_, local_, gathered_;
};

}  // namespace kvrt::parallel
