#include "core/exec/engine.h"

#include <cblas.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "core/backend/cpu_backend.h"
#include "core/capacity/model_shape.h"
#include "core/sched/page_hash.h"

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

// The commands rank 0 sends: a header {op, payload bytes}, then the payload.
enum Op : uint64_t { kStop = 0, kStep, kTierLookup, kTierSave, kTierLoad, kTierWait };

// Each rank's reply: its status's code, then its message (truncated), then the op's extra bytes.
constexpr size_t kStatusBytes = 1024;

}  // namespace

// One rank's side of the tier commands: the pages as it keys them, its latest copy's ticket.
struct TierState {
  std::vector<uint64_t> hashes;
  std::vector<int64_t> pages;
  std::vector<uint8_t> loaded;
  uint64_t last_ticket = 0;
};

namespace {

// A tier command's payload: u32 reason, u32 count, count u64 hashes, count i32 pages.
void encode_pages(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                  uint32_t reason, std::vector<uint8_t>* out) {
  const uint32_t n = static_cast<uint32_t>(hashes.size());
  out->resize(8 + n * 8 + pages.size() * 4);
  std::memcpy(out->data(), &reason, 4);
  std::memcpy(out->data() + 4, &n, 4);
  if (n > 0) std::memcpy(out->data() + 8, hashes.data(), n * 8);
  if (!pages.empty()) std::memcpy(out->data() + 8 + n * 8, pages.data(), pages.size() * 4);
}

// The inverse, with each hash mixed with the rank (its tier's keys). False for bytes that are
// not a tier command.
bool decode_pages(std::span<const uint8_t> in, uint32_t rank, bool with_pages, uint32_t* reason,
                  TierState* t) {
  if (in.size() < 8) return false;
  uint32_t n = 0;
  std::memcpy(reason, in.data(), 4);
  std::memcpy(&n, in.data() + 4, 4);
  if (in.size() != 8 + size_t{n} * (with_pages ? 12 : 8)) return false;
  t->hashes.resize(n);
  if (n > 0) std::memcpy(t->hashes.data(), in.data() + 8, size_t{n} * 8);
  for (uint64_t& h : t->hashes) h = sched::rank_hash(h, rank);
  t->pages.resize(with_pages ? n : 0);
  for (size_t i = 0; i < t->pages.size(); ++i) {
    int32_t page = 0;
    std::memcpy(&page, in.data() + 8 + size_t{n} * 8 + i * 4, 4);
    t->pages[i] = page;
  }
  return true;
}

// Runs one command on one rank; `extra` gets the op's reply bytes (sized by the caller).
Status execute(RankExecutor& rank, TierState& tier, uint64_t op, std::span<const uint8_t> payload,
               std::span<uint8_t> extra) {
  const uint32_t me = static_cast<uint32_t>(rank.rank());
  plugin::StoreTier* st = rank.store().tier();
  if (op != kStep && st == nullptr) {
    return Status::Internal(rank.store().name() + " has no tier on this rank");
  }
  uint32_t reason = 0;
  switch (op) {
    case kStep: {
      std::vector<int32_t> words(payload.size() / 4);
      if (!words.empty()) std::memcpy(words.data(), payload.data(), words.size() * 4);
      Batch batch;
      if (Status s = deserialize(words, &batch); !s.ok() || payload.size() % 4 != 0) {
        // Rank 0 serialised these words itself: a batch this rank cannot read means the group
        // is broken, and running on would leave the other ranks waiting in collectives.
        spdlog::critical("TP rank {}: {}", me, s.message());
        std::abort();
      }
      return rank.forward(batch, nullptr);  // only rank 0 writes logits
    }
    case kTierLookup: {
      if (!decode_pages(payload, me, false, &reason, &tier)) break;
      Result<uint32_t> n = st->lookup(tier.hashes);
      if (!n.ok()) return n.status();
      const uint64_t hits = *n;
      std::memcpy(extra.data(), &hits, 8);
      return Status::Ok();
    }
    case kTierSave: {
      if (!decode_pages(payload, me, true, &reason, &tier)) break;
      Result<uint64_t> ticket =
          st->save(tier.hashes, tier.pages, static_cast<kvrt_tier_reason>(reason));
      if (!ticket.ok()) return ticket.status();
      tier.last_ticket = *ticket;
      return Status::Ok();
    }
    case kTierLoad: {
      if (!decode_pages(payload, me, true, &reason, &tier)) break;
      tier.loaded.assign(tier.hashes.size(), 0);
      Result<uint64_t> ticket = st->load(tier.hashes, tier.pages, tier.loaded);
      if (!ticket.ok()) {
        // Earlier copies may still land in pages the caller is about to recompute into.
        (void)st->wait(tier.last_ticket);
        return ticket.status();
      }
      tier.last_ticket = *ticket;
      if (!tier.loaded.empty()) std::memcpy(extra.data(), tier.loaded.data(), tier.loaded.size());
      return st->wait(tier.last_ticket);
    }
    case kTierWait:
      return st->wait(tier.last_ticket);
    default:
      break;
  }
  spdlog::critical("TP rank {}: command {} with {} bytes is not one rank 0 sends", me, op,
                   payload.size());
  std::abort();
}

// A reply record's rank-named status (status_to_record wrote it; the extra bytes follow).
Status decode_reply(std::span<const uint8_t> record, int rank) {
  return status_from_record(record.first(kStatusBytes))
      .WithContext("TP rank " + std::to_string(rank));
}

// How many extra reply bytes each op has, from its payload.
size_t reply_bytes(uint64_t op, std::span<const uint8_t> payload) {
  if (op == kTierLookup) return 8;
  if (op == kTierLoad && payload.size() >= 8) {
    uint32_t n = 0;
    std::memcpy(&n, payload.data() + 4, 4);
    return n;
  }
  return 0;
}

// Every rank's reply, on every rank.
Status exchange(comm::Communicator& comm, const Status& mine, std::span<const uint8_t> extra,
                std::vector<uint8_t>* all) {
  const size_t record = kStatusBytes + extra.size();
  std::vector<uint8_t> own(record);
  status_to_record(mine, std::span<uint8_t>(own).first(kStatusBytes));
  if (!extra.empty()) std::memcpy(own.data() + kStatusBytes, extra.data(), extra.size());
  all->resize(record * comm.size());
  const std::vector<size_t> counts(comm.size(), record);
  return comm.all_gather(own.data(), counts, all->data(), comm::ElementType::kU8, nullptr);
}

}  // namespace

