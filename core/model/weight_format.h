// How a checkpoint stores its Linear weights: config.json's quantization_config, read once, and
// the dequantization of a block of a stored weight to f32, for load_block (weights.h) -- the
// architectures' loaders name tensors and shapes and never see the format.
//
// Served (dequantized at load; core/model keeps f32 or bf16 matrices):
//  - dense: no quantization_config (F32, BF16, F16 tensors);
//  - fp8 blocks (DeepSeek-V3 / R1, Kimi-K2-Instruct, Qwen3-*-FP8): quant_method "fp8", fmt
//    "e4m3", weight_block_size [rows, cols]; each quantized Linear weight is F8_E4M3 beside a
//    `<name>_scale_inv` of [ceil(out / rows), ceil(in / cols)] (F32 or BF16), the weight being
//    code x scale per block. A block may be cut between TP ranks: its scale is found by the
//    element's global row and column.
// Anything else (another quant_method, a static activation scheme, another fp8 encoding) is
// refused at start, naming config.json, the key and the value.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel/shard.h"
#include "core/util/status.h"

namespace kvrt::model {

class SafetensorsCheckpoint;

struct WeightFormat {
  enum class Kind { kDense, kFp8Block };
  Kind kind = Kind::kDense;
  int64_t block_rows = 0, block_cols = 0;  // kFp8Block: weight_block_size
  // Modules left unquantized by name (modules_to_not_convert / ignored_layers), exactly as
  // written; a stored dtype says the same, and a quantized-looking tensor named here is refused.
  std::vector<std::string> not_converted;

  bool quantized() const { return kind != Kind::kDense; }
  // "fp8 e4m3, 128 x 128 blocks" or "dense", for logs and the capacity report.
  std::string describe() const;
  // quantization_config of config.json (`source`, for messages), or null: dense.
  static Result<WeightFormat> parse(const nlohmann::json* quantization_config,
                                    const std::string& source);
};

// Rows `rows` and columns `cols` of the quantized 2-D weight `name` (stored in `ck` as `format`
// says, of logical `shape`), dequantized to f32 into out [rows][cols]. NotFound when `name` is not
// stored quantized (the caller then reads it dense). A scale of the wrong shape or dtype, a code
// that is NaN, or a tensor of another dtype than the format's is an error naming the tensor.
Status load_quantized_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                            const std::string& name, const std::vector<int64_t>& shape,
                            parallel::Range rows, parallel::Range cols, std::vector<float>& out);

}  // namespace kvrt::model
