// What the communicator tests share: seeded inputs every rank can compute for any rank, their
// bf16 bits, and the reference a collective is compared with -- the threads' communicator on
// the same inputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/comm/thread_communicator.h"

namespace kvrt::comm {

// Rank r's input of n floats for the collective `seed`: values of very different magnitudes,
// so the order of a sum shows in its bits.
inline std::vector<float> input(int rank, size_t n, uint32_t seed) {
  std::mt19937 rng(seed * 131 + static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

// What every rank of a `size`-thread group ends with for the same inputs (they all agree).
template <class T>
std::vector<T> threads_reference(int size, const std::vector<std::vector<T>>& inputs,
                                 ElementType type) {
  ThreadGroup group(size);
  std::vector<std::vector<T>> out = inputs;
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = group.communicator(r);
      ASSERT_TRUE(comm->all_reduce_sum(out[r].data(), out[r].size(), type, nullptr).ok());
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 1; r < size; ++r) EXPECT_EQ(out[r], out[0]);
  return out[0];
}

}  // namespace kvrt::comm
