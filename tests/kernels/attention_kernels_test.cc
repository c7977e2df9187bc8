// Tests of the CPU attention kernels against their scalar references, on every SIMD target this
// CPU supports (dispatch is forced to each in turn): exact decoding of every bf16 / E4M3 value,
// dot products and axpys over all query-block and row-block shapes, online softmax with its tails
// and scales, and a whole attention built from the three kernels against a naive softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"

namespace kvrt::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class Fn>
void ForEachTarget(const Fn& fn) {
  struct Restore {
    ~Restore() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("SIMD target ") + hwy::TargetName(target));
    ASSERT_STREQ(attention_simd_target(), hwy::TargetName(target));
    fn();
  }
}

const char* Name(KvElem type) {
  return type == KvElem::kF32 ? "f32" : type == KvElem::kBf16 ? "bf16" : "e4m3";
}

size_t ElemBytes(KvElem type) { return type == KvElem::kF32 ? 4 : type == KvElem::kBf16 ? 2 : 1; }

// n rows of dim elements of `type`, each row its own allocation (as pages are), values of
// magnitude about `magnitude`.
struct Rows {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<const void*> ptrs;

  Rows(KvElem type, size_t n, size_t dim, std::mt19937& rng, float magnitude = 1.0f) {
    std::normal_distribution<float> normal(0.0f, magnitude);
    std::uniform_int_distribution<int> any_code(0, 255);
    const size_t bytes = ElemBytes(type);
    for (size_t t = 0; t < n; ++t) {
      std::vector<uint8_t> row(dim * bytes);
      std::vector<float> values(dim);
      for (float& v : values) v = normal(rng);
      if (type == KvElem::kF32) {
        std::memcpy(row.data(), values.data(), dim * 4);
      } else if (type == KvElem::kBf16) {
        f32_to_bf16(values.data(), reinterpret_cast<uint16_t*>(row.data()), dim);
      } else {
        for (uint8_t& c : row) c = static_cast<uint8_t>(any_code(rng));
      }
      storage.push_back(std::move(row));
    }
    for (const auto& row : storage) ptrs.push_back(row.data());
  }
  float at(KvElem type, size_t t, size_t d) const {
    return reference::kv_element(type, ptrs[t], d);
  }
};

// n tokens of `heads` rows of dim elements each, side by side head_stride bytes apart (padding
// 0xEE), every token its own allocation, as in a token-major page: rows[t] is token t's head 0.
struct TokenRows {
  Rows per_head;  // token t's head h is row t * heads + h
  size_t heads;
  std::vector<std::vector<uint8_t>> tokens;
  std::vector<const void*> rows;

  TokenRows(KvElem type, size_t n, size_t heads, size_t dim, size_t head_stride, std::mt19937& rng)
      : per_head(type, n * heads, dim, rng), heads(heads), tokens(n), rows(n) {
    for (size_t t = 0; t < n; ++t) {
      tokens[t].assign(heads * head_stride, 0xEE);
      for (size_t h = 0; h < heads; ++h) {
        std::memcpy(tokens[t].data() + h * head_stride, per_head.ptrs[t * heads + h],
                    dim * ElemBytes(type));
      }
      rows[t] = tokens[t].data();
    }
  }
  // Head h's rows, one pointer per token (for the single-head references).
  std::vector<const void*> head(size_t h) const {
    std::vector<const void*> out(rows.size());
    for (size_t t = 0; t < rows.size(); ++t) out[t] = per_head.ptrs[t * heads + h];
    return out;
  }
  double at(KvElem type, size_t t, size_t h, size_t d) const {
    return per_head.at(type, t * heads + h, d);
  }
};

// Scores got and want, [num_q][stride] for n tokens: got is untouched (-1) beyond n, and within
// f32 summation error of want elsewhere, a few ulps of magnitude(g, t) = sum_d |q[g][d] k_t[d]|.
template <class Magnitude>
void ExpectScoresMatch(const std::vector<float>& got, const std::vector<float>& want, size_t num_q,
                       size_t stride, size_t n, const Magnitude& magnitude) {
  for (size_t g = 0; g < num_q; ++g) {
    for (size_t t = 0; t < stride; ++t) {
      const size_t i = g * stride + t;
      if (t >= n) {
        ASSERT_EQ(got[i], -1.0f) << "wrote beyond n";
        continue;
      }
      ASSERT_NEAR(got[i], want[i], 1e-6 * magnitude(g, t) + 1e-30) << "q " << g << " t " << t;
    }
  }
}

