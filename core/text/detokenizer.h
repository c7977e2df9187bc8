// A request's output text on the step thread, as its ids arrive: decoded a few tokens at a time
// (TextStream), searched for stop strings, and handed out in pieces that never hold a part of a
// stop string, so the pieces a stream sends add up to the answer a non-streamed request gets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tokenizer.h"

namespace kvrt::text {

// The text of a request's output as its ids arrive, decoded a few tokens at a time rather than
// whole on every token: each step decodes only the ids since the last emitted character (plus
// the one before, so a decoder's spacing rules see context), and a character whose bytes are
// split across tokens is held back until it is whole, so a delta never carries half of one
// (vLLM's prefix / read offsets). The output is decoded after `context`, the prompt's last ids,
// so that a decoder's rule for a sequence's first piece (a Metaspace decoder dropping its space,
// as transformers' Llama-2 and Mistral tokenizer.json files do) never eats the output's first
// space.
class TextStream {
 public:
  explicit TextStream(const Tokenizer* tokenizer, std::vector<int32_t> context = {})
      : tokenizer_(tokenizer), context_(std::move(context)), read_(context_.size()) {}
  // The ids so far (each call one or more longer than the last); returns the text now whole.
  const std::string& update(const std::vector<int32_t>& ids);
  // Every id decoded at once: the exact final text (an unfinished character included).
  std::string finish(const std::vector<int32_t>& ids) const;
  const std::string& text() const { return text_; }

 private:
  // Positions [from, end) of context_ followed by ids.
  std::vector<int32_t> window(const std::vector<int32_t>& ids, size_t from) const;

  const Tokenizer* tokenizer_;
  std::vector<int32_t> context_;
  std::string text_;
  // Positions in context_ then the output: [prefix_, read_) were decoded into the end of text_
  // (or are the context).
  size_t prefix_ = 0;
  size_t read_ = 0;
};

// The first byte offset of a stop string in `text`, and which one, or npos.
size_t find_stop(std::string_view text, const std::vector<std::string>& stops,
                 std::string* matched);
// How much of an unfinished output may be handed out: `text` without its longest suffix that is
// the start of a stop string (the rest may yet complete one, and a stop string is never sent),
// as vLLM and SGLang hold it back. A match inside `text` is find_stop's to cut.
size_t stop_safe_length(std::string_view text, const std::vector<std::string>& stops);

// One request's output text: a TextStream over the prompt's last ids, its stop strings, and
// what has been handed out so far.
class OutputText {
 public:
  // `tokenizer` null: no text (and no stop strings: check_request refuses them).
  OutputText(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
             std::vector<std::string> stop);
  // The output's ids grew: decodes the new ones; true when the text now completes a stop string
  // (the text is then cut before it, and the request must end in this step).
  bool update(const std::vector<int32_t>& output_ids);
  // The request ended otherwise (length, stop token, abort): the text is the exact decoding of
  // every id, an unfinished last character included.
  void finish(const std::vector<int32_t>& output_ids);
  // The text not handed out yet that may be: all of it once ended, else all but what may be the
  // start of a stop string.
  std::string take();
  const std::string& matched() const { return matched_; }  // the stop string that ended it

 private:
  TextStream stream_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::string text_;  // the output's text, cut before a matched stop string
  size_t sent_ = 0;   // bytes of text_ handed out
  bool ended_ = false;
  std::string matched_;
};

}  // namespace kvrt::text
