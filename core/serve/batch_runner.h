// What runs a scheduled batch and samples its tokens, called by the serving core between
// Scheduler::schedule() and Scheduler::update(): the engine (EngineRunner), or a stand-in with the
// same contract (a test's scripted model, a benchmark's instant one).
#pragma once

#include <span>
#include <vector>

#include "core/exec/engine.h"
#include "core/sampling/sampler.h"
#include "core/sched/scheduler.h"
#include "core/util/status.h"

namespace kvrt::serve {

class BatchRunner {
 public:
  virtual ~BatchRunner() = default;
  // Runs the batch: next[i] = the token sampled for batch.sequences[i] where it samples (anything
  // elsewhere), with samplers[i], its request's sampler. A failure leaves the batch unapplied:
  // the caller hands it back to the scheduler (Scheduler::fail).
  virtual Status run(const sched::ScheduledBatch& batch, std::span<sampling::Sampler* const> samplers,
                     std::vector<int32_t>* next) = 0;
};

// The engine: the scheduled batch as the engine's (tokens, start positions, page tables; every
// row's logits for a chunk whose prompt log-probabilities were asked for), then one
// Engine::step_and_sample (serving_core.cc, beside its one user).
class EngineRunner : public BatchRunner {
 public:
  explicit EngineRunner(exec::Engine* engine) : engine_(engine) {}
  Status run(const sched::ScheduledBatch& batch, std::span<sampling::Sampler* const> samplers,
             std::vector<int32_t>* next) override;

 private:
  exec::Engine* engine_;
  exec::Batch exec_batch_;
  std::vector<exec::SequenceSampling> sampling_;
};

}  // namespace kvrt::serve
