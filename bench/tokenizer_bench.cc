// Encoding speed: ~1 MB of text through a tokenizer.json (qwen3, llama-3.1) and through
// SentencePiece on stories260k's tokenizer.model, on one thread. The text is bench/eval's
// stories260k samples repeated to 1 MiB (many repeated words: the per-word cache's best case);
// "cold" runs start each iteration with a fresh tokenizer (an empty cache), and "multilingual"
// repeats tests/data/tokenizers/corpus.json (code, CJK, emoji, ...) instead.
//
//   KVRT_SOURCE_DIR=. ./build/bin/tokenizer_bench     (from the repository root; the
//   tokenizers are read from ../shared beside it)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/eval/corpus.h"
#include "core/text/tokenizer.h"
#include "core/text/tokenizer_json.h"
#include "core/util/file.h"

namespace {

namespace fs = std::filesystem;
using kvrt::text::Tokenizer;

constexpr size_t kTextBytes = size_t{1} << 20;

fs::path source_dir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return root == nullptr ? fs::path(".") : fs::path(root);
}

// A data file's bytes (util::read_file, bounded as any file kvrt reads); "" when unreadable.
std::string read_text(const fs::path& path) {
  kvrt::Result<std::string> text =
      kvrt::util::read_file(path.string(), kvrt::eval::kEvalCorpusFile);
  return text.ok() ? std::move(*text) : std::string();
}

// text repeated (whole copies, then a cut) to kTextBytes; "" when text is.
std::string repeat_to_size(const std::string& text) {
  std::string out;
  if (text.empty()) return out;
  out.reserve(kTextBytes + text.size());
  while (out.size() < kTextBytes) out += text;
  // Cut at a character boundary.
  size_t cut = kTextBytes;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  out.resize(cut);
  return out;
}

const std::string& stories_text() {
  static const std::string text =
      repeat_to_size(read_text(source_dir() / "bench" / "eval" / "stories260k-samples.txt"));
  return text;
}

const std::string& multilingual_text() {
  static const std::string text = [] {
    const std::string corpus =
        read_text(source_dir() / "tests" / "data" / "tokenizers" / "corpus.json");
    if (corpus.empty()) return std::string();
    std::string joined;
    for (const auto& t : nlohmann::json::parse(corpus)) joined += t.get<std::string>() + "\n";
    return repeat_to_size(joined);
  }();
  return text;
}

fs::path tokenizer_dir(const std::string& name) {
  if (name == "stories260k") return source_dir() / ".." / "shared" / "models" / "stories260k";
  return source_dir() / ".." / "shared" / "tokenizers" / name;
}

std::unique_ptr<Tokenizer> load(const std::string& name, benchmark::State& state) {
  kvrt::Result<std::unique_ptr<Tokenizer>> tok =
      kvrt::text::load_model_tokenizer(tokenizer_dir(name).string());
  if (!tok.ok()) {
    state.SkipWithError(tok.status().message().c_str());
    return nullptr;
  }
  return std::move(*tok);
}

void report(benchmark::State& state, const std::string& text, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// Warm: the tokenizer (and its cache) lives across iterations.
void BM_Encode(benchmark::State& state, const std::string& name, const std::string& (*text)()) {
  const std::string& input = text();
  if (input.empty()) return state.SkipWithError("the benchmark text is missing");
  std::unique_ptr<Tokenizer> tok = load(name, state);
  if (tok == nullptr) return;
  size_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok->encode(input, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, input, tokens);
}

// Cold: a fresh tokenizer each iteration, its loading not timed.
void BM_EncodeCold(benchmark::State& state, const std::string& name, const std::string& (*text)()) {
  const std::string& input = text();
  if (input.empty()) return state.SkipWithError("the benchmark text is missing");
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Tokenizer> tok = load(name, state);
    state.ResumeTiming();
    if (tok == nullptr) return;
    std::vector<int32_t> ids = tok->encode(input, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  report(state, input, tokens);
}

// Loading: reading and parsing the files, building the vocabulary and merge tables.
void BM_Load(benchmark::State& state, const std::string& name) {
  for (auto _ : state) {
    std::unique_ptr<Tokenizer> tok = load(name, state);
    if (tok == nullptr) return;
    benchmark::DoNotOptimize(tok.get());
  }
}

BENCHMARK_CAPTURE(BM_Load, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, llama31, std::string("llama-3.1"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, sentencepiece_stories260k, std::string("stories260k"), stories_text)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen3_stories, std::string("qwen3"), stories_text)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama31_stories, std::string("llama-3.1"), stories_text)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, qwen3_stories, std::string("qwen3"), stories_text)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_EncodeCold, qwen3_multilingual, std::string("qwen3"), multilingual_text)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_Encode, sentencepiece_multilingual, std::string("stories260k"),
                  multilingual_text)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
