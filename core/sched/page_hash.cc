#include "core/sched/page_hash.h"

#include <xxhash.h>

namespace kvrt::sched {

uint64_t root_hash(std::string_view identity) {
  return XXH3_64bits(identity.data(), identity.size());
}

uint64_t rank_hash(uint64_t page_hash, uint32_t rank) {
  return XXH3_64bits_withSeed(&page_hash, sizeof(page_hash), uint64_t{rank} + 1);
}

uint64_t page_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // The parent's hash is the seed: allocation-free chaining. Token bytes are little-endian on
  // every platform kvrt builds for (x86-64, aarch64).
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

std::vector<uint64_t> page_hashes(uint64_t root, std::span<const int32_t> tokens,
                                  uint32_t page_size) {
  std::vector<uint64_t> hashes;
  uint64_t parent = root;
  for (size_t start = 0; page_size > 0 && start + page_size <= tokens.size(); start += page_size) {
    parent = page_hash(parent, tokens.subspan(start, page_size));
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace kvrt::sched
