// The MPI communicator against a reference, run by ctest under mpirun with 2, 3 and 4 ranks:
// every collective on every rank gives what the threads' communicator gives for the same inputs
// (bit for bit: both sum in rank order), with sizes that do not divide the rank count, empty
// contributions, and bf16. Each rank computes every rank's inputs from a seed, so the reference
// needs no messages.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "core/comm/mpi_group.h"
#include "tests/core/comm/communicator_reference.h"

namespace kvrt::comm {
namespace {

MpiGroup* world() {
  static MpiGroup* group = [] {
    Result<MpiGroup*> g = MpiGroup::world(60);
    return g.ok() ? *g : nullptr;
  }();
  return group;
}

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(world(), nullptr);
    if (comm_ == nullptr) comm_ = world()->communicator(world()->rank()).release();
  }
  static Communicator* comm_;
};
Communicator* MpiCommunicatorTest::comm_ = nullptr;

TEST_F(MpiCommunicatorTest, AllReduceEqualsTheThreadsBitForBit) {
  const int size = comm_->size(), rank = comm_->rank();
  ASSERT_EQ(std::string(comm_->backend()), "mpi");
  uint32_t seed = 1;
  for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{768}, size_t{1000},
                   size_t{4097}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < size; ++r) inputs.push_back(input(r, n, seed));
    const std::vector<float> want = threads_reference(size, inputs, ElementType::kF32);
    std::vector<float> mine = inputs[rank];
    ASSERT_TRUE(comm_->all_reduce_sum(mine.data(), n, ElementType::kF32, nullptr).ok());
    EXPECT_EQ(0, std::memcmp(mine.data(), want.data(), n * 4));

    std::vector<std::vector<uint16_t>> bf16;
    for (int r = 0; r < size; ++r) bf16.push_back(to_bf16_bits(inputs[r]));
    const std::vector<uint16_t> want16 = threads_reference(size, bf16, ElementType::kBF16);
    std::vector<uint16_t> mine16 = bf16[rank];
    ASSERT_TRUE(comm_->all_reduce_sum(mine16.data(), n, ElementType::kBF16, nullptr).ok());
    EXPECT_EQ(mine16, want16);
    ++seed;
  }
  EXPECT_FALSE(comm_->all_reduce_sum(nullptr, 4, ElementType::kU8, nullptr).ok());
}

TEST_F(MpiCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  const int size = comm_->size(), rank = comm_->rank();
  // Uneven counts, rank 1 contributing nothing (and a null pointer).
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = r == 1 ? 0 : static_cast<size_t>(2 * r + 3);
  std::vector<float> want;
  for (int r = 0; r < size; ++r) {
    const std::vector<float> part = input(r, counts[r], 99);
    want.insert(want.end(), part.begin(), part.end());
  }
  const std::vector<float> mine = input(rank, counts[rank], 99);
  std::vector<float> got(want.size(), -1.0f);
  ASSERT_TRUE(comm_->all_gather(mine.empty() ? nullptr : mine.data(), counts, got.data(),
                                ElementType::kF32, nullptr)
                  .ok());
  EXPECT_EQ(got, want);
  // Bytes, of an odd length.
  std::vector<size_t> byte_counts(size, 5);
  std::vector<uint8_t> record(5, static_cast<uint8_t>(rank + 1)), all(5 * size, 0);
  ASSERT_TRUE(
      comm_->all_gather(record.data(), byte_counts, all.data(), ElementType::kU8, nullptr).ok());
  for (int r = 0; r < size; ++r) EXPECT_EQ(all[5 * r + 4], r + 1);
  const std::vector<size_t> wrong(size + 1, 1);
  EXPECT_FALSE(comm_->all_gather(record.data(), wrong, all.data(), ElementType::kU8, nullptr).ok());
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  const int size = comm_->size(), rank = comm_->rank();
  for (int root = 0; root < size; ++root) {
    std::vector<float> data = input(rank, 37, 7);
    ASSERT_TRUE(comm_->broadcast(data.data(), data.size(), ElementType::kF32, root, nullptr).ok());
    EXPECT_EQ(data, input(root, 37, 7)) << "root " << root;
  }
  uint64_t header[2] = {static_cast<uint64_t>(rank), 42};
  ASSERT_TRUE(comm_->broadcast_idle(header, sizeof(header), ElementType::kU8, 0).ok());
  EXPECT_EQ(header[0], 0u);
  EXPECT_EQ(header[1], 42u);
}

TEST_F(MpiCommunicatorTest, CountsTheBytesItSends) {
  const int size = comm_->size(), rank = comm_->rank();
  const CommStats before = comm_->stats();
  std::vector<float> data(1001, 1.0f);
  ASSERT_TRUE(comm_->all_reduce_sum(data.data(), data.size(), ElementType::kF32, nullptr).ok());
  EXPECT_EQ(data[1000], static_cast<float>(size));
  const CommStats after = comm_->stats();
  EXPECT_EQ(after.collectives, before.collectives + 1);
  // Its input less its own part, then its part's sum to every other rank.
  EXPECT_EQ(after.bytes_sent - before.bytes_sent,
            all_reduce_bytes_sent(1001, ElementType::kF32, size, rank));
  const size_t mine = 1001 / size + (rank < 1001 % size ? 1 : 0);
  EXPECT_EQ(all_reduce_bytes_sent(1001, ElementType::kF32, size, rank),
            ((1001 - mine) + mine * (size - 1)) * 4);
  EXPECT_GE(after.seconds, before.seconds);
}

}  // namespace
}  // namespace kvrt::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  return kvrt::comm::mpi_finish(rc);
}