// Accumulators got and want, [num_q][acc_stride] of dim elements: the padding beyond dim is
// unchanged, and the rest within a few ulps of |want| + magnitude(g, d) = sum_t |w[g][t] v_t[d]|.
template <class Magnitude>
void ExpectAccumulatorsMatch(const std::vector<float>& got, const std::vector<float>& want,
                             size_t num_q, size_t acc_stride, size_t dim,
                             const Magnitude& magnitude) {
  for (size_t g = 0; g < num_q; ++g) {
    for (size_t d = 0; d < acc_stride; ++d) {
      const size_t i = g * acc_stride + d;
      if (d >= dim) {
        ASSERT_EQ(got[i], want[i]) << "changed padding beyond dim";
        continue;
      }
      ASSERT_NEAR(got[i], want[i], 1e-6 * (std::fabs(want[i]) + magnitude(g, d)) + 1e-30)
          << "q " << g << " d " << d;
    }
  }
}

std::vector<float> Normal(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

constexpr KvElem kTypes[] = {KvElem::kF32, KvElem::kBf16, KvElem::kE4M3};

TEST(AttentionKernels, DecodeEveryBf16AndE4M3ValueExactly) {
  // A one-hot query picks out one element per dot product, so the scores are the decoded
  // values themselves; E4M3 includes subnormals, zeros of both signs and the NaN codes (+-480).
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<uint16_t> bf16(256 * 8);
  std::mt19937 rng(7);
  for (uint16_t& b : bf16) {
    b = static_cast<uint16_t>(rng());
    if ((b & 0x7F80) == 0x7F80) b &= 0xBFFF;  // no inf / NaN: they would poison the sums
  }
  EXPECT_EQ(reference::kv_element(KvElem::kE4M3, codes.data(), 0x38), 1.0f);
  EXPECT_EQ(reference::kv_element(KvElem::kE4M3, codes.data(), 0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(reference::kv_element(KvElem::kE4M3, codes.data(), 0xFE), -448.0f);
  EXPECT_EQ(reference::kv_element(KvElem::kE4M3, codes.data(), 0x7F), 480.0f);
  ForEachTarget([&] {
    for (KvElem type : {KvElem::kBf16, KvElem::kE4M3}) {
      const void* base = type == KvElem::kBf16 ? static_cast<const void*>(bf16.data())
                                               : static_cast<const void*>(codes.data());
      const size_t elem = type == KvElem::kBf16 ? 2 : 1;
      const size_t dim = 8, n = (type == KvElem::kBf16 ? bf16.size() : codes.size()) / dim;
      std::vector<const void*> rows(n);
      for (size_t t = 0; t < n; ++t) rows[t] = static_cast<const uint8_t*>(base) + t * dim * elem;
      for (size_t d = 0; d < dim; ++d) {
        std::vector<float> q(dim, 0.0f);
        q[d] = 1.0f;
        std::vector<float> scores(n);
        qk_dots(type, q.data(), dim, 1, rows.data(), n, dim, scores.data(), n);
        for (size_t t = 0; t < n; ++t) {
          ASSERT_EQ(scores[t], reference::kv_element(type, rows[t], d))
              << Name(type) << " element " << t * dim + d;
        }
      }
    }
  });
}

TEST(AttentionKernels, QkDotsMatchReference) {
  std::mt19937 rng(1);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      for (size_t dim : {8, 24, 128, 256}) {
        // Every query block (4, 2, 1 and their mixes) and row block (8, 4, 2 and tails).
        for (size_t num_q : {1, 2, 3, 4, 5, 8, 9}) {
          for (size_t n : {0, 1, 3, 8, 9, 17}) {
            SCOPED_TRACE(std::string(Name(type)) + " dim " + std::to_string(dim) + " queries " +
                         std::to_string(num_q) + " rows " + std::to_string(n));
            Rows rows(type, n, dim, rng);
            const size_t q_stride = dim + 8, score_stride = n + 3;
            std::vector<float> q = Normal(num_q * q_stride, rng);
            std::vector<float> got(num_q * score_stride, -1.0f), want = got;
            qk_dots(type, q.data(), q_stride, num_q, rows.ptrs.data(), n, dim, got.data(),
                    score_stride);
            reference::qk_dots(type, q.data(), q_stride, num_q, rows.ptrs.data(), n, dim,
                               want.data(), score_stride);
            ASSERT_NO_FATAL_FAILURE(
                ExpectScoresMatch(got, want, num_q, score_stride, n, [&](size_t g, size_t t) {
                  double magnitude = 0;
                  for (size_t d = 0; d < dim; ++d) {
                    magnitude += std::fabs(q[g * q_stride + d] * rows.at(type, t, d));
                  }
                  return magnitude;
                }));
          }
        }
      }
    }
  });
}

