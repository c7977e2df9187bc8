// End to end on the synth-76m preset (bf16 weights, seeded), the shape compared with llama.cpp:
//   decode/batch1     one sequence, short context: decode tokens per second
//   batch64           64 sequences of 128 prompt + 128 generated tokens, all in one batch:
//                     total (prompt + generated) tokens per second and generated per second
//   batch8            the same with 8 sequences (decode products of 8 rows, which the weights'
//                     bytes bound rather than the arithmetic)
//   prefill/512       one sequence's 512-token prompt in one step: prompt tokens per second,
//                     and the fraction of the arithmetic peak its products' flops reach
//   .../medium        decode/batch1, batch64, batch8 and prefill/512 again with
//                     model.matmul_precision = "medium" (activations rounded to bf16 in the
//                     products: the AVX-512 BF16 dot product where the CPU has it)
//   decode/ctx4096    one sequence decoding after a 4,096-token prompt, per KV store, with the
//                     ceiling a streaming read sets when each token reads every weight and the
//                     KV of the whole context once
//   llama-3.2-1b-shape/decode/batch{1,16,64}/{greedy,sampled}
//                     Llama-3.2-1B's shape and 128,256-token vocabulary (seeded bf16 weights,
//                     model.matmul_precision as "auto" takes it): decode tokens per second of 1,
//                     16 and 64 sequences (32-token prompts, 32 steps timed), each token chosen
//                     by its sequence's own sampler through Engine::step_and_sample, as the
//                     serving core does (the step's rows side by side on the engine's
//                     threads), greedy or at temperature 0.7 and top_p 0.95. Greedy and sampled
//                     run one after the other at each batch size, so their ratio -- the
//                     sampling's cost -- is taken in one process.
// Each with TP 1 and 2 where noted. Threads: the machine's cores, split over the ranks. The
// batch cases also give their roofline (bench/roofline.h, measured in the same run) and the
// fraction of it they reach, and their two phases apart: prefill_s and prefill_peak_fraction
// (the step of all prompts against the arithmetic peak), decode_step_ms and
// decode_roofline_fraction (the decode steps against the same roofline).
//   ./build/bin/e2e_bench --benchmark_filter=decode/batch1
#include <benchmark/benchmark.h>
#include <omp.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/roofline.h"
#include "core/capacity/stores.h"
#include "core/exec/engine.h"
#include "core/exec/generate.h"
#include "core/sampling/sampler.h"
#include "core/model/weights.h"
#include "core/plugin/registry.h"
#include "kernels/cpu/gemm.h"

