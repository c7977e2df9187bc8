// What the real-model end-to-end tests share: a runtime for a checkpoint directory with a
// store, TP size and page size; greedy decoding of a prompt through it; and the relative L2
// distance the fp8 tolerances are stated in.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/exec/generate.h"
#include "core/model/safetensors.h"
#include "core/runtime/runtime.h"

namespace kvrt::e2e {

// ../shared/models/<name> from the source tree ($KVRT_SOURCE_DIR, else the working directory).
inline std::string shared_model_dir(const std::string& name) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/../shared/models/" + name;
}

// The bytes of every tensor stored in `dir`'s checkpoint whose name starts with none of `skip`
// (a vision tower), read from its headers: what capacity planning must count for a model whose
// loader reads all of them.
inline uint64_t stored_tensor_bytes(const std::string& dir, const std::vector<std::string>& skip) {
  Result<model::SafetensorsCheckpoint> ck = model::SafetensorsCheckpoint::open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status().message();
  if (!ck.ok()) return 0;
  uint64_t total = 0;
  for (const std::string& name : ck->names()) {
    bool skipped = false;
    for (const std::string& prefix : skip) skipped = skipped || name.rfind(prefix, 0) == 0;
    if (skipped) continue;
    Result<model::TensorView> t = ck->get(name);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (t.ok()) total += t->bytes;
  }
  return total;
}

// A runtime for the model in `dir` (none: a preset `extra` names) with these settings; the
// registry outlives it.
struct ModelRun {
  plugin::Registry registry;
  config::Config cfg;
  Result<runtime::Runtime> runtime = Status::Internal("unset");

  ModelRun(const std::string& dir, const std::string& store, int tp, int page_size,
           std::vector<std::string> extra = {}) {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    std::vector<std::string> sets = {"device.memory=\"16MiB\"", "tp.size=" + std::to_string(tp),
                                     "scheduler.page_size=" + std::to_string(page_size),
                                     "kv.store=" + store};
    if (!dir.empty()) sets.push_back("model.path=\"" + dir + "\"");
    sets.insert(sets.end(), extra.begin(), extra.end());
    Result<config::Config> c = config::load_string("", "<test>", sets);
    EXPECT_TRUE(c.ok()) << c.status().message();
    cfg = *c;
    registry.set_config_source([this](const std::string& name) -> const toml::table* {
      return cfg.plugin_table("kv", name);
    });
    runtime = runtime::build_runtime(cfg, registry);
  }
};

// n greedy ids after `prompt`, prefilled in chunks of 3 (so prefill also runs over earlier
// pages).
inline Result<exec::Generation> greedy(ModelRun& s, const std::vector<int32_t>& prompt,
                                           int n) {
  exec::GenerateOptions options;
  options.max_new_tokens = n;
  options.prefill_chunk = 3;
  return exec::generate(*s.runtime->engine, prompt, options);
}

// |a - b| / |a| in the L2 norm.
inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += std::pow(double{a[i]} - b[i], 2);
    norm += std::pow(double{a[i]}, 2);
  }
  return std::sqrt(diff / norm);
}

}  // namespace kvrt::e2e
