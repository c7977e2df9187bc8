// Tensor parallelism on the CPU with ranks as threads of one process: collectives go through
// buffers the ranks publish to each other and a barrier.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/tp_group.h"

namespace kvrt::comm {

// A reusable barrier for `size` threads that spins briefly before sleeping. Collectives run
// twice per layer; std::barrier put waiting ranks to sleep in the kernel at once, and waking
// them cost more than the collectives' arithmetic. Spinning is only worth it when every rank
// has a core of its own (spin = false otherwise: the waiters sleep at once and leave the cores
// to the ranks still working).
class SpinBarrier {
 public:
  SpinBarrier(int size, bool spin) : size_(size), spin_(spin) {}
  void arrive_and_wait();

 private:
  const int size_;
  const bool spin_;
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> generation_{0};
};

// What the ranks of one process share: the barrier and each rank's published buffer.
class ThreadGroup : public TpGroup {
 public:
  explicit ThreadGroup(int size);
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  int size() const override { return size_; }
  std::vector<int> local_ranks() const override;
  // Rank r's communicator; the group must outlive it. Each rank's is used by one thread.
  std::unique_ptr<Communicator> communicator(int rank) override;
  // The cores shared out over the ranks, one at least.
  int threads_per_rank(int cores) const override;

 private:
  friend class ThreadCommunicator;
  int size_;
  SpinBarrier barrier_;
  std::vector<const void*> slots_;  // each rank's buffer for the collective in progress
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  const char* backend() const override { return "threads"; }
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Status all_reduce_sum(void* data, size_t count, ElementType type, Stream stream) override;
  Status all_gather(const void* in, std::span<const size_t> counts, void* out, ElementType type,
                    Stream stream) override;
  Status broadcast(void* data, size_t count, ElementType type, int root, Stream stream) override;

 private:
  ThreadGroup* group_;
  int rank_;
  std::vector<float> mine_;  // this rank's copy of an all-reduce input
  std::vector<float> sums_;  // a bf16 all-reduce's sums before rounding
};

}  // namespace kvrt::comm
