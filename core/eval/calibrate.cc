#include "core/eval/calibrate.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/eval/subject.h"
#include "core/util/file.h"

namespace kvrt::eval {
namespace {

std::string number(double v) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

}  // namespace

Result<Calibration> calibrate(const EvalOptions& options, const std::string& store, double margin) {
  if (store != "kv_fp8_e4m3") {
    return Status::InvalidArgument("--calibrate " + store +
                                   ": only kv_fp8_e4m3 reads calibrated scales");
  }
  if (!(margin >= 1.0) || !std::isfinite(margin)) {
    return Status::InvalidArgument("--margin " + number(margin) + ": expected at least 1");
  }
  std::vector<std::string> overrides = options.overrides;
  overrides.push_back("tp.size=1");
  std::vector<std::unique_ptr<Subject>> subjects;
  Result<std::unique_ptr<Subject>> s =
      build_subject(options.config_path, overrides, {"kv_f32_paged", "kv_f32_paged", {}});
  if (!s.ok()) return s.status();
  subjects.push_back(std::move(*s));
  Subject& subject = *subjects[0];
  Result<Windows> windows = load_windows(options.corpus, subject.rt, options.ctx);
  if (!windows.ok()) return windows.status();
  Result<size_t> group = windows_at_once(subjects, windows->ctx);
  if (!group.ok()) return group.status();

  exec::Engine& engine = *subject.rt.engine;
  const plugin::KvStore& kv = engine.store();
  const kvrt_kv_geometry& g = kv.geometry();
  Calibration c;
  c.model = subject.rt.model_name;
  c.corpus = windows->source;
  c.store = store;
  c.margin = margin;
  c.k_amax.assign(g.num_layers, std::vector<double>(g.num_kv_heads, 0.0));
  c.v_amax = c.k_amax;
  const size_t k_row = size_t{g.num_kv_heads} * g.k_head_dim;
  const size_t v_row = size_t{g.num_kv_heads} * g.v_head_dim;
  const uint32_t page = engine.page_size();
  const auto pages_each = static_cast<int64_t>((windows->ctx + page - 1) / page);
  for (size_t first = 0; first < windows->count(); first += *group) {
    const size_t n = std::min(*group, windows->count() - first);
    // The windows as one prefill each: exact f32 K/V do not depend on how they were batched.
    exec::Batch batch;
    for (size_t i = 0; i < n; ++i) {
      exec::SequenceStep step;
      const auto begin = windows->ids.begin() +
                         static_cast<std::ptrdiff_t>((first + i) * static_cast<size_t>(windows->ctx));
      step.tokens.assign(begin, begin + windows->ctx);
      for (int64_t p = 0; p < pages_each; ++p) {
        step.pages.push_back(static_cast<int32_t>(static_cast<int64_t>(i) * pages_each + p));
      }
      batch.sequences.push_back(std::move(step));
    }
    Result<std::vector<float>> logits = engine.step(batch);
    if (!logits.ok()) return logits.status();
    std::vector<int64_t> slots;
    for (size_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < windows->ctx; ++t) {
        slots.push_back(static_cast<int64_t>(i) * pages_each * page + t);
      }
    }
    std::vector<float> k(slots.size() * k_row), v(slots.size() * v_row);
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      if (Status st = kv.gather(layer, slots, k.data(), v_row ? v.data() : nullptr); !st.ok()) {
        return st;
      }
      for (size_t t = 0; t < slots.size(); ++t) {
        for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
          double& km = c.k_amax[layer][h];
          for (uint32_t d = 0; d < g.k_head_dim; ++d) {
            km = std::max(km, std::fabs(static_cast<double>(k[t * k_row + h * g.k_head_dim + d])));
          }
          double& vm = c.v_amax[layer][h];
          for (uint32_t d = 0; d < g.v_head_dim; ++d) {
            vm = std::max(vm, std::fabs(static_cast<double>(v[t * v_row + h * g.v_head_dim + d])));
          }
        }
      }
    }
    c.tokens += slots.size();
  }
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    const auto scale = [&](const std::vector<double>& heads) {
      const double amax = *std::max_element(heads.begin(), heads.end());
      // An all-zero layer still needs a positive scale.
      return amax > 0 ? amax * margin / kE4m3Max : 1.0;
    };
    c.k_scale.push_back(scale(c.k_amax[layer]));
    c.v_scale.push_back(g.v_head_dim ? scale(c.v_amax[layer]) : c.k_scale.back());
  }
  return c;
}

