// Static fp8 scales from a corpus (`kvrt eval --calibrate kv_fp8_e4m3 --out scales.toml`): the
// corpus through the model with exact f32 KV (kv_f32_paged, TP 1, so every KV head is in one
// store), then the largest |K| and |V| of each layer and KV head over every token kept.
// kv_fp8_e4m3's per_tensor mode takes one K and one V scale per layer (the ABI's per-tensor
// scale is per layer), so a layer's scale covers its largest head:
//   scale = max |value| * margin / 448  (448: E4M3's largest finite value).
// Values past 448 * scale saturate. The margin is headroom for text the corpus did not have: an
// unseen value up to margin times the corpus's maximum is still represented. It costs little,
// because E4M3 is floating point: its relative step (2^-3) is the same across its normal range,
// and a margin m only moves values below max / m * 2^-8 ... into subnormals, one binade per
// doubling of m. The default 1.25 keeps 25% of headroom for a quarter of a binade.
#pragma once

#include <string>
#include <vector>

#include "core/eval/eval.h"

namespace kvrt::eval {

inline constexpr double kE4m3Max = 448.0;
inline constexpr double kDefaultMargin = 1.25;

struct Calibration {
  std::string model, corpus, store;
  uint64_t tokens = 0;
  double margin = kDefaultMargin;
  std::vector<std::vector<double>> k_amax, v_amax;  // [layer][kv head]
  std::vector<double> k_scale, v_scale;             // [layer]
};

// Runs the corpus (windows of ctx as kvrt eval cuts them) through kv_f32_paged and measures.
// `store` must be kv_fp8_e4m3, the store that reads the scales.
Result<Calibration> calibrate(const EvalOptions& options, const std::string& store, double margin);

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
