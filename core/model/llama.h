// The Llama family (Llama, Mistral, Qwen2, Qwen3: GQA, rotate-half RoPE with optional llama3
// rope scaling, RMSNorm, SwiGLU, optional q/k/v biases, Qwen3's per-head q/k RMSNorm) as an
// architecture. Qwen2 and Qwen3 are variants here rather than files of their own: each differs
// from Llama by one step between the projections and RoPE, with the same tensors and sharding.
// Megatron-style sharding over TP ranks: column-parallel Q/K/V, gate and up; row-parallel o and
// down (each followed by an all-reduce); vocab-parallel embedding and LM head. Attention heads are
// split by KV head groups, so every rank's query heads share its KV heads evenly; KV heads are
// replicated when TP exceeds them.
#pragma once

#include "core/model/architecture.h"
#include "core/parallel/shard.h"

namespace kvrt::model {

struct LlamaShard {
  int rank = 0;
  int tp = 1;
  parallel::Range q_heads;       // global query heads computed here
  parallel::Range kv_heads;      // global KV heads stored here
  parallel::Range intermediate;  // MLP columns
  parallel::Range vocab;         // embedding and LM head rows
};

// The shard of `rank`, or an error naming the head counts when they cannot be split (KV heads
// and TP must divide one another, as in vLLM and SGLang).
Result<LlamaShard> llama_shard(int64_t num_heads, int64_t num_kv_heads, int64_t intermediate,
                               int64_t vocab, int rank, int tp);

const ArchitectureFamily& llama_family();

}  // namespace kvrt::model
