#include "core/model/generation_config.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/util/file.h"

namespace kvrt::model {

using nlohmann::json;

namespace {

constexpr util::FileKind kGenerationConfigFile{"generation_config.json", 16 * util::kMiB};

}  // namespace

namespace {

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

}  // namespace

Result<GenerationConfig> read_generation_config(std::string_view text, const std::string& source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::ConfigError(source + ": expected a JSON object");
  }
  auto bad = [&](const char* key, const std::string& want) {
    return Status::ConfigError(source + ": " + key + ": expected " + want + ", found " +
                               shown(j[key]));
  };
  // A present key whose value is null is unset, as transformers writes it.
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  GenerationConfig g;
  g.path = source;
  // Each number with the range the serving core accepts, so a default can never be the reason a
  // request is refused.
  struct Real {
    const char* key;
    std::optional<double>* out;
    bool (*in_range)(double);
    const char* want;
  };
  const Real reals[] = {
      {"temperature", &g.temperature, [](double x) { return x >= 0; }, "a number >= 0"},
      {"top_p", &g.top_p, [](double x) { return x > 0 && x <= 1; }, "a number in (0, 1]"},
      {"min_p", &g.min_p, [](double x) { return x >= 0 && x <= 1; }, "a number in [0, 1]"},
      {"repetition_penalty", &g.repetition_penalty, [](double x) { return x > 0; }, "a number > 0"},
  };
  for (const Real& r : reals) {
    if (!present(r.key)) continue;
    const json& v = j[r.key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !r.in_range(v.get<double>())) {
      return bad(r.key, r.want);
    }
    *r.out = v.get<double>();
  }
  if (present("top_k")) {
    const json& v = j["top_k"];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX) {
      return bad("top_k", "an integer, -1 or 0 (every token) or more");
    }
    g.top_k = v.get<int64_t>();
  }
  if (present("max_new_tokens")) {
    const json& v = j["max_new_tokens"];
    // A default of 0 would answer every request that sets no length with nothing.
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > INT32_MAX) {
      return bad("max_new_tokens", "an integer >= 1");
    }
    g.max_new_tokens = v.get<int64_t>();
  }
  if (present("do_sample")) {
    if (!j["do_sample"].is_boolean()) return bad("do_sample", "true or false");
    g.do_sample = j["do_sample"].get<bool>();
  }
  return g;
}

Result<GenerationConfig> load_generation_config(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationConfig{};
  Result<std::string> text = util::read_file(path, kGenerationConfigFile);
  if (!text.ok()) return text.status();
  return read_generation_config(*text, path);
}

}  // namespace kvrt::model
