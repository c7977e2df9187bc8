// The NCCL group: what it refuses at creation (runs anywhere, GPU or not), then on GPUs its
// collectives on device buffers against the threads' communicator on the same inputs, and host
// buffers through the same communicator (the engine's commands). NCCL sums in its own order, so
// sums are compared within the bound of a reordered (and, for bf16, step-rounded) sum; sums
// that are exact in any order must match bit for bit.
#include "core/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/thread_communicator.h"
#include "tests/core/comm/communicator_reference.h"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::comm {
namespace {

int cuda_devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// Small integers: every order of summing them gives the same, exact, sum.
std::vector<float> integers(int rank, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank) + 7);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(value(rng));
  return v;
}

float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, 4);
  return x;
}

// A buffer on the current CUDA device, filled and read through `stream`.
template <class T>
class DeviceVector {
 public:
  DeviceVector(const std::vector<T>& host, cudaStream_t stream) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(bytes(), 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(data_, host.data(), bytes(), cudaMemcpyHostToDevice, stream),
              cudaSuccess);
  }
  ~DeviceVector() { (void)cudaFree(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* data() { return static_cast<T*>(data_); }
  // Waits for the stream: a collective returns before its result is there.
  std::vector<T> read(cudaStream_t stream) const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return host;
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  void* data_ = nullptr;
  size_t size_;
};

// A process that runs two of four ranks, which no TpGroup does.
class TwoOfFourRanks : public TpGroup {
 public:
  int size() const override { return 4; }
  std::vector<int> local_ranks() const override { return {0, 1}; }
  std::unique_ptr<Communicator> communicator(int) override { return nullptr; }
  int threads_per_rank(int) const override { return 1; }
};

TEST(NcclGroupTest, RefusesMoreLocalRanksThanCudaDevices) {
  const int devices = cuda_devices();
  const int ranks = std::max(2, devices + 1);
  ThreadGroup threads(ranks);
  Result<std::unique_ptr<NcclGroup>> group = NcclGroup::create(threads);
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find(
                std::to_string(ranks) + " local TP ranks need " + std::to_string(ranks) +
                " CUDA devices, this process sees " + std::to_string(devices)),
            std::string::npos)
      << group.status().message();
}

TEST(NcclGroupTest, RefusesADevicesListThatDoesNotFitTheRanks) {
  ThreadGroup threads(2);
  Result<std::unique_ptr<NcclGroup>> short_list = NcclGroup::create(threads, {0});
  ASSERT_FALSE(short_list.ok());
  EXPECT_NE(short_list.status().message().find("1 CUDA devices listed for 2 local TP ranks"),
            std::string::npos)
      << short_list.status().message();
  Result<std::unique_ptr<NcclGroup>> shared = NcclGroup::create(threads, {1, 1});
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("CUDA device 1 is listed for two TP ranks"),
            std::string::npos)
      << shared.status().message();
}

TEST(NcclGroupTest, RefusesAProcessThatRunsSomeOfSeveralRanks) {
  TwoOfFourRanks inner;
  Result<std::unique_ptr<NcclGroup>> group = NcclGroup::create(inner);
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("runs 2 of 4 TP ranks"), std::string::npos)
      << group.status().message();
}

