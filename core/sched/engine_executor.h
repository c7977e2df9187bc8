// The scheduler's bridge to the model: runs a ScheduledBatch through the engine and samples each
// sequence's next token with the request's own sampler; and the KV tier of a store that has one,
// driven on every TP rank's store at once.
#pragma once

#include <memory>
#include <vector>

#include "core/exec/engine.h"
#include "core/sched/kv_tier.h"
#include "core/sched/scheduler.h"

namespace kvrt::sched {

class EngineExecutor : public StepExecutor {
 public:
  explicit EngineExecutor(exec::Engine* engine) : engine_(engine) {}
  Status run(const ScheduledBatch& batch, std::vector<int32_t>* next) override;

 private:
  exec::Engine* engine_;
  exec::Batch exec_batch_;
};

class EngineTier : public KvTier {
 public:
  // nullptr when the engine's KV store has no tier callbacks.
  static std::unique_ptr<EngineTier> create(exec::Engine* engine);

  uint64_t lookup(std::span<const uint64_t> hashes) override;
  Status save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              kvrt_tier_reason reason) override;
  Status load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              std::vector<uint8_t>* loaded) override;
  Status wait() override;

 private:
  explicit EngineTier(std::vector<plugin::StoreTier*> tiers);
  std::vector<plugin::StoreTier*> tiers_;  // rank r's at index r
  std::vector<uint64_t> last_ticket_;      // per rank; waiting on it covers every earlier copy
  std::vector<int64_t> pages_;
  std::vector<uint8_t> rank_loaded_;
};

}  // namespace kvrt::sched
