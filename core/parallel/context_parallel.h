// Decode context parallelism (tp.dcp_size = N): within each group of N consecutive TP ranks that
// would hold the same KV -- the MLA latent, which every rank holds under plain TP, or a GQA head
// replicated over tp / kv_heads ranks -- each token's KV is kept by one rank only, so the group's
// pool holds N times the tokens. Tokens are dealt out one at a time: the token at position p of a
// sequence is kept by the group's rank p % N, as its local token p / N (vLLM's default
// interleave of 1, which keeps decode's new tokens spread evenly over the group). A page id
// means the same on every rank: the scheduler's page holds N x page_size tokens, page_size of them
// on each rank, so local token j of a sequence lies in the sequence's page j / page_size.
//
// Attention then runs on every rank of the group for all of the group's query heads over the
// rank's own tokens, giving a partial output and its log-sum-exp per row and head; the group's
// partials merge exactly: with L = log sum_i exp(lse_i), out = sum_i exp(lse_i - L) out_i
// (FlashInfer's merge_state, vLLM's cp_lse_ag_out_rs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvrt/plugin.hpp"

namespace kvrt::parallel {

struct ContextParallel {
  int size = 1;   // N: ranks that share each sequence's tokens
  int index = 0;  // this rank's place in its group, 0 .. N - 1
  int first = 0;  // the group's first TP rank

  // Rank `rank`'s place for tp.dcp_size `size` (groups of `size` consecutive ranks).
  static ContextParallel of(int size, int rank) {
    return ContextParallel{size, rank % size, rank - rank % size};
  }
  bool on() const { return size > 1; }
  // Whether this rank keeps the token at position `pos`, and which of its tokens that is.
  bool keeps(int64_t pos) const { return pos % size == index; }
  int64_t local_index(int64_t pos) const { return pos / size; }
  // How many of the positions [0, n) this rank keeps: the shard's count, as the attention
  // plugins count it (sdk::Shard, runs of one token).
  int64_t kept_before(int64_t n) const {
    return sdk::Shard{static_cast<uint32_t>(size), static_cast<uint32_t>(index), 1, nullptr}
        .tokens_before(n);
  }
};

// The merge of a group's partial attentions for this rank's query heads. `gathered` holds every
// TP rank's contribution back to back, `stride` floats apart: rows x group_heads x dim outputs,
// then rows x group_heads log-sum-exps (-inf where the rank saw no token, its output then 0).
// Group member m is TP rank cp.first + m. This rank's heads are
// [cp.index * heads, (cp.index + 1) * heads) of the group's; row r of its output goes to
// out + r * out_row_stride, head h's dim values from h * dim.
void merge_partials(const ContextParallel& cp, const float* gathered, size_t stride, int64_t rows,
                    int group_heads, int heads, int dim, float* out, int64_t out_row_stride);

}  // namespace kvrt::parallel
