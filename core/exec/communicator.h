// The in-process communicator for tensor parallelism on CPU: TP ranks are threads, collectives
// go through shared buffers and a barrier. Each collective must be called by every rank, in
// the same order, with the same sizes (as with NCCL).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvrt::exec {

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

class Communicator {
 public:
  explicit Communicator(int size);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int size() const { return size_; }

  // data[0..n) becomes the element-wise sum over ranks, on every rank. The sum is taken in
  // rank order on every rank, so all ranks get bit-identical results.
  void all_reduce_sum(int rank, float* data, size_t n);

  // Rank r contributes counts[r] floats; every rank receives the concatenation in rank order
  // into out[0 .. sum(counts)).
  void all_gather(int rank, const float* in, const std::vector<size_t>& counts, float* out);

  // root's data[0..bytes) is copied to every other rank's data.
  void broadcast(int rank, int root, void* data, size_t bytes);

 private:
  int size_;
  SpinBarrier barrier_;
  std::vector<const void*> slots_;  // each rank's buffer for the collective in progress
};

}  // namespace kvrt::exec