TEST(NcclGroupTest, OneRankKeepsItsDataOnDeviceAndHost) {
  REQUIRE_GPU();
  ThreadGroup threads(1);
  Result<std::unique_ptr<NcclGroup>> group = NcclGroup::create(threads);
  ASSERT_TRUE(group.ok()) << group.status().message();
  std::unique_ptr<Communicator> comm = (*group)->communicator(0);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(std::string(comm->backend()), "nccl");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ((*group)->device(0), 0);
  CUDA_OK(cudaSetDevice((*group)->device(0)));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  const std::vector<float> x = input(0, 1000, 1);
  DeviceVector<float> sum(x, stream);
  ASSERT_TRUE(comm->all_reduce_sum(sum.data(), x.size(), ElementType::kF32, stream).ok());
  EXPECT_EQ(sum.read(stream), x);

  DeviceVector<float> in(x, stream), out(std::vector<float>(x.size(), -1.0f), stream);
  const size_t counts[] = {x.size()};
  ASSERT_TRUE(comm->all_gather(in.data(), counts, out.data(), ElementType::kF32, stream).ok());
  EXPECT_EQ(out.read(stream), x);

  DeviceVector<float> root(x, stream);
  ASSERT_TRUE(comm->broadcast(root.data(), x.size(), ElementType::kF32, 0, stream).ok());
  EXPECT_EQ(root.read(stream), x);

  // A command header on the host, as the engine sends it.
  uint64_t header[2] = {3, 42};
  ASSERT_TRUE(comm->broadcast(header, sizeof(header), ElementType::kU8, 0, nullptr).ok());
  ASSERT_TRUE(comm->broadcast_idle(header, sizeof(header), ElementType::kU8, 0).ok());
  EXPECT_EQ(header[0], 3u);
  EXPECT_EQ(header[1], 42u);
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(NcclGroupTest, RanksOnGpusGiveTheThreadsResults) {
  REQUIRE_GPU();
  const int size = std::min(cuda_devices(), 8);
  if (size < 2) GTEST_SKIP() << "one CUDA device: this test needs two (one per TP rank)";
  ThreadGroup threads(size);
  Result<std::unique_ptr<NcclGroup>> created = NcclGroup::create(threads);
  ASSERT_TRUE(created.ok()) << created.status().message();
  NcclGroup& group = **created;
  // Made on the main thread one after another, as the engine makes them.
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(group.communicator(r));

  const size_t n = 4097;  // not a multiple of the rank count or of NCCL's chunks
  std::vector<std::vector<float>> f32, whole;
  std::vector<std::vector<uint16_t>> bf16;
  for (int r = 0; r < size; ++r) {
    f32.push_back(input(r, n, 1));
    bf16.push_back(to_bf16_bits(input(r, n, 2)));
    whole.push_back(integers(r, n));
  }
  const std::vector<float> want_f32 = threads_reference(size, f32, ElementType::kF32);
  const std::vector<uint16_t> want_bf16 = threads_reference(size, bf16, ElementType::kBF16);
  const std::vector<float> want_whole = threads_reference(size, whole, ElementType::kF32);
  // Unequal parts with an empty one (rank 1, whose input is null), then equal parts.
  std::vector<size_t> counts(size);
  std::vector<float> want_gather;
  for (int r = 0; r < size; ++r) {
    counts[r] = r == 1 ? 0 : static_cast<size_t>(2 * r + 3);
    const std::vector<float> part = input(r, counts[r], 99);
    want_gather.insert(want_gather.end(), part.begin(), part.end());
  }
  const std::vector<size_t> equal_counts(size, 5);
  std::vector<uint16_t> want_equal;
  for (int r = 0; r < size; ++r) {
    const std::vector<uint16_t> part = to_bf16_bits(input(r, 5, 98));
    want_equal.insert(want_equal.end(), part.begin(), part.end());
  }
  const int root = size - 1;

  std::vector<std::vector<float>> got_f32(size), got_whole(size), got_gather(size),
      got_broadcast(size), got_host(size);
  std::vector<std::vector<uint16_t>> got_bf16(size), got_equal(size);
  std::vector<CommStats> stats(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      Communicator& comm = *comms[r];
      CUDA_OK(cudaSetDevice(group.device(r)));
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreate(&stream));
      {
        DeviceVector<float> a(f32[r], stream), w(whole[r], stream);
        DeviceVector<uint16_t> b(bf16[r], stream);
        ASSERT_TRUE(comm.all_reduce_sum(a.data(), n, ElementType::kF32, stream).ok());
        stats[r] = comm.stats();
        ASSERT_TRUE(comm.all_reduce_sum(b.data(), n, ElementType::kBF16, stream).ok());
        ASSERT_TRUE(comm.all_reduce_sum(w.data(), n, ElementType::kF32, stream).ok());
        got_f32[r] = a.read(stream);
        got_bf16[r] = b.read(stream);
        got_whole[r] = w.read(stream);

        const std::vector<float> part = input(r, counts[r], 99);
        DeviceVector<float> in(part, stream), out(std::vector<float>(want_gather.size()), stream);
        ASSERT_TRUE(comm.all_gather(part.empty() ? nullptr : in.data(), counts, out.data(),
                                    ElementType::kF32, stream)
                        .ok());
        got_gather[r] = out.read(stream);
        DeviceVector<uint16_t> in16(to_bf16_bits(input(r, 5, 98)), stream),
            out16(std::vector<uint16_t>(want_equal.size()), stream);
        ASSERT_TRUE(
            comm.all_gather(in16.data(), equal_counts, out16.data(), ElementType::kBF16, stream)
                .ok());
        got_equal[r] = out16.read(stream);

        DeviceVector<float> data(input(r, 37, 7), stream);
        ASSERT_TRUE(comm.broadcast(data.data(), 37, ElementType::kF32, root, stream).ok());
        got_broadcast[r] = data.read(stream);
      }
      // Host buffers go through the threads' communicator, whose sums are bit for bit.
      got_host[r] = f32[r];
      ASSERT_TRUE(comm.all_reduce_sum(got_host[r].data(), n, ElementType::kF32, nullptr).ok());
      uint64_t header[2] = {static_cast<uint64_t>(r), 42};
      ASSERT_TRUE(comm.broadcast_idle(header, sizeof(header), ElementType::kU8, 0).ok());
      EXPECT_EQ(header[0], 0u);
      EXPECT_EQ(header[1], 42u);
      CUDA_OK(cudaStreamDestroy(stream));
    });
  }
  for (std::thread& t : ranks) t.join();

  for (int r = 0; r < size; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(got_f32[r].size(), n);
    ASSERT_EQ(got_bf16[r].size(), n);
    // Every rank has the same bits, NCCL's order or not: TP ranks must not drift apart.
    EXPECT_EQ(got_f32[r], got_f32[0]);
    EXPECT_EQ(got_bf16[r], got_bf16[0]);
    EXPECT_EQ(got_whole[r], want_whole);
    EXPECT_EQ(got_gather[r], want_gather);
    EXPECT_EQ(got_equal[r], want_equal);
    EXPECT_EQ(got_broadcast[r], input(root, 37, 7));
    EXPECT_EQ(got_host[r], want_f32);
    EXPECT_EQ(stats[r].collectives, 1u);
    EXPECT_EQ(stats[r].bytes_sent, all_reduce_bytes_sent(n, ElementType::kF32, size, r));
  }
  // Another order of the same sum: within (size - 1) roundings each way, in f32; bf16 rounds at
  // each step NCCL takes, and the reference once at the end.
  for (size_t i = 0; i < n; ++i) {
    float magnitude = 0, magnitude16 = 0;
    for (int r = 0; r < size; ++r) {
      magnitude += std::fabs(f32[r][i]);
      magnitude16 += std::fabs(bf16_value(bf16[r][i]));
    }
    ASSERT_LE(std::fabs(got_f32[0][i] - want_f32[i]), size * std::ldexp(magnitude, -23))
        << "element " << i;
    ASSERT_LE(std::fabs(bf16_value(got_bf16[0][i]) - bf16_value(want_bf16[i])),
              size * std::ldexp(magnitude16, -8))
        << "element " << i;
  }
}

}  // namespace
}  // namespace kvrt::comm
