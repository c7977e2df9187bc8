#include "core/sched/engine_executor.h"

#include "core/plugin/host.h"

namespace kvrt::sched {

Status EngineExecutor::run(const ScheduledBatch& batch, std::vector<int32_t>* next) {
  exec_batch_.sequences.resize(batch.sequences.size());
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const ScheduledSequence& s = batch.sequences[i];
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
    const ScheduledSequence& s = batch.sequences[i];
    if (!s.samples) continue;
    (*next)[i] =
        s.request->sampler.sample(std::span<const float>(logits->data() + i * vocab, vocab));
  }
  return Status::Ok();
}

std::unique_ptr<EngineTier> EngineTier::create(exec::Engine* engine) {
  const plugin::LoadedPlugin* p = engine->ranks().front()->store_plugin();
  if (p->kv.tier_info == nullptr || p->kv.tier_lookup == nullptr || p->kv.tier_save == nullptr ||
      p->kv.tier_load == nullptr || p->kv.tier_wait == nullptr) {
    return nullptr;
  }
  return std::unique_ptr<EngineTier>(new EngineTier(engine));
}

EngineTier::EngineTier(exec::Engine* engine)
    : engine_(engine), last_ticket_(engine->ranks().size(), 0) {}

uint64_t EngineTier::lookup(std::span<const uint64_t> hashes) {
  uint64_t hits = hashes.size();
  for (const auto& rank : engine_->ranks()) {
    uint32_t n = 0;
    const plugin::LoadedPlugin* p = rank->store_plugin();
    if (p->kv.tier_lookup(rank->store(), static_cast<uint32_t>(hashes.size()), hashes.data(), &n) !=
        KVRT_OK) {
      return 0;
    }
    hits = std::min<uint64_t>(hits, n);
  }
  return hits;
}

Status EngineTier::save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        kvrt_tier_reason reason) {
  pages_.assign(pages.begin(), pages.end());
  const auto& ranks = engine_->ranks();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const plugin::LoadedPlugin* p = ranks[r]->store_plugin();
    plugin::clear_last_error();
    kvrt_status st = p->kv.tier_save(ranks[r]->store(), static_cast<uint32_t>(hashes.size()),
                                     hashes.data(), pages_.data(), reason, &last_ticket_[r]);
    if (st != KVRT_OK) return plugin::plugin_failure(p->name, "tier_save", st);
  }
  return Status::Ok();
}

Status EngineTier::load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        std::vector<uint8_t>* loaded) {
  pages_.assign(pages.begin(), pages.end());
  loaded->assign(hashes.size(), 1);
  rank_loaded_.resize(hashes.size());
  const auto& ranks = engine_->ranks();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const plugin::LoadedPlugin* p = ranks[r]->store_plugin();
    plugin::clear_last_error();
    kvrt_status st =
        p->kv.tier_load(ranks[r]->store(), static_cast<uint32_t>(hashes.size()), hashes.data(),
                        pages_.data(), rank_loaded_.data(), &last_ticket_[r]);
    if (st != KVRT_OK) return plugin::plugin_failure(p->name, "tier_load", st);
    for (size_t i = 0; i < hashes.size(); ++i) (*loaded)[i] &= rank_loaded_[i];
  }
  return wait();
}

Status EngineTier::wait() {
  const auto& ranks = engine_->ranks();
  Status first = Status::Ok();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const plugin::LoadedPlugin* p = ranks[r]->store_plugin();
    plugin::clear_last_error();
    kvrt_status st = p->kv.tier_wait(ranks[r]->store(), last_ticket_[r]);
    if (st != KVRT_OK && first.ok()) first = plugin::plugin_failure(p->name, "tier_wait", st);
  }
  return first;
}

}  // namespace kvrt::sched
