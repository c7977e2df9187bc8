// tokenizer_config.json, read once for whoever needs it: the tokenizers (special tokens and what
// encode adds around a text) and the chat template (its text, and the bos_token / eos_token it
// is rendered with).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::text {

// A tokenizer_config.json, and a chat template read on its own (chat_template.jinja).
inline constexpr util::FileKind kTokenizerConfigFile{"tokenizer_config.json / chat template",
                                                     16 * util::kMiB};

// What a tokenizer_config.json says; nullopt where a key is absent (or, for the tokens, null).
struct TokenizerConfig {
  std::optional<bool> add_bos_token, add_eos_token;
  // bos_token / eos_token: a string or an AddedToken object {"content": ...}, as transformers
  // writes either.
  std::optional<std::string> bos_token, eos_token;
  std::optional<bool> clean_up_tokenization_spaces;
  // e.g. "LlamaTokenizerFast", whose add_bos_token/add_eos_token replace the post-processor.
  std::optional<std::string> tokenizer_class;
  // added_tokens_decoder: id -> content. A tiktoken model names its special ids from it; a
  // tokenizer.json carries its own added tokens.
  std::map<int64_t, std::string> added_tokens_decoder;
  // Whether the file has a "chat_template" key, and its template: the string, or the
  // "default" of a list of {"name", "template"}; nullopt when the key holds neither (an error
  // for whoever wants the template, and nobody else's concern).
  bool has_chat_template = false;
  std::optional<std::string> chat_template;
};

// Reads tokenizer_config.json at path. Fails naming the file (and the key) when it is unreadable,
// not JSON, or a key above (chat_template aside) has the wrong type.
Result<TokenizerConfig> read_tokenizer_config(const std::string& path);
// read_tokenizer_config(path), or a default TokenizerConfig (nothing set) when path is "".
Result<TokenizerConfig> read_tokenizer_config_if_any(const std::string& path);
// The same from the file's text; name stands for the file in errors.
Result<TokenizerConfig> parse_tokenizer_config(std::string_view json, const std::string& name);

}  // namespace kvrt::text
