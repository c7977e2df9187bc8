// Static fp8 scales from a corpus (`kvrt eval --calibrate kv_fp8_e4m3 --out scales.toml`): the
// corpus through the model with exact f32 KV (kv_f32_paged, TP 1, so every KV head is in one
// store), twice. The first pass finds the largest |K| and |V| of each layer and KV head; the
// second picks each layer's K scale and V scale (kv_fp8_e4m3's per_tensor mode takes one of each
// per layer: the ABI's per-tensor scale is per layer) as the candidate that minimizes the
// squared quantization error of that layer's values over the corpus.
//
// Why a search and not max-abs / 448 alone: E4M3 is floating point, so multiplying a scale by a
// power of two only shifts exponents and rounds every value the same way; what a scale changes
// is where E4M3's grid falls between powers of two (and which values saturate or go
// subnormal). Where a scale of 1 already covers K and V without saturating (stories260k: |K| up
// to 30, |V| up to 3.9), max-abs / 448 is no better than 1, only differently rounded (margins of
// 1, 2 and 4 measured the same KL). The candidates are
//   amax * 2^(j/16) / 448 * 2^(1/16), j = 0..15:
// one binade above max-abs / 448, every grid offset 2^(1/16) apart, and none below it, so nothing
// the corpus held saturates (each keeps 4% to 100% headroom for values it did not hold).
#pragma once

#include <string>
#include <vector>

#include "core/eval/eval.h"

namespace kvrt::eval {

inline constexpr double kE4m3Max = 448.0;
inline constexpr int kScaleCandidates = 16;

struct Calibration {
  std::string model, corpus, store;
  uint64_t tokens = 0;
  std::vector<std::vector<double>> k_amax, v_amax;  // [layer][kv head]
  std::vector<double> k_scale, v_scale;             // [layer]
  // The squared error per value of the chosen scale and of scale 1, per layer (for the record).
  std::vector<double> k_mse, v_mse, k_mse_scale1, v_mse_scale1;
};

// Runs the corpus (windows of ctx as kvrt eval cuts them) through kv_f32_paged and measures.
// `store` must be kv_fp8_e4m3, the store that reads the scales.
Result<Calibration> calibrate(const EvalOptions& options, const std::string& store);

// The scales as the TOML [kv.kv_fp8_e4m3] reads them, with the per-head maxima as comments.
std::string calibration_toml(const Calibration& c);

// A scale file's [kv.<store>.calibrated] table as one --set value
// ("kv.kv_fp8_e4m3.calibrated={k = [...], v = [...]}"), the store named in the file.
// Errors name the file.
struct ScaleFile {
  std::string store;
  std::string calibrated_override;
};
Result<ScaleFile> read_scale_file(const std::string& path);

}  // namespace kvrt::eval
