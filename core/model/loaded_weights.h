// A model's tensors as its architecture family loaded them. Each family keeps its own type
// (the Llama family's is model::Weights, weights.h) and builds its ranks from it; the engine
// only passes it through, so a new family brings its own tensors without touching another's.
#pragma once

#include "core/model/model_config.h"

namespace kvrt::model {

class LoadedWeights {
 public:
  virtual ~LoadedWeights() = default;
  virtual const ModelConfig& model_config() const = 0;
};

}  // namespace kvrt::model
