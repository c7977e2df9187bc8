// The threads' communicator: every collective across rank threads (f32 and bf16 sums, uneven
// gathers, broadcasts), and the barrier under it letting no thread into a phase early.
#include "core/comm/thread_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <string>
#include <thread>
#include <vector>

namespace kvrt::comm {
namespace {

TEST(Communicator, CollectivesAcrossRankThreads) {
  const int tp = 4;
  ThreadGroup group(tp);
  std::vector<std::vector<float>> reduced(tp), gathered(tp), broadcast(tp);
  std::vector<std::vector<uint16_t>> reduced_bf16(tp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = group.communicator(r);
      ASSERT_EQ(comm->rank(), r);
      ASSERT_EQ(comm->size(), tp);
      reduced[r] = {1.0f * r, 10.0f * r, 1.0f};
      EXPECT_TRUE(comm->all_reduce_sum(reduced[r].data(), 3, ElementType::kF32, nullptr).ok());
      // bf16 1.0 (0x3f80) and 0.5 + r (exact in bf16): sums 4 and 8 on every rank.
      const float halves[] = {0.5f, 1.5f, 2.5f, 3.5f};
      reduced_bf16[r] = {0x3f80, static_cast<uint16_t>(std::bit_cast<uint32_t>(halves[r]) >> 16)};
      EXPECT_TRUE(
          comm->all_reduce_sum(reduced_bf16[r].data(), 2, ElementType::kBF16, nullptr).ok());
      const std::vector<size_t> counts = {1, 2, 0, 1};  // uneven, one rank empty
      std::vector<float> mine(counts[r], static_cast<float>(r));
      gathered[r].resize(4);
      EXPECT_TRUE(
          comm->all_gather(mine.data(), counts, gathered[r].data(), ElementType::kF32, nullptr)
              .ok());
      broadcast[r] = {static_cast<float>(r), static_cast<float>(r)};
      EXPECT_TRUE(comm->broadcast(broadcast[r].data(), 2, ElementType::kF32, 2, nullptr).ok());
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < tp; ++r) {
    EXPECT_EQ(reduced[r], (std::vector<float>{6, 60, 4}));
    EXPECT_EQ(reduced_bf16[r], (std::vector<uint16_t>{0x4080, 0x4100}));  // 4.0, 8.0
    EXPECT_EQ(gathered[r], (std::vector<float>{0, 1, 1, 3}));
    EXPECT_EQ(broadcast[r], (std::vector<float>{2, 2}));
  }
}

TEST(SpinBarrier, NoThreadPassesAPhaseEarly) {
  for (bool spin : {true, false}) {
    for (int threads : {2, 8}) {
      SCOPED_TRACE(std::string(spin ? "spinning" : "sleeping") + ", " + std::to_string(threads) +
                   " threads");
      SpinBarrier barrier(threads, spin);
      std::vector<std::atomic<int>> stamp(threads);
      std::atomic<int> early{0};
      constexpr int kPhases = 2000;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          for (int phase = 1; phase <= kPhases; ++phase) {
            stamp[t].store(phase);
            barrier.arrive_and_wait();
            for (int u = 0; u < threads; ++u) {
              if (stamp[u].load() < phase) early.fetch_add(1);
            }
            barrier.arrive_and_wait();  // nobody stamps the next phase before all have checked
          }
        });
      }
      for (std::thread& t : pool) t.join();
      EXPECT_EQ(early.load(), 0);
    }
  }
}

}  // namespace
}  // namespace kvrt::comm
