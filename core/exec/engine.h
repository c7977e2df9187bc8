// The execution engine: a model sharded over TP ranks, each a RankExecutor (architecture +
// backend + its KV store and attention handle + its communicator), stepping together. Ranks
// 1..tp-1 run on threads of their own here (ThreadGroup); rank 0 runs on the caller's thread
// and broadcasts each step's batch to the others as bytes, so the same loop serves ranks in
// other processes. It knows nothing of requests or scheduling: the caller owns page allocation
// and hands it batches.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "core/exec/batch.h"
#include "core/exec/rank_executor.h"
#include "core/exec/thread_communicator.h"
#include "core/model/loaded_weights.h"
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
  // The architecture comes from the weights' config (model::find_architecture), each rank's KV
  // geometry from capacity::kv_geometry, the backend is the CPU's. `weights` may go once
  // create returns: every rank holds its own shard.
  static Result<std::unique_ptr<Engine>> create(const model::LoadedWeights& weights,
                                                const EngineOptions& options);
  ~Engine();

  // One forward step on every rank; logits [num_sequences][vocab] of each sequence's last new
  // token. The batch is checked first (tokens in the vocabulary, pages in range and covering
  // every position), so a bad batch fails before any rank starts.
  Result<std::vector<float>> step(const Batch& batch);

  // Each rank's KV store tier (rank r at index r), or empty when the store has none.
  std::vector<plugin::StoreTier*> store_tiers();
  // Rank 0's KV store (every rank's has the same format and size).
  const plugin::KvStore& store() const { return ranks_.front()->store(); }
  const model::ModelConfig& config() const { return config_; }
  int tp() const { return options_.tp; }
  uint32_t page_size() const { return options_.page_size; }
  uint64_t num_pages() const { return options_.num_pages; }

 private:
  Engine(const model::ModelConfig& config, const EngineOptions& options)
      : config_(config), options_(options), group_(options.tp) {}
  Status check(const Batch& batch) const;
  // Every rank's status after a step, gathered on every rank; the first failure.
  // *group_failed is set when the gathering itself failed.
  static Status gather_status(Communicator& comm, const Status& mine, bool* group_failed);
  // Ranks 1..: receive each step's batch from rank 0, run it, report; until rank 0 says stop.
  void worker_loop(RankExecutor* rank);

  model::ModelConfig config_;
  EngineOptions options_;
  ThreadGroup group_;
  std::vector<std::unique_ptr<RankExecutor>> ranks_;
  std::vector<std::thread> workers_;
  std::vector<int32_t> words_;  // rank 0's serialised batch
  Status broken_;               // why the TP group cannot step any more (OK while it can)
};

}  // namespace kvrt::exec
