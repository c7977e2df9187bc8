// The CUDA backend against the CPU backend: every op on the same random inputs, at odd sizes and
// strides, with f32 and bf16 weights. Ops that round in a fixed order (copies, scatter-add, bias,
// add, RoPE application) must match bit for bit; the others within a bound stated at each test.
// Needs a GPU, except that asking for a device that is not there must fail anywhere: without a
// GPU every other test skips, saying why.
#include "core/backend/cuda_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/backend/cpu_backend.h"
#include "kernels/shared/fp8_e4m3.h"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::backend {
namespace {

constexpr float kUlp = 1.0f / (1 << 24);  // f32's unit roundoff, 2^-24

std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::unique_ptr<CudaBackend> make_gpu(bool bf16_weights) {
  Result<std::unique_ptr<CudaBackend>> made = CudaBackend::create(0, bf16_weights);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return made.ok() ? std::move(made).value() : nullptr;
}

std::vector<float> download(Backend& backend, const float* data, size_t n) {
  std::vector<float> host(n);
  backend.download(data, n, host.data());
  return host;
}
std::vector<float> download(Backend& backend, const Buffer& buffer) {
  return download(backend, buffer.data(), buffer.size());
}

// Every element equal, NaN-free inputs assumed.
testing::AssertionResult same(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  if (cpu.size() != gpu.size()) return testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      return testing::AssertionFailure()
             << "element " << i << ": CPU " << cpu[i] << ", GPU " << gpu[i];
    }
  }
  return testing::AssertionSuccess();
}

// |cpu[i] - gpu[i]| <= tolerance[i] for every i.
testing::AssertionResult within(const std::vector<float>& cpu, const std::vector<float>& gpu,
                                const std::vector<float>& tolerance) {
  if (cpu.size() != gpu.size()) return testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!(std::fabs(cpu[i] - gpu[i]) <= tolerance[i])) {
      return testing::AssertionFailure() << "element " << i << ": CPU " << cpu[i] << ", GPU "
                                         << gpu[i] << ", tolerance " << tolerance[i];
    }
  }
  return testing::AssertionSuccess();
}

// The same host floats in both backends.
struct Twin {
  Buffer cpu, gpu;
};
Twin upload_both(CpuBackend& cpu, CudaBackend& gpu, const std::vector<float>& host) {
  return {cpu.upload(host), gpu.upload(host)};
}

TEST(CudaBackend, CreateFailsNamingTheDeviceWhenThereIsNone) {
  // Runs everywhere: on a machine without CUDA the failure is that there is no device at all.
  for (const int ordinal : {99, -1}) {
    Result<std::unique_ptr<CudaBackend>> made = CudaBackend::create(ordinal, false);
    ASSERT_FALSE(made.ok());
    EXPECT_NE(made.status().message().find("CUDA device " + std::to_string(ordinal)),
              std::string::npos)
        << made.status().message();
  }
}

TEST(CudaBackend, CountsItsDeviceMemory) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  const kvrt_device device = gpu->device();
  EXPECT_EQ(device.kind, KVRT_DEVICE_CUDA);
  EXPECT_EQ(device.ordinal, 0);
  EXPECT_NE(gpu->stream(), nullptr);
  const uint64_t idle = gpu->device_bytes();
  EXPECT_GE(idle, uint64_t{4} << 20) << "cuBLAS's workspace is the backend's";
  Buffer outliving;
  {
    Buffer buffer = gpu->allocate(1000);
    EXPECT_EQ(gpu->device_bytes(), idle + 4000);
    std::unique_ptr<Matrix> matrix = gpu->upload_matrix(std::vector<float>(30 * 7, 1.0f), 30, 7);
    EXPECT_EQ(gpu->device_bytes(), idle + 4000 + 30 * 7 * 4);
    EXPECT_EQ(download(*gpu, buffer), std::vector<float>(1000, 0.0f)) << "allocate zeroes";
    outliving = gpu->upload(std::vector<float>{1, 2, 3});
  }
  EXPECT_EQ(gpu->device_bytes(), idle + 12);
  EXPECT_EQ(download(*gpu, outliving), (std::vector<float>{1, 2, 3}));
  gpu.reset();
  outliving = Buffer();  // freed after its backend: must neither crash nor leak a count
}