TEST(AttentionKernels, PvAccumulateMatchesReference) {
  std::mt19937 rng(2);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      for (size_t dim : {8, 40, 64, 256}) {
        for (size_t num_q : {1, 2, 3, 4, 5, 8, 15}) {
          for (size_t n : {0, 1, 5, 16}) {
            // Weights up to 1 (softmax) and up to 1000 (times a large per-token V scale): E4M3
            // decodes differently when a weight reaches 2^8.
            for (auto [with_rescale, w_max] :
                 {std::pair{false, 1.0f}, std::pair{true, 1.0f}, std::pair{true, 1000.0f}}) {
              SCOPED_TRACE(std::string(Name(type)) + " dim " + std::to_string(dim) + " queries " +
                           std::to_string(num_q) + " n " + std::to_string(n) + " rescale " +
                           std::to_string(with_rescale) + " weights up to " +
                           std::to_string(w_max));
              Rows rows(type, n, dim, rng);
              const size_t w_stride = n + 1, acc_stride = dim + 8;
              std::vector<float> w(num_q * w_stride);
              for (float& x : w) x = std::uniform_real_distribution<float>(0.0f, w_max)(rng);
              std::vector<float> rescale(num_q);
              for (float& x : rescale) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
              std::vector<float> got = Normal(num_q * acc_stride, rng), want = got;
              const float* r = with_rescale ? rescale.data() : nullptr;
              pv_accumulate(type, w.data(), w_stride, num_q, rows.ptrs.data(), n, dim, r,
                            got.data(), acc_stride);
              reference::pv_accumulate(type, w.data(), w_stride, num_q, rows.ptrs.data(), n, dim, r,
                                       want.data(), acc_stride);
              ASSERT_NO_FATAL_FAILURE(ExpectAccumulatorsMatch(
                  got, want, num_q, acc_stride, dim, [&](size_t g, size_t d) {
                    double magnitude = 0;
                    for (size_t t = 0; t < n; ++t) {
                      magnitude += std::fabs(w[g * w_stride + t] * rows.at(type, t, d));
                    }
                    return magnitude;
                  }));
            }
          }
        }
      }
    }
  });
}

