#include "core/serve/engine_step.h"

#include <spdlog/spdlog.h>


namespace kvrt::serve {

Status EngineExecutor::run(const sched::ScheduledBatch& batch, std::vector<int32_t>* next) {
  exec_batch_.sequences.resize(batch.sequences.size());
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    exec::SequenceStep& e = exec_batch_.sequences[i];
    e.tokens.assign(s.tokens.begin(), s.tokens.end());
    e.start = s.start;
    e.pages.assign(s.pages.begin(), s.pages.end());
  }
  Result<std::vector<float>> logits = engine_->step(exec_batch_);
  if (!logits.ok()) return logits.status();
  const size_t vocab = static_cast<size_t>(engine_->config().vocab_size);
  next->resize(batch.sequences.size());
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    if (!s.samples) continue;
    (*next)[i] =
        sampler_of_(*s.request).sample_in_place(std::span<float>(logits->data() + i * vocab, vocab));
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
