// A model directory's chat template (tokenizer_config.json's "chat_template", or
// chat_template.jinja), rendered as Hugging Face's own JavaScript engine (@huggingface/jinja,
// which transformers.js uses) renders it, checked against it on the fixtures in
// tests/data/chat_templates. Like transformers, templates are read with trim_blocks and
// lstrip_blocks, the trailing newline dropped and {% generation %} tags removed.
//
// Statements: {% if/elif/else %}, {% for x in xs [if cond] %} with tuple targets, {% else %} and
// break/continue, loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem,
// {% set x = e %}, {% set a, b = e %}, {% set ns.attr = e %}, {% set x %}...{% endset %},
// {% macro name(a, b=default) %} (varargs, kwargs) called as name(...), {# comments #} and "-"
// whitespace control. Expressions: string/integer/float literals, lists, tuples, dicts, names,
// a.b, a[k], slices a[start:stop:step], calls with keyword arguments, + - * / // % ** ~,
// comparisons, in / not in, and / or / not, x if c else y, filters (safe tojson list first last
// length count reverse sort join string unique upper lower title capitalize trim indent int
// float abs items default d replace select reject selectattr rejectattr map(attribute=)
// dictsort), tests (is [not] defined undefined none string number integer boolean mapping
// sequence iterable callable odd even true false lower upper), string methods (strip lstrip
// rstrip with characters, split, startswith endswith with a string or a list, replace, upper
// lower title capitalize), dict methods (get items keys values dictsort), and the globals
// namespace(), range(), raise_exception() and strftime_now().
//
// Where the reference and Python's Jinja differ, kvrt follows the reference, except: strip,
// lstrip and rstrip honour their characters argument (the reference ignores it and strips
// whitespace; Python's str methods, which transformers runs, honour it); length and indexing
// count code points (the reference counts UTF-16 units: a character outside the BMP counts 2
// there); upper/lower/title change ASCII letters only (the reference maps all of Unicode);
// looping over an undefined value loops zero times (the reference raises); tojson(sort_keys)
// sorts keys by bytes (the reference by locale). strftime_now formats
// RenderOptions::now_unix_seconds (the current time when negative) in UTC, with %Y %m %d %b %B
// %H %M %% as the reference does.
//
// Anything else (another statement, filter, test, method or global function) is refused when
// the template is parsed, with the construct and its line and byte offset. Rendering is bounded
// (steps, bytes made, macro call depth, value nesting, range() size): a template that exceeds a
// bound is an error naming it, never a hang or an exhausted memory.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"

namespace kvrt::text {

struct ChatMessage {
  std::string role, content;
};

// A variable a caller hands the template beside the messages (SGLang's and vLLM's
// chat_template_kwargs: Kimi's `thinking`, Qwen3's `enable_thinking`): a string, a number, a
// boolean or none, as JSON.
using TemplateVariables = std::vector<std::pair<std::string, nlohmann::json>>;

// What a template sees besides the messages, as transformers' apply_chat_template passes it.
struct RenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  // The time strftime_now() formats, in seconds since 1970 UTC; negative: now.
  int64_t now_unix_seconds = -1;
};

class ChatTemplate {
 public:
  ChatTemplate() = default;  // renders nothing until parsed
  // Parses `source`; a syntax error or a construct kvrt cannot render is an error naming it
  // with its line and byte offset in `source`.
  static Result<ChatTemplate> parse(std::string_view source);

  // The prompt for `messages` (each {"role", "content"} as strings). A template's
  // raise_exception('why') is an error carrying "why"; an operation on values that the reference
  // refuses (e.g. undefined + string) or a bound exceeded is an error naming it. Thread-safe:
  // a parsed template is immutable and each call renders in a context of its own.
  // `variables` are globals besides those (chat_template_kwargs): scalars only, and none of
  // the names set here.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const RenderOptions& options = {},
                             const TemplateVariables& variables = {}) const;

  struct Program;

 private:
  std::shared_ptr<const Program> program_;
};

// A chat template found on disk, with the bos_token and eos_token of the tokenizer_config.json
// beside it. `found` false when the directory has none.
struct ModelChatTemplate {
  bool found = false;
  std::string source;  // the file it came from
  ChatTemplate chat_template;
  std::string bos, eos;
};

// The chat template of a model directory: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} from which "default" is taken).
// `found` false when the directory has neither; an error naming the file when it has one that
// cannot be read, or that kvrt refuses (the construct and its offset) or cannot render a
// one-message conversation with.
Result<ModelChatTemplate> load_model_chat_template(const std::string& model_dir);

// The chat template in a file ([server] chat_template = "path"): a tokenizer_config.json (a
// file whose name ends in .json, read as above) or a template's own text (a .jinja file, say),
// with bos / eos from a tokenizer_config.json beside it when there is one. An error names the
// file when it is missing, holds no template, or holds one kvrt refuses.
Result<ModelChatTemplate> load_chat_template_file(const std::string& path);

}  // namespace kvrt::text
