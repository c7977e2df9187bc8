#include "core/eval/eval.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/eval/subject.h"
#include "core/util/progress.h"
#include "core/util/text.h"

namespace kvrt::eval {
namespace {

using Clock = std::chrono::steady_clock;
using util::fixed;
using util::scientific;

// "[####......] 1200/9198 positions, 3.1 s" on stderr.
class Progress {
 public:
  Progress(bool enabled, const char* what, uint64_t total)
      : line_(enabled), what_(what), total_(total) {}
  void update(uint64_t done) {
    if (!line_.due(done >= total_)) return;
    char text[256];
    std::snprintf(text, sizeof(text), "%s %llu/%llu %s, %.1f s",
                  util::progress_bar(done, total_).c_str(), static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(total_), what_,
                  std::chrono::duration<double>(Clock::now() - start_).count());
    line_.draw(text);
  }
  void done() { line_.clear(); }

 private:
  util::ProgressLine line_;
  const char* what_;
  uint64_t total_;
  Clock::time_point start_ = Clock::now();
};

// Greedy continuations of `prompts` through one subject: the generated ids, `tokens` per prompt.
Result<std::vector<std::vector<int32_t>>> greedy(Subject& s,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int tokens) {
  exec::Engine& engine = *s.rt.engine;
  const uint32_t page = engine.page_size();
  const size_t vocab = s.rt.model.vocab_size;
  std::vector<std::vector<int32_t>> out(prompts.size());
  const int64_t longest = static_cast<int64_t>(prompts.empty() ? 0 : prompts[0].size()) + tokens;
  const auto pages_each = static_cast<int32_t>((longest + page - 1) / page);
  exec::Batch batch;
  for (const std::vector<int32_t>& prompt : prompts) {
    exec::SequenceStep step;
    step.tokens = prompt;
    batch.sequences.push_back(std::move(step));
  }
  for (int t = 0; t < tokens; ++t) {
    // Each sequence's own pages, exactly as many as its positions so far need.
    for (size_t i = 0; i < prompts.size(); ++i) {
      exec::SequenceStep& step = batch.sequences[i];
      const int64_t length = step.start + static_cast<int64_t>(step.tokens.size());
      while (static_cast<int64_t>(step.pages.size()) * page < length) {
        step.pages.push_back(static_cast<int32_t>(i) * pages_each +
                             static_cast<int32_t>(step.pages.size()));
      }
    }
    Result<std::vector<float>> logits = engine.step(batch);
    if (!logits.ok()) return logits.status().WithContext(s.variant.label);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int32_t next = argmax(std::span<const float>(logits->data() + i * vocab, vocab));
      out[i].push_back(next);
      exec::SequenceStep& step = batch.sequences[i];
      step.start += static_cast<int32_t>(step.tokens.size());
      step.tokens = {next};
    }
  }
  return out;
}

}  // namespace

Result<StoreVariant> parse_store_variant(std::string_view text) {
  StoreVariant v;
  v.label = std::string(text);
  const size_t colon = text.find(':');
  v.store = std::string(text.substr(0, colon));
  if (v.store.empty()) return Status::InvalidArgument("--stores '" + v.label + "': no store named");
  std::string_view rest = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t next = rest.find(':');
    const std::string_view option = rest.substr(0, next);
    if (option.find('=') == std::string_view::npos || option.front() == '=') {
      return Status::InvalidArgument("--stores '" + v.label + "': '" + std::string(option) +
                                     "' is not KEY=VALUE (e.g. kv_fp8_e4m3:scale_mode=per_tensor)");
    }
    v.overrides.push_back("kv." + v.store + "." + std::string(option));
    rest = next == std::string_view::npos ? "" : rest.substr(next + 1);
  }
  return v;
}

Result<std::vector<StoreVariant>> weight_variants(std::string_view list,
                                                 const StoreVariant& store) {
  std::vector<StoreVariant> out;
  for (size_t from = 0; from <= list.size();) {
    size_t end = list.find(',', from);
    if (end == std::string_view::npos) end = list.size();
    const std::string format(list.substr(from, end - from));
    if (format != "none" && format != "int4" && format != "fp8") {
      return Status::InvalidArgument("--weights '" + std::string(list) + "': '" + format +
                                     "' is not a weight format (none, int4, fp8)");
    }
    StoreVariant v = store;
    v.label = "weights " + format + (store.label == "kv_f32_paged" ? "" : " / " + store.label);
    v.overrides.push_back("model.quantization=\"" + format + "\"");
    out.push_back(std::move(v));
    from = end + 1;
  }
  return out;
}

