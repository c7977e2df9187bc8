// The attention conformance suite: the properties every attention plugin must have, run through
// the C ABI as the core uses it, over the shipped KV stores (kv_bf16_paged, kv_fp8_e4m3 with
// per-token-head and per-tensor scales) loaded through the same registry.
// `kvrt-conformance --plugin attn_mine.so` runs it for a plugin of kind attention.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/plugin/registry.h"
#include "sdk/conformance/kv_conformance.h"

namespace kvrt::conformance {

// Runs every property against `plugin` (an attention plugin loaded by `registry`). Each property
// runs even when an earlier one failed; one whose store cannot be loaded is skipped.
std::vector<PropertyResult> run_attention_suite(plugin::Registry& registry,
                                                const plugin::LoadedPlugin& plugin,
                                                const Options& options, std::ostream& log);

// ---- one checked attention call, for the suite and for plugin tests -------------------------

struct AttentionSequence {
  uint32_t kv_len;  // KV tokens, the new ones included
  uint32_t q_len;   // query rows: the newest tokens (1 for decode)
};

struct AttentionCase {
  std::string store = "kv_bf16_paged";
  const toml::table* store_config = nullptr;      // the store's table; nullptr: the registry's
  const toml::table* attention_config = nullptr;  // likewise for the attention plugin
  uint32_t num_q_heads = 8;
  uint32_t num_kv_heads = 2;
  uint32_t qk_head_dim = 64;
  uint32_t v_head_dim = 64;  // 0: V is in the K row (MLA), the output has v_width per head
  // With v_head_dim 0: V is the K row's first v_width values (MLA: the latent's kv_lora_rank
  // of kv_lora_rank + qk_rope); 0: all of it.
  uint32_t v_width = 0;
  uint32_t page_size = 16;
  std::vector<AttentionSequence> sequences;
  bool causal = true;
  kvrt_dtype q_dtype = KVRT_DTYPE_F32;
  kvrt_dtype out_dtype = KVRT_DTYPE_F32;
  bool shuffle_pages = true;  // pages in random order; false: 0, 1, 2, ... (contiguous memory)
  // Run with a copy of the store's layout whose dtype is INT8 and whose pointers are NULL: the
  // plugin must report it unsupported and compute through the store's gather().
  bool force_gather = false;
  uint32_t layers = 1;       // one plan(), then run() once per layer (each with its own K/V)
  float q_scale = 1.0f;      // Q magnitude; larger makes the softmax sharper
  uint32_t row_padding = 0;  // extra elements between Q rows and between output rows
  // (ABI 1.4) Through run_lse: its log-sum-exps are checked too.
  bool lse = false;
  // (ABI 1.4) Over this many shards (> 1): each keeps the runs of `interleave` positions whose
  // index is its own modulo `shards`, in a store of its own, planned with plan_sharded() and run
  // with run_lse(); the outputs are merged by their log-sum-exps and checked against the
  // attention over the whole.
  uint32_t shards = 1;
  uint32_t interleave = 1;
};

// Writes random K/V through the store's write() into the case's pages, runs the plugin, and
// compares every output element with a naive attention in double over the store's own
// dequantized K/V (gather()) and the Q the plugin was given (bf16-rounded for bf16 Q). The
// allowed error is 1e-4 of the largest |V| the row can see, plus half a bf16 ulp of the value
// for bf16 output: the attention arithmetic must be exact to f32 rounding, whatever the format.
// Returns "" on a match, else one line saying what differed or which call failed. When
// `create_unsupported` is given, a create() that returns KVRT_ERR_UNSUPPORTED sets it and
// returns "" (the caller skips).
std::string check_attention_case(plugin::Registry& registry, const plugin::LoadedPlugin& attention,
                                 const AttentionCase& c, uint32_t seed,
                                 bool* create_unsupported = nullptr);

}  // namespace kvrt::conformance