TEST(CudaBackend, EmbedGatherAndCopyRowsAreExact) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(1);
  const int64_t width = 13, table_rows = 7, first_row = 5;
  Twin table = upload_both(cpu, *gpu, random_floats(table_rows * width, rng));
  // Ids before, inside and past this rank's rows (vocab-parallel).
  const std::vector<int32_t> ids = {5, 11, 4, 12, 0, 8, 8, 100000};
  Twin embedded = upload_both(cpu, *gpu, std::vector<float>(ids.size() * width, -1.0f));
  cpu.embed(table.cpu, first_row, ids, width, embedded.cpu.data());
  gpu->embed(table.gpu, first_row, ids, width, embedded.gpu.data());
  EXPECT_TRUE(same(download(cpu, embedded.cpu), download(*gpu, embedded.gpu)));

  // Back to back, the staging area grows between them and is reused: each keeps its own rows.
  Twin src = upload_both(cpu, *gpu, random_floats(300 * 3, rng));
  std::uniform_int_distribution<int64_t> row(0, 299);
  const std::vector<int64_t> few = {7, 7, 299};
  std::vector<int64_t> many(5000);
  for (int64_t& r : many) r = row(rng);
  Twin out_few = upload_both(cpu, *gpu, std::vector<float>(few.size() * 3));
  Twin out_many = upload_both(cpu, *gpu, std::vector<float>(many.size() * 3));
  Twin out_again = upload_both(cpu, *gpu, std::vector<float>(few.size() * 3));
  for (auto* backend : std::initializer_list<Backend*>{&cpu, gpu.get()}) {
    const bool on_cpu = backend == &cpu;
    const float* s = on_cpu ? src.cpu.data() : src.gpu.data();
    backend->gather_rows(s, few, 3, on_cpu ? out_few.cpu.data() : out_few.gpu.data());
    backend->gather_rows(s, many, 3, on_cpu ? out_many.cpu.data() : out_many.gpu.data());
    backend->gather_rows(s, std::vector<int64_t>{1, 0, 2}, 3,
                         on_cpu ? out_again.cpu.data() : out_again.gpu.data());
  }
  EXPECT_TRUE(same(download(cpu, out_few.cpu), download(*gpu, out_few.gpu)));
  EXPECT_TRUE(same(download(cpu, out_many.cpu), download(*gpu, out_many.gpu)));
  EXPECT_TRUE(same(download(cpu, out_again.cpu), download(*gpu, out_again.gpu)));

  // Strided rows into a wider destination: the gaps stay as they were.
  Twin wide = upload_both(cpu, *gpu, random_floats(9 * 17, rng));
  Twin narrow = upload_both(cpu, *gpu, random_floats(9 * 15, rng));
  cpu.copy_rows(wide.cpu.data() + 2, 17, narrow.cpu.data() + 1, 15, 9, 11);
  gpu->copy_rows(wide.gpu.data() + 2, 17, narrow.gpu.data() + 1, 15, 9, 11);
  EXPECT_TRUE(same(download(cpu, narrow.cpu), download(*gpu, narrow.gpu)));
}

TEST(CudaBackend, StagedSlotsOutlastTheOpsStagedAfterThem) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  const std::vector<int64_t> slots = {9, 4, 1 << 20, 0, 77};
  const int64_t* device_slots = gpu->stage_slots(slots);
  ASSERT_NE(device_slots, nullptr);
  // Ops in between stage host arrays of their own, as a step's layers do before their KV writes.
  Buffer table = gpu->upload(std::vector<float>(100, 1.0f));
  Buffer out = gpu->allocate(4000);
  std::vector<int64_t> rows(1000, 3);
  gpu->gather_rows(table.data(), rows, 4, out.data());
  gpu->embed(table, 0, std::vector<int32_t>(1000, 2), 4, out.data());
  std::vector<int64_t> back(slots.size());
  CUDA_OK(cudaStreamSynchronize(static_cast<cudaStream_t>(gpu->stream())));
  CUDA_OK(cudaMemcpy(back.data(), device_slots, slots.size() * sizeof(int64_t),
                     cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, slots);
}

