// The execution engine: a model sharded over TP ranks, each a RankExecutor (architecture +
// backend + its KV store and attention handle + its communicator), stepping together. Where the
// ranks run is the TP group's (core/comm/tp_group.h): threads of this process, or one
// process each under an MPI launcher. Rank 0 leads: it takes the caller's batches and KV-tier
// requests and broadcasts each as a command (bytes) to the other ranks, which follow -- on
// threads of their own here, or in follow() in their own processes -- so the same loop serves
// both. It knows nothing of requests or scheduling: the caller owns page allocation and hands it
// batches.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/backend/cpu_backend.h"
#include "core/comm/thread_communicator.h"
#include "core/exec/batch.h"
#include "core/exec/rank_executor.h"
#include "core/sampling/sampler.h"
#include "core/model/loaded_weights.h"
#include "core/plugin/registry.h"

namespace kvrt::exec {

struct TierState;

// What a step samples for one sequence of its batch (Engine::step_and_sample).
struct SequenceSampling {
  sampling::Sampler* sampler = nullptr;  // the request's; null: the sequence samples nothing
  // Its tokens so far (prompt first): the prompt's log-probabilities read the token at each
  // position from here.
  std::span<const int32_t> tokens;
  int32_t prompt_len = 0;
  bool samples = false;  // its last new token produces a next token
};

struct EngineOptions {
  int tp = 1;
  uint32_t page_size = 16;  // tokens per page of each rank's KV store
  // Decode context parallelism (tp.dcp_size): each group of dcp_size consecutive ranks shares
  // every sequence's tokens, so a page id holds page_size x dcp_size tokens over the group. It
  // must divide the ranks that hold the same KV (the runtime checks it against the model).
  int dcp_size = 1;
  uint64_t num_pages = 0;
  bool bf16_weights = false;  // hold matrices in bf16 instead of f32
  // Products of bf16 weights round the activations to bf16 first (model.matmul_precision =
  // "medium"); the CPU backend's only.
  bool bf16_activations = false;
  // model.quantization on the CPU backend: projections quantized at load (cpu_backend.h).
  backend::CpuQuantization quantization;
  int threads = 0;  // threads for this process's ranks' products; 0 = OMP_NUM_THREADS or cores
  RankPlugins plugins;
  // Where the ranks run; null: tp threads of this process. Must outlive the engine, and its size
  // must be tp.
  comm::TpGroup* group = nullptr;
  // Each local rank's compute backend, made on the creating thread before the rank loads its
  // weights into it (its store comes later, on the backend's device: Backend::bind_device);
  // empty: the CPU's. The composition root sets it for device.kind = "cuda".
  std::function<Result<std::unique_ptr<backend::Backend>>(int rank)> make_backend;
  // Called once this process's ranks hold their weights and before any KV pool exists: how
  // many pages each pool gets (on a GPU the runtime measures what the weights took); empty:
  // num_pages. When the ranks are several processes, every process's answer is gathered and
  // the least is used, so page ids mean the same on every rank.
  std::function<Result<uint64_t>()> size_pool;
};

class Engine {
 public:
  // The architecture comes from the weights' config (model::find_architecture), each rank's KV
  // geometry from capacity::kv_geometry, the backend options.make_backend's (the CPU's by
  // default). Builds this process's ranks
  // only. `weights` may go once create returns: every rank holds its own shard.
  static Result<std::unique_ptr<Engine>> create(const model::LoadedWeights& weights,
                                                const EngineOptions& options);
  ~Engine();

  // Whether this process runs rank 0, which steps; else it runs another rank and follows.
  bool leads() const { return leads_; }
  // The group is unusable from now on (a rank failed to start, or the process is being
  // stopped): later commands fail with `why`, and rank 0 no longer tells followers to stop.
  void mark_broken(const Status& why) { broken_ = why; }
  // Whether the group failed (a collective timed out or failed, a rank was lost): the engine
  // cannot step again, and broken_reason() says why.
  bool broken() const { return !broken_.ok(); }
  const Status& broken_reason() const { return broken_; }
  // A following process's work: runs rank 0's commands until rank 0 stops the group (OK) or the
  // group fails (the reason, naming the rank).
  Status follow();