namespace {

using namespace kvrt;
using Clock = std::chrono::steady_clock;

const model::Weights& weights() {
  static model::Weights* w = new model::Weights(std::move(*model::make_preset("synth-76m")));
  return *w;
}

// Made on first use: 5 GB of f32 while its weights are generated.
const model::Weights& weights_1b() {
  static model::Weights* w =
      new model::Weights(std::move(*model::make_preset("llama-3.2-1b-shape")));
  return *w;
}

plugin::Registry& registry() {
  static plugin::Registry* r = new plugin::Registry();
  return *r;
}

// The projections' format: bf16, or quantized at load (model.quantization) with the activations
// "auto" gives them (int4: int8 on a CPU with AVX-512 VNNI or AVX2, else f32; fp8: bf16 on a
// CPU with the AVX-512 BF16 dot product, else f32).
enum class Format { kBf16, kInt4, kFp8 };

std::string suffix_of(Format f) {
  return f == Format::kInt4 ? "/int4" : f == Format::kFp8 ? "/fp8" : "";
}

backend::CpuQuantization quantization_of(Format f) {
  backend::CpuQuantization q;
  q.format = f == Format::kInt4  ? backend::CpuQuantization::Format::kInt4
             : f == Format::kFp8 ? backend::CpuQuantization::Format::kFp8
                                 : backend::CpuQuantization::Format::kNone;
  q.activations = backend::CpuQuantization::activations_for(q.format, "auto");
  return q;
}

// The bytes of weights a decode step reads: the projections in their format, the rest in bf16.
double held_weight_bytes(const model::ModelConfig& c, Format f) {
  const double projections = static_cast<double>(c.projection_parameter_count());
  const double per = f == Format::kBf16 ? 2 : quantization_of(f).bytes_per_weight();
  return static_cast<double>(c.weight_bytes(2)) - 2 * projections + per * projections;
}

// medium: model.matmul_precision = "medium" (activations rounded to bf16 in the products: the
// AVX-512 BF16 dot product where the CPU has it).
std::unique_ptr<exec::Engine> make_engine(int tp, const std::string& store, uint64_t pages,
                                          bool medium = false,
                                          const model::Weights& w = weights(),
                                          Format format = Format::kBf16) {
  exec::EngineOptions o;
  o.bf16_activations = medium;
  o.quantization = quantization_of(format);
  o.tp = tp;
  o.page_size = 16;
  o.num_pages = pages;
  o.bf16_weights = true;
  o.plugins.store = *registry().load_kv_store(store);
  o.plugins.attention = *registry().load("attn_cpu");
  return std::move(*exec::Engine::create(w, o));
}

std::vector<int32_t> prompt(size_t n, int32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = 3 + static_cast<int32_t>((i * 7 + salt * 13) % 256);
  p[0] = 1;
  return p;
}

// Decode tokens per second of one sequence, over the benchmark's iterations (prefill excluded).
double decode_tok_per_s(benchmark::State& state, exec::Engine& engine,
                        const std::vector<int32_t>& prompt, const exec::GenerateOptions& o) {
  double seconds = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    auto out = exec::generate(engine, prompt, o);
    seconds += out->decode_seconds;
    tokens += static_cast<int64_t>(out->ids.size()) - 1;  // the first id comes from prefill
  }
  return static_cast<double>(tokens) / seconds;
}

using bench::read_bandwidth_GBps;

// The machine's arithmetic peak for bf16 weights, measured once (bench/roofline.h).
const bench::Peak& peak() {
  static const bench::Peak p = bench::arithmetic_peak();
  return p;
}

void BM_DecodeBatch1(benchmark::State& state, bool medium, Format format) {
  const int tp = static_cast<int>(state.range(0));
  auto engine = make_engine(tp, "kv_bf16_paged", 64, medium, weights(), format);
  exec::GenerateOptions o;
  o.max_new_tokens = 65;
  const double tok_per_s = decode_tok_per_s(state, *engine, prompt(16, 1), o);
  state.counters["decode_tok_per_s"] = tok_per_s;
  // Every weight is read once per token; the streaming read of as many bytes, measured now, is
  // the ceiling that memory bandwidth sets.
  const double weight_bytes = held_weight_bytes(weights().config, format);
  const double read_GBps = read_bandwidth_GBps(static_cast<size_t>(weight_bytes));
  state.counters["weights_GBps"] = tok_per_s * weight_bytes / 1e9;
  state.counters["read_GBps"] = read_GBps;
  state.counters["bandwidth_ceiling_tok_per_s"] = read_GBps * 1e9 / weight_bytes;
}