Engine::Engine(const model::ModelConfig& config, const EngineOptions& options)
    : config_(config), options_(options) {}

Engine::~Engine() {
  // With a broken group the followers have left their loop (or will not hear the stop). Without
  // local_, create() failed before any follower started: there is nobody to stop.
  if (leads_ && local_ != nullptr && options_.tp > 1 && broken_.ok()) {
    uint64_t header[2] = {kStop, 0};
    (void)local_->communicator().broadcast(header, sizeof(header), comm::ElementType::kU8, 0,
                                           nullptr);
  }
  for (std::thread& t : followers_) t.join();
}

Status Engine::follow_loop(RankExecutor* rank) {
  comm::Communicator& comm = rank->communicator();
  std::vector<uint8_t> payload, extra, all;
  TierState tier;
  while (true) {
    uint64_t header[2] = {0, 0};
    if (Status s = comm.broadcast_idle(header, sizeof(header), comm::ElementType::kU8, 0);
        !s.ok()) {
      return s;
    }
    if (header[0] == kStop) return Status::Ok();
    payload.resize(header[1]);
    if (Status s =
            comm.broadcast(payload.data(), payload.size(), comm::ElementType::kU8, 0, nullptr);
        !s.ok()) {
      return s;
    }
    extra.assign(reply_bytes(header[0], payload), 0);
    const Status mine = execute(*rank, tier, header[0], payload, extra);
    if (Status s = exchange(comm, mine, extra, &all); !s.ok()) return s;
  }
}

Status Engine::follow() {
  if (leads_) return Status::Internal("rank 0 leads; it does not follow");
  Status s = follow_loop(local_);
  if (!s.ok()) broken_ = s;
  return s;
}