Result<EvalResult> run_eval(const EvalOptions& options) {
  if (options.stores.empty()) return Status::InvalidArgument("kvrt eval: no store to evaluate");
  std::vector<std::unique_ptr<Subject>> subjects;
  for (const StoreVariant& v : options.stores) {
    Result<std::unique_ptr<Subject>> s = build_subject(options.config_path, options.overrides, v);
    if (!s.ok()) return s.status();
    subjects.push_back(std::move(*s));
  }
  const runtime::Runtime& ref = subjects[0]->rt;
  Result<Windows> windows = load_windows(options.corpus, ref, options.ctx);
  if (!windows.ok()) return windows.status();
  const Windows& w = *windows;
  const size_t vocab = ref.model.vocab_size;
  for (const auto& s : subjects) {
    if (static_cast<size_t>(s->rt.model.vocab_size) != vocab) {
      return Status::InvalidArgument(s->variant.label + ": a different model's vocabulary (" +
                                     std::to_string(s->rt.model.vocab_size) + " against " +
                                     std::to_string(vocab) + ")");
    }
  }
  Result<size_t> group = windows_at_once(subjects, w.ctx);
  if (!group.ok()) return group.status();

  EvalResult result;
  result.model = ref.model_name;
  result.corpus = w.source;
  result.corpus_tokens = w.total_tokens;
  result.windows = w.count();
  result.dropped_tokens = w.total_tokens - w.count() * static_cast<uint64_t>(w.ctx);
  result.ctx = w.ctx;
  result.positions = w.count() * static_cast<uint64_t>(w.ctx - 1);
  std::vector<Accumulator> acc(subjects.size());
  Progress progress(options.progress, "positions", result.positions);
  uint64_t done = 0;
  for (size_t g0 = 0; g0 < w.count(); g0 += *group) {
    const size_t n = std::min(*group, w.count() - g0);
    for (int64_t t = 0; t + 1 < w.ctx; ++t) {
      const exec::Batch batch = teacher_step(w, g0, n, t, subjects[0]->rt.engine->page_size());
      std::vector<std::vector<float>> step(subjects.size());
      for (size_t s = 0; s < subjects.size(); ++s) {
        Result<std::vector<float>> l = subjects[s]->rt.engine->step(batch);
        if (!l.ok()) return l.status().WithContext(subjects[s]->variant.label);
        step[s] = std::move(*l);
      }
      for (size_t i = 0; i < n; ++i) {
        const int32_t next = w.ids[(g0 + i) * static_cast<size_t>(w.ctx) + static_cast<size_t>(t) + 1];
        const std::span<const float> r(step[0].data() + i * vocab, vocab);
        acc[0].add_nll(r, next);
        for (size_t s = 1; s < subjects.size(); ++s) {
          acc[s].add(std::span<const float>(step[s].data() + i * vocab, vocab), r, next);
        }
      }
      done += n;
      progress.update(done);
    }
  }
  progress.done();

  // Greedy continuations of the first tokens of the first windows.
  const int prompt_tokens =
      static_cast<int>(std::min<int64_t>(options.greedy_prompt_tokens, w.ctx / 2));
  const int greedy_tokens =
      static_cast<int>(std::min<int64_t>(options.greedy_tokens, w.ctx - prompt_tokens));
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < w.count() && static_cast<int>(prompts.size()) < options.greedy_prompts &&
                     prompts.size() < *group;
       ++i) {
    const auto begin = w.ids.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(w.ctx));
    prompts.emplace_back(begin, begin + prompt_tokens);
  }
  result.greedy_tokens = greedy_tokens;
  std::vector<std::vector<int32_t>> reference;
  for (size_t s = 0; s < subjects.size(); ++s) {
    const Subject& subject = *subjects[s];
    StoreResult r;
    r.variant = subject.variant;
    r.bytes_per_token = subject.rt.engine->store().info().bytes_per_token;
    r.max_total_num_tokens = subject.rt.plan.max_total_num_tokens;
    r.perplexity = acc[s].perplexity();
    r.perplexity_ratio = r.perplexity / acc[0].perplexity();
    r.kl = acc[s].kl();
    r.top1_agreement = acc[s].top1_agreement();
    r.mean_abs_logit_error = acc[s].mean_abs_logit_error();
    if (greedy_tokens > 0 && !prompts.empty()) {
      Result<std::vector<std::vector<int32_t>>> g = greedy(*subjects[s], prompts, greedy_tokens);
      if (!g.ok()) return g.status();
      if (s == 0) reference = *g;
      for (size_t i = 0; i < prompts.size(); ++i) {
        int same = 0;
        while (same < greedy_tokens && (*g)[i][static_cast<size_t>(same)] ==
                                           reference[i][static_cast<size_t>(same)]) {
          ++same;
        }
        r.greedy_agreement.push_back(same);
      }
      std::vector<int> sorted = r.greedy_agreement;
      std::sort(sorted.begin(), sorted.end());
      const size_t m = sorted.size();
      r.greedy_median = m % 2 == 1 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2.0;
      r.greedy_min = sorted.front();
    }
    result.stores.push_back(std::move(r));
  }
  return result;
}

