#include "core/sched/scheduler.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/sched/page_hash.h"

namespace kvrt::sched {
namespace {

constexpr int32_t kVocab = 1000;

// The token a request emits at a position: independent of batching, caching and retraction,
// so every schedule must produce the same outputs.
int32_t expected_token(uint64_t id, int64_t position) {
  return static_cast<int32_t>((id * 7919 + static_cast<uint64_t>(position) * 104729) % 997);
}

// A KV pool of token ids instead of K/V: each step checks that every position a sequence reads
// holds that sequence's token (so cached, loaded and retracted pages are right), that no two
// sequences write one slot, then writes the new tokens.
class ShadowExecutor {
 public:
  ShadowExecutor(uint32_t page_size, uint64_t num_pages)
      : page_size_(page_size), slots_(num_pages * page_size, -1) {}

  Status run(const ScheduledBatch& batch, std::vector<int32_t>* next) {
    ++steps;
    if (fail_next > 0) {
      --fail_next;
      return Status::Internal("injected executor failure");
    }
    written_.clear();
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      const ScheduledSequence& s = batch.sequences[i];
      const Request& r = *s.request;
      max_batch_tokens = std::max<int64_t>(max_batch_tokens, batch.num_tokens());
      for (int64_t pos = 0; pos < s.start; ++pos) {
        if (slots_[slot(s, pos)] != r.tokens[pos]) {
          return fail("request " + std::to_string(r.spec.id) + " reads a wrong token at " +
                      std::to_string(pos));
        }
      }
      for (size_t j = 0; j < s.tokens.size(); ++j) {
        const int64_t pos = s.start + static_cast<int64_t>(j);
        if (s.tokens[j] != r.tokens[pos]) return fail("batch token differs from the request's");
        const int64_t sl = slot(s, pos);
        if (!written_.insert(sl).second) return fail("two sequences write one slot");
        slots_[sl] = s.tokens[j];
      }
      if (s.samples) {
        (*next)[i] = expected_token(r.spec.id, s.start + static_cast<int64_t>(s.tokens.size()));
      }
    }
    return Status::Ok();
  }

  std::vector<int32_t>& slots() { return slots_; }
  uint32_t page_size() const { return page_size_; }

  int fail_next = 0;
  int64_t steps = 0;
  int64_t max_batch_tokens = 0;
  std::string error;

 private:
  int64_t slot(const ScheduledSequence& s, int64_t pos) const {
    return int64_t{s.pages[pos / page_size_]} * page_size_ + pos % page_size_;
  }
  Status fail(const std::string& what) {
    if (error.empty()) error = what;
    return Status::Internal(what);
  }

  uint32_t page_size_;
  std::vector<int32_t> slots_;
  std::unordered_set<int64_t> written_;
};

// A host tier over the shadow pool: copies page contents by hash, holds at most `capacity`
// pages (dropping the oldest), and can lose pages between lookup and load.
class ShadowTier : public KvTier {
 public:
  ShadowTier(ShadowExecutor* exec, size_t capacity, double loss = 0.0, uint64_t seed = 1)
      : exec_(exec), capacity_(capacity), loss_(loss), rng_(seed) {}

  uint64_t lookup(std::span<const uint64_t> hashes) override {
    uint64_t n = 0;
    while (n < hashes.size() && pages_.count(hashes[n])) ++n;
    return n;
  }
  Status save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              kvrt_tier_reason reason) override {
    ++saves[reason];
    if (reason == KVRT_TIER_HIT) return Status::Ok();
    const uint32_t ps = exec_->page_size();
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (pages_.count(hashes[i])) continue;
      auto first = exec_->slots().begin() + int64_t{pages[i]} * ps;
      pages_[hashes[i]].assign(first, first + ps);
      order_.push_back(hashes[i]);
      while (pages_.size() > capacity_) {
        pages_.erase(order_.front());
        order_.erase(order_.begin());
      }
    }
    return Status::Ok();
  }
  Status load(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              std::vector<uint8_t>* loaded) override {
    const uint32_t ps = exec_->page_size();
    loaded->assign(hashes.size(), 0);
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto it = pages_.find(hashes[i]);
      if (it == pages_.end() || std::uniform_real_distribution<>(0, 1)(rng_) < loss_) continue;
      std::copy(it->second.begin(), it->second.end(),
                exec_->slots().begin() + int64_t{pages[i]} * ps);
      (*loaded)[i] = 1;
      ++loaded_pages;
    }
    return Status::Ok();
  }
  Status wait() override { return Status::Ok(); }

  std::map<kvrt_tier_reason, int> saves;
  uint64_t loaded_pages = 0;

 private:
  ShadowExecutor* exec_;
  size_t capacity_;
  double loss_;
  std::mt19937_64 rng_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pages_;
  std::vector<uint64_t> order_;
};

