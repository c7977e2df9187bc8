// Chained page hashes: the key under which a full page of tokens is cached and tiered. A page's
// hash is XXH3-64 of its parent page's hash and its token ids; the chain starts from a root
// seeded with the model's identity and the KV store's format, so equal prefixes of the same
// model in the same format hash equally in every process (and in a tier shared by several
// servers), and different models or formats never collide by construction. Each TP rank's tier
// sees the hashes mixed with its rank (rank_hash), since each holds only its own heads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvrt::sched {

// The root of every chain for one model and KV format, e.g. from the model's path or preset and
// dtype, and the store's name, dtypes, scale mode and page bytes.
uint64_t root_hash(std::string_view identity);

// The key rank `rank`'s tier stores a page under.
uint64_t rank_hash(uint64_t page_hash, uint32_t rank);

// XXH3-64 of the page's token ids (little-endian int32) seeded with the parent's hash.
uint64_t page_hash(uint64_t parent, std::span<const int32_t> tokens);

// The hashes of every full page of `tokens` (a trailing partial page has none).
std::vector<uint64_t> page_hashes(uint64_t root, std::span<const int32_t> tokens,
                                  uint32_t page_size);

}  // namespace kvrt::sched
