// Engine::step_and_sample: one forward step and the sampling of its tokens, the step's sequences
// side by side on the engine's threads (over a 150k-token vocabulary a draw costs about as much
// as a small model's step).
#include <algorithm>

#include "core/exec/engine.h"

namespace kvrt::exec {

Result<std::vector<int32_t>> Engine::step_and_sample(const Batch& batch,
                                                     std::span<const SequenceSampling> sampling) {
  if (sampling.size() != batch.sequences.size()) {
    return Status::Internal("execute: " + std::to_string(sampling.size()) + " samplers for " +
                            std::to_string(batch.sequences.size()) + " sequences");
  }
  Result<std::vector<float>> logits = step(batch);
  if (!logits.ok()) return logits.status();
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const size_t n = batch.sequences.size();
  std::vector<int32_t> next(n, 0);
  // Each sequence's first logits row, so the sampling below touches only its own state.
  std::vector<size_t> first_rows(n);
  size_t row = 0;
  for (size_t i = 0; i < n; ++i) {
    first_rows[i] = row;
    row += static_cast<size_t>(batch.sequences[i].logit_rows());
  }
  const int threads = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(threads_)));
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
  for (size_t i = 0; i < n; ++i) {
    const SequenceStep& e = batch.sequences[i];
    const SequenceSampling& s = sampling[i];
    if (s.sampler == nullptr) continue;
    const auto rows = static_cast<size_t>(e.logit_rows());
    auto logits_of = [&](size_t r) {
      return std::span<float>(logits->data() + (first_rows[i] + r) * vocab, vocab);
    };
    if (e.all_logits) {
      // Row j predicts position start + j + 1.
      for (size_t j = 0; j < rows; ++j) {
        const int32_t target = e.start + static_cast<int32_t>(j) + 1;
        if (target >= s.prompt_len) break;
        s.sampler->add_prompt_logprob(target, logits_of(j), s.tokens[target]);
      }
    }
    if (s.samples) next[i] = s.sampler->sample_in_place(logits_of(rows - 1));
  }
  return next;
}

}  // namespace kvrt::exec
