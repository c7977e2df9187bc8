#include "core/comm/thread_communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "kernels/cpu/convert.h"

namespace kvrt::comm {

void SpinBarrier::arrive_and_wait() {
  const uint32_t generation = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    // The last to arrive opens the next phase; nobody can arrive again before they see the
    // new generation, which this store publishes after the reset.
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    return;
  }
  if (spin_) {
    // A few thousand pauses: long enough to cover a rank that arrives a little late within a
    // layer, short enough that a rank left waiting for a whole step goes to sleep.
    for (int i = 0; i < 4096; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  while (generation_.load(std::memory_order_acquire) == generation) {
    generation_.wait(generation, std::memory_order_acquire);
  }
}

ThreadGroup::ThreadGroup(int size)
    : size_(size),
      barrier_(size, static_cast<unsigned>(size) <= std::thread::hardware_concurrency()),
      slots_(size, nullptr) {}

std::vector<int> ThreadGroup::local_ranks() const {
  std::vector<int> ranks(size_);
  for (int r = 0; r < size_; ++r) ranks[r] = r;
  return ranks;
}

int ThreadGroup::threads_per_rank(int cores) const { return std::max(1, cores / size_); }

std::unique_ptr<Communicator> ThreadGroup::communicator(int rank) {
  return std::make_unique<ThreadCommunicator>(this, rank);
}

Status ThreadCommunicator::all_reduce_sum(void* data, size_t n, ElementType type, Stream) {
  const int size = group_->size_;
  if (size == 1) return Status::Ok();
  if (type == ElementType::kU8) {
    return Status::InvalidArgument("all_reduce_sum: bytes cannot be summed");
  }
  const auto start = std::chrono::steady_clock::now();
  // Each rank publishes a private f32 copy of its input, then sums all copies in rank order.
  if (type == ElementType::kF32) {
    mine_.assign(static_cast<const float*>(data), static_cast<const float*>(data) + n);
  } else {
    mine_.resize(n);
    kernels::bf16_to_f32(static_cast<const uint16_t*>(data), mine_.data(), n);
  }
  std::vector<const void*>& slots = group_->slots_;
  slots[rank_] = mine_.data();
  group_->barrier_.arrive_and_wait();  // every input published
  if (type == ElementType::kBF16) sums_.resize(n);
  float* out = type == ElementType::kF32 ? static_cast<float*>(data) : sums_.data();
  for (size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < size; ++r) sum += static_cast<const float*>(slots[r])[i];
    out[i] = sum;
  }
  group_->barrier_.arrive_and_wait();  // nobody still reads `mine_`
  if (type == ElementType::kBF16) kernels::f32_to_bf16(out, static_cast<uint16_t*>(data), n);
  count(all_reduce_bytes_sent(n, type, size, rank_), start);
  return Status::Ok();
}

Status ThreadCommunicator::all_gather(const void* in, std::span<const size_t> counts, void* out,
                                      ElementType type, Stream) {
  const int size = group_->size_;
  if (counts.size() != static_cast<size_t>(size)) {
    return Status::InvalidArgument("all_gather: " + std::to_string(counts.size()) + " counts for " +
                                   std::to_string(size) + " ranks");
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t bytes = element_bytes(type);
  std::vector<const void*>& slots = group_->slots_;
  slots[rank_] = in;
  group_->barrier_.arrive_and_wait();
  size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    // A rank may contribute nothing (its slice is empty, its pointer may be null).
    if (counts[r] > 0) {
      std::memcpy(static_cast<char*>(out) + offset * bytes, slots[r], counts[r] * bytes);
    }
    offset += counts[r];
  }
  group_->barrier_.arrive_and_wait();
  count(all_gather_bytes_sent(counts, type, rank_), start);
  return Status::Ok();
}

Status ThreadCommunicator::broadcast(void* data, size_t n, ElementType type, int root, Stream) {
  if (group_->size_ == 1) return Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  std::vector<const void*>& slots = group_->slots_;
  if (rank_ == root) slots[root] = data;
  group_->barrier_.arrive_and_wait();
  if (rank_ != root && n > 0) std::memcpy(data, slots[root], n * element_bytes(type));
  group_->barrier_.arrive_and_wait();
  this->count(broadcast_bytes_sent(n, type, group_->size_, rank_, root), start);
  return Status::Ok();
}

}  // namespace kvrt::comm