Status Engine::lead(uint64_t op, std::span<const uint8_t> payload, size_t extra_bytes,
                    const std::function<Status(std::span<uint8_t>)>& on_rank0,
                    std::vector<uint8_t>* out) {
  if (!leads_) return Status::Internal("only rank 0 sends commands");
  if (!broken_.ok()) return broken_;
  std::vector<uint8_t> extra(extra_bytes, 0);
  if (options_.tp == 1) {
    Status s = on_rank0(extra);
    if (out != nullptr) *out = std::move(extra);
    return s;
  }
  comm::Communicator& comm = local_->communicator();
  // A collective that fails leaves the group unusable (core/comm/communicator.h): later
  // commands say so instead of waiting on ranks that may have left.
  auto broke = [this](const Status& s) {
    broken_ = s.WithContext("the TP group failed; the engine cannot step again");
    return broken_;
  };
  uint64_t header[2] = {op, payload.size()};
  if (Status s = comm.broadcast(header, sizeof(header), comm::ElementType::kU8, 0, nullptr);
      !s.ok()) {
    return broke(s);
  }
  if (Status s = comm.broadcast(const_cast<uint8_t*>(payload.data()), payload.size(),
                                comm::ElementType::kU8, 0, nullptr);
      !s.ok()) {
    return broke(s);
  }
  const Status mine = on_rank0(extra);
  if (Status s = exchange(comm, mine, extra, &replies_); !s.ok()) return broke(s);
  const size_t record = kStatusBytes + extra_bytes;
  if (out != nullptr) out->resize(extra_bytes * options_.tp);
  Status first = Status::Ok();
  for (int r = 0; r < options_.tp; ++r) {
    std::span<const uint8_t> rec(replies_.data() + r * record, record);
    if (Status s = decode_reply(rec, r); !s.ok() && first.ok()) first = s;
    if (out != nullptr && extra_bytes > 0) {
      std::memcpy(out->data() + r * extra_bytes, rec.data() + kStatusBytes, extra_bytes);
    }
  }
  return first;
}

