// One TP rank: the pairing of an architecture (the model's shard and its forward, core/model)
// with a compute backend (where the tensors live and the ops run), this rank's KV store and
// attention handle (through the plugin wrappers) and its communicator. It owns the step's
// host-side bookkeeping -- the new tokens' slots and the attention plan -- and hands the
// architecture the step's plugin::StepAttention, which each layer calls once.
#pragma once

#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/comm/communicator.h"
#include "core/exec/batch.h"
#include "core/model/architecture.h"
#include "core/plugin/attention.h"
#include "core/plugin/kv_store.h"
#include "core/plugin/step_attention.h"
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
  Status attach(const RankPlugins& plugins, const kvrt_kv_geometry& geometry, uint64_t num_pages);
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
  std::unique_ptr<plugin::StepAttention> step_attention_;
  uint32_t page_size_ = 0;
  // The step: its new tokens' ids, positions and slots, and the planned batch as CSR.
  std::vector<int32_t> ids_, positions_;
  std::vector<int64_t> slots_, last_rows_;
  std::vector<int32_t> qo_indptr_, kv_page_indptr_, kv_page_indices_, kv_last_page_len_;
};

}  // namespace kvrt::exec
