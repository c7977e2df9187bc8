#include "core/exec/rank_executor.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <string>

namespace kvrt::exec {

RankExecutor::~RankExecutor() = default;

Result<std::unique_ptr<RankExecutor>> RankExecutor::load(const model::ArchitectureFamily& family,
                                                         const model::LoadedWeights& weights,
                                                         std::unique_ptr<backend::Backend> backend,
                                                         std::unique_ptr<comm::Communicator> comm) {
  const int rank = comm->rank(), tp = comm->size();
  std::unique_ptr<RankExecutor> r(new RankExecutor(std::move(backend), std::move(comm)));
  Result<std::unique_ptr<model::Architecture>> arch =
      family.create(weights, rank, tp, *r->backend_);
  if (!arch.ok()) return arch.status();
  r->arch_ = std::move(*arch);
  return r;
}

Status RankExecutor::attach(const RankPlugins& plugins, const kvrt_kv_geometry& geometry,
                            uint64_t num_pages, int dcp_size) {
  const int rank = comm_->rank();
  page_size_ = geometry.page_size;
  cp_ = parallel::ContextParallel::of(dcp_size, rank);
  backend_->bind_device();  // the pool goes on this rank's device (others were loaded since)
  Result<std::unique_ptr<plugin::KvStore>> store =
      plugin::KvStore::create(*plugins.store, geometry, num_pages, plugins.store_config);
  if (!store.ok()) return store.status();
  store_ = std::move(*store);

  const model::AttentionShape shape = arch_->attention_shape();
  if (cp_.on() && shape.q_heads == 0) {
    return Status::Unsupported("tp.dcp_size " + std::to_string(dcp_size) + ": TP rank " +
                               std::to_string(rank) +
                               " has no query heads, and every rank of a context-parallel group "
                               "attends its share of the tokens");
  }
  if (cp_.on() && backend_->device().kind != KVRT_DEVICE_CPU) {
    return Status::Unsupported("tp.dcp_size " + std::to_string(dcp_size) +
                               ": context parallelism merges on the CPU only so far");
  }
  if (shape.q_heads == 0) {  // it writes its KV heads and never attends
    step_attention_ = std::make_unique<parallel::StepAttention>(store_.get(), nullptr);
    return Status::Ok();
  }
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  // Under context parallelism the rank attends all of its group's query heads.
  p.num_q_heads = static_cast<uint32_t>(shape.q_heads * dcp_size);
  p.num_kv_heads = static_cast<uint32_t>(shape.kv_heads);
  p.qk_head_dim = static_cast<uint32_t>(shape.qk_head_dim);
  p.v_head_dim = static_cast<uint32_t>(shape.v_head_dim);
  p.softmax_scale = shape.softmax_scale;
  p.v_offset = geometry.v_offset;
  p.device = backend_->device();
  Result<std::unique_ptr<plugin::Attention>> attention =
      plugin::Attention::create(*plugins.attention, p, plugins.attention_config);
  if (!attention.ok()) return attention.status();
  attention_ = std::move(*attention);
  if (cp_.on() && !attention_->shardable()) {
    return Status::Unsupported("tp.dcp_size " + std::to_string(dcp_size) +
                               ": attention plugin " + attention_->name() +
                               " has no plan_sharded / run_lse (ABI 1.4), so it cannot attend a "
                               "sequence whose tokens are spread over ranks");
  }
  if (Status native = attention_->supports(store_->checked_layout(0)); !native.ok()) {
    if (!store_->has_gather()) {
      return Status::Unsupported(native.message() + "; and " + store_->name() +
                                 " has no gather() to fall back on");
    }
    if (rank == 0) {
      spdlog::warn(
          "{}; attention reads {} through its gather(), which decodes every cached token at every "
          "layer (docs/writing-a-kv-store.md: what that costs)",
          native.message(), store_->name());
    }
  }
  step_attention_ = std::make_unique<parallel::StepAttention>(store_.get(), attention_.get(),
                                                              comm_.get(), cp_);
  return Status::Ok();
}

Status RankExecutor::plan_attention(const Batch& batch) {
  qo_indptr_.assign(1, 0);
  kv_page_indptr_.assign(1, 0);
  kv_page_indices_.clear();
  kv_last_page_len_.clear();
  kv_len_.clear();
  for (const SequenceStep& s : batch.sequences) {
    const int64_t kv_len = s.start + static_cast<int64_t>(s.tokens.size());
    // The tokens this rank keeps (all of them without context parallelism), in its pages: the
    // sequence's first pages, as many as they fill.
    const int64_t kept = cp_.kept_before(kv_len);
    const int64_t pages = (kept + page_size_ - 1) / page_size_;
    qo_indptr_.push_back(qo_indptr_.back() + static_cast<int32_t>(s.tokens.size()));
    kv_page_indices_.insert(kv_page_indices_.end(), s.pages.begin(), s.pages.begin() + pages);
    kv_page_indptr_.push_back(static_cast<int32_t>(kv_page_indices_.size()));
    kv_last_page_len_.push_back(
        pages == 0 ? 0 : static_cast<int32_t>(kept - (pages - 1) * page_size_));
    kv_len_.push_back(static_cast<int32_t>(kv_len));
  }
  if (attention_ == nullptr) return Status::Ok();
  kvrt_attention_batch b{};
  b.struct_size = sizeof(b);
  b.batch_size = static_cast<uint32_t>(batch.sequences.size());
  b.page_size = page_size_;
  b.causal = 1;
  b.qo_indptr = qo_indptr_.data();
  b.kv_page_indptr = kv_page_indptr_.data();
  b.kv_page_indices = kv_page_indices_.data();
  b.kv_last_page_len = kv_last_page_len_.data();
  if (!cp_.on()) return attention_->plan(b);
  const kvrt_attention_shard shard{sizeof(kvrt_attention_shard), static_cast<uint32_t>(cp_.size),
                                   static_cast<uint32_t>(cp_.index), 1, kv_len_.data()};
  return attention_->plan(b, &shard);
}

Status RankExecutor::forward(const Batch& batch, std::vector<float>* logits) {
  // A backend whose device fails mid-step (a CUDA launch or allocation error) throws; the step
  // then fails with the reason instead of ending the process, after waiting (best effort) for
  // what it had queued. (At TP > 1 the other ranks are then left in their collectives: NCCL
  // has no deadline, unlike the MPI group.)
  try {
    backend_->begin_step();
    // Token ids, positions and KV slots of the new tokens, in batch order.
    ids_.clear();
    positions_.clear();
    slots_.clear();
    kept_rows_.clear();
    last_rows_.clear();
    for (const SequenceStep& s : batch.sequences) {
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const int32_t pos = s.start + static_cast<int32_t>(i);
        ids_.push_back(s.tokens[i]);
        positions_.push_back(pos);
        if (!cp_.keeps(pos)) continue;  // another rank of the group keeps it
        // Its place among the rank's tokens of the sequence, in the sequence's pages.
        const int64_t j = cp_.local_index(pos);
        slots_.push_back(int64_t{s.pages[j / page_size_]} * page_size_ + j % page_size_);
        if (cp_.on()) kept_rows_.push_back(static_cast<int32_t>(ids_.size() - 1));
      }
      // The rows whose logits it gets: its last new token's, or every one's.
      const int64_t end = static_cast<int64_t>(ids_.size());
      for (int64_t row = end - s.logit_rows(); row < end; ++row) last_rows_.push_back(row);
    }
    // A failed plan still runs the forward, with its collectives: each layer's attention
    // returns the failure, and the forward returns it at the end. The slots are staged on the
    // device once a step, for every layer's writes.
    Status plan = plan_attention(batch);
    const int64_t* device_slots = backend_->stage_slots(slots_);
    step_attention_->begin_step(slots_, kept_rows_, device_slots, backend_->stream(),
                                std::move(plan));
    Status s = arch_->forward({ids_, positions_, last_rows_}, *backend_, *comm_, *step_attention_,
                              logits);
    backend_->end_step();
    return s;
  } catch (const std::exception& e) {
    try {
      backend_->end_step();
    } catch (const std::exception&) {  // the device is gone: nothing left to wait for
    }
    return Status::Internal("TP rank " + std::to_string(rank()) + ": " + e.what());
  }
}

}  // namespace kvrt::exec
