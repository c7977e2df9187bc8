// The Llama family's tensors (model/llama.cc builds its ranks from them) in f32, by their Hugging
// Face names, from a checkpoint directory or a synthetic preset. Every matrix is row-major in
// the Hugging Face layout, [out_features][in_features] as stored (y = W x), so a loaded model
// and a preset look the same to the executor.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/loaded_weights.h"
#include "core/model/model_config.h"
#include "core/parallel/shard.h"
#include "core/util/status.h"

namespace kvrt::model {

// With H = hidden_size, Q = q_dim(), KV = kv_dim(), I = intermediate_size:
struct LayerWeights {
  std::vector<float> input_norm;              // [H] RMSNorm before attention
  std::vector<float> q, k, v;                 // [Q][H], [KV][H], [KV][H]
  std::vector<float> q_bias, k_bias, v_bias;  // [Q], [KV], [KV]; empty unless attention_bias
  std::vector<float> q_norm, k_norm;          // [head_dim] each; empty unless qk_norm (Qwen3)
  std::vector<float> o;                       // [H][Q]
  std::vector<float> post_norm;               // [H] RMSNorm before the MLP
  std::vector<float> gate, up;                // [I][H]
  std::vector<float> down;                    // [H][I]
  // A checkpoint's quantized projections kept as stored where they can be (the f32 one is then
  // empty): TensorBlock::packed.
  backend::QuantizedMatrix q_q, k_q, v_q, o_q, gate_q, up_q, down_q;
};

// The part of each tensor a Weights holds: all of it, or one TP rank's (load_hf with a part):
// q rows and o columns of q_heads, k / v rows of kv_heads, gate / up rows and down columns of
// intermediate, embed and lm_head rows of vocab. The ranges are global heads and rows.
struct HeldPart {
  bool whole = true;
  parallel::Range q_heads, kv_heads, intermediate, vocab;
};

struct Weights : LoadedWeights {
  ModelConfig config;
  HeldPart held;  // whole unless loaded for one rank
  const ModelConfig& model_config() const override { return config; }
  std::vector<float> embed;  // [vocab][H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [H]
  std::vector<float> lm_head;     // [vocab][H]; empty when config.tie_word_embeddings

  // The output projection: lm_head, or embed when tied.
  const std::vector<float>& output_embedding() const { return lm_head.empty() ? embed : lm_head; }
};

// One block a family's loader reads of one tensor: rows `rows` and columns `cols` (empty for a
// 1-D tensor) of `name` (transformers' name, as in the checkpoint) of logical `shape`, into *out
// (nullptr in a list made only to be counted).
struct TensorBlock {
  std::string name;
  std::vector<int64_t> shape;
  parallel::Range rows, cols;
  std::vector<float>* out = nullptr;
  // Where a projection stored quantized is kept as stored when it can be (load_quantized_block's
  // `packed`; `out` then stays empty); null: always dequantized into `out`.
  backend::QuantizedMatrix* packed = nullptr;
};

// The Llama family's blocks of w.config's tensors that `w` holds (w.held), in load order, into
// w (its layers sized to receive them). load_hf reads this list; capacity planning counts it.
std::vector<TensorBlock> llama_blocks(Weights& w);

// Loads <dir>/config.json (parse_hf_config) and the safetensors weights (one file or sharded),
// converting F32 / BF16 / F16 to f32. Tensor names are the transformers ones
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...). A missing tensor or
// a wrong shape is an error naming the tensor, the expected shape and what was found. Tensors
// the model does not use are ignored, as is lm_head.weight when the embeddings are tied.
// With `part`, only that part of each sharded tensor is converted (and, the files being mapped,
// read): a TP rank in its own process holds its shard and no more.
Result<Weights> load_hf(const std::string& dir, const HeldPart* part = nullptr);

class SafetensorsCheckpoint;

