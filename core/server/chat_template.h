// A model directory's chat template (tokenizer_config.json's "chat_template", or
// chat_template.jinja), rendered by a small Jinja subset written for the shapes chat templates
// take, not a general Jinja engine:
//   text, {{ expr }}, {% if %} / {% elif %} / {% else %} / {% endif %},
//   {% for x in expr %} ... {% endfor %} (loop.index, loop.index0, loop.first, loop.last),
//   {% set name = expr %}, {# comments #}, and "-" trimming whitespace on either side;
//   expressions: string, integer and boolean literals, none, names, a.b and a['b'] and a[i],
//   + and ~ (joining strings), == != < > <= >=, in, not, and, or, parentheses,
//   "is defined" / "is none" (and their "is not"), the filters trim, length, upper, lower,
//   and raise_exception('why') (the template refusing the conversation).
// Anything else is refused when the template is parsed, with the construct and its offset, so
// the server can say why it falls back to its default template.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"

namespace kvrt::server {

struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  ChatTemplate() = default;  // renders nothing until parsed
  // Parses `source`; an unsupported construct or a syntax error is an error naming it.
  static Result<ChatTemplate> parse(std::string_view source);

  // The prompt for `messages`, with bos_token / eos_token as the template names them and
  // add_generation_prompt true. A template's raise_exception is an error with its message.
  Result<std::string> render(const std::vector<ChatMessage>& messages, const std::string& bos,
                             const std::string& eos) const;

  struct Node;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

// The chat template of a model directory: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} from which "default" is taken),
// with its bos_token and eos_token. `found` false when the directory has none; an error when
// it has one that cannot be read or rendered by the subset above.
struct ModelChatTemplate {
  bool found = false;
  std::string source;  // the file it came from
  ChatTemplate chat_template;
  std::string bos, eos;
};
Result<ModelChatTemplate> load_model_chat_template(const std::string& model_dir);

}  // namespace kvrt::server
