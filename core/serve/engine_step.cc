#include "core/serve/engine_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvrt::serve {

Status EngineExecutor::run(const sched::ScheduledBatch& batch, std::vector<int32_t>* next) {
  exec_batch_.sequences.resize(batch.sequences.size());
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    exec::SequenceStep& e = exec_batch_.sequences[i];
    e.tokens.assign(s.tokens.begin(), s.tokens.end());
    e.start = s.start;
    e.pages.assign(s.pages.begin(), s.pages.end());
    // A prefill chunk whose rows predict prompt tokens the request wants log-probabilities of
    // (row j predicts position start + j + 1) gets every row's logits.
    const exec::Sampler& sampler = sampler_of_(*s.request);
    const int32_t wanted = sampler.next_prompt_position();
    const int32_t last_predicted = s.start + static_cast<int32_t>(s.tokens.size());
    e.all_logits = sampler.params().prompt_logprobs_from >= 0 && wanted < s.request->prompt_len &&
                   last_predicted >= wanted;
  }
  Result<std::vector<float>> logits = engine_->step(exec_batch_);
  if (!logits.ok()) return logits.status();
  const size_t vocab = static_cast<size_t>(engine_->config().vocab_size);
  const size_t n = batch.sequences.size();
  next->resize(n);
  // Each sequence's sampler and first logits row, looked up here so the sampling below only
  // touches its own sequence's state.
  samplers_.resize(n);
  first_rows_.resize(n);
  size_t row = 0;
  for (size_t i = 0; i < n; ++i) {
    samplers_[i] = &sampler_of_(*batch.sequences[i].request);
    first_rows_[i] = row;
    row += static_cast<size_t>(exec_batch_.sequences[i].logit_rows());
  }
  // Sequences are sampled side by side on the engine's threads: over a 150k-token vocabulary
  // a draw costs about as much as a small model's step.
  const int threads =
      static_cast<int>(std::min<size_t>(n, static_cast<size_t>(engine_->threads())));
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
  for (size_t i = 0; i < n; ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    const exec::SequenceStep& e = exec_batch_.sequences[i];
    exec::Sampler& sampler = *samplers_[i];
    const auto rows = static_cast<size_t>(e.logit_rows());
    auto logits_of = [&](size_t r) {
      return std::span<float>(logits->data() + (first_rows_[i] + r) * vocab, vocab);
    };
    if (e.all_logits) {
      for (size_t j = 0; j < rows; ++j) {
        const int32_t target = e.start + static_cast<int32_t>(j) + 1;
        if (target >= s.request->prompt_len) break;
        sampler.add_prompt_logprob(target, logits_of(j), s.request->tokens[target]);
      }
    }
    if (s.samples) (*next)[i] = sampler.sample_in_place(logits_of(rows - 1));
  }
  return Status::Ok();
}

std::unique_ptr<EngineTier> EngineTier::create(exec::Engine* engine) {
  if (!engine->has_tier()) return nullptr;
  return std::unique_ptr<EngineTier>(new EngineTier(engine));
}

uint64_t EngineTier::lookup(std::span<const uint64_t> hashes) {
  Result<uint64_t> hits = engine_->tier_lookup(hashes);
  if (!hits.ok()) {
    // A lookup is a hint: without it the pages are recomputed.
    spdlog::warn("{}; the prefix is recomputed", hits.status().message());
    return 0;
  }
  return *hits;
}

Status EngineTier::save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        kvrt_tier_reason reason) {
  return engine_->tier_save(hashes, pages, reason);
}

Status EngineTier::load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        std::vector<uint8_t>* loaded) {
  return engine_->tier_load(hashes, pages, loaded);
}

Status EngineTier::wait() { return engine_->tier_wait(); }

}  // namespace kvrt::serve
