// tiktoken BPE models, as Kimi (K2, K2.5, Kimi-Linear) ships them: no tokenizer.json, but
// tiktoken.model (one "base64(token bytes) rank" line per token, ranks 0..n-1) beside
// tokenizer_config.json. Encoding and decoding give what Kimi's TikTokenTokenizer gives (OpenAI's
// tiktoken with Kimi's split pattern), id for id and byte for byte:
// - ids 0..n-1 are the ranks; ids n..n+255 are the 256 reserved special tokens, each named by
//   tokenizer_config.json's added_tokens_decoder, else "<|reserved_token_{id}|>";
// - special-token names inside text are matched as their ids (tiktoken's allowed_special="all");
// - decode joins the tokens' bytes and reads them as UTF-8, U+FFFD for invalid sequences.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/text/tokenizer.h"
#include "core/text/tokenizer_config.h"
#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::text {

// A tiktoken.model: Kimi-K2's is under 3 MiB (163,584 ranks).
inline constexpr util::FileKind kTiktokenFile{"tiktoken model", 64 * util::kMiB};

// Loads tiktoken.model at model_path, with tokenizer_config.json at config_path ("" for none).
// A malformed line (not "base64 rank", bad base64, a duplicate token or rank, ranks that are not
// 0..n-1) fails naming the file and the line; a tokenizer_config.json whose special tokens do not
// fit (an added_tokens_decoder id outside the specials, a bos_token that is no special) fails
// naming that file and the key.
Result<std::unique_ptr<Tokenizer>> load_tiktoken(const std::string& model_path,
                                                 const std::string& config_path);

// The same from text already read: tiktoken.model's `model` (messages name `model_name`) and a
// tokenizer_config.json's `config` (`config_name`; a default TokenizerConfig for none).
Result<std::unique_ptr<Tokenizer>> parse_tiktoken(std::string_view model,
                                                  const TokenizerConfig& config,
                                                  const std::string& model_name,
                                                  const std::string& config_name);

}  // namespace kvrt::text
