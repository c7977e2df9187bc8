// `kvrt tokenize` and `kvrt detokenize`: a model or tokenizer directory's tokenizer (and chat
// template) on their own, without loading weights, as transformers' encode,
// apply_chat_template and decode give them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvrt::cli {

struct TokenizeArgs {
  std::string dir;                      // a model or tokenizer directory
  std::optional<std::string> text;      // --text
  std::optional<std::string> file;      // --file: its bytes exactly
  std::optional<std::string> messages;  // --messages: a JSON file of [{role, content}, ...]
  bool no_generation_prompt = false;    // with --messages
  // with --messages: the template's variables, a JSON object ({"thinking": false})
  std::optional<std::string> chat_template_kwargs;
  bool add_special_tokens = false;      // with --text / --file
  bool json = false;                    // {"ids": [...]} instead of the ids on one line
};
// Prints the ids; 0, or 1 with the reason on stderr.
int run_tokenize(const TokenizeArgs& args);

struct DetokenizeArgs {
  std::string dir;
  std::vector<int32_t> ids;
  bool skip_special_tokens = false;
  bool json = false;  // {"text": "..."} instead of the text and a newline
};
// Prints the text; 0, or 1 with the reason on stderr.
int run_detokenize(const DetokenizeArgs& args);

}  // namespace kvrt::cli