// Both add each source row in turn, unfused, so repeated rows sum in the same order to the same
// bits; the GPU groups them by destination rather than using atomics.
TEST(CudaBackend, ScatterAddRowsIsExactWithRepeatedRows) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(2);
  const int64_t width = 301;
  const std::vector<int64_t> rows = {3, 1, 3, 0, 3, 1, 6, 3};
  const std::vector<float> weights = random_floats(rows.size(), rng);
  Twin src = upload_both(cpu, *gpu, random_floats(rows.size() * width, rng));
  Twin dst = upload_both(cpu, *gpu, random_floats(7 * width, rng));
  cpu.scatter_add_rows(src.cpu.data(), rows, weights, width, dst.cpu.data());
  gpu->scatter_add_rows(src.gpu.data(), rows, weights, width, dst.gpu.data());
  EXPECT_TRUE(same(download(cpu, dst.cpu), download(*gpu, dst.gpu)));
}

TEST(CudaBackend, AddAndAddBiasAreExact) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(3);
  Twin x = upload_both(cpu, *gpu, random_floats(5 * 40, rng));
  Twin y = upload_both(cpu, *gpu, random_floats(5 * 40, rng));
  Twin bias = upload_both(cpu, *gpu, random_floats(33, rng));
  cpu.add(x.cpu.data(), y.cpu.data(), 5 * 40 - 3);
  gpu->add(x.gpu.data(), y.gpu.data(), 5 * 40 - 3);
  cpu.add_bias(x.cpu.data() + 2, 5, 40, bias.cpu);
  gpu->add_bias(x.gpu.data() + 2, 5, 40, bias.gpu);
  EXPECT_TRUE(same(download(cpu, x.cpu), download(*gpu, x.gpu)));
  cpu.fill_zero(x.cpu.data() + 7, 100);
  gpu->fill_zero(x.gpu.data() + 7, 100);
  EXPECT_TRUE(same(download(cpu, x.cpu), download(*gpu, x.gpu)));
}

// The sums of squares add in different orders: each is within dim * u of the exact sum (relative,
// the terms being positive), the inverse square root halves that, and the scaling rounds three
// times more. So |gpu - cpu| <= (dim + 8) * u * |cpu|.
TEST(CudaBackend, RmsNormMatchesWithinSummationOrder) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(4);
  const auto tolerance = [](const std::vector<float>& cpu_out, int64_t dim) {
    std::vector<float> t(cpu_out.size());
    for (size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<float>(dim + 8) * kUlp * std::fabs(cpu_out[i]);
    }
    return t;
  };
  {
    const int64_t rows = 5, dim = 1001;
    Twin x = upload_both(cpu, *gpu, random_floats(rows * dim, rng, 3.0f));
    Twin w = upload_both(cpu, *gpu, random_floats(dim, rng));
    Twin out = upload_both(cpu, *gpu, std::vector<float>(rows * dim));
    cpu.rms_norm(x.cpu.data(), w.cpu, out.cpu.data(), rows, dim, 1e-6f);
    gpu->rms_norm(x.gpu.data(), w.gpu, out.gpu.data(), rows, dim, 1e-6f);
    const std::vector<float> expected = download(cpu, out.cpu);
    EXPECT_TRUE(within(expected, download(*gpu, out.gpu), tolerance(expected, dim)));
  }
  {
    // Strided, and in place (as MLA's latent norm runs).
    const int64_t rows = 6, dim = 511, stride = 577;
    Twin x = upload_both(cpu, *gpu, random_floats(rows * stride, rng));
    Twin w = upload_both(cpu, *gpu, random_floats(dim, rng));
    cpu.rms_norm_strided(x.cpu.data(), stride, w.cpu, x.cpu.data(), stride, rows, dim, 1e-5f);
    gpu->rms_norm_strided(x.gpu.data(), stride, w.gpu, x.gpu.data(), stride, rows, dim, 1e-5f);
    const std::vector<float> expected = download(cpu, x.cpu);
    EXPECT_TRUE(within(expected, download(*gpu, x.gpu), tolerance(expected, dim)));
  }
}

// exp is within 2 ulps on the GPU and 1 on the CPU, the sigmoid's division and the products add
// a few roundings: 16 ulps relative covers it with room.
TEST(CudaBackend, SiluMulMatchesWithinExpAccuracy) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(5);
  const int64_t rows = 3, n = 333;
  Twin x = upload_both(cpu, *gpu, random_floats(rows * 2 * n, rng, 4.0f));
  Twin out = upload_both(cpu, *gpu, std::vector<float>(rows * n));
  cpu.silu_mul(x.cpu.data(), rows, n, out.cpu.data());
  gpu->silu_mul(x.gpu.data(), rows, n, out.gpu.data());
  const std::vector<float> expected = download(cpu, out.cpu);
  std::vector<float> tolerance(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) tolerance[i] = 16 * kUlp * std::fabs(expected[i]);
  EXPECT_TRUE(within(expected, download(*gpu, out.gpu), tolerance));
}

