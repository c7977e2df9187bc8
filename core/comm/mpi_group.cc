#include "core/comm/mpi_group.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/util/range.h"
#include "kernels/cpu/convert.h"

namespace kvrt::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The process's MPI state: whether it was initialised, why the group broke.
std::mutex g_mutex;
std::unique_ptr<MpiGroup> g_world;
std::atomic<bool> g_abandoned{false};
std::atomic<bool> g_broken{false};
std::string g_abandon_reason;  // under g_mutex
std::string g_broken_reason;   // the first failure, under g_mutex

std::string abandon_reason() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_abandon_reason;
}

// Message tags: one per phase, so the phases of one collective never match each other's
// messages (between two ranks, messages of one tag arrive in the order they were sent).
constexpr int kTagReduceScatter = 11, kTagAllGatherSums = 12, kTagAllGather = 13,
              kTagBroadcast = 14;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, double timeout_s, int ranks_on_host)
      : comm_(comm),
        rank_(rank),
        size_(size),
        timeout_s_(timeout_s),
        // Waiting ranks spin only when every rank on this host has a core of its own.
        spin_(static_cast<unsigned>(ranks_on_host) <= std::thread::hardware_concurrency()) {}
  ~MpiCommunicator() override {
    // A broken group's requests may still be pending: the process is about to abort. After
    // MPI_Finalize (a communicator a static still held) there is nothing left to free.
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!g_broken.load() && !finalised) MPI_Comm_free(&comm_);
  }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status all_reduce_sum(void* data, size_t n, ElementType type, Stream) override {
    if (size_ == 1) return Status::Ok();
    if (type == ElementType::kU8) {
      return Status::InvalidArgument("all_reduce_sum: bytes cannot be summed");
    }
    if (Status s = usable(); !s.ok()) return s;
    const auto start = Clock::now();
    const size_t bytes = element_bytes(type);
    char* base = static_cast<char*>(data);
    auto part = [&](int r) { return util::split(static_cast<int64_t>(n), size_, r); };
    const util::Range mine = part(rank_);
    // Reduce-scatter: every rank's copy of my part arrives here, and my copies of the others'
    // parts go to their owners.
    staging_.resize(static_cast<size_t>(mine.size()) * bytes * size_);
    begin();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      if (Status s = post_recv(staging_.data() + q * mine.size() * bytes, mine.size() * bytes, q,
                               kTagReduceScatter);
          !s.ok()) {
        return s;
      }
      const util::Range theirs = part(q);
      if (Status s = post_send(base + theirs.begin * bytes, theirs.size() * bytes, q,
                               kTagReduceScatter);
          !s.ok()) {
        return s;
      }
    }
    if (Status s = wait("an all-reduce"); !s.ok()) return s;
    // My part's sum, over ranks in rank order and from 0 (the threads' arithmetic, bit for bit).
    const size_t m = static_cast<size_t>(mine.size());
    sums_.assign(m, 0.0f);
    for (int q = 0; q < size_; ++q) {
      const char* src = q == rank_ ? base + mine.begin * bytes : staging_.data() + q * m * bytes;
      if (type == ElementType::kF32) {
        const float* x = reinterpret_cast<const float*>(src);
        for (size_t i = 0; i < m; ++i) sums_[i] += x[i];
      } else {
        converted_.resize(m);
        kernels::bf16_to_f32(reinterpret_cast<const uint16_t*>(src), converted_.data(), m);
        for (size_t i = 0; i < m; ++i) sums_[i] += converted_[i];
      }
    }
    if (m == 0) {
      // A buffer shorter than the group: this rank owns no part of it.
    } else if (type == ElementType::kF32) {
      std::memcpy(base + mine.begin * bytes, sums_.data(), m * bytes);
    } else {
      kernels::f32_to_bf16(sums_.data(), reinterpret_cast<uint16_t*>(base + mine.begin * bytes),
                           m);
    }
    // All-gather of the sums.
    begin();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const util::Range theirs = part(q);
      if (Status s = post_recv(base + theirs.begin * bytes, theirs.size() * bytes, q,
                               kTagAllGatherSums);
          !s.ok()) {
        return s;
      }
      if (Status s = post_send(base + mine.begin * bytes, m * bytes, q, kTagAllGatherSums);
          !s.ok()) {
        return s;
      }
    }
    if (Status s = wait("an all-reduce"); !s.ok()) return s;
    count(all_reduce_bytes_sent(n, type, size_, rank_), start);
    return Status::Ok();
  }

  Status all_gather(const void* in, std::span<const size_t> counts, void* out, ElementType type,
                    Stream) override {
    if (counts.size() != static_cast<size_t>(size_)) {
      return Status::InvalidArgument("all_gather: " + std::to_string(counts.size()) +
                                     " counts for " + std::to_string(size_) + " ranks");
    }
    if (Status s = usable(); !s.ok()) return s;
    const auto start = Clock::now();
    const size_t bytes = element_bytes(type);
    char* dst = static_cast<char*>(out);
    size_t offset = 0, my_offset = 0;
    begin();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        my_offset = offset;
      } else if (counts[q] > 0) {
        if (Status s = post_recv(dst + offset * bytes, counts[q] * bytes, q, kTagAllGather);
            !s.ok()) {
          return s;
        }
      }
      offset += counts[q];
    }
    if (counts[rank_] > 0) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        if (Status s = post_send(in, counts[rank_] * bytes, q, kTagAllGather); !s.ok()) return s;
      }
      std::memmove(dst + my_offset * bytes, in, counts[rank_] * bytes);
    }
    if (Status s = wait("an all-gather"); !s.ok()) return s;
    count(all_gather_bytes_sent(counts, type, rank_), start);
    return Status::Ok();
  }

  Status broadcast(void* data, size_t n, ElementType type, int root, Stream) override {
    return broadcast_within(data, n, type, root, true);
  }

  Status broadcast_idle(void* data, size_t n, ElementType type, int root) override {
    return broadcast_within(data, n, type, root, false);
  }

 private:
  Status usable() const {
    if (g_abandoned.load()) return Status::Internal(abandon_reason());
    if (g_broken.load()) {
      std::lock_guard<std::mutex> lock(g_mutex);
      return Status::Internal(g_broken_reason);
    }
    return Status::Ok();
  }

  Status broadcast_within(void* data, size_t n, ElementType type, int root, bool bounded) {
    if (size_ == 1) return Status::Ok();
    if (Status s = usable(); !s.ok()) return s;
    const auto start = Clock::now();
    const size_t bytes = n * element_bytes(type);
    begin();
    if (rank_ == root) {
      for (int q = 0; q < size_; ++q) {
        if (q == root) continue;
        if (Status s = post_send(data, bytes, q, kTagBroadcast); !s.ok()) return s;
      }
    } else if (Status s = post_recv(data, bytes, root, kTagBroadcast); !s.ok()) {
      return s;
    }
    if (Status s = wait("a broadcast", bounded); !s.ok()) return s;
    count(broadcast_bytes_sent(n, type, size_, rank_, root), start);
    return Status::Ok();
  }

  void begin() {
    requests_.clear();
    peers_.clear();
  }

  Status check_size(size_t bytes) {
    if (bytes > static_cast<size_t>(INT_MAX)) {
      return fail(Status::OutOfRange("a message of " + std::to_string(bytes) +
                                     " bytes is over MPI's limit of 2^31 - 1"));
    }
    return Status::Ok();
  }

  Status post_send(const void* data, size_t bytes, int peer, int tag) {
    return post(true, const_cast<void*>(data), bytes, peer, tag);
  }
  Status post_recv(void* data, size_t bytes, int peer, int tag) {
    return post(false, data, bytes, peer, tag);
  }

  Status post(bool send, void* data, size_t bytes, int peer, int tag) {
    if (Status s = check_size(bytes); !s.ok()) return s;
    requests_.emplace_back();
    peers_.push_back(peer);
    const int n = static_cast<int>(bytes);
    const int rc = send ? MPI_Isend(data, n, MPI_BYTE, peer, tag, comm_, &requests_.back())
                        : MPI_Irecv(data, n, MPI_BYTE, peer, tag, comm_, &requests_.back());
    if (rc != MPI_SUCCESS) {
      return fail(Status::Internal(std::string(send ? "sending to" : "receiving from") +
                                   " TP rank " + std::to_string(peer) + ": " + mpi_error(rc)));
    }
    return Status::Ok();
  }

  // The group is broken from here on: pending receives are cancelled (their buffers are the
  // caller's), sends are left to the abort.
  Status fail(Status s) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_broken_reason.empty()) g_broken_reason = s.message();
    }
    g_broken.store(true);
    for (MPI_Request& r : requests_) {
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    }
    requests_.clear();
    return s;
  }

  // Every posted request done, or the group broken: past the deadline (when bounded), an MPI
  // error, or mpi_abandon.
  Status wait(const char* what, bool bounded = true) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_s_));
    int pending = static_cast<int>(requests_.size());
    done_.resize(requests_.size());
    statuses_.resize(requests_.size());
    for (uint32_t polls = 0; pending > 0; ++polls) {
      int finished = 0;
      const int rc = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &finished,
                                  done_.data(), statuses_.data());
      if (rc != MPI_SUCCESS) {
        return fail(Status::Internal(std::string(what) + " failed: " + mpi_error(rc)));
      }
      if (finished != MPI_UNDEFINED) pending -= finished;
      if (pending == 0) break;
      // Testsome sets completed requests to MPI_REQUEST_NULL: the others name the late ranks.
      if ((polls & 63) == 0) {
        if (g_abandoned.load()) return fail(Status::Internal(abandon_reason()));
        if (bounded && Clock::now() > deadline) return fail(late(what));
      }
      if (spin_ && polls < 20000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else if (polls < 40000) {
        sched_yield();
      } else {
        // Long waits (an idle server's next command, a slow rank) leave the core alone.
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return Status::Ok();
  }

  Status late(const char* what) const {
    std::vector<int> late;
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL &&
          std::find(late.begin(), late.end(), peers_[i]) == late.end()) {
        late.push_back(peers_[i]);
      }
    }
    std::string names;
    for (int r : late) names += (names.empty() ? "" : ", ") + std::to_string(r);
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", timeout_s_);
    return Status::Internal("TP rank " + std::to_string(rank_) + " waited " + seconds +
                            " s (tp.timeout_s) in " + what + " for TP rank" +
                            (late.size() > 1 ? "s " : " ") + names +
                            ", which did not answer: hung, stopped, or unreachable");
  }

  MPI_Comm comm_;
  const int rank_, size_;
  const double timeout_s_;
  const bool spin_;
  std::vector<MPI_Request> requests_;
  std::vector<int> peers_;  // the rank at the other end of each request
  std::vector<int> done_;
  std::vector<MPI_Status> statuses_;
  std::vector<char> staging_;
  std::vector<float> sums_, converted_;
};

}  // namespace

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 0;
}

