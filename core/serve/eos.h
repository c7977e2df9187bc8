// The end-of-sequence stop policy `kvrt serve` and `kvrt generate` share: a request stops at the
// model's EOS ids (generation_config.json's, else the tokenizer's) unless it ignores them.
#pragma once

#include <cstdint>
#include <vector>

namespace kvrt::serve {

// Appends the model's EOS ids `eos` to *stop_ids, after the ids already there, unless
// `ignore_eos` (SGLang's sampling_params.ignore_eos, `kvrt generate --ignore-eos`).
void add_eos_stop_ids(const std::vector<int32_t>& eos, bool ignore_eos,
                      std::vector<int32_t>* stop_ids);

}  // namespace kvrt::serve
