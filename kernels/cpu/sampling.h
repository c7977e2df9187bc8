// The passes a sampler makes over one row of logits (Highway SIMD with run-time dispatch), so
// that drawing a token from a 150k-token vocabulary costs a few reads of the row instead of a
// sort; and their scalar references (namespace reference), which tests compare them with.
//
// Rows are float32 of any length n (no alignment asked). -inf entries (masked tokens) are fine
// everywhere; NaN is not expected (a model's logits are finite).
#pragma once

#include <cstddef>
#include <vector>

namespace kvrt::kernels {

// The index of the first maximum (as std::max_element); 0 when n is 0.
size_t argmax(const float* x, size_t n);

// The largest entry; -inf when n is 0.
float max_value(const float* x, size_t n);

// w[i] = exp(t), t = (x[i] - shift) * scale, where x[i] >= floor, else 0; returns the sum of w.
// For weights against the row's maximum: shift >= every x[i] and scale > 0, so every t <= 0,
// every weight is in [0, 1] and the maximum's is 1; exp(t) is then within (3e-7 + 1.2e-7 |t|)
// of itself, relative (the rounding t itself carries), and 0 for t < -87.
float exp_weights(const float* x, size_t n, float shift, float scale, float floor, float* w);

// The sum of exp((x[i] - shift) * scale) over the row (a log-sum-exp's sum, shift >= every
// x[i]), as exactly as exp_weights, writing nothing.
float exp_sum(const float* x, size_t n, float shift, float scale);

// The sum of the w[i] that are greater than `above`.
float sum_above(const float* w, size_t n, float above);

// The first i >= from with x[i] >= at_least; n when there is none.
size_t find_at_least(const float* x, size_t n, size_t from, float at_least);

// Inverse-CDF search in index order over the entries greater than `above`: the first i whose
// running sum of such entries (w[0..i]) exceeds `target`; n when the whole sum does not (the
// caller's target came from a sum rounded differently).
size_t prefix_search(const float* w, size_t n, float above, float target);

// The k-th largest entry (1 <= k <= n): a selection, not a sort. Few k against n keep a heap of
// k filtered by a vectorised scan (one read of the row); otherwise nth_element on a copy in
// `scratch`.
float kth_largest(const float* x, size_t n, size_t k, std::vector<float>* scratch);

namespace reference {
size_t argmax(const float* x, size_t n);
float max_value(const float* x, size_t n);
float exp_weights(const float* x, size_t n, float shift, float scale, float floor, float* w);
float exp_sum(const float* x, size_t n, float shift, float scale);
float sum_above(const float* w, size_t n, float above);
size_t find_at_least(const float* x, size_t n, size_t from, float at_least);
size_t prefix_search(const float* w, size_t n, float above, float target);
}  // namespace reference

}  // namespace kvrt::kernels
