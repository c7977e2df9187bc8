// Hugging Face tokenizer.json files (the "fast" tokenizers of transformers): BPE models, byte-level
// (GPT-2, Llama 3, Qwen, DeepSeek) or SentencePiece-derived (Llama 2, Mistral: byte_fallback and
// Metaspace), with their normalizers, pre-tokenizers, added tokens, post-processors and decoders.
// Encoding and decoding give what transformers gives, id for id and byte for byte. The stages
// are in tokenizer_json/, one file each; tokenizer_json.cc assembles them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/text/tokenizer.h"
#include "core/text/tokenizer_config.h"
#include "core/util/status.h"

namespace kvrt::text {

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

}  // namespace kvrt::text
