#include "core/model/weight_format.h"

#include <cmath>

#include "core/model/safetensors.h"

namespace kvrt::model {

using nlohmann::json;

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

std::string WeightFormat::describe() const {
  switch (kind) {
    case Kind::kDense:
      return "dense";
    case Kind::kFp8Block:
      return "fp8 e4m3, " + std::to_string(block_rows) + " x " + std::to_string(block_cols) +
             " blocks (dequantized at load)";
  }
  return "?";
}

Result<WeightFormat> WeightFormat::parse(const json* q, const std::string& source) {
  WeightFormat f;
  if (q == nullptr || q->is_null()) return f;
  const std::string at = source + ": quantization_config";
  auto bad = [&](const std::string& key, const std::string& why) {
    return Status::ConfigError(at + (key.empty() ? "" : "." + key) + ": " + why);
  };
  if (!q->is_object()) return bad("", "expected an object, found " + q->dump());
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string()) {
    return bad("quant_method", "missing, or not a string");
  }
  const std::string m = method->get<std::string>();
  if (m != "fp8") {
    return bad("quant_method",
               quoted(m) + " is not served (kvrt reads \"fp8\" block weights; GPTQ, AWQ, "
                           "bitsandbytes and other formats are refused)");
  }
  // DeepSeek-V3's form: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
  // "weight_block_size": [128, 128]}.
  if (auto fmt = q->find("fmt"); fmt != q->end()) {
    if (!fmt->is_string() || fmt->get<std::string>() != "e4m3") {
      return bad("fmt", fmt->dump() + " is not served (only \"e4m3\")");
    }
  }
  if (auto scheme = q->find("activation_scheme"); scheme != q->end()) {
    if (!scheme->is_string() || scheme->get<std::string>() != "dynamic") {
      return bad("activation_scheme",
                 scheme->dump() + " is not served (only \"dynamic\": the weights are "
                                  "dequantized at load and activations are not quantized)");
    }
  }
  auto block = q->find("weight_block_size");
  if (block == q->end() || block->is_null()) {
    return bad("weight_block_size", "missing: per-tensor fp8 weights are not served yet");
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() < 1 ||
      (*block)[1].get<int64_t>() < 1 || (*block)[0].get<int64_t>() > (1 << 20) ||
      (*block)[1].get<int64_t>() > (1 << 20)) {
    return bad("weight_block_size", "expected [rows, cols] of positive integers, found " +
                                        block->dump());
  }
  f.kind = Kind::kFp8Block;
  f.block_rows = (*block)[0].get<int64_t>();
  f.block_cols = (*block)[1].get<int64_t>();
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    auto list = q->find(key);
    if (list == q->end() || list->is_null()) continue;
    if (!list->is_array()) return bad(key, "expected a list of module names");
    for (const json& name : *list) {
      if (!name.is_string()) return bad(key, "expected a list of module names");
      f.not_converted.push_back(name.get<std::string>());
    }
  }
  return f;
}

Status load_quantized_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                            const std::string& name, const std::vector<int64_t>& shape,
                            parallel::Range rows, parallel::Range cols, std::vector<float>& out) {
  if (format.kind != WeightFormat::Kind::kFp8Block || shape.size() != 2 || !ck.contains(name)) {
    return Status::NotFound(name + " is not stored quantized");
  }
  Result<TensorView> w = ck.get(name);
  if (!w.ok()) return w.status();
  if (w->dtype != DType::kF8E4M3) return Status::NotFound(name + " is stored dense");
  if (w->shape != shape) {
    return Status::InvalidArgument(w->file + ": tensor " + quoted(name) + ": expected shape " +
                                   shape_string(shape) + ", found " + shape_string(w->shape));
  }
  // Its scales: one per block of block_rows x block_cols, the edge blocks cut short.
  const std::string scale_name = name + "_scale_inv";
  const int64_t br = format.block_rows, bc = format.block_cols;
  const std::vector<int64_t> scale_shape = {(shape[0] + br - 1) / br, (shape[1] + bc - 1) / bc};
  if (!ck.contains(scale_name)) {
    return Status::InvalidArgument(w->file + ": tensor " + quoted(name) +
                                   " is F8_E4M3 but its scale " + quoted(scale_name) + " (" +
                                   shape_string(scale_shape) + ") is missing");
  }
  Result<TensorView> s = ck.get(scale_name);
  if (!s.ok()) return s.status();
  if (s->shape != scale_shape || (s->dtype != DType::kF32 && s->dtype != DType::kBF16)) {
    return Status::InvalidArgument(
        s->file + ": tensor " + quoted(scale_name) + ": expected an F32 or BF16 scale of " +
        shape_string(scale_shape) + " (" + std::to_string(br) + " x " + std::to_string(bc) +
        " blocks of " + shape_string(shape) + "), found " + std::string(dtype_name(s->dtype)) +
        " " + shape_string(s->shape));
  }
  // A module the config leaves unconverted must not be stored as codes.
  const std::string module = name.size() > 7 && name.ends_with(".weight")
                                 ? name.substr(0, name.size() - 7)
                                 : name;
  for (const std::string& kept : format.not_converted) {
    if (kept == module || kept == name) {
      return Status::InvalidArgument(w->file + ": tensor " + quoted(name) +
                                     " is F8_E4M3, but quantization_config lists " +
                                     quoted(kept) + " as not converted");
    }
  }
  // The scales (a small tensor), then each row's codes times its blocks' scales.
  std::vector<float> scales(static_cast<size_t>(scale_shape[0] * scale_shape[1]));
  to_f32(*s, scales.data());
  out.resize(static_cast<size_t>(rows.size() * cols.size()));
  const auto* codes = static_cast<const uint8_t*>(w->data);
  TensorView row = *w;
  row.shape = {cols.size()};
  row.bytes = static_cast<size_t>(cols.size());
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const uint8_t* from = codes + r * shape[1] + cols.begin;
    for (int64_t c = 0; c < cols.size(); ++c) {
      if ((from[c] & 0x7F) == 0x7F) {
        return Status::InvalidArgument(w->file + ": tensor " + quoted(name) + ": element [" +
                                       std::to_string(r) + ", " +
                                       std::to_string(cols.begin + c) + "] is an E4M3 NaN");
      }
    }
    row.data = from;
    float* o = out.data() + (r - rows.begin) * cols.size();
    to_f32(row, o);
    const float* block_scales = scales.data() + (r / br) * scale_shape[1];
    // Exact in f32 when the scale is a bf16 value (the codes carry 4 significant bits).
    for (int64_t c = 0; c < cols.size(); ++c) o[c] *= block_scales[(cols.begin + c) / bc];
  }
  return Status::Ok();
}

}  // namespace kvrt::model
