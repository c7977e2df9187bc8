// Capacity arithmetic (DESIGN.md, Capacity): how many tokens a KV store's pool holds on a
// device budget, and how many requests can decode at once at a given mean live length.
#pragma once

#include <cstdint>
#include <string>

#include "core/util/status.h"

namespace kvrt::capacity {

struct Budget {
  uint64_t device_memory = 0;         // free at start: the [device] memory budget on CPU
  uint64_t weights_per_rank = 0;      // bytes of weights each rank holds
  double mem_fraction_static = 0.88;  // SGLang's rule: the fraction covers weights + KV
};

struct Plan {
  uint64_t kv_budget = 0;   // bytes left for the KV pool on each rank
  uint64_t page_bytes = 0;  // one page, all layers, this rank
  uint32_t page_size = 0;
  uint64_t num_pages = 0;
  uint64_t max_total_num_tokens = 0;
  uint64_t bytes_per_token() const { return page_size ? page_bytes / page_size : 0; }
  // Requests that fit at once when each holds mean_live_tokens of KV.
  uint64_t concurrent_decodes(uint64_t mean_live_tokens) const {
    return mean_live_tokens ? max_total_num_tokens / mean_live_tokens : 0;
  }
};

// KV heads each TP rank holds: an even split, or 1 (replicated) when TP exceeds the heads.
// Other ratios (6 heads on 4 ranks) cannot be sharded and are refused, naming both numbers.
Result<uint32_t> kv_heads_per_rank(uint32_t total_kv_heads, uint32_t tp_size);

// kv_budget = (memory - weights) - memory * (1 - mem_fraction_static);
// max_total_num_tokens = floor(kv_budget / page_bytes) * page_size. A budget that leaves no
// room is refused with the shortfall in bytes.
Result<Plan> plan(const Budget& budget, uint64_t page_bytes, uint32_t page_size);

// "24.0 GiB", "512.0 MiB", "980 B".
std::string format_bytes(uint64_t bytes);

}  // namespace kvrt::capacity