Result<MpiGroup*> MpiGroup::world(double timeout_s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_world != nullptr) return g_world.get();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return Status::Internal("MPI_Init_thread failed: " + mpi_error(rc));
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status::Unsupported(
          "this MPI library cannot be called from more than one thread (MPI_THREAD_SERIALIZED); "
          "kvrt's server steps on a thread of its own");
    }
  }
  // Errors come back as codes (and become statuses) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::unique_ptr<MpiGroup> g(new MpiGroup());
  MPI_Comm_size(MPI_COMM_WORLD, &g->size_);
  MPI_Comm_rank(MPI_COMM_WORLD, &g->rank_);
  MPI_Comm host_comm;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g->rank_, MPI_INFO_NULL, &host_comm);
  MPI_Comm_size(host_comm, &g->local_size_);
  MPI_Comm_free(&host_comm);
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  MPI_Get_processor_name(name, &length);
  g->host_.assign(name, static_cast<size_t>(length));
  g->timeout_s_ = timeout_s;
  MPI_Comm startup, first;
  MPI_Comm_dup(MPI_COMM_WORLD, &startup);
  MPI_Comm_dup(MPI_COMM_WORLD, &first);
  g->startup_ = g->make(&startup, 10 * timeout_s);
  g->first_ = g->make(&first, timeout_s);
  g_world = std::move(g);
  return g_world.get();
}

