#include "core/capacity/capacity.h"

#include <cstdio>

namespace kvrt::capacity {

std::string bytes_and_exact(uint64_t bytes) {
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

namespace {

std::string fraction(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace

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

Result<kvrt_kv_geometry> kv_geometry(const KvShape& shape, uint32_t tp_size, uint32_t page_size,
                                     kvrt_dtype input_dtype) {
  auto zero = [](const char* field) {
    return Status::InvalidArgument(std::string("model shape: ") + field + " must be positive");
  };
  if (shape.layers == 0) return zero("layers");
  if (page_size == 0) return zero("page_size");
  if (tp_size == 0) return zero("TP size");
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = shape.layers;
  g.page_size = page_size;
  g.input_dtype = input_dtype;
  g.tp_size = tp_size;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  if (shape.mla()) {
    // Every rank attends with all its query heads over the same latent, so each keeps it whole.
    if (shape.qk_rope_head_dim == 0) return zero("qk_rope_head_dim (MLA)");
    g.num_kv_heads = g.total_kv_heads = 1;
    g.k_head_dim = shape.kv_lora_rank + shape.qk_rope_head_dim;
    g.v_head_dim = 0;
    g.v_width = shape.kv_lora_rank;  // V is the latent, the row's first kv_lora_rank values
    g.v_offset = 0;
    return g;
  }
  if (shape.head_dim == 0) return zero("head_dim");
  Result<uint32_t> heads = kv_heads_per_rank(shape.kv_heads, tp_size);
  if (!heads.ok()) return heads.status();
  g.num_kv_heads = *heads;
  g.total_kv_heads = shape.kv_heads;
  g.k_head_dim = shape.head_dim;
  g.v_head_dim = shape.v_head_dim;
  g.v_width = shape.v_head_dim != 0 ? shape.v_head_dim : shape.head_dim;
  g.v_offset = 0;
  return g;
}

uint32_t kv_copies(const KvShape& shape, uint32_t tp_size) {
  if (shape.mla()) return tp_size;
  if (shape.kv_heads > 0 && tp_size > shape.kv_heads && tp_size % shape.kv_heads == 0) {
    return tp_size / shape.kv_heads;
  }
  return 1;
}

namespace {

std::string copies_text(const KvShape& shape, uint32_t tp_size) {
  const uint32_t copies = kv_copies(shape, tp_size);
  if (shape.mla()) {
    return "the MLA latent: " + std::to_string(copies) + " copies (one on every rank)";
  }
  return "each KV head: " + std::to_string(copies) + " copies (" + std::to_string(tp_size) +
         " ranks over " + std::to_string(shape.kv_heads) + " KV heads)";
}

}  // namespace

Status check_dcp(const KvShape& shape, uint32_t tp_size, uint32_t dcp_size) {
  if (dcp_size <= 1) return Status::Ok();
  const uint32_t copies = kv_copies(shape, tp_size);
  if (copies == 1) {
    return Status::ConfigError(
        "tp.dcp_size " + std::to_string(dcp_size) + ": at tp.size " + std::to_string(tp_size) +
        " each rank holds KV heads of its own (" + std::to_string(shape.kv_heads) +
        " KV heads), so there is no copy to remove; decode context parallelism helps MLA "
        "models and GQA models with fewer KV heads than TP ranks");
  }
  if (copies % dcp_size != 0) {
    return Status::ConfigError("tp.dcp_size " + std::to_string(dcp_size) +
                               " must divide the ranks that hold the same KV: " +
                               copies_text(shape, tp_size));
  }
  return Status::Ok();
}

std::string dcp_removes(const KvShape& shape, uint32_t tp_size, uint32_t dcp_size) {
  if (dcp_size <= 1) return "";
  return copies_text(shape, tp_size) + " -> " +
         std::to_string(kv_copies(shape, tp_size) / dcp_size) + ", each token on 1 rank of a "
         "group of " + std::to_string(dcp_size);
}

std::vector<uint32_t> dcp_sizes(const KvShape& shape, uint32_t tp_size) {
  std::vector<uint32_t> sizes;
  const uint32_t copies = kv_copies(shape, tp_size);
  for (uint32_t n = 2; n <= copies; ++n) {
    if (copies % n == 0) sizes.push_back(n);
  }
  return sizes;
}

Result<Plan> plan(const Budget& budget, uint64_t page_bytes, uint32_t page_size,
                  uint32_t dcp_size) {
  if (page_bytes == 0 || page_size == 0 || dcp_size == 0) {
    return Status::InvalidArgument("page_bytes, page_size and dcp_size must be positive");
  }
  if (!(budget.mem_fraction_static > 0 && budget.mem_fraction_static < 1)) {
    return Status::InvalidArgument("mem_fraction_static must lie in (0, 1)");
  }
  // In integers, so the report's terms add up to the byte.
  const uint64_t reserve = budget.reserve();
  const uint64_t used = budget.weights_per_rank + reserve;
  if (budget.device_memory < used || budget.device_memory - used < page_bytes) {
    const uint64_t shortfall = used + page_bytes - budget.device_memory;
    return Status::NoMemory(
        "the configuration does not fit: device memory " + bytes_and_exact(budget.device_memory) +
        " - weights per rank " + bytes_and_exact(budget.weights_per_rank) + " - reserve " +
        bytes_and_exact(reserve) + " (memory * (1 - mem_fraction_static " +
        fraction(budget.mem_fraction_static) + ")) leaves no room for one KV page of " +
        bytes_and_exact(page_bytes) + "; short by " + std::to_string(shortfall) +
        " bytes (add memory or TP ranks, or raise mem_fraction_static)");
  }
  Plan p;
  p.kv_budget = budget.device_memory - used;
  p.page_bytes = page_bytes;
  p.page_size = page_size;
  p.dcp_size = dcp_size;
  p.num_pages = p.kv_budget / page_bytes;
  p.max_total_num_tokens = p.num_pages * page_size * dcp_size;
  return p;
}

std::string format_report(const StoreCapacity& capacity, const Budget& budget) {
  const Plan& p = capacity.plan;
  std::string out;
  auto line = [&out](const char* term, const std::string& value) {
    char head[40];
    std::snprintf(head, sizeof(head), "  %-22s ", term);
    out += head + value + "\n";
  };
  out += "capacity of " + capacity.store + " (per TP rank):\n";
  line("device memory", bytes_and_exact(budget.device_memory));
  line("weights per rank", bytes_and_exact(budget.weights_per_rank) +
                               (budget.weights_source.empty() ? "" : ", " + budget.weights_source));
  line("reserve", bytes_and_exact(budget.reserve()) + " = device memory * (1 - " +
                      "mem_fraction_static " + fraction(budget.mem_fraction_static) + ")");
  line("KV budget", bytes_and_exact(p.kv_budget) + " = device memory - weights - reserve");
  line("bytes per token", std::to_string(p.bytes_per_token()));
  line("page size", std::to_string(p.page_size) + " tokens");
  line("page bytes", bytes_and_exact(p.page_bytes));
  line("num pages", std::to_string(p.num_pages) + " = floor(KV budget / page bytes)");
  if (p.dcp_size > 1) {
    line("tp.dcp_size", std::to_string(p.dcp_size) + ": " + capacity.dcp_removes);
    line("max_total_num_tokens", std::to_string(p.max_total_num_tokens) +
                                     " = num pages * page size * tp.dcp_size");
  } else {
    line("max_total_num_tokens",
         std::to_string(p.max_total_num_tokens) + " = num pages * page size");
  }
  line("host tier tokens",
       !capacity.host_tier ? std::string("none")
       : !capacity.host_tier_sized
           ? std::string("unknown (the store's tier does not say: no tier_pages, ABI 1.0)")
           : std::to_string(capacity.host_tier_tokens) +
                 " (evicted prefixes kept for reuse; no extra concurrent decodes)");
  std::string decodes;
  for (uint64_t n : kReportLengths) {
    decodes += (decodes.empty() ? "@" : ", @") + std::to_string(n / 1024) + "K " +
               std::to_string(p.concurrent_decodes(n));
  }
  line("concurrent decodes", decodes + " (max_total_num_tokens / mean live length)");
  return out;
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
