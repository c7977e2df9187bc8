#include "core/model/architecture.h"

#include "core/model/deepseek_v3.h"
#include "core/model/llama.h"
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

Result<std::unique_ptr<LoadedWeights>> make_preset_weights(std::string_view name, uint64_t seed) {
  Result<ModelConfig> config = preset_config(name);
  if (!config.ok()) return config.status();
  Result<const ArchitectureFamily*> family = find_architecture(*config);
  if (!family.ok()) return family.status();
  return (*family)->generate(*config, seed);
}

}  // namespace kvrt::model