struct Outcome {
  FinishKind kind;
  std::string reason;
  std::string field;  // a refusal's
  std::vector<int32_t> output;
  int64_t cached_tokens;
  int ends = 0;
};

SchedulerOptions small_options(uint32_t page_size, uint64_t num_pages) {
  SchedulerOptions o;
  o.page_size = page_size;
  o.num_pages = num_pages;
  o.vocab_size = kVocab;
  o.root_hash = root_hash("test-model");
  o.log_interval = 0;
  o.check_invariants = true;
  return o;
}

// Runs a scheduler to idle, recording how each request ended.
struct Harness {
  Harness(const SchedulerOptions& o, bool with_tier = false, size_t tier_pages = 0,
          double loss = 0.0)
      : exec(o.page_size, o.num_pages),
        tier(&exec, tier_pages, loss),
        sched(o, with_tier ? &tier : nullptr) {}
  void record(const Ended& e) {
    Outcome& out = outcomes[e.id];
    out.kind = e.kind;
    out.reason = e.reason;
    out.output = outputs[e.id];
    out.cached_tokens = e.cached_tokens;
    ++out.ends;
  }
  // One step as the serving core takes it: schedule -> run -> update, until the step is over.
  Result<StepStats> step() {
    for (;;) {
      const ScheduledBatch& b = sched.schedule();
      for (const Ended& e : b.ended) record(e);
      if (b.empty()) break;
      std::vector<int32_t> next(b.sequences.size(), 0);
      if (Status s = exec.run(b, &next); !s.ok()) {
        sched.fail();
        return s;
      }
      const StepUpdate u = sched.update(next);
      for (const Advanced& a : u.advanced) {
        outputs[a.id].push_back(a.token);
        if (stop_when && stop_when(outputs[a.id])) {
          if (std::optional<Ended> e = sched.stop(a.id)) record(*e);
        }
      }
      for (const Ended& e : u.ended) record(e);
    }
    return sched.end_step();
  }
  bool abort(uint64_t id, const std::string& reason) {
    std::optional<Ended> e = sched.abort(id, reason);
    if (e) record(*e);
    return e.has_value();
  }
  void submit(uint64_t id, std::vector<int32_t> prompt, int32_t max_new,
              std::vector<int32_t> stop = {}) {
    RequestSpec spec;
    spec.id = id;
    spec.prompt = std::move(prompt);
    spec.max_new_tokens = max_new;
    spec.stop_ids = std::move(stop);
    // A refusal is recorded as an abort with its message, so every submitted id has an outcome.
    // Checked first, as the serving core checks every request at its door.
    if (Status st = check_request(sched.options(), spec); !st.ok()) {
      Outcome& out = outcomes[id];
      out.kind = FinishKind::kAborted;
      out.reason = st.message();
      out.field = st.field();
      ++out.ends;
      return;
    }
    sched.submit(std::move(spec));
  }
  // Steps until idle; false (with a message) on an error or a step limit (a livelock).
  ::testing::AssertionResult run(int max_steps = 100000) {
    for (int i = 0; i < max_steps; ++i) {
      if (sched.idle()) return ::testing::AssertionSuccess();
      Result<StepStats> s = step();
      if (!s.ok()) return ::testing::AssertionFailure() << s.status().message();
      stats.push_back(*s);
    }
    return ::testing::AssertionFailure() << "not idle after " << max_steps << " steps";
  }

  ShadowExecutor exec;
  ShadowTier tier;
  Scheduler sched;
  std::map<uint64_t, Outcome> outcomes;
  std::map<uint64_t, std::vector<int32_t>> outputs;  // every token each request generated
  // Ends a request with its last token, as a stop, when this says so (as the serving core does
  // for a stop string).
  std::function<bool(const std::vector<int32_t>& output)> stop_when;
  std::vector<StepStats> stats;
};