// The multi-head kernels read token rows holding every head side by side (token-major pages),
// with or without padding between heads, for every group size's query blocks and token blocks.
TEST(AttentionKernels, HeadsKernelsMatchReference) {
  std::mt19937 rng(5);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      for (size_t dim : {8, 64, 136}) {
        for (size_t pad : {0, 24}) {
          for (size_t group : {1, 2, 3, 4, 5, 8}) {
            for (size_t heads : {1, 3, 4}) {
              for (size_t n : {0, 1, 5, 17}) {
                SCOPED_TRACE(std::string(Name(type)) + " dim " + std::to_string(dim) + " pad " +
                             std::to_string(pad) + " group " + std::to_string(group) + " heads " +
                             std::to_string(heads) + " n " + std::to_string(n));
                const size_t head_stride = dim * ElemBytes(type) + pad;
                TokenRows tokens(type, n, heads, dim, head_stride, rng);
                const std::vector<const void*>& rows = tokens.rows;
                const size_t num_q = group * heads, q_stride = dim + 8, stride = n + 3;

                std::vector<float> q = Normal(num_q * q_stride, rng);
                std::vector<float> got(num_q * stride, -1.0f), want = got;
                // Prefetching (the rows themselves, twice) is a hint: the scores are the same.
                const PrefetchRows lists[] = {{rows.data(), heads * head_stride},
                                              {rows.data(), 64}};
                qk_dots_heads(type, q.data(), q_stride, group, heads, rows.data(), head_stride, n,
                              dim, got.data(), stride, pad == 0 ? lists : nullptr,
                              pad == 0 ? 2 : 0);
                reference::qk_dots_heads(type, q.data(), q_stride, group, heads, rows.data(),
                                         head_stride, n, dim, want.data(), stride);
                ASSERT_NO_FATAL_FAILURE(
                    ExpectScoresMatch(got, want, num_q, stride, n, [&](size_t i, size_t t) {
                      double magnitude = 0;
                      for (size_t d = 0; d < dim; ++d) {
                        magnitude +=
                            std::fabs(q[i * q_stride + d] * tokens.at(type, t, i / group, d));
                      }
                      return magnitude;
                    }));

                std::vector<float> w(num_q * stride), rescale(num_q);
                for (float& x : w) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
                for (float& x : rescale) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
                const size_t acc_stride = dim + 8;
                std::vector<float> acc_got = Normal(num_q * acc_stride, rng), acc_want = acc_got;
                pv_accumulate_heads(type, w.data(), stride, group, heads, rows.data(), head_stride,
                                    n, dim, rescale.data(), acc_got.data(), acc_stride);
                reference::pv_accumulate_heads(type, w.data(), stride, group, heads, rows.data(),
                                               head_stride, n, dim, rescale.data(), acc_want.data(),
                                               acc_stride);
                ASSERT_NO_FATAL_FAILURE(ExpectAccumulatorsMatch(
                    acc_got, acc_want, num_q, acc_stride, dim, [&](size_t i, size_t d) {
                      double magnitude = 0;
                      for (size_t t = 0; t < n; ++t) {
                        magnitude +=
                            std::fabs(w[i * stride + t] * tokens.at(type, t, i / group, d));
                      }
                      return magnitude;
                    }));
              }
            }
          }
        }
      }
    }
  });
}

// Prefill's scores: a tile transposed once (zero-padded to the stride), then outer products for
// any number of queries, against the reference dot products.
TEST(AttentionKernels, TransposedTileScoresMatchReference) {
  std::mt19937 rng(6);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      for (size_t dim : {8, 64, 136}) {
        for (size_t kt_stride : {32, 40}) {
          for (size_t n : {1, 5, 8, 17, 32}) {
            if (n > kt_stride) continue;
            // Rows of two heads side by side; the second head's rows are the ones used.
            const size_t offset = dim * ElemBytes(type);
            TokenRows tokens(type, n, 2, dim, offset, rng);
            const std::vector<const void*> head1 = tokens.head(1);
            std::vector<float> kt(dim * kt_stride, -7.0f);
            transpose_rows(type, tokens.rows.data(), offset, n, dim, kt.data(), kt_stride);
            for (size_t d = 0; d < dim; ++d) {
              for (size_t t = 0; t < kt_stride; ++t) {
                const float want = t < n ? reference::kv_element(type, head1[t], d) : 0.0f;
                ASSERT_EQ(kt[d * kt_stride + t], want) << Name(type) << " d " << d << " t " << t;
              }
            }
            for (size_t num_q : {1, 2, 3, 4, 5, 7}) {
              SCOPED_TRACE(std::string(Name(type)) + " dim " + std::to_string(dim) + " n " +
                           std::to_string(n) + " q " + std::to_string(num_q));
              const size_t q_stride = dim + 8, stride = kt_stride + 3;
              std::vector<float> q = Normal(num_q * q_stride, rng);
              std::vector<float> got(num_q * stride, -1.0f), want = got;
              qk_dots_transposed(q.data(), q_stride, num_q, kt.data(), kt_stride, n, dim,
                                 got.data(), stride);
              reference::qk_dots(type, q.data(), q_stride, num_q, head1.data(), n, dim, want.data(),
                                 stride);
              ASSERT_NO_FATAL_FAILURE(
                  ExpectScoresMatch(got, want, num_q, stride, n, [&](size_t g, size_t t) {
                    double magnitude = 0;
                    for (size_t d = 0; d < dim; ++d) {
                      magnitude += std::fabs(q[g * q_stride + d] * kt[d * kt_stride + t]);
                    }
                    return magnitude;
                  }));
            }
          }
        }
      }
    }
  });
}

