#include "core/model/architecture.h"

#include <algorithm>
#include <set>

#include "core/model/deepseek_v3.h"
#include "core/model/llama.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"

namespace kvrt::model {

Result<const ArchitectureFamily*> find_architecture(const ModelConfig& config) {
  if (config.architecture == "DeepseekV3ForCausalLM") return &deepseek_v3_family();
  for (const char* llama :
       {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}) {
    if (config.architecture == llama) return &llama_family();
  }
  std::string names;
  for (const std::string& n : supported_architectures()) names += (names.empty() ? "" : ", ") + n;
  return Status::Unsupported("architecture '" + config.architecture +
                             "' has no implementation; there is: " + names);
}

uint64_t CheckpointBytes::most() const {
  return per_rank.empty() ? 0 : *std::max_element(per_rank.begin(), per_rank.end());
}

Result<CheckpointBytes> checkpoint_bytes_per_rank(const std::string& dir, const ModelConfig& config,
                                                  int tp, int dense_element_bytes,
                                                  bool keep_packed) {
  Result<const ArchitectureFamily*> family = find_architecture(config);
  if (!family.ok()) return family.status();
  if (Status s = (*family)->check_tp(config, tp); !s.ok()) return s;
  Result<SafetensorsCheckpoint> ck = SafetensorsCheckpoint::open(dir);
  if (!ck.ok()) return ck.status();
  // Rank r of `ranks`' bytes; the stored tensors counted go to *counted when given.
  auto count = [&](int r, int ranks, std::set<std::string>* counted) -> Result<uint64_t> {
    Result<std::vector<TensorBlock>> blocks = (*family)->tensors(config, r, ranks);
    if (!blocks.ok()) return blocks.status();
    return stored_bytes(*ck, config.weight_format, dir, *blocks, dense_element_bytes, keep_packed,
                        counted);
  };
  CheckpointBytes out;
  std::set<std::string> read;  // every stored tensor the model reads (each rank reads a part)
  Result<uint64_t> whole = count(0, 1, &read);
  if (!whole.ok()) return whole.status();
  out.whole = *whole;
  for (int rank = 0; rank < tp; ++rank) {
    Result<uint64_t> bytes = tp == 1 ? whole : count(rank, tp, nullptr);
    if (!bytes.ok()) return bytes.status();
    out.per_rank.push_back(*bytes);
  }
  uint64_t unread_bytes = 0;
  std::set<std::string> unread_roots;
  for (const std::string& name : ck->names()) {
    if (read.count(name) != 0) continue;
    out.not_loaded.push_back(name);
    Result<TensorView> t = ck->get(name);
    if (t.ok()) unread_bytes += t->bytes;
    unread_roots.insert(name.substr(0, name.find('.') + 1));
  }
  const std::string dense = dense_element_bytes > 0
                                ? std::to_string(dense_element_bytes) + " bytes an element"
                                : "as stored";
  std::string quantized = "as stored";
  if (dense_element_bytes > 0) {
    quantized = std::string(keep_packed ? "packed where the model keeps them as stored, else "
                                          "dequantized to "
                                        : "dequantized to ") +
                dense;
  }
  out.source =
      "counted from the safetensors headers of " + dir + " (the tensors each rank loads; " +
      (config.weight_format.quantized() ? "quantized weights (" + config.weight_format.describe() +
                                              ") " + quantized + "; dense ones " + dense + ")"
                                        : "dense, " + dense + ")");
  if (!out.not_loaded.empty()) {
    std::string roots;
    for (const std::string& r : unread_roots) roots += (roots.empty() ? "" : ", ") + r;
    out.source += "; not loaded: " + std::to_string(out.not_loaded.size()) + " stored tensors (" +
                  std::to_string(unread_bytes) + " bytes) under " + roots;
  }
  return out;
}

Result<std::unique_ptr<LoadedWeights>> make_preset_weights(std::string_view name, uint64_t seed) {
  Result<ModelConfig> config = preset_config(name);
  if (!config.ok()) return config.status();
  Result<const ArchitectureFamily*> family = find_architecture(*config);
  if (!family.ok()) return family.status();
  return (*family)->generate(*config, seed);
}

}  // namespace kvrt::model