void BM_Batch(benchmark::State& state, int seqs, bool medium, Format format) {
  const int tp = static_cast<int>(state.range(0));
  const int prompt_len = 128, gen = 128, pages_per_seq = (prompt_len + gen) / 16;
  auto engine =
      make_engine(tp, "kv_bf16_paged", seqs * pages_per_seq, medium, weights(), format);
  double seconds = 0, prefill_seconds = 0;
  int64_t generated = 0;
  for (auto _ : state) {
    exec::Batch batch;
    for (int s = 0; s < seqs; ++s) {
      exec::SequenceStep step;
      step.tokens = prompt(prompt_len, s);
      step.pages.resize(pages_per_seq);
      std::iota(step.pages.begin(), step.pages.end(), s * pages_per_seq);
      batch.sequences.push_back(std::move(step));
    }
    const auto start = Clock::now();
    auto logits = engine->step(batch);  // all prefills in one step
    prefill_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t vocab = engine->config().vocab_size;
    for (int t = 0; t < gen - 1; ++t) {
      for (int s = 0; s < seqs; ++s) {
        exec::SequenceStep& step = batch.sequences[s];
        const float* row = logits->data() + s * vocab;
        const int32_t next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
        step.start += static_cast<int32_t>(step.tokens.size());
        step.tokens.assign(1, next);
      }
      logits = engine->step(batch);
    }
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    generated += int64_t{seqs} * gen;
  }
  const double total_tok_per_s =
      static_cast<double>(generated + generated / gen * prompt_len) / seconds;
  state.counters["total_tok_per_s"] = total_tok_per_s;
  state.counters["generated_tok_per_s"] = static_cast<double>(generated) / seconds;
  // The roofline over `seqs` sequences: each decode step reads every weight once for all of
  // them (bandwidth x seqs / weight bytes tokens per second) and does 2 flops per parameter
  // per token (peak / that), whichever is lower, applied to every token as the issue defined
  // it. The prompt's tokens are bound by the arithmetic alone, so for them it is low, and the
  // fraction errs high.
  const double weight_bytes = held_weight_bytes(weights().config, format);
  const double flops_per_token = 2.0 * static_cast<double>(weights().config.parameter_count());
  const double read_GBps = read_bandwidth_GBps(static_cast<size_t>(weight_bytes));
  const double roofline =
      std::min(read_GBps * 1e9 * seqs / weight_bytes, peak().best() * 1e9 / flops_per_token);
  state.counters["read_GBps"] = read_GBps;
  state.counters["peak_GFLOPs"] = peak().best();
  state.counters["roofline_tok_per_s"] = roofline;
  state.counters["roofline_fraction"] = total_tok_per_s / roofline;
  // The two phases apart: the prompts' step against the arithmetic peak, the decode steps
  // (gen - 1 of them, seqs tokens each) against the same roofline.
  const double iterations = static_cast<double>(state.iterations());
  const double decode_tok_per_s =
      iterations * seqs * (gen - 1) / std::max(1e-9, seconds - prefill_seconds);
  state.counters["prefill_s"] = prefill_seconds / iterations;
  state.counters["prefill_peak_fraction"] =
      iterations * seqs * prompt_len * flops_per_token / prefill_seconds / 1e9 / peak().best();
  state.counters["decode_step_ms"] = 1e3 * seqs / decode_tok_per_s;
  state.counters["decode_roofline_fraction"] = decode_tok_per_s / roofline;
}

void BM_Prefill(benchmark::State& state, bool medium) {
  const int tp = static_cast<int>(state.range(0));
  const int len = 512;
  auto engine = make_engine(tp, "kv_bf16_paged", len / 16, medium);
  double seconds = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    exec::Batch batch;
    exec::SequenceStep step;
    step.tokens = prompt(len, 3);
    step.pages.resize(len / 16);
    std::iota(step.pages.begin(), step.pages.end(), 0);
    batch.sequences.push_back(std::move(step));
    const auto start = Clock::now();
    auto logits = engine->step(batch);
    benchmark::DoNotOptimize(logits->data());
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    tokens += len;
  }
  const double tok_per_s = static_cast<double>(tokens) / seconds;
  // 2 flops per parameter per token (the products; attention over the 512 tokens adds ~6%, not
  // counted, so the fraction errs low).
  const double flops_per_token = 2.0 * static_cast<double>(weights().config.parameter_count());
  state.counters["prefill_tok_per_s"] = tok_per_s;
  state.counters["peak_GFLOPs"] = peak().best();
  state.counters["peak_fraction"] = tok_per_s * flops_per_token / 1e9 / peak().best();
}

