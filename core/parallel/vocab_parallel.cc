#include "core/parallel/vocab_parallel.h"

#include <algorithm>

namespace kvrt::parallel {

VocabParallel::VocabParallel(backend::Backend& backend, int rank, int tp, int64_t vocab_size,
                             int64_t hidden, const std::vector<float>& embed,
                             std::vector<float> lm_head, const std::vector<float>& final_norm)
    : rank_(rank),
      tp_(tp),
      vocab_size_(vocab_size),
      hidden_(hidden),
      vocab_(split(vocab_size, tp, rank)),
      embed_(backend.upload(embed)),
      final_norm_(backend.upload(final_norm)),
      lm_head_(backend.upload_matrix(std::move(lm_head), vocab_.size(), hidden)) {}

Status VocabParallel::embed(backend::Backend& be, comm::Communicator& comm,
                            std::span<const int32_t> ids, float* x) {
  const auto T = static_cast<int64_t>(ids.size());
  be.embed(embed_, vocab_.begin, ids, hidden_, x);
  return comm.all_reduce_sum(x, T * hidden_, comm::ElementType::kF32, be.stream());
}

Status VocabParallel::logits(backend::Backend& be, comm::Communicator& comm, const float* x,
                             std::span<const int64_t> last_rows, float eps,
                             std::vector<float>* logits) {
  const int64_t B = static_cast<int64_t>(last_rows.size()), H = hidden_, V = vocab_size_;
  be.reserve(&last_, B * H);
  be.gather_rows(x, last_rows, H, last_.data());
  be.rms_norm(last_.data(), final_norm_, last_.data(), B, H, eps);
  be.reserve(&local_, B * vocab_.size());
  be.matmul(last_.data(), B, *lm_head_, local_.data());
  // One rank holds every logit: nothing to gather (and no collective over device memory).
  Status s = Status::Ok();
  const float* all = local_.data();
  if (tp_ > 1) {
    std::vector<size_t> counts(tp_);
    for (int r = 0; r < tp_; ++r) counts[r] = B * split(V, tp_, r).size();
    be.reserve(&gathered_, B * V);
    s = comm.all_gather(local_.data(), counts, gathered_.data(), comm::ElementType::kF32,
                        be.stream());
    all = gathered_.data();
  }
  if (rank_ != 0) return s;
  // gathered is [rank][B][V_r]; logits are [B][V].
  std::vector<float> host(B * V);
  be.download(all, host.size(), host.data());
  logits->assign(B * V, 0.0f);
  int64_t offset = 0;
  for (int r = 0; r < tp_; ++r) {
    const Range vr = split(V, tp_, r);
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(host.data() + offset + b * vr.size(), vr.size(),
                  logits->data() + b * V + vr.begin);
    }
    offset += B * vr.size();
  }
  return s;
}

}  // namespace kvrt::parallel
