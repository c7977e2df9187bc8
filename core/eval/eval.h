// `kvrt eval`: the accuracy cost of KV formats on the served model. The same corpus goes through
// the model once per KV store, in windows of the context, teacher-forced: every token is fed as
// one decode step, so each next-token distribution is computed from the K/V the store kept of
// the tokens before it -- what generation reads. The first store (kv_f32_paged: K/V exactly as
// computed) is the reference the others are measured against, position by position, in lock
// step (one step's logits per store in memory at a time). Then greedy continuations of prompts
// from the corpus say how many tokens each store agrees with the reference before it diverges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/eval/metrics.h"
#include "core/util/status.h"

namespace kvrt::eval {

// A store to evaluate: a KV store plugin and options for its [kv.<store>] table.
struct StoreVariant {
  std::string label;                   // as the table shows it
  std::string store;                   // kv.store
  std::vector<std::string> overrides;  // "kv.<store>.key=value", applied after --set
};

// "kv_fp8_e4m3" or "kv_fp8_e4m3:scale_mode=per_tensor:k_scale=0.5": the store, then its own
// options. Errors name the text.
Result<StoreVariant> parse_store_variant(std::string_view text);

// `kvrt eval --weights none,int4,fp8`: one variant per weight format (model.quantization) on the
// one store `store`, labelled "weights <format>"; the first is the reference. Errors name the
// format and --weights.
Result<std::vector<StoreVariant>> weight_variants(std::string_view list, const StoreVariant& store);

// The corpus: text (one document per non-empty line, each tokenized with BOS first) or token
// ids (integers separated by spaces, commas or newlines).
struct CorpusSource {
  std::string text_path, ids_path;
};

struct EvalOptions {
  std::string config_path;             // "" = the defaults
  std::vector<std::string> overrides;  // --set, applied to every store
  std::vector<StoreVariant> stores;    // the first is the reference
  CorpusSource corpus;
  int64_t ctx = 0;  // tokens per window; 0 = the model's context (max_position_embeddings)
  int greedy_prompts = 16;
  int greedy_prompt_tokens = 32;
  int greedy_tokens = 64;
  bool progress = false;  // a progress line on stderr
};

struct StoreResult {
  StoreVariant variant;
  uint64_t bytes_per_token = 0;  // per TP rank, over all its layers
  uint64_t max_total_num_tokens = 0;
  double perplexity = 0, perplexity_ratio = 1;
  Accumulator::Kl kl;
  double top1_agreement = 1, mean_abs_logit_error = 0;
  std::vector<int> greedy_agreement;  // per prompt: tokens equal to the reference's, from the start
  double greedy_median = 0;
  int greedy_min = 0;
};

struct EvalResult {
  std::string model;
  std::string corpus;  // its path
  uint64_t corpus_tokens = 0, windows = 0, dropped_tokens = 0, positions = 0;
  int64_t ctx = 0;
  int greedy_tokens = 0;
  std::vector<StoreResult> stores;
};

Result<EvalResult> run_eval(const EvalOptions& options);

// One row per store: bytes per token and max_total_num_tokens beside the accuracy figures.
std::string format_eval(const EvalResult& result);
std::string eval_json(const EvalResult& result);

}  // namespace kvrt::eval
