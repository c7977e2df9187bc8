#include "core/model/architecture.h"

#include "core/model/llama.h"

namespace kvrt::model {

Result<const ArchitectureFamily*> find_architecture(const ModelConfig& config) {
  // parse_hf_config accepts only the Llama family's names so far, and presets are Llama shapes.
  for (const std::string& name : supported_architectures()) {
    if (config.architecture == name) return &llama_family();
  }
  return Status::Unsupported("architecture '" + config.architecture +
                             "' has no implementation; there is: llama (" +
                             [] {
                               std::string names;
                               for (const std::string& n : supported_architectures())
                                 names += (names.empty() ? "" : ", ") + n;
                               return names;
                             }() +
                             ")");
}

}  // namespace kvrt::model
