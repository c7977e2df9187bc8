#include "core/text/detokenizer.h"

#include <algorithm>
#include <span>

#include "core/text/utf8.h"

namespace kvrt::text {

std::vector<int32_t> TextStream::window(const std::vector<int32_t>& ids, size_t from) const {
  std::vector<int32_t> w;
  if (from < context_.size())
    w.assign(context_.begin() + static_cast<ptrdiff_t>(from), context_.end());
  const size_t skip = from > context_.size() ? from - context_.size() : 0;
  w.insert(w.end(), ids.begin() + static_cast<ptrdiff_t>(skip), ids.end());
  return w;
}

const std::string& TextStream::update(const std::vector<int32_t>& ids) {
  const size_t total = context_.size() + ids.size();
  if (tokenizer_ == nullptr || total <= read_) return text_;
  const std::vector<int32_t> w = window(ids, prefix_);
  const std::span<const int32_t> all(w);
  const std::string before = tokenizer_->decode(all.first(read_ - prefix_));
  const std::string now = tokenizer_->decode(all);
  if (now.size() <= before.size() || now.compare(0, before.size(), before) != 0) return text_;
  const std::string_view fresh = std::string_view(now).substr(before.size());
  // A character cut between tokens: an incomplete sequence, or the decoder's U+FFFD for one.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (!text::valid_utf8(fresh) ||
      (fresh.size() >= 3 && fresh.substr(fresh.size() - 3) == kReplacement)) {
    return text_;
  }
  text_.append(fresh);
  prefix_ = read_;
  read_ = total;
  return text_;
}

std::string TextStream::finish(const std::vector<int32_t>& ids) const {
  if (tokenizer_ == nullptr) return text_;
  const std::string head = tokenizer_->decode(context_);
  std::string whole = tokenizer_->decode(window(ids, 0));
  // A context whose last character the output completes: the output alone.
  if (whole.compare(0, head.size(), head) != 0) return tokenizer_->decode(ids);
  return whole.substr(head.size());
}

size_t find_stop(std::string_view text, const std::vector<std::string>& stops,
                 std::string* matched) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stops) {
    const size_t at = text.find(s);
    if (at < best) {
      best = at;
      if (matched != nullptr) *matched = s;
    }
  }
  return best;
}

size_t stop_safe_length(std::string_view text, const std::vector<std::string>& stops) {
  size_t safe = text.size();
  for (const std::string& stop : stops) {
    // The longest proper prefix of `stop` that `text` ends with.
    for (size_t n = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size()); n > 0; --n) {
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        safe = std::min(safe, text.size() - n);
        break;
      }
    }
  }
  return safe;
}

OutputText::OutputText(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                       std::vector<std::string> stop)
    // The prompt's last ids, as vLLM's incremental detokenizer starts from them.
    : stream_(tokenizer, std::vector<int32_t>(prompt.end() - std::min<size_t>(prompt.size(), 4),
                                              prompt.end())),
      stop_(std::move(stop)) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

bool OutputText::update(const std::vector<int32_t>& output_ids) {
  if (ended_) return !matched_.empty();
  const size_t searched = text_.size();
  text_ = stream_.update(output_ids);
  if (stop_.empty()) return false;
  // Only where a stop string could newly end: the fresh text and the bytes before it.
  const size_t from = searched >= longest_stop_ ? searched - longest_stop_ + 1 : 0;
  const size_t at = find_stop(std::string_view(text_).substr(from), stop_, &matched_);
  if (at == std::string::npos) return false;
  text_.resize(from + at);
  ended_ = true;
  return true;
}

void OutputText::finish(const std::vector<int32_t>& output_ids) {
  if (ended_) return;
  ended_ = true;
  text_ = stream_.finish(output_ids);
}

std::string OutputText::take() {
  const size_t shown = ended_ ? text_.size() : stop_safe_length(text_, stop_);
  if (shown <= sent_) return "";
  std::string piece = text_.substr(sent_, shown - sent_);
  sent_ = shown;
  return piece;
}

}  // namespace kvrt::text
