// A communicator is one rank's handle on its tensor-parallel group, in the shape of NCCL's and
// MPI's: created once per rank, collectives over typed buffers with a count and a stream. The
// forward pass only sees this interface; threads in one process (thread_communicator.h) are one
// implementation, MPI across processes and NCCL across GPUs are others.
//
// Every rank of the group must call the same collectives in the same order with the same counts
// (as with NCCL). A collective that fails returns the error on the ranks that see it; the group
// is then unusable (the caller tears it down).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/util/status.h"

namespace kvrt::exec {

enum class ElementType : uint8_t {
  kF32,   // float
  kBF16,  // uint16_t raw bfloat16 bits; sums are taken in f32 and rounded to nearest even
  kU8,    // bytes (broadcast and all_gather only)
};

size_t element_bytes(ElementType type);

// A backend's stream (cudaStream_t for CUDA); nullptr on the CPU, where every call completes
// before it returns.
using Stream = void*;

class Communicator {
 public:
  virtual ~Communicator() = default;

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
};

}  // namespace kvrt::exec