// For each family's loader: rows `rows` and columns `cols` of the 2-D (or, with cols empty, 1-D)
// tensor `name` of `shape` in `ck`, as f32, row-major [rows][cols]. Only that block is
// converted; a weight stored quantized (`format`, the config's quantization_config) is
// dequantized (weight_format.h). A missing tensor or another shape is an error naming the tensor
// (and `dir`).
Status load_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                  const std::string& dir, const std::string& name, std::vector<int64_t> shape,
                  parallel::Range rows, parallel::Range cols, std::vector<float>& out,
                  backend::QuantizedMatrix* packed = nullptr);

// Every block of `blocks` (load_block), stopping at the first error.
Status load_blocks(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                   const std::string& dir, const std::vector<TensorBlock>& blocks);

// The bytes of `blocks` in `ck`, from the safetensors headers alone (no tensor is read): each
// block's share (its rows x columns of the whole) of the tensors that store it. With
// `dense_element_bytes` 0, as stored: a quantized weight's codes and its scales (and zero
// points), its weight_shape whole, and a dense tensor's stored bytes. Otherwise as the process
// holds them: a dense tensor at `dense_element_bytes` per element (the dtype it is served in), a
// quantized block the family keeps as stored (TensorBlock::packed, where keeps_as_stored) at its
// packed form's bytes when `keep_packed` (the CPU), and any other quantized block dequantized, at
// `dense_element_bytes` too. A missing tensor is an error naming it (and `dir`). The stored
// tensors counted are added to *counted when it is given.
Result<uint64_t> stored_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                              const std::string& dir, const std::vector<TensorBlock>& blocks,
                              int dense_element_bytes, bool keep_packed,
                              std::set<std::string>* counted = nullptr);

// For each family's presets: n seeded values of mean 0 and standard deviation `stddev` (see
// below), the stream a function of (seed, name) only.
void fill_random(std::vector<float>& v, size_t n, double stddev, uint64_t seed,
                 const std::string& name);

// Synthetic presets: the Llama shape of a named model with seeded random weights, the same on
// every run and platform for a given (name, seed). Projections and embeddings are drawn from a
// centred, roughly normal distribution with std 0.02 (a sum of four uniforms, so bounded at
// +-3.5 std); norm weights are 1; biases 0. Each tensor has its own stream derived from the seed
// and its name, so adding a tensor to a preset does not change the others. Vocabulary 512 with
// bos 1 / eos 2, matching make_byte_tokenizer().
//   synth-76m:  hidden 768, 12 layers, 12 heads / 4 KV heads, head_dim 64, MLP 2048, tied;
//               75,909,888 parameters.
//   synth-tiny: hidden 64, 2 layers, 4 heads / 2 KV heads, head_dim 16, MLP 128, tied; for tests.
// An unknown name is an error listing the known ones.
Result<Weights> make_preset(std::string_view name, uint64_t seed = 0);
// The Llama family's seeded weights of any Llama shape, as make_preset draws them.
Weights generate_llama(const ModelConfig& config, uint64_t seed);
// The shape of a preset without generating its weights (for capacity planning). Besides the
// Llama presets above, the DeepSeek-V3 (MLA + MoE) presets, generated by
// model::make_preset_weights (architecture.h):
//   synth-mla:      hidden 1024, 4 layers (1 dense, MLP 2816; then 64 experts of 256, top 8,
//                   1 shared), 16 heads, q_lora 384, kv_lora 512, qk_nope 128, qk_rope 64,
//                   v_head 128, yarn x32 as Kimi-K2; 188,691,136 parameters.
//   synth-mla-tiny: hidden 64, 3 layers, 4 heads, q_lora 32, kv_lora 32, 16 + 8, v 16, 8 experts
//                   of 32 in 2 groups (top 2 of the best group), 1 shared, yarn x4; for tests.
Result<ModelConfig> preset_config(std::string_view name);
std::vector<std::string> preset_names();

// A 64-bit hash of every weight's bit pattern and every tensor's length, in a fixed order: equal
// fingerprints mean (with overwhelming likelihood) identical weights. Not cryptographic.
uint64_t fingerprint(const Weights& weights);

}  // namespace kvrt::model
