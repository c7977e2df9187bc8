// Reading a request body's JSON the way every API of kvrt serve does: an object, valid UTF-8,
// nothing after it; fields by type, unknown ones refused by name; a refusal names its field.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/api/protocol.h"

namespace kvrt::api {

// A 400 naming `param` ("param: message"; the message alone when param is "").
ApiError bad(const std::string& param, const std::string& message);
// "a number", "a list", ...: what a value is, for refusals.
std::string type_name(const nlohmann::json& v);

// A list of token ids, each inside the vocabulary when `vocab` > 0 (a generation's ids are the
// serving core's to check).
std::variant<std::vector<int32_t>, ApiError> read_ids(const nlohmann::json& v,
                                                      const std::string& param, int32_t vocab);

// A message's content: a string, or a list of text parts (whose type is one of `types`) joined
// with newlines, as vLLM renders them for a text-only template. `at` names the content in
// errors, `only` ends the refusal of another part type; `strict`: a part's other fields are
// refused.
std::variant<std::string, ApiError> text_content(const nlohmann::json& c, const std::string& at,
                                                 std::initializer_list<std::string_view> types,
                                                 const char* only, bool strict);

// A JSON object body, valid UTF-8, or the error (a number beyond a double's refused naming the
// field it was read for).
std::variant<nlohmann::json, ApiError> read_object(std::string_view body);

// The fields of `j` outside `known`, refused by name.
std::optional<ApiError> unknown_field(const nlohmann::json& j,
                                      std::initializer_list<const char*> known);

// A field accepted when absent, null or as `accepts` says; else refused with `why`.
struct FieldRule {
  const char* key;
  bool (*accepts)(const nlohmann::json&);
  const char* why;
};
std::optional<ApiError> refused_field(const nlohmann::json& j, std::span<const FieldRule> rules);
// For a field of which only null (or absence) is accepted.
bool never(const nlohmann::json&);

// The fields SGLang's and OpenAI's clients send with their "nothing" value, accepted as such;
// any other value asks for what kvrt does not do, refused by name.
std::optional<ApiError> no_op(const nlohmann::json& j);

// An error of the /generate request an OpenAI call was mapped to, naming the call's own field:
// the first of `names` whose /generate prefix the param starts with is replaced.
ApiError renamed(ApiError error,
                 std::initializer_list<std::pair<const char*, const char*>> names);

// j[key] into *out when it is a boolean; absent or null leaves *out.
std::optional<ApiError> read_bool(const nlohmann::json& j, const char* key, bool* out);

}  // namespace kvrt::api
