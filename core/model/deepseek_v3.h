// The DeepSeek-V3 family (DeepseekV3ForCausalLM: DeepSeek-V3, Kimi-K2) as an architecture:
// multi-head latent attention (MLA) and DeepSeek's mixture of experts, as transformers'
// modeling_deepseek_v3 defines them.
//
// Attention. q = q_b_proj(q_a_layernorm(q_a_proj(h))) (or q_proj(h)), per head qk_nope + qk_rope
// values; kv_a_proj_with_mqa(h) gives the latent c (kv_lora_rank values, then kv_a_layernorm)
// and one rope key shared by every head. The KV cache holds [c | rope(k_pe)] per token and
// layer: one row of kv_lora_rank + qk_rope_head_dim, whole on every TP rank. Attention runs in
// the weight-absorbed form, decode and prefill alike: each head's q_nope is mapped into the
// latent space by its K part of kv_b_proj (W_UK^T q_nope), so the attention plugin scores
// [W_UK^T q_nope | rope(q_pe)] against the cached rows as one MQA head of kv_lora + rope, takes
// the values as the rows' first kv_lora_rank values (the store's v_width), and the head's V
// part of kv_b_proj maps the result out (W_UV o). Per-head K and V are never materialised.
//
// Mixture of experts, from layer first_k_dense_replace on (every moe_layer_freq-th): sigmoid
// scores of the router; e_score_correction_bias added only to choose; group-limited top-k
// (the topk_group of n_group groups with the best sum of their two best choices; the others'
// choices masked to 0, as transformers does); the chosen scores normalised (norm_topk_prob),
// times routed_scaling_factor; plus the shared experts. Layers before are a dense SwiGLU MLP.
//
// TP. Query heads split over the ranks (near-equal; a rank may hold none); q_a_proj and
// kv_a_proj_with_mqa are replicated, so every rank computes the latent and stores it whole;
// q_b_proj and kv_b_proj are split by head, o_proj by its input columns. Experts are split
// *inside* each expert (TP, the default of SGLang and vLLM): each rank holds a near-equal slice
// of every routed and shared expert's intermediate columns, routes every token itself (the
// router is replicated and its input identical on every rank), and one all-reduce per layer
// sums the routed, shared and dense parts. Embedding and LM head are vocab-parallel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model/architecture.h"
#include "core/model/weights.h"
#include "core/parallel/shard.h"

namespace kvrt::model {

// One rank's share, as global ranges.
struct DeepseekV3Shard {
  int rank = 0;
  int tp = 1;
  parallel::Range heads;         // query heads
  parallel::Range intermediate;  // the dense MLP's columns
  parallel::Range expert;        // each routed expert's columns (of moe_intermediate_size)
  // The shared experts' columns (of n_shared * moe_intermediate_size).
  parallel::Range shared;
  parallel::Range vocab;         // embedding and LM head rows
};

Result<DeepseekV3Shard> deepseek_v3_shard(const ModelConfig& config, int rank, int tp);

// A SwiGLU MLP: gate, up [I][H], down [H][I]. A checkpoint's quantized projections are kept as
// stored where they can be (the *_q ones; the f32 one is then empty).
struct MlpWeights {
  std::vector<float> gate, up, down;
  backend::QuantizedMatrix gate_q, up_q, down_q;
};

// With H = hidden, Lq = q_lora_rank, L = kv_lora_rank, R = qk_rope, N = qk_nope, V = v_head,
// n = heads: every tensor as transformers stores it, [out][in].
struct DeepseekV3Layer {
  std::vector<float> input_norm, post_norm;  // [H]
  std::vector<float> q_a, q_a_norm;          // [Lq][H], [Lq]; empty without q_lora_rank
  std::vector<float> q_b;                    // q_b_proj [n (N+R)][Lq], or q_proj [n (N+R)][H]
  std::vector<float> kv_a, kv_a_norm;        // [L+R][H], [L]
  std::vector<float> kv_b;                   // [n (N+V)][L]
  std::vector<float> o;                      // [H][n V]
  // A checkpoint's quantized projections kept as stored where they can be (the f32 one is then
  // empty). kv_b is always dequantized: its per-head parts become MLA's absorbed matrices.
  backend::QuantizedMatrix q_a_q, q_b_q, kv_a_q, o_q;
  MlpWeights mlp;                            // a dense layer's
  std::vector<float> router, router_bias;    // [E][H], [E]: a MoE layer's
  std::vector<MlpWeights> experts;           // E of them
  MlpWeights shared;                         // the shared experts, as one MLP (may be empty)
};

struct DeepseekV3Weights : LoadedWeights {
  ModelConfig config;
  // The part held: all of every tensor, or one rank's (the shard's heads' rows of q_b and kv_b
  // and columns of o, its columns of every MLP, its vocab rows).
  bool whole = true;
  DeepseekV3Shard part;
  const ModelConfig& model_config() const override { return config; }
  std::vector<float> embed;  // [vocab][H]
  std::vector<DeepseekV3Layer> layers;
  std::vector<float> final_norm;  // [H]
  std::vector<float> lm_head;     // [vocab][H]; empty when tied
};

// From <dir>/config.json and its safetensors, by transformers' tensor names
// (model.layers.N.self_attn.kv_a_proj_with_mqa.weight, model.layers.N.mlp.experts.E.gate_proj.weight,
// ...); with `part`, only that rank's part of each tensor.
Result<DeepseekV3Weights> load_deepseek_v3(const std::string& dir, const DeepseekV3Shard* part);
// The blocks of w.config's tensors that `w` holds (all, or w.part), in load order, into w (its
// layers sized to receive them). load_deepseek_v3 reads this list; capacity planning counts it.
std::vector<TensorBlock> deepseek_v3_blocks(DeepseekV3Weights& w);

// Seeded weights of `config`'s shape, as make_preset draws them (std 0.02, norms 1; the
// router's correction bias std 0.02 too, so it does change some choices).
DeepseekV3Weights generate_deepseek_v3(const ModelConfig& config, uint64_t seed);

// The attention's softmax scale: 1 / sqrt(qk_nope + qk_rope), times mscale(factor,
// mscale_all_dim)^2 under YaRN (DeepseekV3Attention's).
float mla_softmax_scale(const ModelConfig& config);

const ArchitectureFamily& deepseek_v3_family();

}  // namespace kvrt::model
