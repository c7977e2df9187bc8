// Post-processors: what add_special_tokens puts around a text (TemplateProcessing, Bert and
// Roberta processing; ByteLevel's offsets need nothing).
#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

namespace {

Status read_one_post_processor(const Reader& r, const json& j, const std::string& key,
                               const std::string& type, int32_t vocab_size,
                               std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "TemplateProcessing") {
    const auto single = j.find("single");
    const auto specials = j.find("special_tokens");
    if (single == j.end() || !single->is_array())
      return r.invalid(key + ".single", "is not a list");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string at = key + ".single[" + std::to_string(i) + "]";
      if (item.contains("Sequence")) {
        const json& seq = item["Sequence"];
        if (!seq.contains("id") || seq["id"] != "A" || seen_sequence) {
          return r.unsupported(at + ".Sequence", seq.dump() + " (a single text is sequence A)");
        }
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return r.invalid(at,
                         "is neither {\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (specials == j.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return r.invalid(at, "names \"" + name + "\", which " + key +
                                 ".special_tokens does not list with its ids");
      }
      for (const json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          return r.invalid(key + ".special_tokens[\"" + name + "\"].ids", "holds an invalid id");
        }
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    }
    prefix->insert(prefix->begin(), before.begin(), before.end());
    suffix->insert(suffix->end(), after.begin(), after.end());
    return Status::Ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}: cls A sep.
    int32_t ids[2];
    const char* fields[2] = {"cls", "sep"};
    for (int k = 0; k < 2; ++k) {
      const auto it = j.find(fields[k]);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer() ||
          (*it)[1].get<int64_t>() < 0 || (*it)[1].get<int64_t>() >= vocab_size) {
        return r.invalid(key + "." + fields[k], "is not [token, id]");
      }
      ids[k] = (*it)[1].get<int32_t>();
    }
    prefix->insert(prefix->begin(), ids[0]);
    suffix->push_back(ids[1]);
    return Status::Ok();
  }
  return r.unsupported(key + ".type", "\"" + type + "\"");
}

}  // namespace

Status read_post_processor(const Reader& r, const json& j, const std::string& key,
                           int32_t vocab_size, std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix) {
  return r.read_flattened(
      j, key, "processors", [&](const json& part, const std::string& at, const std::string& type) {
        return read_one_post_processor(r, part, at, type, vocab_size, prefix, suffix);
      });
}

}  // namespace kvrt::text::tokenizer_json