// The angles are the same f32 products of the same frequencies (computed on the host by the
// shared formula); cos and sin differ only in their last-bit rounding (the GPU rounds a double,
// glibc's cosf / sinf are within an ulp), and each side's product with the scale rounds once
// more: |gpu - cpu| <= 4 u * scale.
TEST(CudaBackend, RopeTablesMatchAtLongPositions) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 4096, 4097, 32768, 131071, 1000003};
  const auto compare = [&](const Twin& cos, const Twin& sin, float scale) {
    const std::vector<float> tolerance(cos.cpu.size(), 4 * kUlp * scale);
    EXPECT_TRUE(within(download(cpu, cos.cpu), download(*gpu, cos.gpu), tolerance)) << "cos";
    EXPECT_TRUE(within(download(cpu, sin.cpu), download(*gpu, sin.gpu), tolerance)) << "sin";
  };
  for (const float theta : {10000.0f, 1000000.0f}) {
    const int64_t head_dim = 128, half = head_dim / 2;
    Twin cos = upload_both(cpu, *gpu, std::vector<float>(positions.size() * half));
    Twin sin = upload_both(cpu, *gpu, std::vector<float>(positions.size() * half));
    cpu.rope_tables(positions, head_dim, theta, cos.cpu.data(), sin.cpu.data());
    gpu->rope_tables(positions, head_dim, theta, cos.gpu.data(), sin.gpu.data());
    compare(cos, sin, 1.0f);
  }
  // YaRN's way: given frequencies and an attention factor.
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> frequency(1e-6f, 1.0f);
  std::vector<float> inv_freq(32);
  for (float& f : inv_freq) f = frequency(rng);
  Twin cos = upload_both(cpu, *gpu, std::vector<float>(positions.size() * inv_freq.size()));
  Twin sin = upload_both(cpu, *gpu, std::vector<float>(positions.size() * inv_freq.size()));
  cpu.rope_tables_from(positions, inv_freq, 1.3f, cos.cpu.data(), sin.cpu.data());
  gpu->rope_tables_from(positions, inv_freq, 1.3f, cos.gpu.data(), sin.gpu.data());
  compare(cos, sin, 1.3f);
}

// Given the same tables, both rotations are the same unfused products: bit for bit.
TEST(CudaBackend, ApplyRopeIsExactOnTheSameTables) {
  REQUIRE_GPU();
  std::unique_ptr<CudaBackend> gpu = make_gpu(false);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(false, 1);
  std::mt19937 rng(7);
  for (const int64_t head_dim : {64, 10, 7}) {
    const int64_t tokens = 5, heads = 3, half = head_dim / 2;
    const int64_t row_stride = heads * head_dim + 9;  // heads inside a wider row (q with k, v)
    const std::vector<int32_t> positions = {3, 4096, 4097, 70000, 9};
    std::vector<float> cos(tokens * half), sin(tokens * half);
    cpu.rope_tables(positions, head_dim, 10000.0f, cos.data(), sin.data());
    Twin cos_table = upload_both(cpu, *gpu, cos), sin_table = upload_both(cpu, *gpu, sin);
    const std::vector<float> x = random_floats(tokens * row_stride, rng);
    Twin half_rotated = upload_both(cpu, *gpu, x), interleaved = upload_both(cpu, *gpu, x);
    cpu.apply_rope(half_rotated.cpu.data() + 1, tokens, heads, head_dim, row_stride,
                   cos_table.cpu.data(), sin_table.cpu.data());
    gpu->apply_rope(half_rotated.gpu.data() + 1, tokens, heads, head_dim, row_stride,
                    cos_table.gpu.data(), sin_table.gpu.data());
    EXPECT_TRUE(same(download(cpu, half_rotated.cpu), download(*gpu, half_rotated.gpu)))
        << "rotate-half, head_dim " << head_dim;
    cpu.apply_rope_interleaved(interleaved.cpu.data() + 1, tokens, heads, head_dim, row_stride,
                               cos_table.cpu.data(), sin_table.cpu.data());
    gpu->apply_rope_interleaved(interleaved.gpu.data() + 1, tokens, heads, head_dim, row_stride,
                                cos_table.gpu.data(), sin_table.gpu.data());
    EXPECT_TRUE(same(download(cpu, interleaved.cpu), download(*gpu, interleaved.gpu)))
        << "interleaved, head_dim " << head_dim;
  }
}

