// PCRE2 regexes as tokenizers' Rust regex crate runs them, and literal-or-regex patterns.
#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

namespace {

// Per-thread match state: PCRE2's compiled code is shared, match data and JIT stacks are not.
struct MatchState {
  MatchState()
      : data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        // Look-aheads over long whitespace runs recurse deeply: allow 64 MiB, reserved lazily.
        stack(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr)) {
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(const std::string& pattern,
                                                    const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument(where + ": regex /" + pattern + "/ does not compile at offset " +
                                   std::to_string(offset) + ": " +
                                   reinterpret_cast<const char*>(message));
  }
  // Without JIT (an unsupported CPU) pcre2_match interprets the same pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::shared_ptr<const Regex>(new Regex(code));
}

void Regex::find_all(std::string_view text, std::vector<Span>* out) const {
  thread_local MatchState state;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  uint32_t options = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), pos, options | PCRE2_NO_UTF_CHECK,
                               state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (options == 0 || pos == text.size()) break;
      // An empty match here and nothing longer: step over one character.
      size_t len;
      decode_utf8(text, pos, &len);
      pos += len;
      options = 0;
      continue;
    }
    // Any other failure (a match limit) leaves the rest of the text unmatched.
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) out->push_back({begin, end});
    pos = end;
    options = end == begin ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
  }
}

std::string Regex::replace_all(std::string_view text, std::string_view content) const {
  std::vector<Span> matches;
  find_all(text, &matches);
  std::string out;
  size_t at = 0;
  for (const Span& m : matches) {
    out.append(text.substr(at, m.begin - at)).append(content);
    at = m.end;
  }
  out.append(text.substr(at));
  return out;
}

void Pattern::find_all(std::string_view text, std::vector<Span>* out) const {
  if (regex) return regex->find_all(text, out);
  if (literal.empty()) return;
  for (size_t at = text.find(literal); at != std::string_view::npos;
       at = text.find(literal, at + literal.size())) {
    out->push_back({at, at + literal.size()});
  }
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  if (regex) return regex->replace_all(text, content);
  std::string out;
  if (literal.empty()) return std::string(text);
  size_t at = 0;
  for (size_t found = text.find(literal); found != std::string_view::npos;
       found = text.find(literal, at)) {
    out.append(text.substr(at, found - at)).append(content);
    at = found + literal.size();
  }
  out.append(text.substr(at));
  return out;
}

}  // namespace kvrt::text::tokenizer_json