std::string format_eval(const EvalResult& r) {
  std::string out = "kvrt eval: " + r.model + ", corpus " + r.corpus + ": " +
                    std::to_string(r.corpus_tokens) + " tokens, " + std::to_string(r.windows) +
                    " windows of " + std::to_string(r.ctx) + " (" +
                    std::to_string(r.dropped_tokens) + " left over), " +
                    std::to_string(r.positions) + " positions; reference " +
                    (r.stores.empty() ? "-" : r.stores[0].variant.label) + "\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"store", "bytes/token", "max_total_num_tokens", "perplexity", "ppl ratio", "KL mean",
       "KL median", "KL p99", "KL max", "top-1 %", "|logit err|",
       "greedy same (median/min of " + std::to_string(r.greedy_tokens) + ")"}};
  for (const StoreResult& s : r.stores) {
    rows.push_back({s.variant.label, std::to_string(s.bytes_per_token),
                    std::to_string(s.max_total_num_tokens), fixed(s.perplexity, 4),
                    fixed(s.perplexity_ratio, 4), scientific(s.kl.mean), scientific(s.kl.median),
                    scientific(s.kl.p99), scientific(s.kl.max), fixed(100 * s.top1_agreement, 2),
                    scientific(s.mean_abs_logit_error),
                    s.greedy_agreement.empty()
                        ? "-"
                        : fixed(s.greedy_median, 1) + " / " + std::to_string(s.greedy_min)});
  }
  out += util::render_columns(rows, 1, false);
  return out;
}

std::string eval_json(const EvalResult& r) {
  nlohmann::json stores = nlohmann::json::array();
  for (const StoreResult& s : r.stores) {
    stores.push_back({{"label", s.variant.label},
                      {"store", s.variant.store},
                      {"overrides", s.variant.overrides},
                      {"bytes_per_token", s.bytes_per_token},
                      {"max_total_num_tokens", s.max_total_num_tokens},
                      {"perplexity", s.perplexity},
                      {"perplexity_ratio", s.perplexity_ratio},
                      {"kl", {{"mean", s.kl.mean}, {"median", s.kl.median}, {"p99", s.kl.p99},
                              {"max", s.kl.max}}},
                      {"top1_agreement", s.top1_agreement},
                      {"mean_abs_logit_error", s.mean_abs_logit_error},
                      {"greedy_agreement", s.greedy_agreement},
                      {"greedy_median", s.greedy_median},
                      {"greedy_min", s.greedy_min}});
  }
  const nlohmann::json out = {{"model", r.model},
                              {"corpus", r.corpus},
                              {"corpus_tokens", r.corpus_tokens},
                              {"windows", r.windows},
                              {"ctx", r.ctx},
                              {"dropped_tokens", r.dropped_tokens},
                              {"positions", r.positions},
                              {"greedy_tokens", r.greedy_tokens},
                              {"stores", stores}};
  return out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace kvrt::eval
