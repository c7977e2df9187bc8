// What the scheduler needs from a KV store's tier (kv_host_tiered or a user's own): the prefix
// cache reports pages it inserts, hits and evicts, and at admission asks for pages the device no
// longer holds. Keyed by chained page hashes (page_hash.h). Implemented over every TP rank's
// store by serve::EngineTier (core/serve/engine_tier.h); absent (nullptr) when the store has no
// tier.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/status.h"
#include "kvrt/kv_store.h"

namespace kvrt::sched {

class KvTier {
 public:
  virtual ~KvTier() = default;
  // How many leading pages of `hashes` the tier holds (on every rank); a hint, see load().
  virtual uint64_t lookup(std::span<const uint64_t> hashes) = 0;
  // Reports device pages for `reason`; the store's policy decides what to copy. Asynchronous:
  // the pages must not be rewritten before wait() returns.
  virtual Status save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                      kvrt_tier_reason reason) = 0;
  // Copies the tier's pages into `pages` and waits for them. (*loaded)[i] is 1 for a page
  // loaded on every rank, 0 for one some rank no longer had (the caller recomputes it).
  virtual Status load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                      std::vector<uint8_t>* loaded) = 0;
  // Returns when every copy started so far is done.
  virtual Status wait() = 0;
};

}  // namespace kvrt::sched