namespace {

// OpenBLAS picks its kernels from the CPU's model number; a virtual CPU it does not know (a
// generic "Intel Xeon Processor") gets Prescott's SSE3 kernels even with AVX2 or AVX-512 there.
// It reads OPENBLAS_CORETYPE only when it loads, so kvrt can only say so. Measured here:
// synth-mla's decode step at batch 64, 285 ms with Prescott's kernels, 124 ms with SkylakeX's.
void warn_if_blas_misdetected() {
  static bool once = [] {
    const std::string core = openblas_get_corename();
    if (core == "Prescott" && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
        __builtin_cpu_supports("avx2")) {
      spdlog::warn(
          "OpenBLAS chose its Prescott (SSE3) kernels on a CPU with {}: batched products run "
          "2-3x slower than they could; set OPENBLAS_CORETYPE={} before starting kvrt",
          __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
          __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
    }
    return true;
  }();
  (void)once;
}

// size_pool's answer, the least over the group's processes when it spans several (one local
// rank each: its communicator gathers every process's 8 bytes).
Result<uint64_t> agreed_pages(const std::function<Result<uint64_t>()>& size_pool,
                              comm::TpGroup& group, RankExecutor& local) {
  Result<uint64_t> mine = size_pool();
  if (!mine.ok()) return mine.status();
  if (group.local_ranks().size() == static_cast<size_t>(group.size())) return mine;
  std::vector<size_t> counts(group.size(), 8);
  std::vector<uint8_t> all(8 * counts.size());
  const uint64_t own = *mine;
  if (Status s = local.communicator().all_gather(&own, counts, all.data(), comm::ElementType::kU8,
                                                 nullptr);
      !s.ok()) {
    return s.WithContext("agreeing on the KV pool's pages");
  }
  uint64_t least = own;
  for (size_t r = 0; r < counts.size(); ++r) {
    uint64_t pages = 0;
    std::memcpy(&pages, all.data() + 8 * r, 8);
    least = std::min(least, pages);
  }
  return least;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const model::LoadedWeights& weights,
                                               const EngineOptions& options) {
  if (options.tp < 1 || options.tp > 8) {
    return Status::InvalidArgument("tp.size must be 1..8, found " + std::to_string(options.tp));
  }
  if (options.num_pages == 0) return Status::InvalidArgument("the KV pool has no pages");
  if (options.dcp_size < 1 || options.tp % options.dcp_size != 0) {
    return Status::InvalidArgument("tp.dcp_size " + std::to_string(options.dcp_size) +
                                   " does not divide tp.size " + std::to_string(options.tp));
  }
  if (options.group != nullptr && options.group->size() != options.tp) {
    return Status::InvalidArgument("the TP group has " + std::to_string(options.group->size()) +
                                   " ranks, tp.size is " + std::to_string(options.tp));
  }
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
  warn_if_blas_misdetected();
  std::unique_ptr<Engine> engine(new Engine(c, options));
  if (options.group == nullptr) {
    engine->own_group_ = std::make_unique<comm::ThreadGroup>(options.tp);
    engine->group_ = engine->own_group_.get();
  } else {
    engine->group_ = options.group;
  }
  comm::TpGroup& group = *engine->group_;
  const int cores = options.threads > 0 ? options.threads : default_threads();
  engine->threads_ = cores;
  const int threads_per_rank = group.threads_per_rank(cores);
  for (int r : group.local_ranks()) {
    std::unique_ptr<backend::Backend> backend;
    if (options.make_backend) {
      Result<std::unique_ptr<backend::Backend>> made = options.make_backend(r);
      if (!made.ok()) return made.status().WithContext("TP rank " + std::to_string(r));
      backend = std::move(*made);
    } else {
      backend = std::make_unique<backend::CpuBackend>(options.bf16_weights, threads_per_rank,
                                                      options.bf16_activations,
                                                      options.quantization);
    }
    Result<std::unique_ptr<RankExecutor>> rank =
        RankExecutor::load(**family, weights, std::move(backend), group.communicator(r));
    if (!rank.ok()) return rank.status().WithContext("TP rank " + std::to_string(r));
    engine->ranks_.push_back(std::move(*rank));
  }
  if (options.size_pool) {
    Result<uint64_t> pages = agreed_pages(options.size_pool, group, *engine->ranks_.front());
    if (!pages.ok()) return pages.status();
    engine->options_.num_pages = *pages;
  }
  for (const std::unique_ptr<RankExecutor>& rank : engine->ranks_) {
    kvrt_kv_geometry g = *geometry;
    g.tp_rank = static_cast<uint32_t>(rank->rank());
    g.device = rank->backend().device();
    if (Status s = rank->attach(options.plugins, g, engine->options_.num_pages, options.dcp_size);
        !s.ok()) {
      return s.WithContext("TP rank " + std::to_string(rank->rank()));
    }
  }
  engine->local_ = engine->ranks_.front().get();
  engine->leader_tier_ = std::make_unique<TierState>();
  engine->leads_ = engine->local_->rank() == 0;
  for (size_t i = 1; i < engine->ranks_.size(); ++i) {
    engine->followers_.emplace_back([e = engine.get(), i] {
      (void)e->follow_loop(e->ranks_[i].get());  // rank 0 sees a failure in its collectives
    });
  }
  return engine;
}

Status Engine::check(const Batch& batch) const {
  const int64_t total_slots = static_cast<int64_t>(options_.num_pages) * page_size();
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
    const int64_t needed = (kv_len + page_size() - 1) / page_size();
    if (s.start < 0 || static_cast<int64_t>(s.pages.size()) < needed) {
      return Status::InvalidArgument(where + std::to_string(kv_len) + " tokens need " +
                                     std::to_string(needed) + " pages, the page table has " +
                                     std::to_string(s.pages.size()));
    }
    for (int64_t p = 0; p < needed; ++p) {
      if (s.pages[p] < 0 || int64_t{s.pages[p]} * page_size() >= total_slots) {
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
  std::span<const uint8_t> payload;
  if (options_.tp > 1) {
    serialize(batch, &words_);
    payload = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(words_.data()),
                                       words_.size() * sizeof(int32_t));
  }
  Status s = lead(kStep, payload, 0,
                  [&](std::span<uint8_t>) { return local_->forward(batch, &logits); }, nullptr);
  if (!s.ok()) return s;
  return logits;
}

// One forward step and the sampling of its tokens, the step's sequences side by side on the
// engine's threads (over a 150k-token vocabulary a draw costs about as much as a small model's
// step).
Result<std::vector<int32_t>> Engine::step_and_sample(const Batch& batch,
                                                     std::span<const SequenceSampling> sampling) {
  if (sampling.size() != batch.sequences.size()) {
    return Status::Internal("execute: " + std::to_string(sampling.size()) + " samplers for " +
                            std::to_string(batch.sequences.size()) + " sequences");
  }
  Result<std::vector<float>> logits = step(batch);
  if (!logits.ok()) return logits.status();
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const size_t n = batch.sequences.size();
  std::vector<int32_t> next(n, 0);
  // Each sequence's first logits row, so the sampling below touches only its own state.
  std::vector<size_t> first_rows(n);
  size_t row = 0;
  for (size_t i = 0; i < n; ++i) {
    first_rows[i] = row;
    row += static_cast<size_t>(batch.sequences[i].logit_rows());
  }
  const int threads = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(threads_)));
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (threads > 1)
  for (size_t i = 0; i < n; ++i) {
    const SequenceStep& e = batch.sequences[i];
    const SequenceSampling& s = sampling[i];
    if (s.sampler == nullptr) continue;
    const auto rows = static_cast<size_t>(e.logit_rows());
    auto logits_of = [&](size_t r) {
      return std::span<float>(logits->data() + (first_rows[i] + r) * vocab, vocab);
    };
    if (e.all_logits) {
      // Row j predicts position start + j + 1.
      for (size_t j = 0; j < rows; ++j) {
        const int32_t target = e.start + static_cast<int32_t>(j) + 1;
        if (target >= s.prompt_len) break;
        s.sampler->add_prompt_logprob(target, logits_of(j), s.tokens[target]);
      }
    }
    if (s.samples) next[i] = s.sampler->sample_in_place(logits_of(rows - 1));
  }
  return next;
}

Status Engine::tier_command(uint64_t op, std::span<const uint64_t> hashes,
                            std::span<const int32_t> pages, uint32_t reason,
                            std::vector<uint8_t>* out) {
  if (!has_tier()) return Status::Internal(local_->store().name() + " has no tier");
  encode_pages(hashes, pages, reason, &command_);
  const size_t extra = reply_bytes(op, command_);
  return lead(op, command_, extra,
              [&](std::span<uint8_t> mine) {
                return execute(*local_, *leader_tier_, op, command_, mine);
              },
              out);
}

Result<uint64_t> Engine::tier_lookup(std::span<const uint64_t> hashes) {
  std::vector<uint8_t> counts;
  if (Status s = tier_command(kTierLookup, hashes, {}, 0, &counts); !s.ok()) return s;
  uint64_t hits = hashes.size();
  for (int r = 0; r < options_.tp; ++r) {
    uint64_t n = 0;
    std::memcpy(&n, counts.data() + r * 8, 8);
    hits = std::min(hits, n);
  }
  return hits;
}

Status Engine::tier_save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                         kvrt_tier_reason reason) {
  return tier_command(kTierSave, hashes, pages, static_cast<uint32_t>(reason), nullptr);
}

Status Engine::tier_load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                         std::vector<uint8_t>* loaded) {
  std::vector<uint8_t> all;
  Status s = tier_command(kTierLoad, hashes, pages, 0, &all);
  loaded->assign(hashes.size(), 0);
  if (!s.ok()) return s;
  for (size_t i = 0; i < hashes.size(); ++i) {
    uint8_t every = 1;
    for (int r = 0; r < options_.tp; ++r) every &= all[r * hashes.size() + i];
    (*loaded)[i] = every;
  }
  return Status::Ok();
}

Status Engine::tier_wait() { return tier_command(kTierWait, {}, {}, 0, nullptr); }

Result<kvrt_tier_info> Engine::tier_info() const {
  if (!has_tier()) return Status::Internal(local_->store().name() + " has no tier");
  return local_->store().tier()->info();
}

}  // namespace kvrt::exec