std::vector<int32_t> prompt_of(int32_t seed, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = (seed * 131 + i * 17) % kVocab;
  return p;
}

std::vector<int32_t> expected_output(uint64_t id, int32_t prompt_len, int32_t max_new,
                                     const std::vector<int32_t>& stop = {}) {
  std::vector<int32_t> out;
  for (int32_t k = 0; k < max_new; ++k) {
    out.push_back(expected_token(id, prompt_len + k));
    if (std::find(stop.begin(), stop.end(), out.back()) != stop.end()) break;
  }
  return out;
}

TEST(Scheduler, RunsOneRequestToItsLength) {
  Harness h(small_options(4, 32));
  h.submit(1, prompt_of(1, 10), 7);
  ASSERT_TRUE(h.run());
  ASSERT_EQ(h.outcomes.size(), 1u);
  EXPECT_EQ(h.outcomes[1].kind, FinishKind::kLength);
  EXPECT_EQ(h.outcomes[1].output, expected_output(1, 10, 7));
  EXPECT_EQ(h.sched.counters().generated_tokens, 7u);
  // One prefill, then six decode steps.
  EXPECT_TRUE(h.stats.front().prefill);
  EXPECT_EQ(h.stats.size(), 7u);
  // Its pages went back: all free or cached, none in use.
  EXPECT_EQ(h.stats.back().pages_in_use, 0u);
}

TEST(Scheduler, FeedsTheServerMetrics) {
  Harness h(small_options(4, 32));
  metrics::Registry registry;
  metrics::ServerMetrics m(registry);
  h.sched.set_metrics(&m);
  h.submit(1, prompt_of(1, 10), 7);
  h.submit(2, prompt_of(2, 10), 3);
  h.submit(3, {2000}, 3);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(m.prompt_tokens_total.value(), 20);
  EXPECT_EQ(m.generation_tokens_total.value(), 10);
  EXPECT_EQ(m.num_requests_total.value(), 2);
  EXPECT_EQ(m.num_aborted_requests_total.value(), 0);  // the refused one never ran
  EXPECT_EQ(m.time_to_first_token_seconds.snapshot().count, 2u);
  EXPECT_EQ(m.inter_token_latency_seconds.snapshot().count, 8u);
  EXPECT_EQ(m.e2e_request_latency_seconds.snapshot().count, 2u);
  EXPECT_EQ(m.generation_tokens.snapshot().sum, 10);
  EXPECT_EQ(m.num_running_reqs.value(), 0);
  EXPECT_NE(registry.render_prometheus().find("kvrt:generation_tokens_total 10"),
            std::string::npos);
}

TEST(Scheduler, StopsAtAStopToken) {
  Harness h(small_options(4, 32));
  const int32_t third = expected_token(2, 10 + 2);
  h.submit(2, prompt_of(2, 10), 50, {third});
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[2].kind, FinishKind::kStop);
  EXPECT_EQ(h.outcomes[2].output.size(), 3u);
}

TEST(Scheduler, RefusesARequestThatCanNeverFitNamingTheFieldAndBothNumbers) {
  SchedulerOptions o = small_options(4, 8);  // 32 tokens in all
  o.max_context = 36;
  Harness h(o);
  h.submit(1, prompt_of(1, 20), 20);
  h.submit(2, {5, 1001, 3}, 4);
  h.submit(3, {}, 4);
  h.submit(4, prompt_of(4, 8), 8);
  h.submit(5, prompt_of(5, 4), 0);
  h.submit(6, prompt_of(6, 10), 26);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[1].field, "max_new_tokens");
  EXPECT_EQ(h.outcomes[1].reason,
            "max_new_tokens: 20 prompt tokens + 20 max_new_tokens = 40 tokens exceed the model's "
            "context of 36 tokens");
  EXPECT_EQ(h.outcomes[6].field, "max_new_tokens");
  EXPECT_NE(h.outcomes[6].reason.find("= 36 tokens of KV (9 pages) exceed max_total_num_tokens, "
                                      "the 32 tokens (8 pages) of the whole KV pool"),
            std::string::npos)
      << h.outcomes[6].reason;
  EXPECT_EQ(h.outcomes[2].field, "input_ids");
  EXPECT_NE(h.outcomes[2].reason.find("token 1001 at position 1 is outside the vocabulary"),
            std::string::npos)
      << h.outcomes[2].reason;
  EXPECT_EQ(h.outcomes[3].reason, "input_ids: the prompt is empty");
  EXPECT_EQ(h.outcomes[5].field, "max_new_tokens");
  EXPECT_EQ(h.outcomes[4].kind, FinishKind::kLength);  // the others did not hold it up
  // Refused at submit: never queued, counted nowhere.
  EXPECT_EQ(h.sched.counters().submitted, 1u);
  EXPECT_EQ(h.sched.counters().aborted, 0u);
}

