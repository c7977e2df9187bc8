#include "core/exec/engine.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

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

}  // namespace

Engine::Engine(const model::ModelConfig& config, const EngineOptions& options)
    : config_(config), options_(options), comm_(std::make_unique<Communicator>(options.tp)) {}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void Engine::worker_loop(size_t rank) {
  uint64_t seen = 0;
  while (true) {
    const Batch* batch = nullptr;
    std::vector<float>* logits = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      batch = batch_;
      logits = logits_;
    }
    Status s = ranks_[rank]->forward(*batch, logits);  // only rank 0 writes logits
    {
      std::lock_guard lock(mutex_);
      results_[rank] = std::move(s);
      if (--running_ == 0) done_.notify_one();
    }
  }
}

Result<std::unique_ptr<Engine>> Engine::create(const model::Weights& weights,
                                               const EngineOptions& options) {
  if (options.tp < 1 || options.tp > 8) {
    return Status::InvalidArgument("tp.size must be 1..8, found " + std::to_string(options.tp));
  }
  if (options.num_pages == 0) return Status::InvalidArgument("the KV pool has no pages");
  // Products are split over each rank's OpenMP threads (RankExecutor::matmul): the BLAS's own
  // threads would spin against them on the same cores.
  openblas_set_num_threads(1);
  std::unique_ptr<Engine> engine(new Engine(weights.config, options));
  const model::ModelConfig& c = weights.config;
  const int cores =
      options.threads > 0 ? options.threads : default_threads();
  const int threads_per_rank = std::max(1, cores / options.tp);
  for (int r = 0; r < options.tp; ++r) {
    Result<RankShard> shard = shard_for(c.num_attention_heads, c.num_key_value_heads,
                                        c.intermediate_size, c.vocab_size, r, options.tp);
    if (!shard.ok()) return shard.status();
    Result<std::unique_ptr<RankExecutor>> rank = RankExecutor::create(
        weights, *shard, engine->comm_.get(), options.plugins, options.page_size, options.num_pages,
        options.bf16_weights, threads_per_rank);
    if (!rank.ok()) return rank.status().WithContext("TP rank " + std::to_string(r));
    engine->ranks_.push_back(std::move(*rank));
  }
  engine->results_.resize(engine->ranks_.size());
  for (size_t r = 1; r < engine->ranks_.size(); ++r) {
    engine->workers_.emplace_back([e = engine.get(), r] { e->worker_loop(r); });
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
  if (!workers_.empty()) {
    std::lock_guard lock(mutex_);
    batch_ = &batch;
    logits_ = &logits;
    running_ = workers_.size();
    ++generation_;
  }
  start_.notify_all();
  results_[0] = ranks_[0]->forward(batch, &logits);
  if (!workers_.empty()) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
  }
  for (const Status& s : results_) {
    if (!s.ok()) return s;
  }
  return logits;
}

}  // namespace kvrt::exec
