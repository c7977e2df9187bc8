// One forward step's work: for each sequence, its new tokens (a prefill chunk, or one token
// when decoding), where they start, and the pages that hold its KV (the core's page table).
// Plain data that serialises to bytes, so rank 0 can broadcast it to ranks in other processes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/status.h"

namespace kvrt::exec {

struct SequenceStep {
  std::vector<int32_t> tokens;  // new tokens; their K/V are written this step
  int32_t start = 0;            // position of tokens[0] == tokens already in the KV cache
  std::vector<int32_t> pages;   // page ids for positions [0, start + tokens.size()), in order
  // Logits for every new token, not only the last (a prompt's log-probabilities).
  bool all_logits = false;
  // Rows of logits it gets: one, or one per new token.
  int64_t logit_rows() const { return all_logits ? static_cast<int64_t>(tokens.size()) : 1; }
};

struct Batch {
  std::vector<SequenceStep> sequences;
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const SequenceStep& s : sequences) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
};

// The batch as little-endian int32 words: the sequence count, then per sequence its start,
// token count, tokens, page count, pages and all_logits (0 or 1). Replaces the contents of
// `out`.
void serialize(const Batch& batch, std::vector<int32_t>* out);
// The inverse; an error (never a read past the end) for words that do not describe a batch.
Status deserialize(std::span<const int32_t> words, Batch* batch);

}  // namespace kvrt::exec
