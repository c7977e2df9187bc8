#include "core/eval/subject.h"

#include <algorithm>

#include "core/eval/corpus.h"
#include "core/util/file.h"

namespace kvrt::eval {

Result<std::unique_ptr<Subject>> build_subject(const std::string& config_path,
                                               const std::vector<std::string>& overrides,
                                               const StoreVariant& variant) {
  auto s = std::make_unique<Subject>();
  s->variant = variant;
  std::vector<std::string> all = overrides;
  all.push_back("kv.store=" + variant.store);
  all.insert(all.end(), variant.overrides.begin(), variant.overrides.end());
  Result<config::Config> cfg = config::load(config_path, all);
  if (!cfg.ok()) return cfg.status().WithContext("store " + variant.label);
  s->cfg = *cfg;
  runtime::wire_plugins(s->registry, s->cfg);
  Result<runtime::Runtime> rt = runtime::build_runtime(s->cfg, s->registry);
  if (!rt.ok()) return rt.status().WithContext("store " + variant.label);
  s->rt = std::move(*rt);
  return s;
}


Result<Windows> load_windows(const CorpusSource& corpus, const runtime::Runtime& rt, int64_t ctx) {
  if (corpus.text_path.empty() == corpus.ids_path.empty()) {
    return Status::InvalidArgument("kvrt eval: give one of --text FILE or --ids FILE");
  }
  Windows w;
  w.source = corpus.text_path.empty() ? corpus.ids_path : corpus.text_path;
  Result<std::string> text = util::read_file(w.source, kEvalCorpusFile);
  if (!text.ok()) return text.status();
  std::vector<int32_t> ids;
  if (!corpus.ids_path.empty()) {
    Result<std::vector<int32_t>> parsed =
        parse_token_ids(*text, w.source, static_cast<int64_t>(rt.model.vocab_size));
    if (!parsed.ok()) return parsed.status();
    ids = std::move(*parsed);
  } else {
    // One document per non-empty line, BOS first, as each would be sent on its own.
    size_t from = 0;
    while (from < text->size()) {
      size_t end = text->find('\n', from);
      if (end == std::string::npos) end = text->size();
      std::string_view line(text->data() + from, end - from);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") != std::string_view::npos) {
        const std::vector<int32_t> doc = rt.tokenizer->encode(line, true);
        ids.insert(ids.end(), doc.begin(), doc.end());
      }
      from = end + 1;
    }
  }
  if (ids.empty()) return Status::InvalidArgument(w.source + ": the corpus is empty");
  const int64_t context = rt.model.max_position_embeddings;
  w.ctx = ctx > 0 ? ctx : context;
  if (w.ctx < 2 || (context > 0 && w.ctx > context)) {
    return Status::InvalidArgument("--ctx " + std::to_string(w.ctx) + ": expected 2.." +
                                   std::to_string(context) + " (" + rt.model_name +
                                   "'s context)");
  }
  w.total_tokens = ids.size();
  if (static_cast<int64_t>(ids.size()) < w.ctx) {
    return Status::InvalidArgument(w.source + ": " + std::to_string(ids.size()) +
                                   " tokens, fewer than one window of " + std::to_string(w.ctx) +
                                   " (give a longer corpus, or a shorter --ctx)");
  }
  ids.resize(ids.size() / static_cast<size_t>(w.ctx) * static_cast<size_t>(w.ctx));
  w.ids = std::move(ids);
  return w;
}

Result<size_t> windows_at_once(const std::vector<std::unique_ptr<Subject>>& subjects,
                               int64_t ctx) {
  size_t n = 64;
  for (const auto& s : subjects) {
    const exec::Engine& e = *s->rt.engine;
    const uint64_t pages_each = (static_cast<uint64_t>(ctx) + e.page_size() - 1) / e.page_size();
    const uint64_t fit = e.num_pages() / pages_each;
    if (fit == 0) {
      return Status::OutOfRange("store " + s->variant.label + ": its KV pool holds " +
                                std::to_string(e.num_pages() * e.page_size()) +
                                " tokens, fewer than one window of " + std::to_string(ctx) +
                                " (raise [device] memory or give a shorter --ctx)");
    }
    n = std::min<size_t>(n, fit);
  }
  return n;
}

exec::Batch teacher_step(const Windows& w, size_t first, size_t n, int64_t t, uint32_t page_size) {
  const auto pages_each = static_cast<int32_t>((w.ctx + page_size - 1) / page_size);
  const auto pages_now = static_cast<int32_t>((t + 1 + page_size - 1) / page_size);
  exec::Batch batch;
  batch.sequences.resize(n);
  for (size_t i = 0; i < n; ++i) {
    exec::SequenceStep& s = batch.sequences[i];
    s.tokens = {w.ids[(first + i) * static_cast<size_t>(w.ctx) + static_cast<size_t>(t)]};
    s.start = static_cast<int32_t>(t);
    for (int32_t p = 0; p < pages_now; ++p) {
      s.pages.push_back(static_cast<int32_t>(i) * pages_each + p);
    }
  }
  return batch;
}

}  // namespace kvrt::eval