// KV bytes per token of synth-76m in `store` (TP 1, pages of 16): the store's own page bytes.
uint64_t kv_bytes_per_token(const std::string& store) {
  const model::ModelConfig& c = weights().config;
  capacity::KvShape shape;
  shape.layers = static_cast<uint32_t>(c.num_hidden_layers);
  shape.kv_heads = static_cast<uint32_t>(c.num_key_value_heads);
  shape.head_dim = shape.v_head_dim = static_cast<uint32_t>(c.head_dim);
  capacity::Budget budget;
  budget.device_memory = uint64_t{1} << 32;
  const capacity::StoreCapacity cap = capacity::store_capacity(
      **registry().load_kv_store(store), nullptr, *capacity::kv_geometry(shape, 1, 16), budget);
  return cap.plan.bytes_per_token();
}

void BM_DecodeLongContext(benchmark::State& state, const std::string& store) {
  const int64_t context = 4096, new_tokens = 33;
  auto engine = make_engine(1, store, context / 16 + 8);
  exec::GenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.prefill_chunk = 512;
  const double tok_per_s = decode_tok_per_s(state, *engine, prompt(context, 2), o);
  state.counters["decode_tok_per_s"] = tok_per_s;
  // Each decode step reads every weight and the KV of the context so far (its mean over the
  // steps); a streaming read of as many bytes, measured now, bounds the tokens per second.
  const double weight_bytes = static_cast<double>(weights().config.weight_bytes(2));
  const double kv_bytes = static_cast<double>(kv_bytes_per_token(store)) *
                          (static_cast<double>(context) + static_cast<double>(new_tokens) / 2);
  const double read_GBps = read_bandwidth_GBps(static_cast<size_t>(weight_bytes));
  state.counters["kv_MiB_per_step"] = kv_bytes / (1 << 20);
  state.counters["read_GBps"] = read_GBps;
  state.counters["bandwidth_ceiling_tok_per_s"] = read_GBps * 1e9 / (weight_bytes + kv_bytes);
}

void BM_RealVocabulary(benchmark::State& state, int seqs, bool sampled, Format format) {
  const int prompt_len = 32, steps = 32, pages_per_seq = (prompt_len + steps + 16) / 16;
  // What model.matmul_precision = "auto" takes for bf16 weights on this CPU.
  const bool medium = kernels::gemm_isa_supported(kernels::GemmIsa::kAvx512Bf16);
  auto engine =
      make_engine(1, "kv_bf16_paged", seqs * pages_per_seq, medium, weights_1b(), format);
  double decode_seconds = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    std::vector<sampling::Sampler> samplers;
    samplers.reserve(static_cast<size_t>(seqs));
    exec::Batch batch;
    std::vector<std::vector<int32_t>> history(static_cast<size_t>(seqs));
    for (int s = 0; s < seqs; ++s) {
      sampling::SamplingParams p;
      if (sampled) p.temperature = 0.7f, p.top_p = 0.95f;
      p.seed = static_cast<uint64_t>(s);
      samplers.emplace_back(p);
      exec::SequenceStep step;
      step.tokens = prompt(prompt_len, s);
      step.pages.resize(pages_per_seq);
      std::iota(step.pages.begin(), step.pages.end(), s * pages_per_seq);
      history[static_cast<size_t>(s)] = step.tokens;
      batch.sequences.push_back(std::move(step));
    }
    // Each sequence drawn by its own sampler, as the serving core's runner has the engine do.
    std::vector<exec::SequenceSampling> sampling(static_cast<size_t>(seqs));
    for (int s = 0; s < seqs; ++s) {
      const auto i = static_cast<size_t>(s);
      sampling[i] = exec::SequenceSampling{&samplers[i], history[i], prompt_len, true};
    }
    auto next = engine->step_and_sample(batch, sampling);  // the prompts, not timed
    const auto start = Clock::now();
    for (int t = 0; t < steps; ++t) {
      for (int s = 0; s < seqs; ++s) {
        exec::SequenceStep& step = batch.sequences[static_cast<size_t>(s)];
        step.start += static_cast<int32_t>(step.tokens.size());
        step.tokens.assign(1, (*next)[static_cast<size_t>(s)]);
      }
      next = engine->step_and_sample(batch, sampling);
    }
    decode_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    tokens += int64_t{seqs} * steps;
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["decode_tok_per_s"] = static_cast<double>(tokens) / decode_seconds;
  state.counters["step_ms"] = 1e3 * decode_seconds / (iterations * steps);
}

}  // namespace