// Each product is a sum of k terms rounded k times in some order; every rounding error is at most
// u times a partial sum, itself at most S = sum |x_i w_i|. The two sides' orders differ, so their
// difference is a sum of ~2k independent errors of at most u * S: bounded here by
// slack * sqrt(k) * u * S, several standard deviations. slack is 4 for f32 weights; with bf16
// weights the GPU sums three exact-term products (ops.h: split_bf16x3) and adds them, so 8.
void check_matmul(bool bf16_weights, int64_t m, int64_t rows, int64_t cols, int64_t x_stride,
                  int64_t y_stride, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << (bf16_weights ? "bf16" : "f32") << " m " << m << " rows "
                                  << rows << " cols " << cols << " strides " << x_stride << ", "
                                  << y_stride);
  std::unique_ptr<CudaBackend> gpu = make_gpu(bf16_weights);
  ASSERT_NE(gpu, nullptr);
  CpuBackend cpu(bf16_weights, 1);
  std::mt19937 rng(seed);
  std::vector<float> w = random_floats(rows * cols, rng, 0.1f);
  const std::vector<float> x = random_floats(m * x_stride, rng);
  const std::unique_ptr<Matrix> cpu_w = cpu.upload_matrix(w, rows, cols);
  const std::unique_ptr<Matrix> gpu_w = gpu->upload_matrix(w, rows, cols);
  if (bf16_weights) {
    for (float& v : w)
      v = kernels::shared::bits_float(uint32_t{kernels::shared::bf16_round(v)} << 16);
  }
  Twin in = upload_both(cpu, *gpu, x);
  // The sentinel shows the gaps between strided rows are left alone.
  Twin out = upload_both(cpu, *gpu, std::vector<float>(m * y_stride, 42.0f));
  if (x_stride == cols && y_stride == rows) {
    cpu.matmul(in.cpu.data(), m, *cpu_w, out.cpu.data());
    gpu->matmul(in.gpu.data(), m, *gpu_w, out.gpu.data());
  } else {
    cpu.matmul_strided(in.cpu.data(), m, x_stride, *cpu_w, out.cpu.data(), y_stride);
    gpu->matmul_strided(in.gpu.data(), m, x_stride, *gpu_w, out.gpu.data(), y_stride);
  }
  const float slack = bf16_weights ? 8.0f : 4.0f;
  std::vector<float> tolerance(m * y_stride, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < rows; ++j) {
      double magnitude = 0;
      for (int64_t i = 0; i < cols; ++i) {
        magnitude += std::fabs(double{x[r * x_stride + i]} * w[j * cols + i]);
      }
      tolerance[r * y_stride + j] =
          static_cast<float>(slack * std::sqrt(double(cols)) * kUlp * magnitude);
    }
  }
  EXPECT_TRUE(within(download(cpu, out.cpu), download(*gpu, out.gpu), tolerance));
}

TEST(CudaBackend, MatmulF32MatchesWithinRounding) {
  REQUIRE_GPU();
  for (const int64_t m : {1, 3, 17, 40}) check_matmul(false, m, 37, 129, 129, 37, 10 + m);
  check_matmul(false, 5, 37, 129, 150, 50, 20);  // one head's slice of wider rows (MLA)
  check_matmul(false, 1, 37, 129, 150, 50, 21);
  check_matmul(false, 4, 3, 0, 0, 3, 22);  // no inputs: zeros
}

TEST(CudaBackend, MatmulBf16WeightsKeepsF32Activations) {
  REQUIRE_GPU();
  // Decode-sized (the CPU's bf16 kernel) and prefill-sized (the CPU widens the weights).
  for (const int64_t m : {1, 3, 16, 17, 40}) check_matmul(true, m, 37, 129, 129, 37, 30 + m);
  check_matmul(true, 5, 37, 129, 150, 50, 40);
  check_matmul(true, 4, 3, 0, 0, 3, 41);
  // Enough rows of a wide product that the GPU takes them in several bands.
  check_matmul(true, 1400, 4096, 64, 64, 4096, 42);
}

}  // namespace
}  // namespace kvrt::backend
