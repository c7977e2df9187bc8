// A corpus given as token ids (kvrt eval --ids): integers separated by spaces, commas, tabs or
// newlines, each in the model's vocabulary. Fuzzed (tests/fuzz/fuzz_corpus_ids.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::eval {

// A text corpus (kvrt eval, kvrt bench --matrix's eval_text).
inline constexpr util::FileKind kEvalCorpusFile{"evaluation corpus", 256 * util::kMiB};

// The ids of `text`; an error naming `path` and the token (its place, and what it is) for a
// word that is not an integer or an id outside 0..vocab-1.
Result<std::vector<int32_t>> parse_token_ids(std::string_view text, const std::string& path,
                                             int64_t vocab);

}  // namespace kvrt::eval