  // One forward step on every rank; logits [rows][vocab]: each sequence's last new token's, or
  // each of its new tokens' when it asks for all_logits (SequenceStep::logit_rows). The batch
  // is checked first (tokens in the vocabulary, pages in range and covering every position),
  // so a bad batch fails before any rank starts. Leader only.
  Result<std::vector<float>> step(const Batch& batch);
  // step(), then each sequence's next token from its sampler (next[i] for sequences[i]; 0 where
  // it does not sample), the sequences sampled side by side on threads(); a sequence with
  // all_logits first hands its sampler the prompt's log-probabilities its rows predict.
  Result<std::vector<int32_t>> step_and_sample(const Batch& batch,
                                               std::span<const SequenceSampling> sampling);

  // The KV store's host tier on every rank at once (each rank's tier keys the pages with its
  // rank, sched::rank_hash). Leader only, and only when has_tier().
  bool has_tier() const { return local_->store().tier() != nullptr; }
  // Leading pages of `hashes` every rank's tier holds (the least over ranks).
  Result<uint64_t> tier_lookup(std::span<const uint64_t> hashes);
  Status tier_save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                   kvrt_tier_reason reason);
  // Copies the pages in on every rank and waits; loaded[i] = 1 for a page every rank loaded.
  Status tier_load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                   std::vector<uint8_t>* loaded);
  // Every rank's copies so far are done.
  Status tier_wait();
  // What rank 0's tier holds and has done (every rank's saves and loads the same pages).
  Result<kvrt_tier_info> tier_info() const;

  // This process's first rank's KV store (every rank's has the same format and size).
  const plugin::KvStore& store() const { return local_->store(); }
  // This process's first rank's communicator: the collectives' time and bytes.
  const comm::Communicator& communicator() const { return local_->communicator(); }
  const model::ModelConfig& config() const { return config_; }
  int tp() const { return options_.tp; }
  // Tokens one page id holds: page_size tokens on each rank's store, times dcp_size under decode
  // context parallelism (the group's ranks each keep page_size of them). Page tables count in
  // these.
  uint32_t page_size() const { return options_.page_size * options_.dcp_size; }
  int dcp_size() const { return options_.dcp_size; }
  uint64_t num_pages() const { return options_.num_pages; }
  // The threads this process's work may use (EngineOptions::threads, else OMP_NUM_THREADS or
  // the cores): its ranks' products share them, and so does sampling a step's sequences.
  int threads() const { return threads_; }

 private:
  Engine(const model::ModelConfig& config, const EngineOptions& options);
  Status check(const Batch& batch) const;
  // Rank 0: sends a command to the other ranks, runs it on its own and gathers every rank's
  // reply. *out gets the replies' extra bytes, rank by rank.
  // on_rank0 runs the command on rank 0 and fills its extra reply bytes.
  Status lead(uint64_t op, std::span<const uint8_t> payload, size_t reply_bytes,
              const std::function<Status(std::span<uint8_t>)>& on_rank0,
              std::vector<uint8_t>* out);
  Status tier_command(uint64_t op, std::span<const uint64_t> hashes,
                      std::span<const int32_t> pages, uint32_t reason, std::vector<uint8_t>* out);
  // Ranks 1..: receive commands from rank 0 and run them, until rank 0 says stop.
  Status follow_loop(RankExecutor* rank);

  model::ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<comm::ThreadGroup> own_group_;  // when options.group is null
  comm::TpGroup* group_ = nullptr;
  bool leads_ = true;
  std::vector<std::unique_ptr<RankExecutor>> ranks_;  // this process's, ascending
  RankExecutor* local_ = nullptr;  // ranks_[0]: rank 0 when leading
  std::vector<std::thread> followers_;
  std::unique_ptr<TierState> leader_tier_;  // rank 0's side of the tier commands
  std::vector<uint8_t> command_;  // rank 0's serialised command
  std::vector<uint8_t> replies_;
  std::vector<int32_t> words_;
  Status broken_;  // why the TP group cannot step any more (OK while it can)
  int threads_ = 1;
};

}  // namespace kvrt::exec
