#include "core/comm/communicator.h"

#include "core/util/range.h"

namespace kvrt::comm {

size_t element_bytes(ElementType type) {
  switch (type) {
    case ElementType::kF32:
      return 4;
    case ElementType::kBF16:
      return 2;
    case ElementType::kU8:
      return 1;
  }
  return 1;
}

void Communicator::count(uint64_t bytes_sent, std::chrono::steady_clock::time_point start) {
  ++stats_.collectives;
  stats_.bytes_sent += bytes_sent;
  stats_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t all_reduce_bytes_sent(size_t count, ElementType type, int size, int rank) {
  if (size <= 1) return 0;
  // Its input's other parts to their owners, then its own part's sum to every other rank.
  const int64_t mine = util::split(static_cast<int64_t>(count), size, rank).size();
  const uint64_t others = count - static_cast<uint64_t>(mine);
  return (others + static_cast<uint64_t>(mine) * (size - 1)) * element_bytes(type);
}

uint64_t all_gather_bytes_sent(std::span<const size_t> counts, ElementType type, int rank) {
  return static_cast<uint64_t>(counts[rank]) * (counts.size() - 1) * element_bytes(type);
}

uint64_t broadcast_bytes_sent(size_t count, ElementType type, int size, int rank, int root) {
  return rank == root ? static_cast<uint64_t>(count) * (size - 1) * element_bytes(type) : 0;
}

}  // namespace kvrt::comm
