// A model directory's generation_config.json: the sampling its authors recommend, which vLLM and
// SGLang apply to every request that leaves a parameter unset. Only the keys both read are taken
// (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), and do_sample: false,
// which transformers reads as greedy whatever the temperature; every other key (eos_token_id,
// max_length, ...) is transformers' business and ignored here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace kvrt::model {

struct GenerationConfig {
  std::string path;  // the file read; "" when the directory has none (every field unset)
  std::optional<double> temperature;         // >= 0
  std::optional<double> top_p;               // (0, 1]
  std::optional<int64_t> top_k;              // -1 or 0: every token
  std::optional<double> min_p;               // [0, 1]
  std::optional<double> repetition_penalty;  // > 0
  std::optional<int64_t> max_new_tokens;     // >= 1
  std::optional<bool> do_sample;             // false: greedy
};

// The text of a generation_config.json (`source` names it in messages). A key of the wrong type
// or out of range is a ConfigError "<source>: <key>: expected ..., found ..."; text that is not
// a JSON object, likewise without a key.
Result<GenerationConfig> read_generation_config(std::string_view text, const std::string& source);

// <dir>/generation_config.json when the directory has one; a directory without one gives an
// empty GenerationConfig (path ""), not an error.
Result<GenerationConfig> load_generation_config(const std::string& dir);

}  // namespace kvrt::model
