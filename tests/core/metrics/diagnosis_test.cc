#include "core/metrics/diagnosis.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvrt::metrics {
namespace {

// The budget of DESIGN.md's example: bf16 holds 159744 tokens, fp8 (with scales) 310128, and the
// host-tiered store the same as bf16 on the device.
const std::vector<StoreCeiling> kStores = {
    {"kv_bf16_paged", 159744, false},
    {"kv_fp8_e4m3", 310128, false},
    {"kv_host_tiered", 159744, true},
};

StepSample step(int running, int queued, uint64_t tokens_in_use, uint64_t mean_length,
                bool blocked) {
  StepSample s;
  s.running = running;
  s.queued = queued;
  s.tokens_in_use = tokens_in_use;
  s.live_tokens = static_cast<uint64_t>(running) * mean_length;
  s.admission_blocked_by_kv = blocked;
  s.step_seconds = 0.05;
  s.decode_tokens = running;
  return s;
}

TEST(Diagnosis, KvBoundNamesTheCeilingAndEveryOtherStore) {
  // 35 requests of ~4K tokens fill 94% of a 159744-token pool, 115 wait, and the queue head
  // did not fit in 97 of 100 steps.
  DiagnosisWindow w;
  for (int i = 0; i < 100; ++i) w.add(step(35, 115, 150159, 4012, i < 97));
  Diagnosis d = w.diagnose(159744, "kv_bf16_paged", kStores);

  EXPECT_EQ(d.kind, Diagnosis::Kind::kKvBound);
  EXPECT_NEAR(d.ceiling, 39.8, 0.05);
  EXPECT_NEAR(d.mean_token_usage, 0.94, 0.001);
  EXPECT_DOUBLE_EQ(d.kv_blocked_share, 0.97);
  EXPECT_EQ(d.line,
            "Diagnosis: KV-bound. running 35.0 (ceiling 159744 / 4012 = 39.8), queue 115.0, "
            "token usage 0.94, admission blocked by KV in 97% of steps. Same budget: "
            "kv_fp8_e4m3 -> ceiling 77.3; kv_host_tiered -> ceiling 39.8 (a host tier keeps "
            "prefixes for reuse; it does not raise the number of requests that can decode at "
            "once).");
}

TEST(Diagnosis, CeilingIsPoolOverMeanLiveLengthOfRunningRequests) {
  // The mean is over request-steps: 10 requests of 1000 and 30 of 3000 average 2500, not 2000.
  DiagnosisWindow w;
  w.add(step(10, 0, 10000, 1000, false));
  w.add(step(30, 0, 90000, 3000, false));
  Diagnosis d = w.diagnose(100000, "kv_bf16_paged", {});
  EXPECT_DOUBLE_EQ(d.mean_live_length, 2500.0);
  EXPECT_DOUBLE_EQ(d.ceiling, 40.0);
  EXPECT_DOUBLE_EQ(d.mean_running, 20.0);
  EXPECT_DOUBLE_EQ(d.mean_token_usage, 0.5);
}

TEST(Diagnosis, KvBoundByUsageAloneOrByBlockedAdmissionsAlone) {
  DiagnosisWindow full;  // usage 0.95, never reported blocked
  for (int i = 0; i < 10; ++i) full.add(step(30, 5, 95000, 3000, false));
  EXPECT_EQ(full.diagnose(100000, "kv_bf16_paged", {}).kind, Diagnosis::Kind::kKvBound);

  DiagnosisWindow blocked;  // usage 0.5 (long prompts at the head), blocked in half the steps
  for (int i = 0; i < 10; ++i) blocked.add(step(10, 5, 50000, 5000, i % 2 == 0));
  EXPECT_EQ(blocked.diagnose(100000, "kv_bf16_paged", {}).kind, Diagnosis::Kind::kKvBound);
}

TEST(Diagnosis, HostTierNoteWhenTheCurrentStoreIsTiered) {
  DiagnosisWindow w;
  for (int i = 0; i < 4; ++i) w.add(step(25, 40, 98000, 4000, true));
  Diagnosis d = w.diagnose(100000, "kv_host_tiered",
                           {{"kv_host_tiered", 100000, true}, {"kv_fp8_e4m3", 200000, false}});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kKvBound);
  EXPECT_EQ(d.line,
            "Diagnosis: KV-bound. running 25.0 (ceiling 100000 / 4000 = 25.0; a host tier keeps "
            "prefixes for reuse; it does not raise the number of requests that can decode at "
            "once), queue 40.0, token usage 0.98, admission blocked by KV in 100% of steps. Same "
            "budget: kv_fp8_e4m3 -> ceiling 50.0.");
}

