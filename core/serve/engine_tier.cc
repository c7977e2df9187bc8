#include "core/serve/engine_tier.h"

#include <spdlog/spdlog.h>


namespace kvrt::serve {

std::unique_ptr<EngineTier> EngineTier::create(exec::Engine* engine) {
  if (!engine->has_tier()) return nullptr;
  return std::unique_ptr<EngineTier>(new EngineTier(engine));
}

uint64_t EngineTier::lookup(std::span<const uint64_t> hashes) {
  Result<uint64_t> hits = engine_->tier_lookup(hashes);
  if (!hits.ok()) {
    // A lookup is a hint: without it the pages are recomputed.
    spdlog::warn("{}; the prefix is recomputed", hits.status().message());
    return 0;
  }
  return *hits;
}

Status EngineTier::save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        kvrt_tier_reason reason) {
  return engine_->tier_save(hashes, pages, reason);
}

Status EngineTier::load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
                        std::vector<uint8_t>* loaded) {
  return engine_->tier_load(hashes, pages, loaded);
}

Status EngineTier::wait() { return engine_->tier_wait(); }

}  // namespace kvrt::serve
