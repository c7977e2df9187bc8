#include "core/eval/calibrate.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/eval/subject.h"
#include "kernels/cpu/convert.h"
#include "core/util/file.h"

namespace kvrt::eval {
namespace {

std::string number(double v) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

}  // namespace

namespace {

// Every window through the subject as prefills (exact f32 K/V do not depend on the batching),
// then `use(layer, k, v, tokens)` with the layer's gathered K and V rows of the group.
template <class Use>
Status for_each_layer_of_the_corpus(Subject& subject, const Windows& windows, size_t group,
                                    Use use) {
  exec::Engine& engine = *subject.rt.engine;
  const plugin::KvStore& kv = engine.store();
  const kvrt_kv_geometry& g = kv.geometry();
  const size_t k_row = size_t{g.num_kv_heads} * g.k_head_dim;
  const size_t v_row = size_t{g.num_kv_heads} * g.v_head_dim;
  const uint32_t page = engine.page_size();
  const auto pages_each = static_cast<int64_t>((windows.ctx + page - 1) / page);
  for (size_t first = 0; first < windows.count(); first += group) {
    const size_t n = std::min(group, windows.count() - first);
    exec::Batch batch;
    std::vector<int64_t> slots;
    for (size_t i = 0; i < n; ++i) {
      exec::SequenceStep step;
      const auto begin = windows.ids.begin() + static_cast<std::ptrdiff_t>(
                                                   (first + i) * static_cast<size_t>(windows.ctx));
      step.tokens.assign(begin, begin + windows.ctx);
      for (int64_t p = 0; p < pages_each; ++p) {
        step.pages.push_back(static_cast<int32_t>(static_cast<int64_t>(i) * pages_each + p));
      }
      for (int64_t t = 0; t < windows.ctx; ++t) {
        slots.push_back(static_cast<int64_t>(i) * pages_each * page + t);
      }
      batch.sequences.push_back(std::move(step));
    }
    Result<std::vector<float>> logits = engine.step(batch);
    if (!logits.ok()) return logits.status();
    std::vector<float> k(slots.size() * k_row), v(slots.size() * v_row);
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      if (Status st = kv.gather(layer, slots, k.data(), v_row ? v.data() : nullptr); !st.ok()) {
        return st;
      }
      use(layer, k, v, slots.size());
    }
  }
  return Status::Ok();
}

// Sum of (x - dequantize(quantize(x / scale)) * scale)^2 over `values`.
double squared_error(const std::vector<float>& values, double scale, std::vector<uint8_t>& codes,
                     std::vector<float>& back) {
  codes.resize(values.size());
  back.resize(values.size());
  kernels::f32_to_e4m3(values.data(), codes.data(), values.size(), static_cast<float>(1.0 / scale));
  kernels::e4m3_to_f32(codes.data(), back.data(), values.size(), static_cast<float>(scale));
  double sum = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double d = static_cast<double>(values[i]) - back[i];
    sum += d * d;
  }
  return sum;
}

double candidate(double amax, int j) {
  return amax * std::exp2((j + 1) / static_cast<double>(kScaleCandidates)) / kE4m3Max;
}

}  // namespace