int main(int argc, char** argv) {
  // Log lines (the OpenBLAS core-type warning, plugin notes) on stderr: stdout is the
  // benchmark's, JSON alone with --benchmark_format=json.
  spdlog::set_default_logger(spdlog::stderr_color_mt("e2e_bench"));
  benchmark::Initialize(&argc, argv);
  // Each case with the activations in f32 (model.matmul_precision = "highest"), then with
  // "medium" (the name's /medium: what "auto" takes on a CPU with the AVX-512 BF16 dot product),
  // one after the other in the same process.
  for (const bool medium : {false, true}) {
    const std::string suffix = medium ? "/medium" : "";
    benchmark::RegisterBenchmark(("decode/batch1" + suffix).c_str(), BM_DecodeBatch1, medium,
                                 Format::kBf16)
        ->Arg(1)
        ->Arg(2)
        ->ArgName("tp")
        ->Iterations(3)
        ->Unit(benchmark::kSecond);
    for (int seqs : {64, 8}) {
      benchmark::RegisterBenchmark(("batch" + std::to_string(seqs) + "/128+128" + suffix).c_str(),
                                   BM_Batch, seqs, medium, Format::kBf16)
          ->Arg(1)
          ->Arg(2)
          ->ArgName("tp")
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
    }
    benchmark::RegisterBenchmark(("prefill/512" + suffix).c_str(), BM_Prefill, medium)
        ->Arg(1)
        ->ArgName("tp")
        ->Iterations(3)
        ->Unit(benchmark::kSecond);
  }
  for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3"}) {
    benchmark::RegisterBenchmark((std::string("decode/ctx4096/") + store).c_str(),
                                 BM_DecodeLongContext, std::string(store))
        ->Iterations(1)
        ->Unit(benchmark::kSecond);
  }
  for (int seqs : {1, 16, 64}) {
    for (const bool sampled : {false, true}) {
      benchmark::RegisterBenchmark(("llama-3.2-1b-shape/decode/batch" + std::to_string(seqs) +
                                    (sampled ? "/sampled" : "/greedy"))
                                       .c_str(),
                                   BM_RealVocabulary, seqs, sampled, Format::kBf16)
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
    }
  }
  // Projections quantized at load (model.quantization), at "auto"'s activations for them: the
  // bf16 cases above at the same shapes are the baseline (the figures' ratio: interleave runs).
  for (const Format f : {Format::kInt4, Format::kFp8}) {
    benchmark::RegisterBenchmark(("decode/batch1" + suffix_of(f)).c_str(), BM_DecodeBatch1,
                                 false, f)
        ->Arg(1)
        ->ArgName("tp")
        ->Iterations(3)
        ->Unit(benchmark::kSecond);
    for (int seqs : {64, 8}) {
      benchmark::RegisterBenchmark(
          ("batch" + std::to_string(seqs) + "/128+128" + suffix_of(f)).c_str(), BM_Batch, seqs,
          false, f)
          ->Arg(1)
          ->ArgName("tp")
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
    }
  }
  for (const Format f : {Format::kBf16, Format::kInt4, Format::kFp8}) {
    for (int seqs : {1, 8, 64}) {
      if (f == Format::kBf16 && seqs != 8) continue;  // 1 and 64 are above
      benchmark::RegisterBenchmark(("llama-3.2-1b-shape/decode/batch" + std::to_string(seqs) +
                                    "/greedy" + suffix_of(f))
                                       .c_str(),
                                   BM_RealVocabulary, seqs, false, f)
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
