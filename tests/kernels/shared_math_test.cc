// The arithmetic the CPU and CUDA paths share (kernels/shared/, __host__ __device__), against the
// CPU kernels: E4M3 encode bit-equal to kernels::f32_to_e4m3 (the fp8 store's encoding) over a
// sweep of every exponent and every tie, decode of all 256 codes, the per-row scale as
// quantize_rows_e4m3_f32 applies it; page positions and row addresses as a store's layout and
// gather() see them; split planning; and the flash-decoding merge against one softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"
#include "kernels/cpu/convert.h"
#include "kernels/shared/fp8_e4m3.h"
#include "kernels/shared/paged_attention.h"

namespace kvrt::kernels {
namespace {

uint8_t cpu_encode(float x) {
  uint8_t code = 0;
  f32_to_e4m3(&x, &code, 1, 1.0f);
  return code;
}

TEST(SharedE4M3, EncodeIsBitEqualToTheCpuKernel) {
  // Every 2^9-th bit pattern (8.4M values, every exponent and sign, NaNs and infinities) ...
  std::vector<float> in;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 509) {
    in.push_back(shared::bits_float(static_cast<uint32_t>(bits)));
  }
  // ... every code's value, the midpoints between neighbours (ties) and one ulp either side.
  for (int code = 0; code < 0x7F; ++code) {
    const float v = reference::e4m3_code_value(static_cast<uint8_t>(code));
    const float next = code < 0x7E ? reference::e4m3_code_value(static_cast<uint8_t>(code + 1))
                                   : 480.0f;
    const float mid = (v + next) / 2;
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      in.push_back(x);
      in.push_back(-x);
    }
  }
  for (float x : {0.0f, -0.0f, 448.0f, 464.0f, 479.9f, 1e30f, FLT_MIN, FLT_MAX, 0x1p-10f,
                  0x1p-9f, 0x1.8p-10f}) {
    in.push_back(x);
  }
  std::vector<uint8_t> want(in.size());
  f32_to_e4m3(in.data(), want.data(), in.size(), 1.0f);
  size_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (shared::e4m3_encode(in[i]) != want[i] && ++wrong < 5) {
      ADD_FAILURE() << "x = " << in[i] << " (bits " << std::hex << shared::float_bits(in[i])
                    << "): shared " << int(shared::e4m3_encode(in[i])) << ", CPU kernel "
                    << int(want[i]);
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << in.size();
  EXPECT_EQ(shared::e4m3_encode(1e30f), cpu_encode(1e30f));  // saturates, never NaN
}

TEST(SharedE4M3, DecodesEveryCodeAsTheCpuKernel) {
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<uint8_t>(code);
    float want = 0;
    e4m3_to_f32(&c, &want, 1, 1.0f);
    const float got = shared::e4m3_decode(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(shared::float_bits(got), shared::float_bits(want)) << code;
      EXPECT_EQ(shared::e4m3_encode(got), c) << code;  // every finite code round-trips
    }
  }
}

TEST(SharedE4M3, RowScaleAndCodesAreTheStoresPerRowQuantization) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const size_t rows = 64, dim = 40;
  std::vector<float> in(rows * dim);
  for (size_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 40) - 20);
    for (size_t d = 0; d < dim; ++d) in[r * dim + d] = normal(rng) * magnitude;
  }
  std::fill(in.begin(), in.begin() + dim, 0.0f);  // a zero row: scale 1
  in[dim] = INFINITY;                            // a row with inf: finite values still encode
  in[2 * dim] = 1e-44f;                          // a subnormal row: scale at least FLT_MIN
  std::fill(in.begin() + 2 * dim + 1, in.begin() + 3 * dim, 0.0f);
  std::vector<uint8_t> codes(in.size());
  std::vector<float> scales(rows);
  quantize_rows_e4m3_f32(in.data(), dim, rows, dim, codes.data(), dim, scales.data(), 1);
  for (size_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (size_t d = 0; d < dim; ++d) amax = std::fmax(amax, std::fabs(in[r * dim + d]));
    const float scale = shared::e4m3_row_scale(amax);
    ASSERT_EQ(shared::float_bits(scale), shared::float_bits(scales[r])) << "row " << r;
    const float inv = 1.0f / scale;
    for (size_t d = 0; d < dim; ++d) {
      ASSERT_EQ(shared::e4m3_encode(in[r * dim + d] * inv), codes[r * dim + d])
          << "row " << r << " element " << d;
    }
  }
}

TEST(SharedBf16, RoundingIsBitEqualToTheCpuKernel) {
  std::vector<float> in;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251) {
    in.push_back(shared::bits_float(static_cast<uint32_t>(bits)));
  }
  for (uint32_t hi = 0; hi < 0x10000; hi += 7) {  // ties: exactly half a bf16 ulp, both parities
    in.push_back(shared::bits_float((hi << 16) | 0x8000u));
  }
  std::vector<uint16_t> want(in.size());
  f32_to_bf16(in.data(), want.data(), in.size());
  size_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (shared::bf16_round(in[i]) != want[i] && ++wrong < 5) {
      ADD_FAILURE() << std::hex << "bits " << shared::float_bits(in[i]) << ": shared "
                    << shared::bf16_round(in[i]) << ", CPU kernel " << want[i];
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << in.size();
}

