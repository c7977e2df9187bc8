#include "core/eval/corpus.h"

#include <charconv>

namespace kvrt::eval {

Result<std::vector<int32_t>> parse_token_ids(std::string_view text, const std::string& path,
                                             int64_t vocab) {
  const auto separator = [](char c) {
    return c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t';
  };
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (separator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && !separator(text[end])) ++end;
    const std::string_view word(text.data() + i, end - i);
    int64_t id = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || ptr != word.data() + word.size()) {
      return Status::InvalidArgument(path + ": token " + std::to_string(ids.size() + 1) + " '" +
                                     std::string(word.substr(0, 32)) + "' is not an integer id");
    }
    if (id < 0 || id >= vocab) {
      return Status::OutOfRange(path + ": token " + std::to_string(ids.size() + 1) + " is id " +
                                std::to_string(id) + ", outside the model's vocabulary 0.." +
                                std::to_string(vocab - 1));
    }
    ids.push_back(static_cast<int32_t>(id));
    i = end;
  }
  return ids;
}

}  // namespace kvrt::eval
