#include "core/model/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/util/file.h"

namespace kvrt::model {

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
        read_token(config, "eos_token", name, &out.eos_token)}) {
    if (!s.ok()) return s;
  }
  return out;
}

Result<TokenizerConfig> read_tokenizer_config(const std::string& path) {
  Result<std::string> text = util::read_file(path, util::kTokenizerConfigFile);
  if (!text.ok()) return text.status();
  return parse_tokenizer_config(*text, path);
}

Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view, std::string_view,
                                                      const std::string& name) {
  return Status::Unsupported(name + ": tokenizer.json is not supported yet");
}

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& json_path,
                                                     const std::string& config_path) {
  Result<std::string> text = util::read_file(json_path, util::kTokenizerFile);
  if (!text.ok()) return text.status();
  std::string config_text;
  if (!config_path.empty()) {
    Result<std::string> c = util::read_file(config_path, util::kTokenizerConfigFile);
    if (!c.ok()) return c.status();
    config_text = std::move(*c);
  }
  return parse_hf_tokenizer(*text, config_text, json_path);
}

}  // namespace kvrt::model
