// Hugging Face tokenizer.json files (the "fast" tokenizers of transformers): BPE models, byte-level
// (GPT-2, Llama 3, Qwen, DeepSeek) or SentencePiece-derived (Llama 2, Mistral: byte_fallback and
// Metaspace), with their normalizers, pre-tokenizers, added tokens, post-processors and decoders.
// Encoding and decoding give what transformers gives, id for id and byte for byte.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/model/tokenizer.h"
#include "core/util/status.h"

namespace kvrt::model {

// What a tokenizer_config.json says about special tokens; nullopt where a key is absent (or, for
// the tokens, null).
struct TokenizerConfig {
  std::optional<bool> add_bos_token, add_eos_token;
  std::optional<std::string> bos_token, eos_token;  // strings or {"content": ...} objects
  std::optional<bool> clean_up_tokenization_spaces;
  // e.g. "LlamaTokenizerFast", whose add_bos_token/add_eos_token replace the post-processor.
  std::optional<std::string> tokenizer_class;
};

// Reads tokenizer_config.json at path. Fails naming the file (and the key) when it is unreadable,
// not JSON, or a key above has the wrong type.
Result<TokenizerConfig> read_tokenizer_config(const std::string& path);
// The same from the file's text; name stands for the file in errors.
Result<TokenizerConfig> parse_tokenizer_config(std::string_view json, const std::string& name);

// Loads tokenizer.json at json_path, with tokenizer_config.json at config_path ("" for none).
// A construct this implementation does not support (a WordPiece or Unigram model, an unknown
// pre-tokenizer, ...) fails with Unsupported naming the file and the JSON key and type; nothing is
// silently ignored.
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& json_path,
                                                     const std::string& config_path);
// The same from tokenizer.json's text and a parsed config (a default TokenizerConfig for none);
// name stands for the file in errors.
Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view json,
                                                      const TokenizerConfig& config,
                                                      const std::string& name);

}  // namespace kvrt::model