TEST(Diagnosis, ClientBoundWhenNothingWaitsAndSlotsAreFree) {
  DiagnosisWindow w;
  for (int i = 0; i < 10; ++i) w.add(step(4, 0, 16000, 4000, false));
  Diagnosis d = w.diagnose(160000, "kv_bf16_paged", kStores);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kClientBound);
  EXPECT_EQ(d.line,
            "Diagnosis: client-bound. running 4.0, queue 0.0, token usage 0.10: the server has "
            "room for more requests (ceiling 40.0); send more concurrent requests.");
}

TEST(Diagnosis, ComputeBoundWhenRequestsWaitButKvHasRoom) {
  // 8 running (a max_running_requests of 8), 20 waiting, KV a third full, never blocked by KV.
  DiagnosisWindow w;
  for (int i = 0; i < 10; ++i) {
    StepSample s = step(8, 20, 32000, 4000, false);
    s.new_admissions = i % 5 == 0 ? 1 : 0;
    s.prefill_tokens = i % 5 == 0 ? 512 : 0;
    w.add(s);
  }
  Diagnosis d = w.diagnose(96000, "kv_bf16_paged", kStores);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kComputeBound);
  EXPECT_DOUBLE_EQ(d.mean_step_seconds, 0.05);
  EXPECT_DOUBLE_EQ(d.mean_tokens_per_step, 8.0 + 102.4);
  EXPECT_EQ(d.line,
            "Diagnosis: compute-bound. running 8.0 (ceiling 24.0), queue 20.0, token usage 0.33, "
            "admission blocked by KV in 0% of steps. Mean step 50.0 ms for 110.4 tokens "
            "(8.0 decode + 102.4 prefill), 2 admitted; requests wait but KV is not what stops "
            "them: if running sits at max_running_requests raise it, otherwise the step time "
            "dominates.");
}

TEST(Diagnosis, AtTheCeilingWithNothingWaitingIsNotClientBound) {
  // More clients would not help: the pool already holds as many requests as it can.
  DiagnosisWindow w;
  for (int i = 0; i < 10; ++i) w.add(step(40, 0, 80000, 2000, false));
  Diagnosis d = w.diagnose(80000, "kv_bf16_paged", {});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kComputeBound);
  EXPECT_NE(d.line.find("running is at the ceiling with nothing waiting"), std::string::npos);
}

TEST(Diagnosis, IdleWithoutStepsOrWithoutRequests) {
  DiagnosisWindow w;
  Diagnosis none = w.diagnose(160000, "kv_bf16_paged", kStores);
  EXPECT_EQ(none.kind, Diagnosis::Kind::kIdle);
  EXPECT_EQ(none.line, "Diagnosis: idle. no scheduler steps in this interval.");

  w.add(StepSample{});
  EXPECT_EQ(w.diagnose(160000, "kv_bf16_paged", kStores).kind, Diagnosis::Kind::kIdle);
  EXPECT_EQ(kind_name(Diagnosis::Kind::kKvBound), "KV-bound");
}

TEST(Diagnosis, ResetStartsANewInterval) {
  DiagnosisWindow w;
  for (int i = 0; i < 10; ++i) w.add(step(35, 115, 150000, 4000, true));
  ASSERT_EQ(w.diagnose(159744, "kv_bf16_paged", {}).kind, Diagnosis::Kind::kKvBound);

  w.reset();
  EXPECT_EQ(w.steps(), 0u);
  EXPECT_EQ(w.diagnose(159744, "kv_bf16_paged", {}).kind, Diagnosis::Kind::kIdle);

  // Only the new interval counts: the earlier queue and blocked steps are gone.
  w.add(step(2, 0, 8000, 4000, false));
  Diagnosis d = w.diagnose(159744, "kv_bf16_paged", {});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kClientBound);
  EXPECT_DOUBLE_EQ(d.mean_queue, 0.0);
  EXPECT_DOUBLE_EQ(d.kv_blocked_share, 0.0);
  EXPECT_EQ(d.steps, 1u);
}

}  // namespace
}  // namespace kvrt::metrics
