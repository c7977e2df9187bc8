#include "core/exec/engine.h"

#include <cblas.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/capacity/model_shape.h"
#include "core/exec/cpu_backend.h"

namespace kvrt::exec {
namespace {

// OMP_NUM_THREADS when set (read here, not through omp_get_max_threads(), which a previous
// engine's omp_set_num_threads on this thread would have changed), else the machine's cores.
int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// What rank 0 broadcasts ahead of each step: the batch's length in words, or kStop.
constexpr uint64_t kStop = UINT64_MAX;

// A rank's status as bytes for the all-gather: its code, then its message (truncated).
constexpr size_t kStatusBytes = 1024;

}  // namespace

Engine::~Engine() {
  // With a broken group the workers have left their loop (or will not hear the stop).
  if (!workers_.empty() && broken_.ok()) {
    uint64_t stop = kStop;
    (void)ranks_[0]->communicator().broadcast(&stop, sizeof(stop), ElementType::kU8, 0, nullptr);
  }
  for (std::thread& t : workers_) t.join();
}

Status Engine::gather_status(Communicator& comm, const Status& mine, bool* group_failed) {
  const int size = comm.size();
  if (size == 1) return mine;
  std::vector<uint8_t> record(kStatusBytes, 0), all(kStatusBytes * size);
  record[0] = static_cast<uint8_t>(mine.code());
  const std::string& message = mine.message();
  std::memcpy(record.data() + 1, message.data(), std::min(message.size(), kStatusBytes - 2));
  const std::vector<size_t> counts(size, kStatusBytes);
  if (Status s = comm.all_gather(record.data(), counts, all.data(), ElementType::kU8, nullptr);
      !s.ok()) {
    if (group_failed != nullptr) *group_failed = true;
    return s;
  }
  for (int r = 0; r < size; ++r) {
    const uint8_t* rec = all.data() + r * kStatusBytes;
    if (rec[0] != 0) {
      return Status::FromCode(static_cast<Status::Code>(rec[0]),
                              std::string(reinterpret_cast<const char*>(rec + 1)))
          .WithContext("TP rank " + std::to_string(r));
    }
  }
  return Status::Ok();
}

void Engine::worker_loop(RankExecutor* rank) {
  Communicator& comm = rank->communicator();
  std::vector<int32_t> words;
  Batch batch;
  while (true) {
    uint64_t n = 0;
    if (!comm.broadcast(&n, sizeof(n), ElementType::kU8, 0, nullptr).ok() || n == kStop) return;
    words.resize(n);
    if (!comm.broadcast(words.data(), n * sizeof(int32_t), ElementType::kU8, 0, nullptr).ok()) {
      return;  // the group is broken; rank 0 knows it too
    }
    Status s = deserialize(words, &batch);
    if (!s.ok()) {
      // Rank 0 serialised these words itself: a batch this rank cannot read means the group is
      // broken, and running on would leave the other ranks waiting in collectives forever.
      spdlog::critical("TP rank {}: {}", rank->rank(), s.message());
      std::abort();
    }
    s = rank->forward(batch, nullptr);  // only rank 0 writes logits
    bool group_failed = false;
    (void)gather_status(comm, s, &group_failed);
    if (group_failed) return;
  }
}

Result<std::unique_ptr<Engine>> Engine::create(const model::LoadedWeights& weights,
                                               const EngineOptions& options) {
  if (options.tp < 1 || options.tp > 8) {
    return Status::InvalidArgument("tp.size must be 1..8, found " + std::to_string(options.tp));
  }
  if (options.num_pages == 0) return Status::InvalidArgument("the KV pool has no pages");
  const model::ModelConfig& c = weights.model_config();
  Result<const model::ArchitectureFamily*> family = model::find_architecture(c);
  if (!family.ok()) return family.status();
  if (Status s = (*family)->check_tp(c, options.tp); !s.ok()) return s;
  Result<kvrt_kv_geometry> geometry = capacity::kv_geometry(
      capacity::kv_shape(c), static_cast<uint32_t>(options.tp), options.page_size, KVRT_DTYPE_F32);
  if (!geometry.ok()) return geometry.status();
  // Products are split over each rank's OpenMP threads (CpuBackend::matmul): the BLAS's own
  // threads would spin against them on the same cores.
  openblas_set_num_threads(1);
  std::unique_ptr<Engine> engine(new Engine(c, options));
  const int cores = options.threads > 0 ? options.threads : default_threads();
  const int threads_per_rank = std::max(1, cores / options.tp);
  for (int r = 0; r < options.tp; ++r) {
    kvrt_kv_geometry g = *geometry;
    g.tp_rank = static_cast<uint32_t>(r);
    Result<std::unique_ptr<RankExecutor>> rank = RankExecutor::create(
        **family, weights, std::make_unique<CpuBackend>(options.bf16_weights, threads_per_rank),
        engine->group_.communicator(r), options.plugins, g, options.num_pages);
    if (!rank.ok()) return rank.status().WithContext("TP rank " + std::to_string(r));
    engine->ranks_.push_back(std::move(*rank));
  }
  for (size_t r = 1; r < engine->ranks_.size(); ++r) {
    engine->workers_.emplace_back([e = engine.get(), r] { e->worker_loop(e->ranks_[r].get()); });
  }
  return engine;
}

Status Engine::check(const Batch& batch) const {
  const int64_t total_slots = static_cast<int64_t>(options_.num_pages) * options_.page_size;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceStep& s = batch.sequences[i];
    const std::string where = "sequence " + std::to_string(i) + ": ";
    if (s.tokens.empty()) return Status::InvalidArgument(where + "no new tokens");
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return Status::InvalidArgument(where + "token id " + std::to_string(t) +
                                       " outside the vocabulary of " +
                                       std::to_string(config_.vocab_size));
      }
    }
    const int64_t kv_len = s.start + static_cast<int64_t>(s.tokens.size());
    const int64_t needed = (kv_len + options_.page_size - 1) / options_.page_size;
    if (s.start < 0 || static_cast<int64_t>(s.pages.size()) < needed) {
      return Status::InvalidArgument(where + std::to_string(kv_len) + " tokens need " +
                                     std::to_string(needed) + " pages, the page table has " +
                                     std::to_string(s.pages.size()));
    }
    for (int64_t p = 0; p < needed; ++p) {
      if (s.pages[p] < 0 || int64_t{s.pages[p]} * options_.page_size >= total_slots) {
        return Status::OutOfRange(where + "page " + std::to_string(s.pages[p]) +
                                  " outside the pool of " + std::to_string(options_.num_pages));
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<float>> Engine::step(const Batch& batch) {
  if (Status s = check(batch); !s.ok()) return s;
  std::vector<float> logits;
  RankExecutor& rank0 = *ranks_[0];
  if (workers_.empty()) {
    if (Status s = rank0.forward(batch, &logits); !s.ok()) return s;
    return logits;
  }
  if (!broken_.ok()) return broken_;
  Communicator& comm = rank0.communicator();
  serialize(batch, &words_);
  uint64_t n = words_.size();
  // A collective that fails leaves the group unusable (communicator.h): later steps say so
  // instead of waiting on ranks that may have left.
  auto broke = [this](const Status& s) {
    broken_ = s.WithContext("the TP group failed; the engine cannot step again");
    return broken_;
  };
  if (Status s = comm.broadcast(&n, sizeof(n), ElementType::kU8, 0, nullptr); !s.ok()) {
    return broke(s);
  }
  if (Status s = comm.broadcast(words_.data(), n * sizeof(int32_t), ElementType::kU8, 0, nullptr);
      !s.ok()) {
    return broke(s);
  }
  Status mine = rank0.forward(batch, &logits);
  bool group_failed = false;
  if (Status s = gather_status(comm, mine, &group_failed); !s.ok()) {
    return group_failed ? broke(s) : s;
  }
  return logits;
}

std::vector<plugin::StoreTier*> Engine::store_tiers() {
  std::vector<plugin::StoreTier*> tiers;
  for (const auto& rank : ranks_) {
    if (rank->store().tier() == nullptr) return {};
    tiers.push_back(rank->store().tier());
  }
  return tiers;
}

}  // namespace kvrt::exec
