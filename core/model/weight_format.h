// How a checkpoint stores its Linear weights: config.json's quantization_config, read once, and
// the dequantization of a block of a stored weight to f32, for load_block (weights.h) -- the
// architectures' loaders name tensors and shapes and never see the format.
//
// Served (dequantized at load into f32 or bf16 matrices, except where a caller asks for a block
// as stored -- both families' projections but MLA's kv_b, int4 in groups of a multiple of 8 and
// fp8 blocks of a multiple of 4 columns (keeps_as_stored) -- which the CPU then keeps packed):
//  - dense: no quantization_config (F32, BF16, F16 tensors);
//  - fp8 blocks (DeepSeek-V3 / R1, Kimi-K2-Instruct, Qwen3-*-FP8): quant_method "fp8", fmt
//    "e4m3", weight_block_size [rows, cols]; each quantized Linear weight is F8_E4M3 beside a
//    `<name>_scale_inv` of [ceil(out / rows), ceil(in / cols)] (F32 or BF16), the weight being
//    code x scale per block. A block may be cut between TP ranks: its scale is found by the
//    element's global row and column.
//  - compressed-tensors (Kimi-K2-Thinking / K2.5's experts, llm-compressor's output): quant_method
//    "compressed-tensors" with one config group of weights
//    - format "pack-quantized", type "int", 4 or 8 bits, strategy "group" (group_size) or
//      "channel": `<module>.weight_packed` int32 words (8 or 4 codes each, lowest bits first,
//      stored as q + 2^(bits-1)), `<module>.weight_scale` [out, groups] and `<module>.weight_shape`
//      [out, in]; the weight is q x scale per group when symmetric, (q - z) x scale when not,
//      the zero points z in `<module>.weight_zero_point`, packed the same way down the rows
//      ([ceil(out / codes a word), groups]). A TP part may not cut a group or a word;
//    - format "float-quantized", type "float", 8 bits: `<module>.weight` F8_E4M3 and
//      `<module>.weight_scale` per output row ("channel") or one ("tensor").
//    `ignore` names the modules left dense, exactly or as "re:" regular expressions matched from
//    the start of the name (Python's re.match), as compressed-tensors matches them.
// Anything else (another quant_method, a static activation scheme, another fp8 encoding) is
// refused at start, naming config.json, the key and the value.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/parallel/shard.h"
#include "core/util/status.h"

namespace kvrt::model {

class SafetensorsCheckpoint;

struct WeightFormat {
  enum class Kind { kDense, kFp8Block, kPackedInt, kChannelFp8 };
  Kind kind = Kind::kDense;
  int64_t block_rows = 0, block_cols = 0;  // kFp8Block: weight_block_size
  int bits = 0;                            // kPackedInt: 4 or 8
  int64_t group_size = 0;                  // kPackedInt: 0 = one group per row ("channel")
  bool symmetric = true;                   // kPackedInt: false = zero points (weight_zero_point)
  bool per_tensor = false;                 // kChannelFp8: one scale ("tensor")
  // Modules left unquantized by name (modules_to_not_convert / ignored_layers / ignore), exactly
  // as written ("re:" for a regular expression); a stored dtype says the same, and a quantized
  // tensor of a module named here is refused.
  std::vector<std::string> not_converted;

  bool quantized() const { return kind != Kind::kDense; }
  // kPackedInt: the inputs a scale covers in a weight of `in` columns (group_size, or the row).
  int64_t group_of(int64_t in) const { return group_size > 0 ? group_size : in; }
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
// With `packed`, a block that can be kept as stored -- int4 codes in groups of a multiple of 8,
// fp8 blocks of a multiple of 4 columns, the block starting on a group -- goes there instead
// (its codes, and each row's scales; `out` is left empty).
Status load_quantized_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                            const std::string& name, const std::vector<int64_t>& shape,
                            parallel::Range rows, parallel::Range cols, std::vector<float>& out,
                            backend::QuantizedMatrix* packed = nullptr);

// The bytes `ck` stores for rows `rows` and columns `cols` of the quantized weight `name` (of
// logical `shape`), from the headers: that share of its codes and of its scales (and zero
// points), its weight_shape whole; the stored tensors counted are added to *counted when it is
// given. NotFound when `name` is not stored quantized.
Result<uint64_t> stored_quantized_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                                        const std::string& name, const std::vector<int64_t>& shape,
                                        parallel::Range rows, parallel::Range cols,
                                        std::set<std::string>* counted = nullptr);

// Whether load_quantized_block keeps columns `cols` of a weight of `in` columns stored as
// `format` as stored when asked to (its `packed`): int4 codes in groups of a multiple of 8, or
// fp8 blocks of a multiple of 4 columns with `cols` starting on one.
bool keeps_as_stored(const WeightFormat& format, int64_t in, parallel::Range cols);

// The bytes the CPU holds for rows `rows` and columns `cols` of the quantized weight `name` kept
// as stored: its packed form (kernels/cpu/quant_gemm.h: the codes, each row's scales -- bf16
// where the checkpoint stores bf16 ones, else f32 -- and zero points, in panels of 16 rows).
// NotFound when `name` is not stored quantized.
Result<uint64_t> packed_quantized_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                                        const std::string& name, const std::vector<int64_t>& shape,
                                        parallel::Range rows, parallel::Range cols);

// The name `ck` stores the tensor `name` (transformers' name in the language model) under: as is,
// or under "language_model." where a multimodal checkpoint (Kimi-K2.5) keeps its text model
// beside a vision tower (whose tensors are never asked for). A packed weight counts as stored
// by its module's weight_packed.
std::string stored_tensor_name(const SafetensorsCheckpoint& ck, const std::string& name);

}  // namespace kvrt::model
