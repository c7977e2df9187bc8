// Chat conversations to prompts: the template resolved, rendered and tokenized (chat_prompt.h).
#include "core/api/chat_prompt.h"

#include <utility>

namespace kvrt::api {

using text::load_chat_template_file;
using text::load_model_chat_template;
using text::ModelChatTemplate;
using text::RenderOptions;

std::string apply_default_chat_template(const std::vector<text::ChatMessage>& messages,
                                        bool add_generation_prompt) {
  std::string text;
  for (const text::ChatMessage& m : messages) text += m.role + ": " + m.content + "\n";
  return add_generation_prompt ? text + "assistant:" : text;
}

Result<ChatFormat> resolve_chat_format(const std::string& setting, const std::string& model_dir,
                                       const text::Tokenizer* tokenizer) {
  ChatFormat format;
  if (setting == "default") {
    format.description = std::string(kDefaultChatTemplate) + ", as [server] chat_template says";
    return format;
  }
  Result<text::ModelChatTemplate> loaded = setting.empty()
                                               ? text::load_model_chat_template(model_dir)
                                               : text::load_chat_template_file(setting);
  if (!loaded.ok()) {
    if (!setting.empty()) return loaded.status().WithContext("[server] chat_template");
    return Status::InvalidArgument(
        loaded.status().message() +
        " (set [server] chat_template to \"default\" or to a .jinja file to serve chat anyway)");
  }
  if (!loaded->found) {
    format.description = std::string(kDefaultChatTemplate) + ", since " +
                         (model_dir.empty() ? std::string("a preset") : model_dir) +
                         " ships no chat template";
    return format;
  }
  format.is_default = false;
  format.description = loaded->source;
  format.chat_template = std::move(loaded->chat_template);
  format.bos = loaded->bos;
  format.eos = loaded->eos;
  // A template from a file of its own: the special tokens' text from the tokenizer.
  if (tokenizer != nullptr && format.bos.empty() && tokenizer->bos_id() >= 0) {
    format.bos = tokenizer->piece(tokenizer->bos_id());
  }
  if (tokenizer != nullptr && format.eos.empty() && tokenizer->eos_id() >= 0) {
    format.eos = tokenizer->piece(tokenizer->eos_id());
  }
  return format;
}

Result<std::string> render_chat(const ChatFormat& format,
                                const std::vector<text::ChatMessage>& messages,
                                bool add_generation_prompt,
                                const text::TemplateVariables& variables) {
  if (format.is_default) return apply_default_chat_template(messages, add_generation_prompt);
  text::RenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.bos_token = format.bos;
  options.eos_token = format.eos;
  return format.chat_template.render(messages, options, variables);
}

std::optional<VariableError> read_template_variables(const nlohmann::json& kwargs,
                                                     text::TemplateVariables* out) {
  if (kwargs.is_null()) return std::nullopt;
  if (!kwargs.is_object()) return VariableError{"", "expected an object of template variables"};
  static const char* const kReserved[] = {"messages", "add_generation_prompt", "bos_token",
                                          "eos_token", "tools", "documents",
                                          "true",     "false",  "none", "True", "False", "None",
                                          "namespace", "range", "raise_exception",
                                          "strftime_now"};
  for (const auto& [name, v] : kwargs.items()) {
    for (const char* reserved : kReserved) {
      if (name == reserved) return VariableError{name, "set by the server, not by a request"};
    }
    if (v.is_object() || v.is_array() || v.is_binary()) {
      return VariableError{name, "only strings, numbers, booleans and null are passed"};
    }
    out->emplace_back(name, v);
  }
  return std::nullopt;
}

Result<std::vector<int32_t>> chat_prompt_ids(const ChatFormat& format,
                                             const text::Tokenizer& tokenizer,
                                             const std::vector<text::ChatMessage>& messages,
                                             bool add_generation_prompt,
                                             const text::TemplateVariables& variables) {
  Result<std::string> text = render_chat(format, messages, add_generation_prompt, variables);
  if (!text.ok()) return text.status();
  if (format.is_default) return tokenizer.encode(*text, /*add_special_tokens=*/true);
  std::string_view rest = *text;
  std::vector<int32_t> ids;
  const int32_t bos = tokenizer.bos_id();
  if (bos >= 0 && !format.bos.empty() && rest.substr(0, format.bos.size()) == format.bos &&
      tokenizer.encode(format.bos, false) != std::vector<int32_t>{bos}) {
    ids.push_back(bos);
    rest.remove_prefix(format.bos.size());
  }
  const std::vector<int32_t> encoded = tokenizer.encode(rest, /*add_special_tokens=*/false);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  return ids;
}

}  // namespace kvrt::api
