// Text <-> token ids: Hugging Face tokenizer.json files (tokenizer_json.h), tiktoken models
// (tiktoken.model of Kimi checkpoints, tiktoken.h), SentencePiece models (tokenizer.model of
// Llama-family checkpoints) and a byte-level tokenizer for the synthetic presets.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::text {

// A tokenizer.json or a SentencePiece tokenizer.model (a tiktoken.model: tiktoken.h).
inline constexpr util::FileKind kTokenizerFile{"tokenizer model", 64 * util::kMiB};

// Options of Tokenizer::decode.
struct DecodeOptions {
  // Special ids (BOS, EOS, padding, a tokenizer.json's special added tokens) decode to nothing;
  // false keeps their text, as transformers' decode does by default.
  bool skip_special_tokens = true;
};

// Decoding contract. SentencePiece (tokenizer.model) and the byte tokenizer: decode(ids) is the
// text those ids add after whatever preceded them, so a server prints decode(generated ids) right
// after the prompt and a stream of decode(chunk) calls concatenates to the whole text (as long as
// chunks do not split a multi-byte character). Hence SentencePiece's leading-space rule: the space
// encoded into a word's first piece ("\xE2\x96\x81there") is dropped only at the start of a
// sequence, i.e. right after BOS; decode({1, 403, ...}) gives "Once upon a time" and
// decode({403, ...}) gives " Once upon a time". A tokenizer.json decodes exactly as transformers
// does (its decoder chain; a Metaspace or Strip decoder drops the first piece's space wherever the
// ids start), and bytes that are not valid UTF-8 become U+FFFD as there. A tiktoken model joins
// its tokens' bytes, with the same U+FFFD.
//
// Every method is const and may be called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of text. add_special_tokens means what it means in Python transformers: what the
  // tokenizer adds around a text (BOS from a tokenizer.json's post-processor or from
  // tokenizer_config.json's add_bos_token, EOS from its add_eos_token; SentencePiece and the byte
  // tokenizer: bos_id() in front). Special-token strings inside text (e.g. "<|im_start|>") are
  // matched as their ids either way, as transformers does.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  // See the contract above. Ids outside the vocabulary decode to nothing.
  virtual std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const = 0;
  // decode with special tokens skipped (what a server shows).
  std::string decode(std::span<const int32_t> ids) const { return decode(ids, DecodeOptions{}); }
  // Whether id is a special token (skipped by skip_special_tokens); false outside the vocabulary.
  virtual bool is_special(int32_t id) const = 0;
  // The vocabulary entry of id as stored (e.g. "\xE2\x96\x81there", "<0x0A>", "<s>",
  // "\xC4\xA0the"), for debugging output; "" for an id outside the vocabulary.
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  // One more than the largest id (vocabulary and added tokens).
  virtual int32_t vocab_size() const = 0;
};

// The tokenizer of a model or tokenizer directory, as transformers picks it: <dir>/tokenizer.json
// when present (tokenizer_json.h), else <dir>/tiktoken.model when present (tiktoken.h; Kimi's
// TikTokenTokenizer), else <dir>/tokenizer.model (SentencePiece). <dir>/tokenizer_config.json,
// when present, sets bos_id()/eos_id() (bos_token/eos_token, strings or {"content": ...}
// objects), what encode adds (add_bos_token/add_eos_token) and a tiktoken model's special tokens'
// names (added_tokens_decoder). Fails with NotFound naming the directory and the three files
// when none exists, or with the error of the file it read.
Result<std::unique_ptr<Tokenizer>> load_model_tokenizer(const std::string& dir);
// The file load_model_tokenizer(dir) reads: <dir>/tokenizer.json when present, else
// <dir>/tiktoken.model when present, else <dir>/tokenizer.model (whether or not that exists).
std::string model_tokenizer_path(const std::string& dir);

// Loads a SentencePiece model file (e.g. <model dir>/tokenizer.model).
Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path);

// The synthetic presets' tokenizer: id 0 = padding/unknown, 1 = BOS, 2 = EOS, byte b = 3 + b
// (3..258); ids 259..vocab_size-1 are unused and decode to nothing. Any byte string round-trips
// (encode then decode gives it back). vocab_size must be at least 259.
Result<std::unique_ptr<Tokenizer>> make_byte_tokenizer(int32_t vocab_size = 512);

}  // namespace kvrt::text
