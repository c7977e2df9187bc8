#include "core/exec/communicator.h"

#include <cstring>
#include <numeric>

namespace kvrt::exec {

Communicator::Communicator(int size) : size_(size), barrier_(size), slots_(size, nullptr) {}

void Communicator::all_reduce_sum(int rank, float* data, size_t n) {
  if (size_ == 1) return;
  // Each rank publishes a private copy of its input, then sums all copies in rank order.
  std::vector<float> mine(data, data + n);
  slots_[rank] = mine.data();
  barrier_.arrive_and_wait();  // every input published
  for (size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < size_; ++r) sum += static_cast<const float*>(slots_[r])[i];
    data[i] = sum;
  }
  barrier_.arrive_and_wait();  // nobody still reads `mine`
}

void Communicator::all_gather(int rank, const float* in, const std::vector<size_t>& counts,
                              float* out) {
  slots_[rank] = in;
  barrier_.arrive_and_wait();
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    // A rank may contribute nothing (its slice is empty, its pointer may be null).
    if (counts[r] > 0) std::memcpy(out + offset, slots_[r], counts[r] * sizeof(float));
    offset += counts[r];
  }
  barrier_.arrive_and_wait();
}

void Communicator::broadcast(int rank, int root, void* data, size_t bytes) {
  if (size_ == 1) return;
  if (rank == root) slots_[root] = data;
  barrier_.arrive_and_wait();
  if (rank != root && bytes > 0) std::memcpy(data, slots_[root], bytes);
  barrier_.arrive_and_wait();
}

}  // namespace kvrt::exec
