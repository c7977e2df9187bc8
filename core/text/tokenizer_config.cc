#include "core/text/tokenizer_config.h"

#include <nlohmann/json.hpp>

namespace kvrt::text {

namespace {

using json = nlohmann::json;

// A token setting: a string, an AddedToken object {"content": ...}, or null.
Status read_token(const json& config, const char* key, const std::string& name,
                  std::optional<std::string>* out) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return Status::Ok();
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *out = (*it)["content"].get<std::string>();
    return Status::Ok();
  }
  return Status::InvalidArgument(name + ": " + key +
                                 " is neither a string, null nor an object with a \"content\" "
                                 "string");
}

Status read_bool(const json& config, const char* key, const std::string& name,
                 std::optional<bool>* out) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Status::InvalidArgument(name + ": " + key + " is not a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

// "added_tokens_decoder": {"<id>": {"content": "...", ...}, ...}.
Status read_added_tokens_decoder(const json& config, const std::string& name,
                                 std::map<int64_t, std::string>* out) {
  const auto it = config.find("added_tokens_decoder");
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (!it->is_object())
    return Status::InvalidArgument(name + ": added_tokens_decoder is not an object");
  for (const auto& [key, token] : it->items()) {
    const std::string at = name + ": added_tokens_decoder[\"" + key + "\"]";
    // transformers writes the ids as decimal keys; anything else is no id.
    if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) {
      return Status::InvalidArgument(at + " is not a token id");
    }
    if (!token.is_object() || !token.contains("content") || !token["content"].is_string()) {
      return Status::InvalidArgument(at + " has no \"content\" string");
    }
    (*out)[std::stoll(key)] = token["content"].get<std::string>();
  }
  return Status::Ok();
}

// The template of "chat_template": a string, or the "default" of a list of named ones.
std::optional<std::string> chat_template_of(const json& c) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    for (const json& named : c) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        return named["template"].get<std::string>();
      }
    }
  }
  return std::nullopt;
}

}  // namespace

Result<TokenizerConfig> parse_tokenizer_config(std::string_view text, const std::string& name) {
  const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return Status::InvalidArgument(name + ": not valid JSON");
  if (!config.is_object()) return Status::InvalidArgument(name + ": not a JSON object");
  TokenizerConfig out;
  for (Status s :
       {read_bool(config, "add_bos_token", name, &out.add_bos_token),
        read_bool(config, "add_eos_token", name, &out.add_eos_token),
        read_bool(config, "clean_up_tokenization_spaces", name, &out.clean_up_tokenization_spaces),
        read_token(config, "bos_token", name, &out.bos_token),
        read_token(config, "eos_token", name, &out.eos_token),
        read_token(config, "tokenizer_class", name, &out.tokenizer_class),
        read_added_tokens_decoder(config, name, &out.added_tokens_decoder)}) {
    if (!s.ok()) return s;
  }
  if (const auto it = config.find("chat_template"); it != config.end()) {
    out.has_chat_template = true;
    out.chat_template = chat_template_of(*it);
  }
  return out;
}

Result<TokenizerConfig> read_tokenizer_config(const std::string& path) {
  Result<std::string> text = util::read_file(path, kTokenizerConfigFile);
  if (!text.ok()) return text.status();
  return parse_tokenizer_config(*text, path);
}

Result<TokenizerConfig> read_tokenizer_config_if_any(const std::string& path) {
  if (path.empty()) return TokenizerConfig{};
  return read_tokenizer_config(path);
}

}  // namespace kvrt::text
