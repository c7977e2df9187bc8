#include "core/exec/batch.h"

#include <string>

namespace kvrt::exec {

void serialize(const Batch& batch, std::vector<int32_t>* out) {
  out->clear();
  out->push_back(static_cast<int32_t>(batch.sequences.size()));
  for (const SequenceStep& s : batch.sequences) {
    out->push_back(s.start);
    out->push_back(static_cast<int32_t>(s.tokens.size()));
    out->insert(out->end(), s.tokens.begin(), s.tokens.end());
    out->push_back(static_cast<int32_t>(s.pages.size()));
    out->insert(out->end(), s.pages.begin(), s.pages.end());
    out->push_back(s.all_logits ? 1 : 0);
  }
}

Status deserialize(std::span<const int32_t> words, Batch* batch) {
  size_t at = 0;
  auto bad = [&](const char* what) {
    return Status::InvalidArgument("serialised batch: " + std::string(what) + " at word " +
                                   std::to_string(at) + " of " + std::to_string(words.size()));
  };
  auto next_count = [&](int32_t* n) {
    if (at >= words.size() || words[at] < 0) return false;
    *n = words[at++];
    return static_cast<size_t>(*n) <= words.size() - at;
  };
  int32_t sequences = 0;
  if (!next_count(&sequences)) return bad("bad sequence count");
  batch->sequences.resize(static_cast<size_t>(sequences));
  for (SequenceStep& s : batch->sequences) {
    if (at >= words.size()) return bad("missing start");
    s.start = words[at++];
    int32_t n = 0;
    if (!next_count(&n)) return bad("bad token count");
    s.tokens.assign(words.begin() + at, words.begin() + at + n);
    at += static_cast<size_t>(n);
    if (!next_count(&n)) return bad("bad page count");
    s.pages.assign(words.begin() + at, words.begin() + at + n);
    at += static_cast<size_t>(n);
    if (at >= words.size() || (words[at] != 0 && words[at] != 1)) return bad("bad all_logits");
    s.all_logits = words[at++] == 1;
  }
  if (at != words.size()) return bad("trailing words");
  return Status::Ok();
}

}  // namespace kvrt::exec
