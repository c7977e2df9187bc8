// The serving core over an executor that answers from a script: a refusal is a Status naming
// the field and the sink never hears of it; outputs come one per step and end exactly once; a
// stop string ends its request in the step that completes it, counted as finished, and no
// output ever carries a part of it; an engine failure ends the failed batch.
#include "core/serve/serving_core.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>

#include "core/sched/page_hash.h"

namespace kvrt::serve {
namespace {

// Samples script[output length] for every sequence (7 past its end); fails the call numbered
// `fail_at` (1-based) when set.
class Scripted : public BatchRunner {
 public:
  explicit Scripted(std::vector<int32_t> script = {}) : script_(std::move(script)) {}
  Status run(const sched::ScheduledBatch& b, std::span<sampling::Sampler* const>,
             std::vector<int32_t>* next) override {
    if (++calls_ == fail_at) return Status::Internal("the device fell over");
    for (size_t i = 0; i < b.sequences.size(); ++i) {
      const auto k = static_cast<size_t>(b.sequences[i].request->output_len());
      (*next)[i] = k < script_.size() ? script_[k] : 7;
    }
    return Status::Ok();
  }
  int fail_at = 0;

 private:
  std::vector<int32_t> script_;
  int calls_ = 0;
};

ServingOptions options() {
  ServingOptions o;
  o.scheduler.page_size = 4;
  o.scheduler.num_pages = 64;
  o.scheduler.vocab_size = 512;
  o.scheduler.root_hash = sched::root_hash("serving_core_test");
  o.scheduler.log_interval = 0;
  o.scheduler.check_invariants = true;
  o.store = "test";
  return o;
}

GenerateRequest request(uint64_t id) {
  GenerateRequest r;
  r.id = id;
  r.input_ids = {1, 5, 9, 13, 17};
  r.max_new_tokens = 3;
  return r;
}

// Every output a request's sink heard.
struct Heard {
  std::vector<RequestOutput> outputs;
  std::vector<int32_t> ids;
  std::string text;
  RequestSink sink() {
    return [this](const RequestOutput& o) {
      outputs.push_back(o);
      ids.insert(ids.end(), o.new_ids.begin(), o.new_ids.end());
      text += o.new_text;
    };
  }
  int ends() const {
    int n = 0;
    for (const RequestOutput& o : outputs) n += o.finished ? 1 : 0;
    return n;
  }
};

void run(ServingCore& core) {
  for (int i = 0; i < 1000 && !core.idle(); ++i) ASSERT_TRUE(core.step().ok());
  ASSERT_TRUE(core.idle());
}

TEST(ServingCore, RefusesARequestWithAStatusNamingTheFieldAndItsSinkNeverHears) {
  Scripted executor;
  ServingOptions o = options();
  o.scheduler.max_context = 64;
  ServingCore core(o, &executor, nullptr);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::pair<std::string, GenerateRequest>> bad;
  auto add = [&](const std::string& field, auto edit) {
    GenerateRequest r = request(bad.size() + 1);
    edit(r);
    bad.push_back({field, r});
  };
  add("temperature", [](GenerateRequest& r) { r.sampling.temperature = -0.5f; });
  add("temperature", [nan](GenerateRequest& r) { r.sampling.temperature = nan; });
  add("temperature", [inf](GenerateRequest& r) { r.sampling.temperature = inf; });
  add("top_p", [](GenerateRequest& r) { r.sampling.top_p = 0.0f; });
  add("top_p", [](GenerateRequest& r) { r.sampling.top_p = 1.5f; });
  add("top_p", [nan](GenerateRequest& r) { r.sampling.top_p = nan; });
  add("min_p", [](GenerateRequest& r) { r.sampling.min_p = 2.0f; });
  add("top_k", [](GenerateRequest& r) { r.sampling.top_k = -1; });
  add("stop_token_ids", [](GenerateRequest& r) { r.stop_token_ids = {2, 600}; });
  add("max_new_tokens", [](GenerateRequest& r) { r.max_new_tokens = -4; });
  add("max_new_tokens", [](GenerateRequest& r) { r.max_new_tokens = 60; });  // past the context
  add("input_ids", [](GenerateRequest& r) { r.input_ids = {}; });
  add("input_ids", [](GenerateRequest& r) { r.input_ids = {3, 512}; });
  add("stop", [](GenerateRequest& r) { r.stop = {"x"}; });  // no tokenizer
  Heard refused;
  for (const auto& [field, r] : bad) {
    const Status s = core.submit(r, refused.sink());
    EXPECT_EQ(s.field(), field) << s.message();
    EXPECT_EQ(s.message().rfind(field + ": ", 0), 0u) << s.message();
    EXPECT_EQ(core.check_request(r).message(), s.message());
  }
  Heard good;
  GenerateRequest r = request(100);
  r.sampling = {0.8f, 20, 0.9f, 3};
  ASSERT_TRUE(core.submit(r, good.sink()).ok());
  run(core);
  EXPECT_TRUE(refused.outputs.empty());
  EXPECT_EQ(good.ends(), 1);
  EXPECT_EQ(good.ids.size(), 3u);
  EXPECT_EQ(core.counters().submitted, 1u);
  EXPECT_EQ(core.counters().aborted, 0u);
}

TEST(ServingCore, OutputsComeOnePerStepAndTheLastOneAloneIsFinished) {
  Scripted executor({40, 41, 42, 43, 44, 45, 46});
  ServingOptions o = options();
  o.scheduler.num_continuous_decode_steps = 3;  // three ids per decode step
  ServingCore core(o, &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.max_new_tokens = 7;
  r.stop_token_ids = {99};
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  int steps = 0;
  while (!core.idle()) {
    ASSERT_TRUE(core.step().ok());
    ++steps;
  }
  ASSERT_EQ(heard.outputs.size(), static_cast<size_t>(steps));  // prefill (1 id), 3, 3
  EXPECT_EQ(heard.outputs[0].new_ids, std::vector<int32_t>({40}));
  EXPECT_EQ(heard.ids, std::vector<int32_t>({40, 41, 42, 43, 44, 45, 46}));
  for (size_t i = 0; i + 1 < heard.outputs.size(); ++i) EXPECT_FALSE(heard.outputs[i].finished);
  const RequestOutput& end = heard.outputs.back();
  EXPECT_TRUE(end.finished);
  EXPECT_EQ(end.finish_reason, FinishReason::kLength);
  EXPECT_EQ(end.output_tokens, 7);
  EXPECT_EQ(end.prompt_tokens, 5);
}

TEST(ServingCore, AStreamHearsItsFirstTokenAtOnceThenEveryStreamIntervalTokens) {
  Scripted executor({40, 41, 42, 43, 44, 45, 46, 47, 48, 49});
  ServingOptions o = options();
  o.stream_interval = 4;
  ServingCore core(o, &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.max_new_tokens = 10;
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  run(core);
  // The prefill's token, then 4, 4, and the last one at the end.
  ASSERT_EQ(heard.outputs.size(), 4u);
  EXPECT_EQ(heard.outputs[0].new_ids, std::vector<int32_t>({40}));
  EXPECT_EQ(heard.outputs[1].new_ids, std::vector<int32_t>({41, 42, 43, 44}));
  EXPECT_EQ(heard.outputs[2].new_ids, std::vector<int32_t>({45, 46, 47, 48}));
  EXPECT_EQ(heard.outputs[3].new_ids, std::vector<int32_t>({49}));
  EXPECT_EQ(heard.ends(), 1);
  EXPECT_TRUE(heard.outputs.back().finished);
  EXPECT_EQ(heard.outputs[2].output_tokens, 9);
}

TEST(ServingCore, ARequestThatDoesNotStreamHearsOnlyItsEndWithEveryId) {
  Scripted executor({40, 41, 42, 43, 44});
  ServingCore core(options(), &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.max_new_tokens = 5;
  r.stream = false;
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  run(core);
  ASSERT_EQ(heard.outputs.size(), 1u);
  EXPECT_TRUE(heard.outputs[0].finished);
  EXPECT_EQ(heard.outputs[0].new_ids, std::vector<int32_t>({40, 41, 42, 43, 44}));
  EXPECT_EQ(heard.outputs[0].output_tokens, 5);
}

TEST(ServingCore, AStopTokenEndsItNamingTheId) {
  Scripted executor({40, 41, 99, 43});
  ServingCore core(options(), &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.max_new_tokens = 10;
  r.stop_token_ids = {99};
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  run(core);
  ASSERT_EQ(heard.ends(), 1);
  EXPECT_EQ(heard.outputs.back().finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(heard.outputs.back().matched_token, 99);
  EXPECT_EQ(heard.ids, std::vector<int32_t>({40, 41, 99}));
}

// The model's EOS ids, given to the core, stop every request beside its own stop ids, unless it
// ignores them (ignore_eos); then only its own stop ids do.
TEST(ServingCore, TheModelsEosIdsStopARequestUnlessItIgnoresThem) {
  ServingOptions o = options();
  o.eos_token_ids = {41, 42};
  for (bool ignore : {false, true}) {
    Scripted executor({40, 42, 99, 43});
    ServingCore core(o, &executor, nullptr);
    Heard heard;
    GenerateRequest r = request(1);
    r.max_new_tokens = 10;
    r.stop_token_ids = {99};
    r.ignore_eos = ignore;
    ASSERT_TRUE(core.submit(r, heard.sink()).ok());
    run(core);
    ASSERT_EQ(heard.ends(), 1);
    EXPECT_EQ(heard.outputs.back().finish_reason, FinishReason::kStopToken);
    EXPECT_EQ(heard.outputs.back().matched_token, ignore ? 99 : 42);
    EXPECT_EQ(heard.ids, ignore ? std::vector<int32_t>({40, 42, 99})
                                : std::vector<int32_t>({40, 42}));
  }
}

// max_new_tokens 0 (SGLang's, as bench_serving's random dataset sends it): the prompt is
// prefilled and its pages cached, and the request ends with no ids, as a length, even when the
// token the prefill sampled is a stop id.
TEST(ServingCore, ZeroMaxNewTokensEndsWithNoIdsAsALengthAfterItsPrefill) {
  Scripted executor({99});
  ServingCore core(options(), &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.input_ids = {1, 5, 9, 13, 17, 21, 25, 29};  // two whole pages
  r.max_new_tokens = 0;
  r.stop_token_ids = {99};
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  run(core);
  ASSERT_EQ(heard.outputs.size(), 1u);
  EXPECT_TRUE(heard.outputs[0].finished);
  EXPECT_EQ(heard.outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(heard.ids.empty());
  EXPECT_EQ(heard.outputs[0].prompt_tokens, 8);
  EXPECT_EQ(core.counters().finished, 1u);
  // The same prompt again finds its pages in the prefix cache: the prefill ran.
  Heard again;
  GenerateRequest next = request(2);
  next.input_ids = r.input_ids;
  ASSERT_TRUE(core.submit(next, again.sink()).ok());
  run(core);
  ASSERT_EQ(again.ends(), 1);
  EXPECT_GT(again.outputs.back().cached_tokens, 0);
}

TEST(ServingCore, AnAbortBetweenStepsIsHeardAtOnceWithItsMessage) {
  Scripted executor;
  ServingCore core(options(), &executor, nullptr);
  Heard heard;
  GenerateRequest r = request(1);
  r.max_new_tokens = 50;
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  ASSERT_TRUE(core.step().ok());
  EXPECT_TRUE(core.abort(1, "the client disconnected"));
  ASSERT_EQ(heard.ends(), 1);
  EXPECT_EQ(heard.outputs.back().finish_reason, FinishReason::kAborted);
  EXPECT_EQ(heard.outputs.back().message, "the client disconnected");
  EXPECT_FALSE(core.abort(1, "again"));
  EXPECT_TRUE(core.idle());
  EXPECT_EQ(core.unfinished(), 0u);
}

TEST(ServingCore, AnEngineFailureEndsTheFailedBatchAsAnEngineFailure) {
  Scripted executor;
  executor.fail_at = 2;  // the first decode step
  ServingCore core(options(), &executor, nullptr);
  Heard a, b;
  GenerateRequest ra = request(1), rb = request(2);
  ra.max_new_tokens = rb.max_new_tokens = 5;
  ASSERT_TRUE(core.submit(ra, a.sink()).ok());
  ASSERT_TRUE(core.submit(rb, b.sink()).ok());
  ASSERT_TRUE(core.step().ok());  // both prefilled
  Result<sched::StepStats> failed = core.step();
  ASSERT_FALSE(failed.ok());
  for (Heard* h : {&a, &b}) {
    ASSERT_EQ(h->ends(), 1);
    EXPECT_EQ(h->outputs.back().finish_reason, FinishReason::kEngineFailure);
    EXPECT_NE(h->outputs.back().message.find("the device fell over"), std::string::npos);
  }
  EXPECT_TRUE(core.idle());
}

// stories260k's SentencePiece tokenizer, or null (the test skips) without ../shared.
std::unique_ptr<text::Tokenizer> stories_tokenizer() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  Result<std::unique_ptr<text::Tokenizer>> t = text::load_model_tokenizer(
      std::string(root != nullptr ? root : ".") + "/../shared/models/stories260k");
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(ServingCore, AStopStringEndsItInTheStepThatCompletesItCountedAsFinished) {
  std::unique_ptr<text::Tokenizer> tok = stories_tokenizer();
  if (tok == nullptr) GTEST_SKIP() << "../shared/models/stories260k is absent";
  const std::string story = "there was a little girl who liked to play";
  std::vector<int32_t> script = tok->encode(story, false);
  ServingOptions o = options();
  o.scheduler.vocab_size = tok->vocab_size();
  o.tokenizer = tok.get();
  Scripted executor(script);
  ServingCore core(o, &executor, nullptr);
  Heard heard;
  GenerateRequest r;
  r.id = 1;
  r.input_ids = tok->encode("Once upon a time,", true);
  r.max_new_tokens = static_cast<int32_t>(script.size());
  r.stop = {" girl", "never"};
  ASSERT_TRUE(core.submit(r, heard.sink()).ok());
  std::string sent;
  while (!core.idle()) {
    const size_t before = heard.outputs.size();
    ASSERT_TRUE(core.step().ok());
    for (size_t i = before; i < heard.outputs.size(); ++i) {
      sent += heard.outputs[i].new_text;
      // Never any part of the stop string, not even the space it starts with.
      EXPECT_EQ(sent.find(" gir"), std::string::npos) << sent;
      EXPECT_NE(sent.back(), ' ') << sent;
    }
  }
  ASSERT_EQ(heard.ends(), 1);
  const RequestOutput& end = heard.outputs.back();
  EXPECT_EQ(end.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(end.matched_stop, " girl");
  EXPECT_EQ(heard.text, " there was a little");
  // It ended with the token that completed " girl", not later.
  size_t girl = 0;
  while (girl < script.size() && tok->decode(std::span(script).first(girl)).find(" girl") ==
                                     std::string::npos) {
    ++girl;
  }
  EXPECT_EQ(static_cast<size_t>(end.output_tokens), girl);
  EXPECT_EQ(core.counters().finished, 1u);
  EXPECT_EQ(core.counters().aborted, 0u);
  const std::string metrics = core.prometheus();
  EXPECT_NE(metrics.find("kvrt:num_requests_total 1"), std::string::npos);
  EXPECT_NE(metrics.find("kvrt:num_aborted_requests_total 0"), std::string::npos);
}

}  // namespace
}  // namespace kvrt::serve
