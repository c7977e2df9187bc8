#include "core/cli/tokenize.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "core/api/chat_prompt.h"
#include "core/api/prompt.h"
#include "core/text/tokenizer.h"
#include "core/util/file.h"

namespace kvrt::cli {

namespace {

constexpr util::FileKind kPromptFile{"prompt file", 64 * util::kMiB};

using nlohmann::json;

int fail(const std::string& command, const std::string& why) {
  std::cerr << "kvrt " << command << ": " << why << "\n";
  return 1;
}

// The ids of --messages: the directory's chat template rendered and tokenized as
// apply_chat_template does.
Result<std::vector<int32_t>> chat_ids(const TokenizeArgs& args, const text::Tokenizer& tokenizer) {
  Result<std::string> text = util::read_file(*args.messages, kPromptFile);
  if (!text.ok()) return text.status();
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(*args.messages + ": not valid JSON");
  auto messages = api::read_chat_messages(json{{"messages", j}});
  if (auto* e = std::get_if<api::ApiError>(&messages)) {
    return Status::InvalidArgument(*args.messages + ": " + e->message);
  }
  text::TemplateVariables variables;
  if (args.chat_template_kwargs) {
    const json kwargs = json::parse(*args.chat_template_kwargs, nullptr, false);
    if (kwargs.is_discarded()) {
      return Status::InvalidArgument("--chat-template-kwargs: not valid JSON");
    }
    if (auto e = api::read_template_variables(kwargs, &variables)) {
      return Status::InvalidArgument(e->at("--chat-template-kwargs") + ": " + e->why);
    }
  }
  Result<api::ChatFormat> format = api::resolve_chat_format("", args.dir, &tokenizer);
  if (!format.ok()) return format.status();
  if (format->is_default)
    std::cerr << "kvrt tokenize: chat template: " << format->description << "\n";
  return api::chat_prompt_ids(*format, tokenizer,
                              std::get<std::vector<text::ChatMessage>>(messages),
                              !args.no_generation_prompt, variables);
}

}  // namespace

int run_tokenize(const TokenizeArgs& args) {
  const int given = args.text.has_value() + args.file.has_value() + args.messages.has_value();
  if (given != 1) return fail("tokenize", "give exactly one of --text, --file and --messages");
  if (args.messages && args.add_special_tokens) {
    return fail("tokenize",
                "--add-special-tokens is for --text and --file: the chat template writes a "
                "conversation's special tokens itself");
  }
  if (args.no_generation_prompt && !args.messages) {
    return fail("tokenize", "--no-generation-prompt is for --messages");
  }
  if (args.chat_template_kwargs && !args.messages) {
    return fail("tokenize", "--chat-template-kwargs is for --messages");
  }
  Result<std::unique_ptr<text::Tokenizer>> tokenizer = text::load_model_tokenizer(args.dir);
  if (!tokenizer.ok()) return fail("tokenize", tokenizer.status().message());
  std::vector<int32_t> ids;
  if (args.messages) {
    Result<std::vector<int32_t>> chat = chat_ids(args, **tokenizer);
    if (!chat.ok()) return fail("tokenize", chat.status().message());
    ids = std::move(*chat);
  } else {
    std::string text;
    if (args.file) {
      Result<std::string> bytes = util::read_file(*args.file, kPromptFile);
      if (!bytes.ok()) return fail("tokenize", bytes.status().message());
      text = std::move(*bytes);
    } else {
      text = *args.text;
    }
    ids = (*tokenizer)->encode(text, args.add_special_tokens);
  }
  if (args.json) {
    std::cout << json{{"ids", ids}}.dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

int run_detokenize(const DetokenizeArgs& args) {
  Result<std::unique_ptr<text::Tokenizer>> tokenizer = text::load_model_tokenizer(args.dir);
  if (!tokenizer.ok()) return fail("detokenize", tokenizer.status().message());
  const int32_t vocab = (*tokenizer)->vocab_size();
  for (int32_t id : args.ids) {
    if (id < 0 || id >= vocab) {
      return fail("detokenize", "--ids: " + std::to_string(id) + " is outside the vocabulary [0, " +
                                    std::to_string(vocab) + ") of " + args.dir);
    }
  }
  text::DecodeOptions options;
  options.skip_special_tokens = args.skip_special_tokens;
  const std::string text = (*tokenizer)->decode(args.ids, options);
  if (args.json) {
    std::cout << api::to_text(json{{"text", text}}) << "\n";
  } else {
    std::cout << text << "\n";
  }
  return 0;
}

}  // namespace kvrt::cli