// Prefill's weighted sums: a tile's V rows decoded once, then register-blocked sums for any
// number of rows, against the reference.
TEST(AttentionKernels, DecodedTileSumsMatchReference) {
  std::mt19937 rng(8);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      for (size_t dim : {8, 40, 64, 136}) {
        for (size_t n : {0, 1, 5, 32}) {
          // Token rows of two heads; the second head's rows are decoded.
          const size_t offset = dim * ElemBytes(type), v_stride = dim + 8;
          TokenRows tokens(type, n, 2, dim, offset, rng);
          const std::vector<const void*> head1 = tokens.head(1);
          std::vector<float> v(n * v_stride, -7.0f);
          decode_rows(type, tokens.rows.data(), offset, n, dim, v.data(), v_stride);
          std::vector<const void*> v_rows(n);
          for (size_t t = 0; t < n; ++t) {
            v_rows[t] = v.data() + t * v_stride;
            for (size_t d = 0; d < v_stride; ++d) {
              const float want = d < dim ? reference::kv_element(type, head1[t], d) : -7.0f;
              ASSERT_EQ(v[t * v_stride + d], want) << Name(type) << " t " << t << " d " << d;
            }
          }
          for (size_t num_q : {1, 2, 3, 4, 5, 7, 8}) {
            for (bool with_rescale : {false, true}) {
              SCOPED_TRACE(std::string(Name(type)) + " dim " + std::to_string(dim) + " n " +
                           std::to_string(n) + " q " + std::to_string(num_q));
              const size_t w_stride = n + 1, acc_stride = dim + 8;
              std::vector<float> w(num_q * w_stride), rescale(num_q);
              for (float& x : w) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
              for (float& x : rescale) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
              const float* r = with_rescale ? rescale.data() : nullptr;
              std::vector<float> got = Normal(num_q * acc_stride, rng), want = got;
              pv_accumulate_tile(w.data(), w_stride, num_q, v.data(), v_stride, n, dim, r,
                                 got.data(), acc_stride);
              reference::pv_accumulate(KvElem::kF32, w.data(), w_stride, num_q, v_rows.data(), n,
                                       dim, r, want.data(), acc_stride);
              ASSERT_NO_FATAL_FAILURE(ExpectAccumulatorsMatch(
                  got, want, num_q, acc_stride, dim, [&](size_t g, size_t d) {
                    double magnitude = 0;
                    for (size_t t = 0; t < n; ++t) {
                      magnitude += std::fabs(w[g * w_stride + t] * v[t * v_stride + d]);
                    }
                    return magnitude;
                  }));
            }
          }
        }
      }
    }
  });
}

