// Capacity arithmetic (DESIGN.md, Capacity): how many tokens a KV store's pool holds on a
// device budget, and how many requests can decode at once at a given mean live length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/util/status.h"
#include "kvrt/kv_store.h"

namespace kvrt::capacity {

struct Budget {
  uint64_t device_memory = 0;         // free at start: the [device] memory budget on CPU
  uint64_t weights_per_rank = 0;      // bytes of weights each rank holds
  double mem_fraction_static = 0.88;  // SGLang's rule: the fraction covers weights + KV
  // Where weights_per_rank came from, for the report ("" prints nothing): e.g. "the safetensors
  // headers of DIR".
  std::string weights_source;
  // memory * (1 - mem_fraction_static): left for activations, workspaces and the allocator.
  uint64_t reserve() const {
    return static_cast<uint64_t>(static_cast<double>(device_memory) * (1 - mem_fraction_static));
  }
};

struct Plan {
  uint64_t kv_budget = 0;   // bytes left for the KV pool on each rank
  uint64_t page_bytes = 0;  // one page, all layers, this rank
  uint32_t page_size = 0;   // tokens per page on each rank
  // Decode context parallelism (tp.dcp_size): each page id holds page_size tokens on each of
  // dcp_size ranks, so the pool holds dcp_size times the tokens of one rank's pages.
  uint32_t dcp_size = 1;
  uint64_t num_pages = 0;
  uint64_t max_total_num_tokens = 0;  // num_pages * page_size * dcp_size
  uint64_t bytes_per_token() const { return page_size ? page_bytes / page_size : 0; }
  // Requests that fit at once when each holds mean_live_tokens of KV.
  uint64_t concurrent_decodes(uint64_t mean_live_tokens) const {
    return mean_live_tokens ? max_total_num_tokens / mean_live_tokens : 0;
  }
};

// The KV-relevant shape of a model. MHA/GQA: kv_heads of head_dim (K) and v_head_dim (V; 0
// when V shares K's storage); MLA (kv_lora_rank > 0): one latent of kv_lora_rank +
// qk_rope_head_dim per layer, whose V shares K's storage, and kv_heads / head_dim /
// v_head_dim are ignored.
struct KvShape {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t v_head_dim = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t qk_rope_head_dim = 0;
  bool mla() const { return kv_lora_rank > 0; }
};

// KV heads each TP rank holds: an even split, or 1 (replicated) when TP exceeds the heads.
// Other ratios (6 heads on 4 ranks) cannot be sharded and are refused, naming both numbers.
Result<uint32_t> kv_heads_per_rank(uint32_t total_kv_heads, uint32_t tp_size);

// The geometry one TP rank's store sees (rank 0; every rank's is the same size). MHA/GQA:
// kv_heads_per_rank() heads of head_dim / v_head_dim. MLA: a single "head" of
// kv_lora_rank + qk_rope_head_dim with v_head_dim 0, not divided by TP because the latent is
// replicated on every rank. The device is the CPU: the stores' byte counts do not depend on it.
// A zero dimension or an unshardable head count is refused with a message naming it.
Result<kvrt_kv_geometry> kv_geometry(const KvShape& shape, uint32_t tp_size, uint32_t page_size,
                                     kvrt_dtype input_dtype = KVRT_DTYPE_BF16);

// How many TP ranks hold the same KV under plain tensor parallelism: every rank holds the MLA
// latent (tp_size); a GQA head is replicated over tp_size / kv_heads ranks when TP exceeds the
// heads; otherwise each rank holds heads of its own (1).
uint32_t kv_copies(const KvShape& shape, uint32_t tp_size);
// tp.dcp_size against the model's shape: it must divide the copies, and be 1 where there are
// none to remove. The message names tp.dcp_size and says which copies there are.
Status check_dcp(const KvShape& shape, uint32_t tp_size, uint32_t dcp_size);
// What tp.dcp_size removes, for the reports: e.g. "the MLA latent: 8 copies (one on every rank)
// -> 1 per group of 8 ranks". Empty for dcp_size 1.
std::string dcp_removes(const KvShape& shape, uint32_t tp_size, uint32_t dcp_size);
// The dcp sizes above 1 that remove copies at this TP size: the divisors of kv_copies.
std::vector<uint32_t> dcp_sizes(const KvShape& shape, uint32_t tp_size);

// kv_budget = (memory - weights) - memory * (1 - mem_fraction_static);
// max_total_num_tokens = floor(kv_budget / page_bytes) * page_size * dcp_size. A budget that
// leaves no room for one page is refused with every term and the shortfall in bytes.
Result<Plan> plan(const Budget& budget, uint64_t page_bytes, uint32_t page_size,
                  uint32_t dcp_size = 1);

// One KV store's capacity on a budget: what compare_stores() and the start-up report print.
struct StoreCapacity {
  std::string store;        // the plugin's name
  uint64_t page_bytes = 0;  // 0 when the store refused the geometry
  Plan plan;                // valid when error.ok()
  // The store keeps pages in host memory too (a tier); its size in tokens. A tier keeps
  // evicted prefixes for reuse and never raises the number of concurrent decodes.
  bool host_tier = false;
  bool host_tier_sized = false;  // the tier said its size (tier_pages); unknown otherwise
  uint64_t host_tier_tokens = 0;
  Status error;  // why there is no plan: page_bytes refused, or the budget does not fit
  std::string dcp_removes;  // what tp.dcp_size removes (dcp_removes()), for the report
};

// The mean live lengths the report and the comparison table print concurrent decodes for.
inline constexpr uint64_t kReportLengths[] = {1024, 4096, 16384};

// The start-up capacity report: a title line, then one line per term -- device memory,
// weights per rank, reserve, KV budget, bytes per token, page size, page bytes, num pages,
// max_total_num_tokens, host tier tokens ("none" without a tier) and concurrent decodes at
// kReportLengths -- each with its exact bytes and the rule that derives it, e.g.
//   capacity of kv_bf16_paged (per TP rank):
//     device memory          24.0 GiB (25769803776 bytes)
//     reserve                2.9 GiB (3092376453 bytes) = device memory * (1 - mem_fraction_...
//     num pages              3155 = floor(KV budget / page bytes)
// `capacity` must hold a plan (error.ok()).
std::string format_report(const StoreCapacity& capacity, const Budget& budget);

// "24.0 GiB", "512.0 MiB", "980 B".
std::string format_bytes(uint64_t bytes);
// "24.0 GiB (25769803776 bytes)".
std::string bytes_and_exact(uint64_t bytes);

}  // namespace kvrt::capacity
