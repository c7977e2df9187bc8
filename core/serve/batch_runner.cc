#include "core/serve/batch_runner.h"

namespace kvrt::serve {

Status EngineRunner::run(const sched::ScheduledBatch& batch,
                         std::span<sampling::Sampler* const> samplers, std::vector<int32_t>* next) {
  const size_t n = batch.sequences.size();
  exec_batch_.sequences.resize(n);
  sampling_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    exec::SequenceStep& e = exec_batch_.sequences[i];
    e.tokens.assign(s.tokens.begin(), s.tokens.end());
    e.start = s.start;
    e.pages.assign(s.pages.begin(), s.pages.end());
    // A prefill chunk whose rows predict prompt tokens the request wants log-probabilities of
    // (row j predicts position start + j + 1) gets every row's logits.
    const sampling::Sampler& sampler = *samplers[i];
    const int32_t wanted = sampler.next_prompt_position();
    const int32_t last_predicted = s.start + static_cast<int32_t>(s.tokens.size());
    e.all_logits = sampler.params().prompt_logprobs_from >= 0 && wanted < s.request->prompt_len &&
                   last_predicted >= wanted;
    sampling_[i] = exec::SequenceSampling{samplers[i], s.request->tokens, s.request->prompt_len,
                                          s.samples};
  }
  Result<std::vector<int32_t>> tokens = engine_->step_and_sample(exec_batch_, sampling_);
  if (!tokens.ok()) return tokens.status();
  *next = std::move(*tokens);
  return Status::Ok();
}

}  // namespace kvrt::serve
