// Text <-> token ids: SentencePiece models (tokenizer.model of Llama-family checkpoints) and a
// byte-level tokenizer for the synthetic presets.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace kvrt::model {

// Decoding contract, the same for every implementation: decode(ids) is the text those ids add
// after whatever preceded them, so a server prints decode(generated ids) right after the prompt
// and a stream of decode(chunk) calls concatenates to the whole text (as long as chunks do not
// split a multi-byte character). Hence SentencePiece's leading-space rule: the space encoded into
// a word's first piece ("\xE2\x96\x81there") is dropped only at the start of a sequence, i.e.
// right after BOS; decode({1, 403, ...}) gives "Once upon a time" and decode({403, ...}) gives
// " Once upon a time". Special ids (BOS, EOS, padding) decode to nothing.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of text, with bos_id() in front when add_bos (and the tokenizer has a BOS).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // See the contract above. Ids outside the vocabulary decode to nothing.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The vocabulary entry of id as stored (e.g. "\xE2\x96\x81there", "<0x0A>", "<s>"), for
  // debugging output; "" for an id outside the vocabulary.
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  virtual int32_t vocab_size() const = 0;
};

// Loads a SentencePiece model file (e.g. <model dir>/tokenizer.model).
Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path);

// The synthetic presets' tokenizer: id 0 = padding/unknown, 1 = BOS, 2 = EOS, byte b = 3 + b
// (3..258); ids 259..vocab_size-1 are unused and decode to nothing. Any byte string round-trips
// (encode then decode gives it back). vocab_size must be at least 259.
Result<std::unique_ptr<Tokenizer>> make_byte_tokenizer(int32_t vocab_size = 512);

}  // namespace kvrt::model
