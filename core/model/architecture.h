// The architecture interface: one model family's tensors, how they shard over TP ranks, and a
// step's forward written in a compute backend's ops (core/backend/backend.h). One instance holds
// one rank's shard. Llama-family models (Llama, Mistral, Qwen2, Qwen3) are llama.h, DeepSeek-V3's
// MLA + MoE deepseek_v3.h; a new family is a new file registered in architecture.cc, with no
// change to the others or to the backends.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend/backend.h"
#include "core/comm/communicator.h"
#include "core/model/loaded_weights.h"
#include "core/model/model_config.h"
#include "core/model/weights.h"
#include "core/parallel/step_attention.h"
#include "core/util/status.h"

namespace kvrt::model {

// What one step gives the forward pass, in host memory and batch order.
struct StepInputs {
  std::span<const int32_t> ids;        // the new tokens
  std::span<const int32_t> positions;  // their positions
  // The rows whose logits are wanted, in order: per sequence its last new token's, or each of
  // its new tokens' (exec::SequenceStep::all_logits).
  std::span<const int64_t> last_rows;
};

// This rank's attention shape, for the attention plugin and the KV geometry.
struct AttentionShape {
  int64_t q_heads = 0;  // 0: the rank computes no attention (TP above the query heads)
  int64_t kv_heads = 0;
  int64_t qk_head_dim = 0;
  int64_t v_head_dim = 0;
  float softmax_scale = 1;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual AttentionShape attention_shape() const = 0;
  // One step on this rank. Every rank runs it at once with the same inputs, meeting in `comm`'s
  // collectives; rank 0 fills `logits` with [rows][vocab] of the inputs' last_rows, the others
  // leave it alone. A failure (a plugin call) still takes part in every collective,
  // so no rank is left waiting, and is returned at the end.
  virtual Status forward(const StepInputs& inputs, backend::Backend& backend,
                         comm::Communicator& comm, parallel::StepAttention& kv,
                         std::vector<float>* logits) = 0;
};

// A model family: which tensors it has (its LoadedWeights type, and their names in a
// checkpoint), how they shard, and how to build one rank.
struct ArchitectureFamily {
  const char* name;  // "llama", "deepseek_v3"
  // Refuses a TP size the model cannot be sharded over, naming the counts.
  Status (*check_tp)(const ModelConfig& config, int tp);
  // The family's tensors from a Hugging Face directory (config.json and safetensors). A missing
  // or misshapen tensor is an error naming it. With tp > 1, only rank `rank`'s shard of each
  // tensor (a process that runs one rank); create() must then be asked for that rank.
  Result<std::unique_ptr<LoadedWeights>> (*load)(const std::string& dir, int rank, int tp);
  // The blocks of the tensors rank `rank` of `tp` loads (load's own list, with no `out`), for
  // counting a checkpoint's bytes per rank; a TP size the model cannot be sharded over is an error.
  Result<std::vector<TensorBlock>> (*tensors)(const ModelConfig& config, int rank, int tp);
  // Seeded weights of `config`'s shape, whole (a synthetic preset, weights.h).
  Result<std::unique_ptr<LoadedWeights>> (*generate)(const ModelConfig& config, uint64_t seed);
  // Rank `rank` of `tp`: takes its shard out of `weights` (which stay the caller's, and must be
  // this family's type) into `backend`'s memory.
  Result<std::unique_ptr<Architecture>> (*create)(const LoadedWeights& weights, int rank, int tp,
                                                  backend::Backend& backend);
};

// The family serving config.architecture, or an error naming it and the families there are.
Result<const ArchitectureFamily*> find_architecture(const ModelConfig& config);

// The bytes each of `tp` ranks holds of the checkpoint at `dir` (whose config.json reads as
// `config`), from its safetensors headers: the blocks its family loads on that rank, as stored
// (`dense_element_bytes` 0) or as held -- dense ones at `dense_element_bytes` per element,
// quantized ones packed where the family keeps them so and `keep_packed` (the CPU), else
// dequantized (weights.h stored_bytes). Tensors the family does not load (a vision tower) are
// not counted. Errors name the tensor or the TP size.
struct CheckpointBytes {
  std::vector<uint64_t> per_rank;  // [tp]
  uint64_t whole = 0;              // the model's, unsharded (what one rank would hold at TP 1)
  // How they were counted, for reports: "counted from the safetensors headers of DIR (...)",
  // and which stored tensors the family does not load ("; not loaded: 23 tensors (...) under
  // mm_projector., vision_tower.").
  std::string source;
  std::vector<std::string> not_loaded;  // stored names no rank reads, sorted
  uint64_t most() const;                // the largest rank's
};
Result<CheckpointBytes> checkpoint_bytes_per_rank(const std::string& dir, const ModelConfig& config,
                                                  int tp, int dense_element_bytes,
                                                  bool keep_packed);

// A synthetic preset's weights (preset_config(name), weights.h), by its family.
Result<std::unique_ptr<LoadedWeights>> make_preset_weights(std::string_view name,
                                                           uint64_t seed = 0);

}  // namespace kvrt::model
