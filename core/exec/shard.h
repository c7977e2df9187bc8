// Megatron-style sharding of a Llama-family model over TP ranks: column-parallel Q/K/V, gate
// and up; row-parallel o and down; vocab-parallel embedding and LM head. Attention heads are
// split by KV head groups, so every rank's query heads share its KV heads evenly; KV heads are
// replicated when TP exceeds them. Dimensions that do not divide (an intermediate size of 172
// at TP 8) get uneven shards.
#pragma once

#include <cstdint>

#include "core/util/status.h"

namespace kvrt::exec {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Part `index` of `parts` near-equal parts of [0, total): the first total % parts get one more.
Range split(int64_t total, int parts, int index);

struct RankShard {
  int rank = 0;
  int tp = 1;
  Range q_heads;       // global query heads computed here
  Range kv_heads;      // global KV heads stored here
  Range intermediate;  // MLP columns
  Range vocab;         // embedding and LM head rows
};

// The shard of `rank`, or an error naming the head counts when they cannot be split (KV heads
// and TP must divide one another, as in vLLM and SGLang).
Result<RankShard> shard_for(int64_t num_heads, int64_t num_kv_heads, int64_t intermediate,
                            int64_t vocab, int rank, int tp);

}  // namespace kvrt::exec
