#include "core/serve/engine_step.h"

#include <spdlog/spdlog.h>

#include "core/sched/page_hash.h"

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
        sampler_of_(*s.request).sample(std::span<const float>(logits->data() + i * vocab, vocab));
  }
  return Status::Ok();
}

std::unique_ptr<EngineTier> EngineTier::create(exec::Engine* engine) {
  std::vector<plugin::StoreTier*> tiers = engine->store_tiers();
  if (tiers.empty()) return nullptr;
  return std::unique_ptr<EngineTier>(new EngineTier(std::move(tiers)));
}

EngineTier::EngineTier(std::vector<plugin::StoreTier*> tiers)
    : tiers_(std::move(tiers)), last_ticket_(tiers_.size(), 0) {}

std::span<const uint64_t> EngineTier::for_rank(std::span<const uint64_t> hashes, size_t rank) {
  rank_hashes_.resize(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    rank_hashes_[i] = sched::rank_hash(hashes[i], static_cast<uint32_t>(rank));
  }
  return rank_hashes_;
}

uint64_t EngineTier::lookup(std::span<const uint64_t> hashes) {
  uint64_t hits = hashes.size();
  for (size_t r = 0; r < tiers_.size(); ++r) {
    Result<uint32_t> n = tiers_[r]->lookup(for_rank(hashes, r));
    if (!n.ok()) {
      // A lookup is a hint: without it the pages are recomputed.
      spdlog::warn("{}; the prefix is recomputed", n.status().message());
      return 0;
    }
    hits = std::min<uint64_t>(hits, *n);
  }
  return hits;
}

Status EngineTier::save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        kvrt_tier_reason reason) {
  pages_.assign(pages.begin(), pages.end());
  for (size_t r = 0; r < tiers_.size(); ++r) {
    Result<uint64_t> ticket = tiers_[r]->save(for_rank(hashes, r), pages_, reason);
    if (!ticket.ok()) return ticket.status();
    last_ticket_[r] = *ticket;
  }
  return Status::Ok();
}

Status EngineTier::load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        std::vector<uint8_t>* loaded) {
  pages_.assign(pages.begin(), pages.end());
  loaded->assign(hashes.size(), 1);
  rank_loaded_.resize(hashes.size());
  for (size_t r = 0; r < tiers_.size(); ++r) {
    Result<uint64_t> ticket = tiers_[r]->load(for_rank(hashes, r), pages_, rank_loaded_);
    if (!ticket.ok()) {
      // The ranks before this one may still be copying into the pages, which the caller is
      // about to recompute into: let their copies finish first.
      (void)wait();
      return ticket.status();
    }
    last_ticket_[r] = *ticket;
    for (size_t i = 0; i < hashes.size(); ++i) (*loaded)[i] &= rank_loaded_[i];
  }
  return wait();
}

Status EngineTier::wait() {
  Status first = Status::Ok();
  for (size_t r = 0; r < tiers_.size(); ++r) {
    Status s = tiers_[r]->wait(last_ticket_[r]);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Result<kvrt_tier_info> EngineTier::info() const { return tiers_.front()->info(); }

}  // namespace kvrt::serve
