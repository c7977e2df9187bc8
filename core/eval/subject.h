// What kvrt eval and the fp8 calibration share: a runtime per store (a "subject"), the corpus
// cut into windows, and the teacher-forced batches that feed the windows one token per step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/eval/eval.h"
#include "core/exec/batch.h"
#include "core/plugin/registry.h"
#include "core/runtime/runtime.h"

namespace kvrt::eval {

// One store's runtime with the configuration and registry it lives on (neither may move).
struct Subject {
  StoreVariant variant;
  config::Config cfg;
  plugin::Registry registry;
  runtime::Runtime rt;
};

// The configuration (file, --set, kv.store, the variant's options) built into a runtime.
// Errors name the store.
Result<std::unique_ptr<Subject>> build_subject(const std::string& config_path,
                                               const std::vector<std::string>& overrides,
                                               const StoreVariant& variant);

// The corpus as ids, cut into windows of ctx tokens (the remainder is left out).
struct Windows {
  std::string source;
  std::vector<int32_t> ids;  // count() * ctx of them
  uint64_t total_tokens = 0;
  int64_t ctx = 0;
  size_t count() const { return ctx == 0 ? 0 : ids.size() / static_cast<size_t>(ctx); }
};
// Refuses an empty corpus, one shorter than a window, ids outside the vocabulary and a ctx
// beyond the model's context, naming the file.
Result<Windows> load_windows(const CorpusSource& corpus, const runtime::Runtime& rt, int64_t ctx);

// How many windows every subject's KV pool holds at once (at most 64); an error naming the
// store whose pool cannot hold one.
Result<size_t> windows_at_once(const std::vector<std::unique_ptr<Subject>>& subjects,
                               int64_t ctx);

// Step t of windows [first, first + n): each window's token t at position t, window i on pages
// [i * pages_per_window, ...).
exec::Batch teacher_step(const Windows& w, size_t first, size_t n, int64_t t, uint32_t page_size);

}  // namespace kvrt::eval
