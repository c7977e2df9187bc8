// The prompt of a chat conversation, as transformers' apply_chat_template(tokenize=True) builds
// it: the chat template rendered (the model's own, a file the operator names, or kvrt's default
// for a model that ships none), then tokenized without adding special tokens, since the
// template writes its own BOS. Used by /v1/chat/completions, /tokenize and `kvrt tokenize`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/text/chat_template.h"
#include "core/text/tokenizer.h"
#include "core/util/status.h"

namespace kvrt::api {

// The template renderer's types (core/text/chat_template.h), as the API names them.
using text::ChatMessage;
using text::ChatTemplate;

// kvrt's template for a model that ships none: each message as "<role>: <content>\n", then
// "assistant:" for the answer to follow when add_generation_prompt.
inline constexpr const char* kDefaultChatTemplate =
    "default (<role>: <content> lines, then assistant:)";
std::string apply_default_chat_template(const std::vector<text::ChatMessage>& messages,
                                        bool add_generation_prompt = true);

// Which template a server or a command renders chat with.
struct ChatFormat {
  // What it is, for the log and /get_server_info: the file the template came from, or the
  // default's description with the reason it is used.
  std::string description;
  bool is_default = true;      // kvrt's "<role>: <content>" lines (apply_default_chat_template)
  text::ChatTemplate chat_template;  // when !is_default
  std::string bos, eos;        // the template's bos_token / eos_token
};

// The format for `setting` ([server] chat_template) and a model or tokenizer directory:
//   ""        the directory's own template; the default, said so in `description`, when the
//             directory ships none; an error naming the file, construct and offset when it ships
//             one kvrt cannot render (set "default" or a file to serve anyway);
//   "default" kvrt's default, whatever the directory ships;
//   a path    a .jinja file, or a tokenizer_config.json holding a chat_template.
// bos / eos come from the directory's tokenizer_config.json, else from `tokenizer` (its BOS
// and EOS pieces) when given.
Result<ChatFormat> resolve_chat_format(const std::string& setting, const std::string& model_dir,
                                       const text::Tokenizer* tokenizer);

// The rendered conversation; a template's raise_exception is an error with its message.
// `variables` (chat_template_kwargs) are the template's besides the messages; kvrt's default
// template has none to read.
Result<std::string> render_chat(const ChatFormat& format,
                                const std::vector<text::ChatMessage>& messages,
                                bool add_generation_prompt,
                                const text::TemplateVariables& variables = {});

// The prompt ids: a template's rendering encoded without special tokens (its BOS text is the
// BOS id: a tokenizer.json matches it as a special token; for a tokenizer that would read it as
// text, a leading bos text becomes bos_id()), or the default's text with the tokenizer's special
// tokens (BOS) added, as `kvrt generate --prompt` encodes text.
Result<std::vector<int32_t>> chat_prompt_ids(const ChatFormat& format,
                                             const text::Tokenizer& tokenizer,
                                             const std::vector<text::ChatMessage>& messages,
                                             bool add_generation_prompt,
                                             const text::TemplateVariables& variables = {});

// chat_template_kwargs (SGLang's and vLLM's name) from a request or a command line: an object
// of strings, numbers, booleans or null, none of them a name the renderer sets itself
// (messages, add_generation_prompt, bos_token, eos_token, ...). On a refusal, the field under
// chat_template_kwargs that is wrong ("" for the whole) and why.
struct VariableError {
  std::string field, why;
  // The field's name under `root` (the request's key or the command line's flag).
  std::string at(const std::string& root) const {
    return field.empty() ? root : root + "." + field;
  }
};
std::optional<VariableError> read_template_variables(const nlohmann::json& kwargs,
                                                     text::TemplateVariables* out);

}  // namespace kvrt::api
