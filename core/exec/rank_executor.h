// One TP rank: the pairing of an architecture (the model's shard and its forward, core/model)
// with a compute backend (where the tensors live and the ops run), this rank's KV store and
// attention handle (through the plugin wrappers) and its communicator. It owns the step's
// host-side bookkeeping -- the new tokens' slots and the attention plan -- and hands the
// architecture the step's parallel::StepAttention, which each layer calls once. Under decode
// context parallelism (parallel/context_parallel.h) it keeps only its share of each sequence's
// tokens: the slots and the plan are those of its share.
#pragma once

#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/comm/communicator.h"
#include "core/exec/batch.h"
#include "core/model/architecture.h"
#include "core/plugin/attention.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/step_attention.h"
#include "core/plugin/kv_store.h"
#include "core/util/status.h"

namespace kvrt::exec {

// The plugins every rank uses, with their option tables.
struct RankPlugins {
  const plugin::LoadedPlugin* store = nullptr;
  const kvrt_config* store_config = nullptr;
  const plugin::LoadedPlugin* attention = nullptr;
  const kvrt_config* attention_config = nullptr;
};

class RankExecutor {
 public:
  // Builds this rank's share of `weights` with `family` in `backend`. The rank has no KV store
  // until attach(), so the engine can size the pools once every rank's weights are in place.
  static Result<std::unique_ptr<RankExecutor>> load(const model::ArchitectureFamily& family,
                                                    const model::LoadedWeights& weights,
                                                    std::unique_ptr<backend::Backend> backend,
                                                    std::unique_ptr<comm::Communicator> comm);
  // Creates the rank's KV store (`geometry`, num_pages pages) on its backend's device and its
  // attention handle. The attention plugin is asked whether it reads the store's layout
  // natively (supports()); when it does not and the store has no gather() to fall back on, the
  // pairing is refused with both reasons. Once, on the thread that loaded the rank.
  // dcp_size > 1: each group of dcp_size consecutive ranks shares every sequence's tokens
  // (tp.dcp_size; the caller checked that those ranks hold the same KV); the attention plugin
  // must attend a sharded sequence, and every rank must have query heads, as many as the others.
  Status attach(const RankPlugins& plugins, const kvrt_kv_geometry& geometry, uint64_t num_pages,
                int dcp_size = 1);
  const backend::Backend& backend() const { return *backend_; }
  ~RankExecutor();
  RankExecutor(const RankExecutor&) = delete;
  RankExecutor& operator=(const RankExecutor&) = delete;

  // Runs one step. Every rank must call it with the same batch. Rank 0 fills `logits` with
  // [num_sequences][vocab] for each sequence's last new token; other ranks leave it alone. A
  // failure on one rank still takes part in every collective, so no rank is left waiting.
  Status forward(const Batch& batch, std::vector<float>* logits);

  int rank() const { return comm_->rank(); }
  comm::Communicator& communicator() { return *comm_; }
  plugin::KvStore& store() { return *store_; }

 private:
  RankExecutor(std::unique_ptr<backend::Backend> backend, std::unique_ptr<comm::Communicator> comm)
      : backend_(std::move(backend)), comm_(std::move(comm)) {}
  Status plan_attention(const Batch& batch);

  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<model::Architecture> arch_;
  std::unique_ptr<plugin::KvStore> store_;
  std::unique_ptr<plugin::Attention> attention_;  // null on a rank without query heads
  // What each layer of the forward calls, once a layer: the store's write, then attention.
  std::unique_ptr<parallel::StepAttention> step_attention_;
  uint32_t page_size_ = 0;  // tokens per page of this rank's store
  parallel::ContextParallel cp_;
  // The step: its new tokens' ids, positions and slots (of the rows this rank keeps, kept_rows_,
  // under context parallelism), and the planned batch as CSR.
  std::vector<int32_t> ids_, positions_, kept_rows_;
  std::vector<int64_t> slots_, last_rows_;
  std::vector<int32_t> qo_indptr_, kv_page_indptr_, kv_page_indices_, kv_last_page_len_, kv_len_;
};

}  // namespace kvrt::exec