TEST(Scheduler, AStopAfterATokenEndsTheRequestWithThatTokenAsAStop) {
  Harness h(small_options(4, 64));
  h.stop_when = [](const std::vector<int32_t>& output) { return output.size() == 2; };
  h.submit(1, prompt_of(1, 6), 10);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[1].kind, FinishKind::kStop);
  EXPECT_EQ(h.outcomes[1].output.size(), 2u);
  EXPECT_EQ(h.sched.counters().finished, 1u);
  EXPECT_EQ(h.sched.counters().aborted, 0u);
}

TEST(Scheduler, ChunksLongPrompts) {
  SchedulerOptions o = small_options(4, 64);
  o.chunked_prefill_size = 8;
  Harness h(o);
  h.submit(1, prompt_of(1, 30), 3);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[1].output, expected_output(1, 30, 3));
  int prefills = 0;
  for (const StepStats& s : h.stats) prefills += s.prefill ? 1 : 0;
  EXPECT_EQ(prefills, 4);  // 8 + 8 + 8 + 6
  EXPECT_LE(h.exec.max_batch_tokens, 8);
}

TEST(Scheduler, ReusesACachedPrefix) {
  Harness h(small_options(4, 64));
  std::vector<int32_t> shared = prompt_of(9, 13);  // 3 full pages + 1
  h.submit(1, shared, 2);
  ASSERT_TRUE(h.run());
  std::vector<int32_t> longer = shared;
  longer.push_back(77);
  longer.push_back(78);
  h.submit(2, longer, 2);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[1].cached_tokens, 0);
  EXPECT_EQ(h.outcomes[2].cached_tokens, 12);  // 3 full pages of the first prompt
  EXPECT_EQ(h.outcomes[2].output, expected_output(2, 15, 2));
  // The identical prompt again: all but the last token could be cached, in full pages: the
  // first request's 13 prompt + 1 decoded token with KV filled pages 0-2 plus part of page 3.
  h.submit(3, shared, 2);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[3].cached_tokens, 12);
}

TEST(Scheduler, RespectsMaxRunningRequests) {
  SchedulerOptions o = small_options(4, 256);
  o.max_running_requests = 3;
  Harness h(o);
  for (uint64_t id = 0; id < 10; ++id) h.submit(id, prompt_of(id, 5), 6);
  ASSERT_TRUE(h.run());
  for (const StepStats& s : h.stats) EXPECT_LE(s.running, 3);
  for (uint64_t id = 0; id < 10; ++id) EXPECT_EQ(h.outcomes[id].output, expected_output(id, 5, 6));
}

TEST(Scheduler, RetractsTheLeastProgressWhenDecodeRunsOutAndLosesNothing) {
  // 12 pages of 4: three requests of 4 + 20 tokens cannot all decode to the end at once.
  SchedulerOptions o = small_options(4, 12);
  o.new_token_ratio = 0.1;  // admit optimistically so decode must retract
  o.min_new_token_ratio = 0.1;
  Harness h(o);
  for (uint64_t id = 0; id < 3; ++id) h.submit(id, prompt_of(id, 4), 20);
  ASSERT_TRUE(h.run());
  EXPECT_GT(h.sched.counters().retractions, 0u);
  for (uint64_t id = 0; id < 3; ++id) {
    EXPECT_EQ(h.outcomes[id].kind, FinishKind::kLength);
    EXPECT_EQ(h.outcomes[id].output, expected_output(id, 4, 20)) << id;
    EXPECT_EQ(h.outcomes[id].ends, 1);
  }
}