// A store's layout, addressed with the shared arithmetic, holds what was written at each slot.
TEST(SharedPaged, RowAddressesInTheLayoutHoldWhatWasWritten) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  plugin::Registry registry;
  Result<const plugin::LoadedPlugin*> loaded = registry.load_kv_store("kv_f32_paged");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const kvrt_kv_store_api& kv = (*loaded)->kv;
  for (uint32_t page_size : {1u, 7u, 16u}) {
    Result<kvrt_kv_geometry> g =
        capacity::kv_geometry({.layers = 1, .kv_heads = 3, .head_dim = 8, .v_head_dim = 8}, 1,
                              page_size, KVRT_DTYPE_F32);
    ASSERT_TRUE(g.ok()) << g.status().message();
    const uint32_t pages = 9;
    kvrt_kv_store* store = nullptr;
    ASSERT_EQ(kv.create((*loaded)->host_api(), &*g, pages, nullptr, &store), KVRT_OK);
    // A sequence of 40 positions over shuffled pages; position p's K is p + head / 8 + d / 64.
    std::vector<int32_t> page_ids(pages);
    std::iota(page_ids.begin(), page_ids.end(), 0);
    std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(page_size));
    const int64_t positions = std::min<int64_t>(40, int64_t{pages} * page_size);
    std::vector<int64_t> slots;
    std::vector<float> k, v;
    for (int64_t p = 0; p < positions; ++p) {
      const shared::PagePosition at = shared::locate(page_ids.data(), page_size, p);
      slots.push_back(shared::slot_of(at, page_size));
      const shared::PagePosition back = shared::position_of_slot(slots.back(), page_size);
      ASSERT_TRUE(back.page == at.page && back.offset == at.offset) << p;
      for (int h = 0; h < 3; ++h) {
        for (int d = 0; d < 8; ++d) {
          k.push_back(static_cast<float>(p) + h / 8.0f + d / 64.0f);
          v.push_back(-k.back());
        }
      }
    }
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.dtype = KVRT_DTYPE_F32;
    w.num_tokens = static_cast<uint32_t>(slots.size());
    w.slots = slots.data();
    w.k = k.data();
    w.v = v.data();
    ASSERT_EQ(kv.write(store, &w), KVRT_OK);
    kvrt_kv_layout l{};
    l.struct_size = sizeof(l);
    ASSERT_EQ(kv.layout(store, 0, &l), KVRT_OK);
    for (int64_t p = 0; p < positions; ++p) {
      const shared::PagePosition at = shared::locate(page_ids.data(), page_size, p);
      for (int h = 0; h < 3; ++h) {
        float row[8];
        std::memcpy(row,
                    static_cast<const uint8_t*>(l.k_base) +
                        shared::row_offset(at, l.k_page_stride, l.k_token_stride, h,
                                           l.k_head_stride),
                    sizeof(row));
        for (int d = 0; d < 8; ++d) ASSERT_EQ(row[d], k[(p * 3 + h) * 8 + d]) << p << " " << h;
      }
    }
    kv.destroy(store);
  }
}

TEST(SharedPaged, SplitPlanningCoversEachRowOnceInWholePages) {
  for (int64_t page_size : {1, 16, 64}) {
    for (int64_t chunk_tokens : {1, 100, 256}) {
      const int64_t chunk = shared::split_chunk(chunk_tokens, page_size);
      EXPECT_EQ(chunk % page_size, 0);
      EXPECT_GE(chunk, chunk_tokens);
      EXPECT_LT(chunk - chunk_tokens, page_size);
      for (int64_t end : {int64_t{1}, chunk, chunk + 1, 5 * chunk + 3}) {
        const int64_t n = shared::split_count(end, chunk);
        int64_t covered = 0;
        for (int64_t c = 0; c < n; ++c) covered += std::min(end, (c + 1) * chunk) - c * chunk;
        EXPECT_EQ(covered, end);
        EXPECT_EQ(n, end <= chunk ? 1 : (end + chunk - 1) / chunk);
      }
    }
  }
}

// Chunks' partial states merged with merge_weight give one softmax over all the scores.
TEST(SharedPaged, MergeOfChunkStatesIsOneSoftmax) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int n = 1000, dim = 4, chunk = 96;
  std::vector<float> s(n), v(n * dim);
  for (float& x : s) x = normal(rng);
  for (float& x : v) x = normal(rng);
  std::vector<float> maxes, sums, accs;
  for (int c = 0; c < n; c += chunk) {
    float m = -INFINITY, sum = 0;
    for (int t = c; t < std::min(n, c + chunk); ++t) m = std::max(m, s[t]);
    std::vector<float> acc(dim, 0.0f);
    for (int t = c; t < std::min(n, c + chunk); ++t) {
      const float p = std::exp(s[t] - m);
      sum += p;
      for (int d = 0; d < dim; ++d) acc[d] += p * v[t * dim + d];
    }
    maxes.push_back(m);
    sums.push_back(sum);
    accs.insert(accs.end(), acc.begin(), acc.end());
  }
  maxes.push_back(-INFINITY);  // a chunk the row does not see
  sums.push_back(0);
  accs.insert(accs.end(), dim, 0.0f);
  const float max = *std::max_element(maxes.begin(), maxes.end());
  float sum = 0;
  std::vector<float> out(dim, 0.0f);
  for (size_t c = 0; c < maxes.size(); ++c) {
    const float w = shared::merge_weight(maxes[c], max);
    sum += w * sums[c];
    for (int d = 0; d < dim; ++d) out[d] += w * accs[c * dim + d];
  }
  double m = -INFINITY, total = 0;
  for (float x : s) m = std::max<double>(m, x);
  std::vector<double> want(dim, 0.0);
  for (int t = 0; t < n; ++t) {
    const double p = std::exp(s[t] - m);
    total += p;
    for (int d = 0; d < dim; ++d) want[d] += p * v[t * dim + d];
  }
  for (int d = 0; d < dim; ++d) EXPECT_NEAR(out[d] / sum, want[d] / total, 1e-5);
}

}  // namespace
}  // namespace kvrt::kernels
