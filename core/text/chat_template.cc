// ChatTemplate's entry points (the engine is in jinja/: lexer, parser, renderer, filters), and
// where a model's template is found: chat_template.jinja or tokenizer_config.json.
#include "core/text/chat_template.h"

#include <filesystem>
#include <utility>

#include "core/text/jinja/jinja.h"
#include "core/text/tokenizer_config.h"
#include "core/util/file.h"

namespace kvrt::text {

namespace {

using jinja::Function;
using jinja::Value;

uint64_t input_bytes(const std::vector<ChatMessage>& messages, const RenderOptions& o) {
  uint64_t n = o.bos_token.size() + o.eos_token.size();
  for (const ChatMessage& m : messages) n += m.role.size() + m.content.size();
  return n;
}

uint64_t variable_bytes(const TemplateVariables& variables) {
  uint64_t n = 0;
  for (const auto& [name, v] : variables) {
    n += name.size() + (v.is_string() ? v.get_ref<const std::string&>().size() : 8);
  }
  return n;
}

Value global_function(Function::Kind kind) {
  auto f = std::make_shared<Function>();
  f->kind = kind;
  return Value::function(std::move(f));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  Result<std::vector<jinja::Token>> tokens = jinja::lex(source);
  if (!tokens.ok()) return tokens.status();
  Result<jinja::Body> body = jinja::parse(source, std::move(*tokens));
  if (!body.ok()) return body.status();
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->body = std::move(*body);
  ChatTemplate t;
  t.program_ = std::move(program);
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const RenderOptions& options,
                                         const TemplateVariables& variables) const {
  using jinja::Env;
  using jinja::Flow;
  using jinja::List;
  using jinja::Renderer;
  if (!program_) return Status::InvalidArgument("no chat template");
  const uint64_t steps = jinja::kBaseSteps + jinja::kStepsPerMessage * messages.size();
  const uint64_t bytes =
      jinja::kBaseBytes + jinja::kBytesPerInputByte * (input_bytes(messages, options) +
                                                       variable_bytes(variables));
  Renderer r(options, steps, bytes);
  r.set_step_budget(steps);
  r.set_byte_budget(bytes);
  Env* globals = r.new_env(nullptr);
  globals->set("true", Value::boolean(true));
  globals->set("false", Value::boolean(false));
  globals->set("none", Value::none());
  globals->set("True", Value::boolean(true));
  globals->set("False", Value::boolean(false));
  globals->set("None", Value::none());
  globals->set("namespace", global_function(Function::Kind::kNamespace));
  globals->set("range", global_function(Function::Kind::kRange));
  globals->set("raise_exception", global_function(Function::Kind::kRaise));
  globals->set("strftime_now", global_function(Function::Kind::kStrftime));
  List list;
  for (const ChatMessage& m : messages) {
    list.push_back(
        Value::dict({{"role", Value::string(m.role)}, {"content", Value::string(m.content)}}));
  }
  globals->set("messages", Value::list(std::move(list)));
  globals->set("bos_token", Value::string(options.bos_token));
  globals->set("eos_token", Value::string(options.eos_token));
  globals->set("add_generation_prompt", Value::boolean(options.add_generation_prompt));
  for (const auto& [name, v] : variables) {
    if (v.is_boolean()) {
      globals->set(name, Value::boolean(v.get<bool>()));
    } else if (v.is_number_integer()) {
      globals->set(name, Value::integer(v.get<int64_t>()));
    } else if (v.is_number()) {
      globals->set(name, Value::number(v.get<double>()));
    } else if (v.is_string()) {
      globals->set(name, Value::string(v.get<std::string>()));
    } else if (v.is_null()) {
      globals->set(name, Value::none());
    } else {
      return Status::InvalidArgument("template variable '" + name +
                                     "': only strings, numbers, booleans and null");
    }
  }
  std::string out;
  Flow flow = Flow::kNormal;
  if (Status s = r.render(program_->body, r.new_env(globals), &out, &flow); !s.ok()) return s;
  return out;
}

namespace {

// The template of a tokenizer_config.json read as `cfg`, or why there is none.
Result<std::string> config_template(const TokenizerConfig& cfg, const std::string& path) {
  if (cfg.chat_template) return *cfg.chat_template;
  return Status::InvalidArgument(path +
                                 ": chat_template is neither a string nor a list holding a "
                                 "\"default\" template");
}

// Parses t->source's text and renders a one-message conversation with it: a template that
// fails on that would fail every request.
Status finish(ModelChatTemplate* t, const std::string& text) {
  Result<ChatTemplate> parsed = ChatTemplate::parse(text);
  if (!parsed.ok()) return parsed.status().WithContext(t->source);
  RenderOptions options;
  options.bos_token = t->bos;
  options.eos_token = t->eos;
  Result<std::string> trial = parsed->render({{"user", "hi"}}, options);
  if (!trial.ok()) return trial.status().WithContext(t->source + " (rendering one user message)");
  t->chat_template = std::move(*parsed);
  t->found = true;
  return Status::Ok();
}

}  // namespace

Result<ModelChatTemplate> load_model_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ModelChatTemplate t;
  if (model_dir.empty()) return t;
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  TokenizerConfig cfg;
  if (fs::exists(config, ec)) {
    Result<TokenizerConfig> read = read_tokenizer_config(config.string());
    if (!read.ok()) return read.status();
    cfg = std::move(*read);
  }
  t.bos = cfg.bos_token.value_or("");
  t.eos = cfg.eos_token.value_or("");
  std::string text;
  if (fs::exists(jinja, ec)) {
    Result<std::string> read = util::read_file(jinja.string(), kTokenizerConfigFile);
    if (!read.ok()) return read.status();
    text = std::move(*read);
    t.source = jinja.string();
  } else if (cfg.has_chat_template) {
    Result<std::string> c = config_template(cfg, config.string());
    if (!c.ok()) return c.status();
    text = std::move(*c);
    t.source = config.string() + " (chat_template)";
  } else {
    return t;
  }
  if (Status s = finish(&t, text); !s.ok()) return s;
  return t;
}

Result<ModelChatTemplate> load_chat_template_file(const std::string& path) {
  namespace fs = std::filesystem;
  ModelChatTemplate t;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return Status::NotFound(path + ": no such chat template file");
  }
  const bool is_config = fs::path(path).extension() == ".json";
  const fs::path beside =
      is_config ? fs::path(path) : fs::path(path).parent_path() / "tokenizer_config.json";
  TokenizerConfig cfg;
  if (is_config || fs::exists(beside, ec)) {
    Result<TokenizerConfig> read = read_tokenizer_config(beside.string());
    if (!read.ok()) return read.status();
    cfg = std::move(*read);
  }
  t.bos = cfg.bos_token.value_or("");
  t.eos = cfg.eos_token.value_or("");
  std::string text;
  if (is_config) {
    if (!cfg.has_chat_template) return Status::InvalidArgument(path + ": holds no chat_template");
    Result<std::string> c = config_template(cfg, path);
    if (!c.ok()) return c.status();
    text = std::move(*c);
    t.source = path + " (chat_template)";
  } else {
    Result<std::string> read = util::read_file(path, kTokenizerConfigFile);
    if (!read.ok()) return read.status();
    text = std::move(*read);
    t.source = path;
  }
  if (Status s = finish(&t, text); !s.ok()) return s;
  return t;
}

}  // namespace kvrt::text
