#include "core/capacity/capacity.h"

#include <cstdio>

namespace kvrt::capacity {

Result<uint32_t> kv_heads_per_rank(uint32_t total_kv_heads, uint32_t tp_size) {
  if (total_kv_heads == 0 || tp_size == 0) {
    return Status::InvalidArgument("KV heads and TP size must be positive");
  }
  if (total_kv_heads % tp_size == 0) return total_kv_heads / tp_size;
  if (tp_size % total_kv_heads == 0) return 1u;
  return Status::InvalidArgument(std::to_string(total_kv_heads) +
                                 " KV heads cannot be split over " + std::to_string(tp_size) +
                                 " TP ranks (need one to divide the other)");
}

Result<Plan> plan(const Budget& budget, uint64_t page_bytes, uint32_t page_size) {
  if (page_bytes == 0 || page_size == 0) {
    return Status::InvalidArgument("page_bytes and page_size must be positive");
  }
  if (!(budget.mem_fraction_static > 0 && budget.mem_fraction_static < 1)) {
    return Status::InvalidArgument("mem_fraction_static must lie in (0, 1)");
  }
  const double reserve =
      static_cast<double>(budget.device_memory) * (1 - budget.mem_fraction_static);
  const double free_after_weights =
      static_cast<double>(budget.device_memory) - static_cast<double>(budget.weights_per_rank);
  const double kv = free_after_weights - reserve;
  if (kv < static_cast<double>(page_bytes)) {
    const double shortfall = static_cast<double>(page_bytes) - kv;
    return Status::NoMemory(
        "the configuration does not fit: device memory " + format_bytes(budget.device_memory) +
        ", weights " + format_bytes(budget.weights_per_rank) + ", reserve " +
        format_bytes(static_cast<uint64_t>(reserve)) + " leave no room for one KV page of " +
        format_bytes(page_bytes) + "; short by " +
        std::to_string(static_cast<uint64_t>(shortfall)) + " bytes");
  }
  Plan p;
  p.kv_budget = static_cast<uint64_t>(kv);
  p.page_bytes = page_bytes;
  p.page_size = page_size;
  p.num_pages = p.kv_budget / page_bytes;
  p.max_total_num_tokens = p.num_pages * page_size;
  return p;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace kvrt::capacity