Result<Calibration> calibrate(const EvalOptions& options, const std::string& store) {
  if (store != "kv_fp8_e4m3") {
    return Status::InvalidArgument("--calibrate " + store +
                                   ": only kv_fp8_e4m3 reads calibrated scales");
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
  const kvrt_kv_geometry& g = subject.rt.engine->store().geometry();

  Calibration c;
  c.model = subject.rt.model_name;
  c.corpus = windows->source;
  c.store = store;
  c.k_amax.assign(g.num_layers, std::vector<double>(g.num_kv_heads, 0.0));
  c.v_amax = c.k_amax;
  // Pass 1: the largest magnitudes.
  Status st = for_each_layer_of_the_corpus(
      subject, *windows, *group,
      [&](uint32_t layer, const std::vector<float>& k, const std::vector<float>& v, size_t n) {
        for (size_t t = 0; t < n; ++t) {
          for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
            for (uint32_t d = 0; d < g.k_head_dim; ++d) {
              c.k_amax[layer][h] = std::max(
                  c.k_amax[layer][h],
                  std::fabs(static_cast<double>(k[(t * g.num_kv_heads + h) * g.k_head_dim + d])));
            }
            for (uint32_t d = 0; d < g.v_head_dim; ++d) {
              c.v_amax[layer][h] = std::max(
                  c.v_amax[layer][h],
                  std::fabs(static_cast<double>(v[(t * g.num_kv_heads + h) * g.v_head_dim + d])));
            }
          }
        }
        if (layer == 0) c.tokens += n;
      });
  if (!st.ok()) return st;
  auto layer_max = [](const std::vector<double>& heads) {
    return *std::max_element(heads.begin(), heads.end());
  };
  // Pass 2: each candidate's error, and scale 1's.
  const size_t cands = kScaleCandidates + 1;  // the last one is scale 1
  std::vector<std::vector<double>> k_err(g.num_layers, std::vector<double>(cands, 0.0));
  std::vector<std::vector<double>> v_err = k_err;
  std::vector<uint8_t> codes;
  std::vector<float> back;
  uint64_t k_values = 0, v_values = 0;
  st = for_each_layer_of_the_corpus(
      subject, *windows, *group,
      [&](uint32_t layer, const std::vector<float>& k, const std::vector<float>& v, size_t) {
        const double ka = layer_max(c.k_amax[layer]), va = layer_max(c.v_amax[layer]);
        for (size_t j = 0; j < cands; ++j) {
          k_err[layer][j] +=
              squared_error(k, j < kScaleCandidates ? candidate(ka, static_cast<int>(j)) : 1.0,
                            codes, back);
          if (g.v_head_dim != 0) {
            v_err[layer][j] +=
                squared_error(v, j < kScaleCandidates ? candidate(va, static_cast<int>(j)) : 1.0,
                              codes, back);
          }
        }
        if (layer == 0) {
          k_values += k.size();
          v_values += v.size();
        }
      });
  if (!st.ok()) return st;
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    const auto pick = [&](const std::vector<double>& err, double amax, std::vector<double>* scale,
                          std::vector<double>* mse, std::vector<double>* mse1, uint64_t values) {
      if (amax <= 0) {  // an all-zero layer still needs a positive scale
        scale->push_back(1.0);
        mse->push_back(0);
        mse1->push_back(0);
        return;
      }
      const size_t best = static_cast<size_t>(
          std::min_element(err.begin(), err.begin() + kScaleCandidates) - err.begin());
      scale->push_back(candidate(amax, static_cast<int>(best)));
      const double n = static_cast<double>(std::max<uint64_t>(values, 1));
      mse->push_back(err[best] / n);
      mse1->push_back(err[kScaleCandidates] / n);
    };
    pick(k_err[layer], layer_max(c.k_amax[layer]), &c.k_scale, &c.k_mse, &c.k_mse_scale1, k_values);
    if (g.v_head_dim != 0) {
      pick(v_err[layer], layer_max(c.v_amax[layer]), &c.v_scale, &c.v_mse, &c.v_mse_scale1,
           v_values);
    } else {  // V is K
      c.v_scale.push_back(c.k_scale.back());
      c.v_mse.push_back(c.k_mse.back());
      c.v_mse_scale1.push_back(c.k_mse_scale1.back());
    }
  }
  return c;
}

std::string calibration_toml(const Calibration& c) {
  std::string out =
      "# Static fp8 scales from `kvrt eval --calibrate " + c.store + "`: model " + c.model +
      ", corpus " + c.corpus + " (" + std::to_string(c.tokens) +
      " tokens).\n# Each layer's scale is the one of 16 candidates in (max |value| / 448, 2 * "
      "max |value| / 448]\n# with the least squared error over the corpus; stored value = code "
      "* scale.\n# Add these tables to a configuration (or give the file to kvrt eval "
      "--scales).\n#\n# Largest |K| and |V| per KV head, and the mean squared error of the "
      "scale against scale 1, by layer:\n";
  for (size_t l = 0; l < c.k_amax.size(); ++l) {
    out += "#   layer " + std::to_string(l) + "  K";
    for (double x : c.k_amax[l]) out += " " + number(x);
    out += "  V";
    for (double x : c.v_amax[l]) out += " " + number(x);
    out += "  MSE K " + number(c.k_mse[l]) + " (scale 1: " + number(c.k_mse_scale1[l]) + ")" +
           " V " + number(c.v_mse[l]) + " (scale 1: " + number(c.v_mse_scale1[l]) + ")\n";
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
  Result<std::string> text = util::read_file(path, config::kConfigFile);
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
