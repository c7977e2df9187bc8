// A communicator is one rank's handle on its tensor-parallel group, in the shape of NCCL's and
// MPI's: created once per rank, collectives over typed buffers with a count and a stream. The
// forward pass only sees this interface; threads in one process
// (core/comm/thread_communicator.h) are one implementation, MPI across processes and NCCL across
// GPUs are others.
//
// Every rank of the group must call the same collectives in the same order with the same counts
// (as with NCCL). A collective that fails returns the error on the ranks that see it; the group
// is then unusable (the caller tears it down).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/util/status.h"

namespace kvrt::comm {

enum class ElementType : uint8_t {
  kF32,   // float
  kBF16,  // uint16_t raw bfloat16 bits; sums are taken in f32 and rounded to nearest even
  kU8,    // bytes (broadcast and all_gather only)
};

size_t element_bytes(ElementType type);

// A backend's stream (cudaStream_t for CUDA); nullptr on the CPU, where every call completes
// before it returns.
using Stream = void*;

// What one rank's communicator has done since it was made: for the benchmarks' "time in
// communication" and "bytes sent per step".
struct CommStats {
  uint64_t collectives = 0;
  // Payload bytes this rank sent to other ranks (for threads: what the same exchange would
  // send between processes, reduce-scatter + all-gather for an all-reduce).
  uint64_t bytes_sent = 0;
  double seconds = 0;  // inside collectives, waiting for the other ranks included
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Which implementation this is: "threads", "mpi" (and "nccl").
  virtual const char* backend() const = 0;
  const CommStats& stats() const { return stats_; }

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0..count) becomes the element-wise sum over ranks, on every rank. The sum is taken in
  // rank order on every rank, so all ranks get bit-identical results. Not for kU8.
  virtual Status all_reduce_sum(void* data, size_t count, ElementType type, Stream stream) = 0;

  // Rank r contributes counts[r] elements from `in` (which may be null when counts[r] is 0);
  // every rank receives the concatenation in rank order in out[0 .. sum(counts)).
  virtual Status all_gather(const void* in, std::span<const size_t> counts, void* out,
                            ElementType type, Stream stream) = 0;

  // root's data[0..count) is copied into every other rank's data.
  virtual Status broadcast(void* data, size_t count, ElementType type, int root, Stream stream) = 0;

  // broadcast() for a rank that waits for root's next command: with no deadline, since a server
  // may sit idle for hours (a communicator that bounds its waits bounds every other one).
  virtual Status broadcast_idle(void* data, size_t count, ElementType type, int root) {
    return broadcast(data, count, type, root, nullptr);
  }

 protected:
  // One collective done: its bytes sent and the time since `start`.
  void count(uint64_t bytes_sent, std::chrono::steady_clock::time_point start);
  CommStats stats_;
};

// The bytes rank `rank` of `size` sends in each collective when ranks exchange directly (an
// all-reduce as reduce-scatter then all-gather, each rank owning split(count, size, r)).
uint64_t all_reduce_bytes_sent(size_t count, ElementType type, int size, int rank);
uint64_t all_gather_bytes_sent(std::span<const size_t> counts, ElementType type, int rank);
uint64_t broadcast_bytes_sent(size_t count, ElementType type, int size, int rank, int root);

}  // namespace kvrt::comm
