// The scheduler's two seams onto the engine, wired by the serving core: a StepExecutor that runs a
// ScheduledBatch through the engine and samples each sequence's next token with its request's
// sampler, and the KvTier of a store that has one, driven on every TP rank's store at once.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/exec/engine.h"
#include "core/exec/sampler.h"
#include "core/sched/kv_tier.h"
#include "core/sched/scheduler.h"

namespace kvrt::serve {

class EngineExecutor : public sched::StepExecutor {
 public:
  // The sampler of a request (the serving core keeps one per request in flight).
  using SamplerOf = std::function<exec::Sampler&(const sched::Request&)>;
  EngineExecutor(exec::Engine* engine, SamplerOf sampler_of)
      : engine_(engine), sampler_of_(std::move(sampler_of)) {}
  Status run(const sched::ScheduledBatch& batch, std::vector<int32_t>* next) override;

 private:
  exec::Engine* engine_;
  SamplerOf sampler_of_;
  exec::Batch exec_batch_;
  std::vector<exec::Sampler*> samplers_;  // run()'s, per sequence
  std::vector<size_t> first_rows_;
};

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