TEST(Scheduler, AbortsWaitingAndRunningRequests) {
  SchedulerOptions o = small_options(4, 64);
  o.max_running_requests = 1;
  Harness h(o);
  h.submit(1, prompt_of(1, 6), 10);
  h.submit(2, prompt_of(2, 6), 10);
  ASSERT_TRUE(h.step().ok());  // 1 prefilled, 2 waits
  EXPECT_TRUE(h.abort(2, "client went away"));
  EXPECT_TRUE(h.abort(1, "client went away"));
  EXPECT_FALSE(h.abort(1, "twice"));
  EXPECT_TRUE(h.sched.idle());
  EXPECT_TRUE(h.sched.check_invariants().ok());
  EXPECT_EQ(h.outcomes[1].kind, FinishKind::kAborted);
  EXPECT_EQ(h.outcomes[1].output.size(), 1u);
  EXPECT_EQ(h.outcomes[2].reason, "client went away");
}

TEST(Scheduler, AnExecutorFailureLosesNothing) {
  Harness h(small_options(4, 64));
  h.submit(1, prompt_of(1, 6), 5);
  h.exec.fail_next = 1;
  Result<StepStats> failed = h.step();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("injected"), std::string::npos);
  EXPECT_TRUE(h.sched.check_invariants().ok());
  EXPECT_EQ(h.sched.num_waiting(), 1u);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[1].output, expected_output(1, 6, 5));
}

TEST(Scheduler, LoadsPagesTheDeviceEvictedFromTheTier) {
  // 7 pages: a's 4 cached pages cannot all stay on the device while b runs (5 pages).
  SchedulerOptions o = small_options(4, 7);
  Harness h(o, /*with_tier=*/true, /*tier_pages=*/100);
  std::vector<int32_t> a = prompt_of(1, 17), b = prompt_of(2, 17);
  h.submit(1, a, 3);
  ASSERT_TRUE(h.run());
  h.submit(2, b, 3);  // evicts a's pages from the device
  ASSERT_TRUE(h.run());
  EXPECT_GT(h.sched.counters().evicted_pages, 0u);
  h.submit(3, a, 3);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.outcomes[3].cached_tokens, 16);
  EXPECT_GT(h.tier.loaded_pages, 0u);
  EXPECT_EQ(h.outcomes[3].output, expected_output(3, 17, 3));
  EXPECT_GT(h.tier.saves[KVRT_TIER_INSERTED], 0);
  EXPECT_GT(h.tier.saves[KVRT_TIER_EVICTING], 0);
}

TEST(Scheduler, RecomputesPagesTheTierLost) {
  SchedulerOptions o = small_options(4, 10);
  Harness h(o, /*with_tier=*/true, /*tier_pages=*/100, /*loss=*/1.0);
  h.submit(1, prompt_of(1, 17), 3);
  ASSERT_TRUE(h.run());
  h.submit(2, prompt_of(2, 17), 3);
  ASSERT_TRUE(h.run());
  h.submit(3, prompt_of(1, 17), 3);
  ASSERT_TRUE(h.run());
  EXPECT_EQ(h.tier.loaded_pages, 0u);
  EXPECT_EQ(h.outcomes[3].output, expected_output(3, 17, 3));
}

