// The serving core over an executor that answers at once: requests end exactly once, and
// sampling parameters the scheduler does not check are refused at submit, naming the field.
#include "core/serve/serving_core.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "core/sched/page_hash.h"

namespace kvrt::serve {
namespace {

class Instant : public sched::StepExecutor {
 public:
  Status run(const sched::ScheduledBatch& b, std::vector<int32_t>* next) override {
    for (size_t i = 0; i < b.sequences.size(); ++i) (*next)[i] = 7;
    return Status::Ok();
  }
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

TEST(ServingCore, RefusesSamplingParametersNamingTheField) {
  Instant executor;
  ServingCore core(options(), &executor, nullptr);
  std::map<uint64_t, std::string> aborted;
  std::map<uint64_t, size_t> completed;
  core.on_finish([&](const sched::Request& r, sched::FinishKind kind, const std::string& why) {
    if (kind == sched::FinishKind::kAborted) {
      aborted[r.spec.id] = why;
    } else {
      completed[r.spec.id] = r.output().size();
    }
  });
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
  add("top_k", [](GenerateRequest& r) { r.sampling.top_k = -1; });
  add("stop_token_ids", [](GenerateRequest& r) { r.stop_token_ids = {2, 600}; });
  add("max_new_tokens", [](GenerateRequest& r) { r.max_new_tokens = -4; });
  for (const auto& [field, r] : bad) core.submit(r);
  GenerateRequest good = request(100);
  good.sampling = {0.8f, 20, 0.9f, 3};
  core.submit(good);
  while (!core.idle()) ASSERT_TRUE(core.step().ok());

  ASSERT_EQ(aborted.size(), bad.size());
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string& why = aborted[i + 1];
    EXPECT_NE(why.find("request " + std::to_string(i + 1) + ": " + bad[i].first), std::string::npos)
        << why;
  }
  EXPECT_EQ(completed.size(), 1u);
  EXPECT_EQ(completed[100], 3u);
  EXPECT_EQ(core.counters().submitted, bad.size() + 1);
  EXPECT_EQ(core.counters().aborted, bad.size());
}

}  // namespace
}  // namespace kvrt::serve
