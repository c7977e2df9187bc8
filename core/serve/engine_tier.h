// The scheduler's seam onto the engine's KV tier: the KvTier of a store that has one, driven on
// every TP rank's store at once (the scheduler looks pages up and loads them at admission, and
// reports the pages it caches and evicts).
#pragma once

#include <memory>
#include <vector>

#include "core/exec/engine.h"
#include "core/sched/kv_tier.h"

namespace kvrt::serve {

class EngineTier : public sched::KvTier {
 public:
  // nullptr when the engine's KV store has no tier callbacks. Lookup failures are logged and
  // read as misses (the pages are recomputed); save / load / wait failures are returned. The
  // engine drives every TP rank's tier at once (Engine::tier_*).
  static std::unique_ptr<EngineTier> create(exec::Engine* engine);

  uint64_t lookup(std::span<const uint64_t> hashes) override;
  Status save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              kvrt_tier_reason reason) override;
  Status load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              std::vector<uint8_t>* loaded) override;
  Status wait() override;
  // What rank 0's tier holds and has done (every rank's saves and loads the same pages).
  Result<kvrt_tier_info> info() const { return engine_->tier_info(); }

 private:
  explicit EngineTier(exec::Engine* engine) : engine_(engine) {}
  exec::Engine* engine_;
};

}  // namespace kvrt::serve