TEST(AttentionKernels, OnlineSoftmaxMatchesReference) {
  std::mt19937 rng(3);
  ForEachTarget([&] {
    for (size_t n : {0, 1, 3, 7, 8, 9, 16, 31, 64}) {
      for (int scales = 0; scales < 4; ++scales) {
        const size_t num_q = 5, stride = n + 2;
        std::vector<float> ks = Normal(n, rng), vs = Normal(n, rng);
        for (float& x : ks) x = std::fabs(x) + 0.1f;
        const float* k_scales = (scales & 1) ? ks.data() : nullptr;
        const float* v_scales = (scales & 2) ? vs.data() : nullptr;
        // Three steps, so the running max and sum carry over (the first from -inf), with
        // scores wide enough that the max moves between steps.
        std::vector<float> max_got(num_q, kNegInf), sum_got(num_q, 0.0f);
        std::vector<float> max_want = max_got, sum_want = sum_got;
        for (int step = 0; step < 3; ++step) {
          std::vector<float> got = Normal(num_q * stride, rng, 4.0f), want = got, raw = got;
          std::vector<float> rescale_got(num_q, -1.0f), rescale_want(num_q, -1.0f);
          online_softmax(got.data(), stride, num_q, n, 0.7f, k_scales, v_scales, max_got.data(),
                         sum_got.data(), rescale_got.data());
          reference::online_softmax(want.data(), stride, num_q, n, 0.7f, k_scales, v_scales,
                                    max_want.data(), sum_want.data(), rescale_want.data());
          for (size_t g = 0; g < num_q; ++g) {
            SCOPED_TRACE("n " + std::to_string(n) + " scales " + std::to_string(scales) + " step " +
                         std::to_string(step) + " q " + std::to_string(g));
            if (std::isinf(max_want[g])) {
              ASSERT_EQ(max_got[g], max_want[g]);
            } else {  // x rounds once in the reference, twice (s * scale, * k_scale) in SIMD
              ASSERT_NEAR(max_got[g], max_want[g], 1e-6 * std::fabs(max_want[g]));
            }
            // exp of differences of f32 maxima, each rounded to an ulp: relative error grows
            // with their magnitude (see the weights below).
            const double relative = 1e-6 + (n == 0 ? 0.0 : 1e-6 * std::fabs(max_want[g]));
            ASSERT_NEAR(rescale_got[g], rescale_want[g], relative * rescale_want[g]);
            ASSERT_NEAR(sum_got[g], sum_want[g], relative * sum_want[g]);
            for (size_t t = 0; t < stride; ++t) {
              const size_t i = g * stride + t;
              if (t >= n) {
                ASSERT_EQ(got[i], want[i]) << "wrote beyond n";
              } else {
                // x - max carries the f32 rounding of x and max (an ulp or two of each), which
                // exp turns into a relative error of the weight.
                const double x = double{raw[i]} * 0.7 * (k_scales ? k_scales[t] : 1.0f);
                const double exponent_error = 2.4e-7 * (std::fabs(x) + std::fabs(max_want[g]));
                ASSERT_NEAR(got[i], want[i], (1e-6 + exponent_error) * std::fabs(want[i]) + 1e-30)
                    << "t " << t;
              }
            }
          }
        }
      }
    }
  });
}

// The three kernels over tiles of a long sequence give the softmax attention of one group of
// queries, as a naive two-pass softmax computes it: the contract composes.
TEST(AttentionKernels, TilesComposeToAttention) {
  std::mt19937 rng(4);
  ForEachTarget([&] {
    for (KvElem type : kTypes) {
      const size_t num_q = 4, dim = 64, n = 300, tile = 32;
      const float scale = 0.125f;
      Rows k(type, n, dim, rng), v(type, n, dim, rng);
      std::vector<float> q = Normal(num_q * dim, rng, type == KvElem::kE4M3 ? 0.02f : 1.0f);
      std::vector<float> ks = Normal(n, rng), vs = Normal(n, rng);
      for (float& x : ks) x = std::fabs(x) + 0.5f;
      std::vector<float> acc(num_q * dim, 0.0f), running_max(num_q, kNegInf),
          running_sum(num_q, 0.0f), scores(num_q * tile), rescale(num_q);
      for (size_t t0 = 0; t0 < n; t0 += tile) {
        const size_t len = std::min(tile, n - t0);
        qk_dots(type, q.data(), dim, num_q, k.ptrs.data() + t0, len, dim, scores.data(), tile);
        online_softmax(scores.data(), tile, num_q, len, scale, ks.data() + t0, vs.data() + t0,
                       running_max.data(), running_sum.data(), rescale.data());
        pv_accumulate(type, scores.data(), tile, num_q, v.ptrs.data() + t0, len, dim,
                      rescale.data(), acc.data(), dim);
      }
      for (size_t g = 0; g < num_q; ++g) {
        std::vector<double> s(n);
        double max = -INFINITY, sum = 0, v_max = 0;
        for (size_t t = 0; t < n; ++t) {
          for (size_t d = 0; d < dim; ++d) s[t] += double{q[g * dim + d]} * k.at(type, t, d);
          s[t] *= scale * ks[t];
          max = std::max(max, s[t]);
        }
        for (size_t t = 0; t < n; ++t) sum += std::exp(s[t] - max);
        for (size_t d = 0; d < dim; ++d) {
          double out = 0;
          for (size_t t = 0; t < n; ++t) {
            out += std::exp(s[t] - max) / sum * vs[t] * v.at(type, t, d);
            v_max = std::max(v_max, double{std::fabs(vs[t] * v.at(type, t, d))});
          }
          ASSERT_NEAR(acc[g * dim + d] / running_sum[g], out, 1e-5 * v_max)
              << Name(type) << " q " << g << " d " << d;
        }
      }
    }
  });
}

}  // namespace
}  // namespace kvrt::kernels