// Thousands of seeded schedules: random pools, page sizes, chunking, limits, arrivals, shared
// prefixes, stop tokens, aborts and tiers. After every step the invariants hold (page owned
// once, used + free + cached = total, locks match, usage <= 1); every request ends exactly once,
// and every request not aborted produces exactly the tokens it would produce alone.
TEST(Scheduler, RandomizedSchedulesKeepEveryInvariant) {
  uint64_t retractions = 0, cached = 0, tier_loads = 0, aborted_by_client = 0;
  const int kSeeds = 2000;
  for (int seed = 0; seed < kSeeds; ++seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const uint32_t ps = 1u << pick(0, 3);
    SchedulerOptions o = small_options(ps, static_cast<uint64_t>(pick(48, 160) / ps) + 2);
    const int chunks[] = {-1, 3, 8, 32};
    o.chunked_prefill_size = chunks[pick(0, 3)];
    o.max_prefill_tokens = pick(8, 64);
    o.max_running_requests = pick(1, 8);
    o.num_continuous_decode_steps = pick(1, 3);
    o.new_token_ratio = pick(1, 10) / 10.0;
    o.min_new_token_ratio = std::min(o.new_token_ratio, 0.05);
    o.new_token_ratio_decay = 0.05;
    o.longest_prefix_first = pick(0, 1) == 1;
    const bool with_tier = pick(0, 2) == 0;
    Harness h(o, with_tier, static_cast<size_t>(pick(0, 40)), pick(0, 3) / 10.0);

    struct Plan {
      uint64_t id;
      std::vector<int32_t> prompt, stop;
      int32_t max_new;
      int arrive, abort_at;
    };
    std::vector<Plan> plans;
    const int n = pick(4, 16);
    std::vector<std::vector<int32_t>> prefixes = {prompt_of(seed, 40), prompt_of(seed + 1, 40)};
    for (int i = 0; i < n; ++i) {
      Plan p;
      p.id = static_cast<uint64_t>(i);
      const int shared = pick(0, 2) == 0 ? 0 : pick(0, 30);
      const auto& prefix = prefixes[pick(0, 1)];
      p.prompt.assign(prefix.begin(), prefix.begin() + shared);
      for (int k = pick(shared == 0 ? 1 : 0, 12); k > 0; --k) p.prompt.push_back(pick(0, 999));
      p.max_new = pick(1, 40);
      if (pick(0, 3) == 0) p.stop = {expected_token(p.id, p.prompt.size() + pick(0, 10))};
      p.arrive = pick(0, 30);
      p.abort_at = pick(0, 9) == 0 ? pick(0, 60) : -1;
      plans.push_back(std::move(p));
    }
    std::set<uint64_t> client_aborted;
    int step = 0;
    for (; step < 20000; ++step) {
      for (const Plan& p : plans) {
        if (p.arrive == step) h.submit(p.id, p.prompt, p.max_new, p.stop);
        if (p.abort_at == step && p.arrive < step && h.abort(p.id, "client abort")) {
          client_aborted.insert(p.id);
        }
      }
      if (step > 61 && h.sched.idle()) break;
      Result<StepStats> s = h.step();
      ASSERT_TRUE(s.ok()) << "seed " << seed << " step " << step << ": " << s.status().message()
                          << " " << h.exec.error;
      ASSERT_LE(s->token_usage, 1.0);
    }
    ASSERT_TRUE(h.sched.idle()) << "seed " << seed << ": livelock";
    ASSERT_EQ(h.outcomes.size(), plans.size()) << "seed " << seed;
    for (const Plan& p : plans) {
      const Outcome& out = h.outcomes[p.id];
      ASSERT_EQ(out.ends, 1) << "seed " << seed << " request " << p.id;
      if (client_aborted.count(p.id)) continue;
      const uint64_t pages = (p.prompt.size() + p.max_new + ps - 1) / ps;
      if (p.prompt.empty() || pages > o.num_pages) {
        ASSERT_EQ(out.kind, FinishKind::kAborted) << "seed " << seed;
        continue;
      }
      ASSERT_NE(out.kind, FinishKind::kAborted) << "seed " << seed << ": " << out.reason;
      ASSERT_EQ(out.output,
                expected_output(p.id, static_cast<int32_t>(p.prompt.size()), p.max_new, p.stop))
          << "seed " << seed << " request " << p.id;
    }
    retractions += h.sched.counters().retractions;
    cached += h.sched.counters().cached_tokens;
    tier_loads += h.tier.loaded_pages;
    aborted_by_client += client_aborted.size();
  }
  // The schedules did exercise what they are meant to.
  EXPECT_GT(retractions, 100u);
  EXPECT_GT(cached, 1000u);
  EXPECT_GT(tier_loads, 10u);
  EXPECT_GT(aborted_by_client, 10u);
  std::printf(
      "%d schedules: %llu retractions, %llu cached tokens, %llu tier pages loaded, "
      "%llu client aborts\n",
      kSeeds, static_cast<unsigned long long>(retractions), static_cast<unsigned long long>(cached),
      static_cast<unsigned long long>(tier_loads),
      static_cast<unsigned long long>(aborted_by_client));
}

}  // namespace
}  // namespace kvrt::sched
