// The BPE model: the vocabulary and merges of tokenizer.json's "model", and a word merged pair
// by pair, lowest rank first (with byte_fallback, unk and a cache of words).
#include <algorithm>
#include <cstdio>
#include <queue>
#include <tuple>

#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

Status BpeModel::read(const json& model, const Reader& r, std::vector<std::string>* pieces) {
  if (!model.is_object()) return r.invalid("model", "is not an object");
  // Files from before "type" existed are BPE when they have merges.
  std::string type = "BPE";
  if (model.contains("type")) {
    if (Status s = r.get_string(model, "type", "model", &type); !s.ok()) return s;
  } else if (!model.contains("merges")) {
    return r.unsupported("model", "without a \"type\" or \"merges\"");
  }
  if (type != "BPE") return r.unsupported("model.type", "\"" + type + "\" (kvrt reads BPE)");
  if (const auto it = model.find("dropout");
      it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
    return r.unsupported("model.dropout", it->dump());
  }
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    return r.invalid("model.vocab", "is not an object");
  int32_t max_id = -1;
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return r.invalid("model.vocab[\"" + token + "\"]", "is not a token id");
    }
    vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  pieces->resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) (*pieces)[id] = token;

  for (auto [field, out] : {std::pair("continuing_subword_prefix", &continuing_subword_prefix_),
                            std::pair("end_of_word_suffix", &end_of_word_suffix_)}) {
    const auto it = model.find(field);
    if (it == model.end() || it->is_null()) continue;
    if (!it->is_string()) return r.invalid(std::string("model.") + field, "is not a string");
    *out = it->get<std::string>();
  }
  for (auto [field, out] :
       {std::pair("fuse_unk", &fuse_unk_), std::pair("byte_fallback", &byte_fallback_),
        std::pair("ignore_merges", &ignore_merges_)}) {
    if (Status s = r.get_bool(model, field, "model", out); !s.ok()) return s;
  }
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) return r.invalid("model.unk_token", "is not a string");
    const auto found = vocab_.find(it->get<std::string>());
    if (found == vocab_.end()) return r.invalid("model.unk_token", "is not in model.vocab");
    unk_id_ = found->second;
  }
  byte_ids_.fill(-1);
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (const auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) {
        byte_ids_[b] = it->second;
      }
    }
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return r.invalid("model.merges", "is not a list");
  }
  merges_.reserve(merges->size());
  std::string merged;
  std::string_view a, b;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& m = (*merges)[rank];
    const auto key = [rank] { return "model.merges[" + std::to_string(rank) + "]"; };
    if (m.is_string()) {
      // "a b": exactly one space, as the reference requires.
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return r.invalid(key(), "is not \"a b\"");
      }
      a = std::string_view(line).substr(0, space);
      b = std::string_view(line).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      return r.invalid(key(), "is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    const bool prefixed =
        b.compare(0, continuing_subword_prefix_.size(), continuing_subword_prefix_) == 0;
    merged.assign(a).append(b.substr(prefixed ? continuing_subword_prefix_.size() : 0));
    const auto im = vocab_.find(merged);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      return r.invalid(key(), "merges tokens that are not in model.vocab");
    }
    merges_.insert_or_assign(pair_key(ia->second, ib->second),
                             std::pair(static_cast<int32_t>(rank), im->second));
  }
  return Status::Ok();
}

void BpeModel::tokenize_word(const std::string& word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (cache_.append(word, ids)) return;
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  int32_t unk = -1;  // a pending unknown (fuse_unk joins consecutive ones)
  std::string s;
  for (size_t i = 0; i < word.size();) {
    size_t len;
    decode_utf8(word, i, &len);
    s.assign(word, i, len);
    if (i > 0) s.insert(0, continuing_subword_prefix_);
    if (i + len == word.size()) s += end_of_word_suffix_;
    i += len;
    if (const auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk >= 0) add(unk);
      unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : s) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk >= 0 && !fuse_unk_) add(unk);
      unk = unk_id_;
    }
  }
  if (unk >= 0) add(unk);
  if (!symbols.empty()) symbols.back().next = -1;

  // Lowest rank first, then leftmost; entries whose pair has changed since are skipped.
  using Merge = std::tuple<int32_t, int32_t, int32_t>;  // rank, position, new id
  std::priority_queue<Merge, std::vector<Merge>, std::greater<>> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
        it != merges_.end()) {
      queue.emplace(it->second.first, pos, it->second.second);
    }
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push(pos);
  while (!queue.empty()) {
    const auto [rank, pos, new_id] = queue.top();
    queue.pop();
    Symbol& left = symbols[pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.second != new_id) continue;
    left.id = new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    if (left.prev >= 0) push(left.prev);
    push(pos);
  }
  const size_t first = ids->size();
  for (const Symbol& sym : symbols) {
    if (!sym.removed) ids->push_back(sym.id);
  }
  cache_.remember(word, *ids, first);
}

}  // namespace kvrt::text::tokenizer_json
