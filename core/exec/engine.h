// The execution engine: a model sharded over TP ranks (threads), each with its own KV store and
// attention handle, stepping together. It knows nothing of requests or scheduling: the caller
// owns page allocation and hands it batches.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/exec/batch.h"
#include "core/exec/communicator.h"
#include "core/exec/rank_executor.h"
#include "core/model/weights.h"
#include "core/plugin/registry.h"

namespace kvrt::exec {

struct EngineOptions {
  int tp = 1;
  uint32_t page_size = 16;
  uint64_t num_pages = 0;
  bool bf16_weights = false;  // hold matrices in bf16 instead of f32
  int threads = 0;  // threads for all ranks' products; 0 = OMP_NUM_THREADS, else the cores
  RankPlugins plugins;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(const model::Weights& weights,
                                                const EngineOptions& options);
  ~Engine();

  // One forward step on every rank; logits [num_sequences][vocab] of each sequence's last new
  // token. The batch is checked first (tokens in the vocabulary, pages in range and covering
  // every position), so a bad batch fails before any rank starts.
  Result<std::vector<float>> step(const Batch& batch);

  // Every rank's executor (rank r at index r), e.g. to reach its KV store's tier.
  const std::vector<std::unique_ptr<RankExecutor>>& ranks() const { return ranks_; }
  const model::ModelConfig& config() const { return config_; }
  int tp() const { return options_.tp; }
  uint32_t page_size() const { return options_.page_size; }
  uint64_t num_pages() const { return options_.num_pages; }

 private:
  Engine(const model::ModelConfig& config, const EngineOptions& options);
  Status check(const Batch& batch) const;

  void worker_loop(size_t rank);

  model::ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<Communicator> comm_;
  std::vector<std::unique_ptr<RankExecutor>> ranks_;

  // Ranks 1..tp-1 run on threads that live as long as the engine (so do their OpenMP teams);
  // rank 0 runs on the caller's thread. step() publishes the batch as a new generation and
  // waits until every worker has finished it.
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;
  size_t running_ = 0;
  bool stopping_ = false;
  const Batch* batch_ = nullptr;
  std::vector<float>* logits_ = nullptr;
  std::vector<Status> results_;
};

}  // namespace kvrt::exec
