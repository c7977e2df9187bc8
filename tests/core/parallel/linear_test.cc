// Column- and row-parallel linears over TP ranks (threads of one process) give the unsharded
// layer's product: a column-parallel rank its slice of the outputs, a row-parallel rank the whole
// sum. Small integer weights and inputs keep every sum exact, whatever its order.
#include "core/parallel/linear.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/backend/cpu_backend.h"
#include "core/comm/thread_communicator.h"

namespace kvrt::parallel {
namespace {

// [rows][cols] of small integers, distinct per seed.
std::vector<float> matrix(int64_t rows, int64_t cols, int seed) {
  std::vector<float> m(rows * cols);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>((i * 7 + seed * 3) % 9) - 4;
  return m;
}

// y[m][rows] = x[m][cols] * w^T, on the host.
std::vector<float> product(const std::vector<float>& x, int64_t m, const std::vector<float>& w,
                           int64_t rows, int64_t cols) {
  std::vector<float> y(m * rows, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) y[i * rows + r] += x[i * cols + c] * w[r * cols + c];
    }
  }
  return y;
}

// Runs `body(rank, backend, communicator)` on each of `tp` ranks at once.
void on_ranks(int tp,
              const std::function<void(int, backend::Backend&, comm::Communicator&)>& body) {
  comm::ThreadGroup group(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      backend::CpuBackend be(/*bf16_weights=*/false, /*threads=*/1);
      std::unique_ptr<comm::Communicator> comm = group.communicator(r);
      body(r, be, *comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ColumnParallelLinear, EachRankComputesItsSliceOfTheFusedOutputsWithBias) {
  const int tp = 2;
  const int64_t in = 5, m = 3, q_out = 6, k_out = 4;
  const std::vector<float> q = matrix(q_out, in, 1), k = matrix(k_out, in, 2);
  const std::vector<float> q_bias = matrix(q_out, 1, 3), k_bias = matrix(k_out, 1, 4);
  const std::vector<float> x = matrix(m, in, 5);
  const std::vector<float> q_full = product(x, m, q, q_out, in);
  const std::vector<float> k_full = product(x, m, k, k_out, in);
  std::vector<std::vector<float>> got(tp);
  on_ranks(tp, [&](int rank, backend::Backend& be, comm::Communicator&) {
    const Range q_rows = split(q_out, tp, rank), k_rows = split(k_out, tp, rank);
    ColumnParallelLinear layer(be, {{&q, q_rows}, {&k, k_rows}}, in,
                               {{&q_bias, q_rows}, {&k_bias, k_rows}});
    EXPECT_EQ(layer.out(), q_rows.size() + k_rows.size());
    backend::Buffer xb = be.upload(x), y = be.allocate(m * layer.out());
    layer.forward(be, xb.data(), m, y.data());
    got[rank].assign(y.data(), y.data() + y.size());
  });
  for (int rank = 0; rank < tp; ++rank) {
    const Range q_rows = split(q_out, tp, rank), k_rows = split(k_out, tp, rank);
    const int64_t width = q_rows.size() + k_rows.size();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < width; ++j) {
        const float want = j < q_rows.size()
                               ? q_full[i * q_out + q_rows.begin + j] + q_bias[q_rows.begin + j]
                               : k_full[i * k_out + k_rows.begin + j - q_rows.size()] +
                                     k_bias[k_rows.begin + j - q_rows.size()];
        EXPECT_EQ(got[rank][i * width + j], want)
            << "rank " << rank << " row " << i << " col " << j;
      }
    }
  }
}

TEST(RowParallelLinear, EveryRankGetsTheWholeProductOverUnevenShards) {
  const int tp = 3;
  const int64_t in = 7, out = 4, m = 2;  // 7 columns over 3 ranks: 3, 2, 2
  const std::vector<float> w = matrix(out, in, 6), x = matrix(m, in, 7);
  const std::vector<float> want = product(x, m, w, out, in);
  std::vector<std::vector<float>> got(tp);
  on_ranks(tp, [&](int rank, backend::Backend& be, comm::Communicator& comm) {
    const Range cols = split(in, tp, rank);
    RowParallelLinear layer(be, w, out, in, cols);
    // This rank's columns of x: the input a column-parallel layer before it would leave here.
    backend::Buffer xb = be.upload(columns_of(x, in, cols)), y = be.allocate(m * out);
    ASSERT_TRUE(layer.forward(be, comm, xb.data(), m, y.data()).ok());
    got[rank].assign(y.data(), y.data() + y.size());
  });
  for (int rank = 0; rank < tp; ++rank) EXPECT_EQ(got[rank], want) << "rank " << rank;
}

TEST(RowParallelLinear, ARankWithoutInputAddsNothingAndStillJoinsTheSum) {
  const int tp = 2;
  const int64_t in = 4, out = 3, m = 2;
  const std::vector<float> w = matrix(out, in, 8), x = matrix(m, in, 9);
  // Only rank 0's columns count.
  const Range first = split(in, tp, 0);
  const std::vector<float> want =
      product(columns_of(x, in, first), m, columns_of(w, in, first), out, first.size());
  std::vector<std::vector<float>> got(tp);
  on_ranks(tp, [&](int rank, backend::Backend& be, comm::Communicator& comm) {
    const Range cols = split(in, tp, rank);
    RowParallelLinear layer(be, w, out, in, cols);
    backend::Buffer xb = be.upload(columns_of(x, in, cols)), y = be.allocate(m * out);
    ASSERT_TRUE(layer.forward(be, comm, rank == 0 ? xb.data() : nullptr, m, y.data()).ok());
    got[rank].assign(y.data(), y.data() + y.size());
  });
  for (int rank = 0; rank < tp; ++rank) EXPECT_EQ(got[rank], want) << "rank " << rank;
}

TEST(RowParallelLinear, PartialProductsSumOnceThroughReduce) {
  const int tp = 2;
  const int64_t in = 6, out = 2, m = 3;
  const std::vector<float> a = matrix(out, in, 10), b = matrix(out, in, 11), x = matrix(m, in, 12);
  std::vector<float> want = product(x, m, a, out, in);
  const std::vector<float> bx = product(x, m, b, out, in);
  for (size_t i = 0; i < want.size(); ++i) want[i] += bx[i];
  std::vector<std::vector<float>> got(tp);
  on_ranks(tp, [&](int rank, backend::Backend& be, comm::Communicator& comm) {
    const Range cols = split(in, tp, rank);
    RowParallelLinear la(be, a, out, in, cols), lb(be, b, out, in, cols);
    backend::Buffer xb = be.upload(columns_of(x, in, cols));
    backend::Buffer y = be.allocate(m * out), t = be.allocate(m * out);
    la.partial(be, xb.data(), m, y.data());
    lb.partial(be, xb.data(), m, t.data());
    be.add(y.data(), t.data(), y.size());
    ASSERT_TRUE(RowParallelLinear::reduce(be, comm, y.data(), m, out).ok());
    got[rank].assign(y.data(), y.data() + y.size());
  });
  for (int rank = 0; rank < tp; ++rank) EXPECT_EQ(got[rank], want) << "rank " << rank;
}

}  // namespace
}  // namespace kvrt::parallel