std::unique_ptr<Communicator> MpiGroup::make(void* comm, double timeout_s) const {
  MPI_Comm c = *static_cast<MPI_Comm*>(comm);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(c, rank_, size_, timeout_s, local_size_);
}

std::unique_ptr<Communicator> MpiGroup::communicator(int rank) {
  (void)rank;  // a process has one rank: its own
  if (first_ != nullptr) return std::move(first_);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return make(&comm, timeout_s_);
}

std::unique_ptr<Communicator> MpiGroup::startup_communicator() {
  if (startup_ != nullptr) return std::move(startup_);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return make(&comm, 10 * timeout_s_);
}

int MpiGroup::threads_per_rank(int cores) const { return std::max(1, cores / local_size_); }

void mpi_abandon(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_abandoned.load()) return;
    g_abandon_reason = reason;
  }
  g_abandoned.store(true);
}

bool mpi_group_broken() { return g_broken.load() || g_abandoned.load(); }

int mpi_finish(int exit_code) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised) return exit_code;
  if (mpi_group_broken()) {
    // MPI_Finalize would wait for ranks that are gone or hung; the launcher ends them all.
    MPI_Abort(MPI_COMM_WORLD, exit_code != 0 ? exit_code : 1);
  }
  g_world.reset();  // its unused communicators go before MPI does
  MPI_Finalize();
  return exit_code;
}

}  // namespace kvrt::comm