std::string calibration_toml(const Calibration& c) {
  std::string out =
      "# Static fp8 scales from `kvrt eval --calibrate " + c.store + "`: model " + c.model +
      ", corpus " + c.corpus + " (" + std::to_string(c.tokens) +
      " tokens).\n# scale = max |value| of the layer * margin " + number(c.margin) +
      " / 448; stored value = code * scale.\n# Add these tables to a configuration (or give "
      "the file to kvrt eval --scales).\n#\n# Largest |K| and |V| per KV head, layer by "
      "layer:\n";
  for (size_t l = 0; l < c.k_amax.size(); ++l) {
    out += "#   layer " + std::to_string(l) + "  K";
    for (double x : c.k_amax[l]) out += " " + number(x);
    out += "  V";
    for (double x : c.v_amax[l]) out += " " + number(x);
    out += "\n";
  }
  out += "\n[kv." + c.store + "]\nscale_mode = \"per_tensor\"\n\n[kv." + c.store +
         ".calibrated]\n";
  for (const auto& [name, scales] : {std::pair{"k", &c.k_scale}, std::pair{"v", &c.v_scale}}) {
    out += std::string(name) + " = [";
    for (size_t l = 0; l < scales->size(); ++l) out += (l ? ", " : "") + number((*scales)[l]);
    out += "]  # per layer\n";
  }
  return out;
}

Result<ScaleFile> read_scale_file(const std::string& path) {
  Result<std::string> text = util::read_file(path, util::kConfigFile);
  if (!text.ok()) return text.status();
  toml::table parsed;
  try {
    parsed = toml::parse(*text, path);
  } catch (const toml::parse_error& e) {
    const toml::source_position at = e.source().begin;
    return Status::ConfigError(path + ":" + std::to_string(at.line) + ":" +
                               std::to_string(at.column) + ": " + std::string(e.description()));
  }
  const toml::table* kv = parsed["kv"].as_table();
  ScaleFile out;
  if (kv != nullptr) {
    for (auto&& [name, node] : *kv) {
      const toml::table* t = node.as_table();
      const toml::table* calibrated = t ? (*t)["calibrated"].as_table() : nullptr;
      if (calibrated == nullptr) continue;
      out.store = std::string(name.str());
      std::string value = "{";
      for (const char* key : {"k", "v"}) {
        const toml::array* a = (*calibrated)[key].as_array();
        if (a == nullptr) {
          return Status::ConfigError(path + ": kv." + out.store + ".calibrated." + key +
                                     ": expected an array of per-layer scales");
        }
        value += std::string(value.size() > 1 ? ", " : "") + key + " = [";
        for (size_t i = 0; i < a->size(); ++i) {
          std::optional<double> x = (*a)[i].value<double>();
          if (!x) {
            return Status::ConfigError(path + ": kv." + out.store + ".calibrated." + key + "[" +
                                       std::to_string(i) + "] (layer " + std::to_string(i) +
                                       "): expected a number");
          }
          value += (i ? ", " : "") + number(*x);
        }
        value += "]";
      }
      out.calibrated_override = "kv." + out.store + ".calibrated=" + value + "}";
      return out;
    }
  }
  return Status::ConfigError(path + ": no [kv.<store>.calibrated] table (written by kvrt eval "
                                    "--calibrate)");
}

}  // namespace kvrt::eval
